package runtime

import (
	"bufio"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	goruntime "runtime"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// The watchdog is the backstop that trusts nothing inside a sandbox: one
// small process per server instance, this executable started with
// watchdogMarker, in its own session so that a signal meant for the server
// does not reach it, and without a parent-death signal. The server holds
// the only write end of its stdin and tells it, a line each, when a call's
// code has to be over:
//
//	arm <cgroup path> <deadline, Unix ms>
//	disarm <cgroup path>
//
// Past a deadline it kills every process of that call's cgroups, server
// alive or not: a call never runs much past its timeout, even if the
// server's own timer failed. When its stdin ends — the server exited, was
// killed, or died in a way that left nothing to send — it kills every
// process of the instance's cgroups, removes them and the instance's own
// filesystem, and exits: a container whose init ignored its parent-death
// signal (or never got it) is gone within a second of the server, and so
// is the mount of its instance dir.

// watchdogMarker is the argument that makes this executable a watchdog.
const watchdogMarker = "__mcp_exec_watchdog__"

// RunWatchdogIfAsked runs the watchdog, and exits, when this process was
// started as one. The binary's init hook calls it, like libcontainer's.
func RunWatchdogIfAsked() {
	if len(os.Args) > 3 && os.Args[1] == watchdogMarker {
		os.Exit(watchdogMain(os.Args[2], os.Args[3], os.Stdin))
	}
}

// watchdog is the server's end of its watchdog.
type watchdog struct {
	mu  sync.Mutex
	w   *os.File
	cmd *exec.Cmd
	log *slog.Logger
}

// startWatchdog starts the watchdog of an instance.
func startWatchdog(instanceID, instanceDir string, log *slog.Logger) (*watchdog, error) {
	r, w, err := os.Pipe()
	if err != nil {
		return nil, fmt.Errorf("starting the watchdog: %w", err)
	}
	defer r.Close()
	cmd := exec.Command("/proc/self/exe", watchdogMarker, instanceID, instanceDir)
	cmd.Args[0] = "mcp-exec-watchdog"
	cmd.Env = []string{}
	cmd.Dir = "/"
	cmd.Stdin = r
	// Its own session: ^C in the server's terminal, or a signal to the
	// server's process group, does not take the backstop with it.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	if err := cmd.Start(); err != nil {
		w.Close()
		return nil, fmt.Errorf("starting the watchdog: %w", err)
	}
	go cmd.Wait() // reaped when it exits, after the server closed its stdin
	return &watchdog{w: w, cmd: cmd, log: log}, nil
}

// arm tells the watchdog to kill the call's cgroup past deadline.
func (d *watchdog) arm(cgroupPath string, deadline time.Time) {
	d.send(fmt.Sprintf("arm %s %d\n", cgroupPath, deadline.UnixMilli()))
}

// disarm tells the watchdog that the call is over.
func (d *watchdog) disarm(cgroupPath string) {
	d.send(fmt.Sprintf("disarm %s\n", cgroupPath))
}

