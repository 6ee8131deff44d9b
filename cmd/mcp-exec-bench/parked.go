package main

import (
	"context"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"
)

// Parked is what parking an idle persistent session does (runsc,
// MCP_EXEC_PERSISTENT_PARK_S): the memory it gives back, the disk it
// takes instead, and what its next call pays to restore it. Measured on
// a server of its own with a one-second park, a few rounds.
type Parked struct {
	Rounds int `json:"rounds"`
	// Memory of the server's containers (VmRSS summed) with the session
	// frozen, and parked, less what they were before it was opened (the
	// pool's prepared sandbox).
	FrozenKB int64 `json:"frozen_containers_kb"`
	ParkedKB int64 `json:"parked_containers_kb"`
	// ImageKB is the image on disk (median); ParkMS how long the park took,
	// from its timer to the sandbox gone (median, at 10 ms resolution).
	ImageKB int64   `json:"image_kb"`
	ParkMS  float64 `json:"park_ms"`
	// The next call after a park (restore included) and a call in the
	// live session, p50.
	RestoredCallMS float64 `json:"restored_call_ms"`
	LiveCallMS     float64 `json:"live_call_ms"`
	Error          string  `json:"error,omitempty"`
}

// parkAfter is the park the measuring server is given.
const parkAfter = time.Second

// parkRoot is the runtime's default park dir (runtime.DefaultParkDir).
const parkRoot = "/var/tmp/mcp-exec-parked"

func measureParked(ctx context.Context, o options, entry string, log io.Writer) *Parked {
	_, set := runtimeSettings(entry)
	set = append(set, fmt.Sprintf("MCP_EXEC_PERSISTENT_PARK_S=%g", parkAfter.Seconds()))
	env, _ := serverEnv(os.Environ(), o, set...)
	progress(log, "%s: a parked persistent session (a server with MCP_EXEC_PERSISTENT_PARK_S=%g)", entry, parkAfter.Seconds())
	r := &Parked{}
	srv, err := startServer(ctx, o.Server, env)
	if err != nil {
		r.Error = err.Error()
		return r
	}
	defer srv.close()
	if !pause(ctx, o.Settle) {
		return r
	}
	inst, ok := instanceID(srv.pid())
	if !ok {
		r.Error = "the server's instance was not found"
		return r
	}
	dir := filepath.Join(parkRoot, inst)
	base, err := readMemory(srv.pid())
	if err != nil {
		r.Error = err.Error()
		return r
	}
	out, err := srv.exec(ctx, &mcp.CallToolParams{Name: "exec", Arguments: map[string]any{"code": "x = list(range(1000))", "session": "new"}})
	if err != nil {
		r.Error = err.Error()
		return r
	}
	defer srv.exec(ctx, &mcp.CallToolParams{Name: "exec", Arguments: map[string]any{"code": "", "session": out.Session, "end_session": true}})
	call := srv.sessionCaller(printOne, out.Session)
	live := measureLatency(ctx, "live", max(o.N/2, 5), 1, 0, call)
	if live.Summary != nil {
		r.LiveCallMS = live.P50MS
	}
	if m, err := readMemory(srv.pid()); err == nil {
		r.FrozenKB = m.ContainersKB - base.ContainersKB
	}
	var images, parks, restored []float64
	const rounds = 3
	for range rounds {
		start := time.Now()
		kb, ok := awaitPark(ctx, srv.pid(), dir, base.ContainersKB)
		if !ok {
			r.Error = "the session was not parked within 30 s"
			break
		}
		parks = append(parks, float64(time.Since(start)-parkAfter)/1e6)
		images = append(images, float64(kb))
		if m, err := readMemory(srv.pid()); err == nil {
			r.ParkedKB = m.ContainersKB - base.ContainersKB
		}
		t := time.Now()
		if _, err := call(ctx); err != nil {
			r.Error = "the restored session's call: " + err.Error()
			break
		}
		restored = append(restored, float64(time.Since(t))/1e6)
		r.Rounds++
	}
	if r.Rounds > 0 {
		r.ImageKB, r.ParkMS, r.RestoredCallMS = int64(median(images)), median(parks), median(restored)
	}
	return r
}

// awaitPark waits until the session's image is on disk and the server's
// containers are back to what they were without it; it returns the
// image's size.
func awaitPark(ctx context.Context, pid int, dir string, baseKB int64) (int64, bool) {
	deadline := time.Now().Add(30 * time.Second)
	for time.Now().Before(deadline) && ctx.Err() == nil {
		if kb := dirKB(dir); kb > 0 {
			if m, err := readMemory(pid); err == nil && m.ContainersKB <= baseKB+4<<10 {
				return kb, true
			}
		}
		time.Sleep(10 * time.Millisecond)
	}
	return 0, false
}

// dirKB is the disk a dir's files take, in KiB.
func dirKB(dir string) int64 {
	var total int64
	filepath.WalkDir(dir, func(_ string, d fs.DirEntry, err error) error {
		if err == nil && !d.IsDir() {
			if fi, err := d.Info(); err == nil {
				total += fi.Size()
			}
		}
		return nil
	})
	return total >> 10
}

// instanceID is the id of the server's instance: its state dir's lock,
// which it holds open.
func instanceID(pid int) (string, bool) {
	fds := fmt.Sprintf("/proc/%d/fd", pid)
	ents, err := os.ReadDir(fds)
	if err != nil {
		return "", false
	}
	for _, e := range ents {
		if target, err := os.Readlink(filepath.Join(fds, e.Name())); err == nil && strings.HasSuffix(target, "/lock") {
			return filepath.Base(filepath.Dir(target)), true
		}
	}
	return "", false
}

func median(v []float64) float64 {
	if len(v) == 0 {
		return 0
	}
	s := slices.Clone(v)
	slices.Sort(s)
	return s[len(s)/2]
}