func (d *watchdog) send(line string) {
	if d == nil {
		return
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.w == nil {
		return
	}
	if _, err := io.WriteString(d.w, line); err != nil {
		d.log.Warn("the watchdog is gone", "err", err)
	}
}

// close ends the watchdog: it sweeps what is left of the instance (by then
// nothing) and exits.
func (d *watchdog) close() {
	if d == nil {
		return
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.w != nil {
		d.w.Close()
		d.w = nil
	}
}

func watchdogMain(instanceID, instanceDir string, in io.Reader) int {
	signal.Ignore(syscall.SIGINT, syscall.SIGTERM, syscall.SIGHUP, syscall.SIGPIPE)
	if strings.ContainsAny(instanceID, "/.") || instanceID == "" || filepath.Base(instanceDir) != instanceID || !filepath.IsAbs(instanceDir) {
		fmt.Fprintf(os.Stderr, "mcp-exec watchdog: bad instance id %q or dir %q\n", instanceID, instanceDir)
		return 2
	}
	// The lines are taken where they are read, on one thread
	// (GOMAXPROCS 1): each line the server writes then wakes one thread
	// once, not a second through the scheduler (0.53 → 0.3 ms of CPU a
	// call, measured: docs/performance.md).
	goruntime.GOMAXPROCS(1)
	timers := map[string]*time.Timer{}
	sc := bufio.NewScanner(in)
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		var path string
		var deadline time.Time
		switch {
		case len(f) == 3 && f[0] == "arm":
			ms, err := strconv.ParseInt(f[2], 10, 64)
			if err != nil || !ownedBy(f[1], instanceID) {
				continue
			}
			path, deadline = f[1], time.UnixMilli(ms)
		case len(f) == 2 && f[0] == "disarm":
			path = f[1]
		default:
			continue
		}
		if t := timers[path]; t != nil {
			t.Stop()
			delete(timers, path)
		}
		if !deadline.IsZero() {
			timers[path] = time.AfterFunc(time.Until(deadline), func() { killCgroupEverywhere(path) })
		}
	}
	// The server is gone, or done: nothing of the instance may live on.
	for _, t := range timers {
		t.Stop()
	}
	killInstance(instanceID)
	unmountInstance(instanceDir)
	removeAllAtomic(instanceDir)
	return 0
}

// ownedBy keeps a watchdog to its own instance's cgroups.
func ownedBy(cgroupPath, instanceID string) bool {
	return strings.HasPrefix(cgroupPath, "/"+cgroupRoot+"/"+instanceID+"/") && !strings.Contains(cgroupPath, "..")
}

// killCgroupEverywhere kills every process of cgroup paths in every
// hierarchy, until none is left or a few seconds have passed. Hierarchy by
// hierarchy, the freezer's first (cgroupMounts): a frozen session's
// processes die only once its freezer cgroup is thawed, and a forked one's
// are in its template's cgroups of the other hierarchies.
func killCgroupEverywhere(rels ...string) {
	for _, mnt := range cgroupMounts() {
		for _, rel := range rels {
			dir := filepath.Join(mnt, rel)
			if _, err := os.Stat(dir); err == nil {
				killCgroupTree(dir)
			}
		}
	}
}

// killInstance kills every process of an instance's cgroups and its
// templates', and removes them, deepest first.
func killInstance(instanceID string) {
	killCgroupEverywhere("/"+cgroupRoot+"/"+instanceID+templatesSuffix, "/"+cgroupRoot+"/"+instanceID)
	removeCgroupTree(instanceID, slog.New(slog.DiscardHandler))
}

// killCgroupTree kills every process below dir, freezing each cgroup first
// where the freezer allows (cgroup v1), so that no process forks past the
// kill, and retrying until the tree is empty or 5 s have passed.
func killCgroupTree(dir string) {
	deadline := time.Now().Add(5 * time.Second)
	for {
		alive := false
		filepath.WalkDir(dir, func(p string, d os.DirEntry, err error) error {
			if err != nil || !d.IsDir() {
				return nil
			}
			if killFrozen(p) {
				alive = true
			}
			return nil
		})
		if !alive || time.Now().After(deadline) {
			return
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// killFrozen kills the processes of one cgroup and reports whether it had
// any. cgroup v2's cgroup.kill does it atomically; v1's freezer, when the
// cgroup has one, stops a fork bomb from outrunning the kill.
func killFrozen(dir string) bool {
	if err := os.WriteFile(filepath.Join(dir, "cgroup.kill"), []byte("1"), 0); err == nil {
		return cgroupHasProcs(dir)
	}
	frozen := os.WriteFile(filepath.Join(dir, "freezer.state"), []byte("FROZEN"), 0) == nil
	data, err := os.ReadFile(filepath.Join(dir, "cgroup.procs"))
	had := false
	if err == nil {
		for _, f := range strings.Fields(string(data)) {
			if pid, err := strconv.Atoi(f); err == nil && pid > 0 {
				unix.Kill(pid, unix.SIGKILL)
				had = true
			}
		}
	}
	if frozen {
		// SIGKILL takes a frozen process only once it thaws.
		os.WriteFile(filepath.Join(dir, "freezer.state"), []byte("THAWED"), 0)
	}
	return had
}

func cgroupHasProcs(dir string) bool {
	data, err := cgroupRead(filepath.Join(dir, "cgroup.procs"))
	return err == nil && len(strings.TrimSpace(string(data))) > 0
}
