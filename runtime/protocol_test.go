package runtime

import (
	"context"
	"encoding/binary"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/inhuman/mcp-exec/bundle"
	"github.com/inhuman/mcp-exec/internal/testenv"
	"github.com/inhuman/mcp-exec/policy"
	"github.com/inhuman/mcp-exec/rootfs"
	"github.com/inhuman/mcp-exec/runtime/initproto"
)

// The init's protocol (runtime/initproto) is the product's contract between a
// runtime and its sandboxes, the same under every runtime. These tests
// speak it through the process runtime, which needs neither root nor a
// container, so that make unit (-short) runs them anywhere; the runtime
// suite (runtime_test) runs the properties built on it on every runtime.

// protocolSandbox prepares a process-runtime sandbox.
func protocolSandbox(t *testing.T) (*ProcessRuntime, *sandbox) {
	t.Helper()
	py, err := rootfs.FindPython(context.Background(), "")
	if err != nil {
		testenv.Missing(t, "the process runtime runs the host's python3, which is not usable: %v", err)
	}
	work, err := os.MkdirTemp("/dev/shm", "mcp-exec-proto-")
	if err != nil {
		work = t.TempDir()
	} else {
		t.Cleanup(func() { os.RemoveAll(work) })
	}
	os.Chmod(work, 0o711)
	os.Chmod(filepath.Dir(work), 0o711)
	rt, err := NewProcess(Config{WorkDir: work})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { rt.Close() })
	b, err := bundle.New(BundleDir(rt), bundle.Config{Rootfs: "/", Python: py.Path, Limits: policy.DefaultLimits(), InitDir: InitDir(rt),
		CallCaps: policy.DefaultCallCaps()}, uuid.NewString())
	if err != nil {
		t.Fatal(err)
	}
	sb, err := rt.prepareBundle(context.Background(), b)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { sb.Close() })
	return rt, sb.(*sandbox)
}

// sendRaw writes frames to the init as they are, ahead of a call.
func sendRaw(t *testing.T, sb *sandbox, frames ...[]byte) {
	t.Helper()
	sb.conn.wmu.Lock()
	defer sb.conn.wmu.Unlock()
	for _, f := range frames {
		if _, err := sb.conn.to.Write(f); err != nil {
			t.Fatal(err)
		}
	}
}

// The timeout counts from the start frame: a sandbox prepared long before
// its call still gives the code all of its time.
func TestProtocolTimeoutCountsFromStart(t *testing.T) {
	_, sb := protocolSandbox(t)
	// The interpreter waits, ready, for longer than the call's timeout.
	time.Sleep(1500 * time.Millisecond)
	res, err := sb.Run(context.Background(), Request{Code: []byte("import time; time.sleep(0.5); print('done')"),
		Timeout: time.Second, MaxOutputBytes: 1 << 20})
	if err != nil {
		t.Fatal(err)
	}
	if res.TimedOut || string(res.Stdout) != "done\n" || res.Duration < 500*time.Millisecond || res.Duration > time.Second {
		t.Errorf("a 0.5 s call with a 1 s timeout on a sandbox ready for 1.5 s: timed out %v, stdout %q, duration %v", res.TimedOut, res.Stdout, res.Duration)
	}
}

// A frame the init cannot take is an error of the call's sandbox, said as
// the init says it, and nothing of the call runs.
func TestProtocolMalformedFrames(t *testing.T) {
	shortFile := frame(initproto.HFile, []byte{0xff, 0xff}, []byte("x"))
	badPath := frame(initproto.HFile, binary.BigEndian.AppendUint16(nil, 5), []byte("../..x"))
	for _, tc := range []struct {
		name   string
		frames [][]byte
		want   string
	}{
		{"a file frame cut short", [][]byte{shortFile}, "malformed frame"},
		{"a path out of the work dir", [][]byte{badPath}, "writing input file ../..: Invalid argument"},
		{"an unknown frame type", [][]byte{frame('Z', []byte("?"))}, "unknown type"},
		{"a second configuration", [][]byte{frame(initproto.HConfig)}, "second configuration"},
		{"a frame over the bound", [][]byte{{initproto.HStdin, 0xff, 0xff, 0xff, 0xff}}, "Message too long"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, sb := protocolSandbox(t)
			sendRaw(t, sb, tc.frames...)
			res, err := sb.Run(context.Background(), Request{Code: []byte("print('ran')"), Timeout: 10 * time.Second, MaxOutputBytes: 1 << 20})
			if !errors.Is(err, ErrSandbox) || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("after %s: err %v, want the sandbox's error saying %q", tc.name, err, tc.want)
			}
			if strings.Contains(string(res.Stdout), "ran") {
				t.Errorf("after %s: the code ran", tc.name)
			}
		})
	}
}

// The configuration is checked before anything runs: a field the init
// does not know ends it, and the sandbox never gets ready.
func TestProtocolUnknownConfiguration(t *testing.T) {
	c := &initproto.Config{Init: bundle.Init{UID: 1, GID: 1, WorkDir: "/tmp", Script: "/x", Argv: []string{"/p", "/x"}}}
	payload, err := c.Encode()
	if err != nil {
		t.Fatal(err)
	}
	payload = append(payload, 0x7f, 0x7f, 0, 0, 0, 0) // key 32639, empty
	// Decoded by the C side: started as the init, with this configuration.
	dir := t.TempDir()
	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	go func() {
		writeFrame(w, initproto.HConfig, payload)
		w.Close()
	}()
	out, err := initProcess(dir, r)
	if err == nil || !strings.Contains(out, "the configuration's field 32639: unknown key") {
		t.Errorf("an init with an unknown configuration key: err %v, stderr %q; want it to refuse, naming the key", err, out)
	}
}

// initProcess runs this test binary as the init, its stdin r, and returns
// what it wrote on stderr.
func initProcess(dir string, r *os.File) (string, error) {
	cmd := exec.Command("/proc/self/exe", initproto.InitMarker)
	cmd.Dir = dir
	cmd.Stdin = r
	var stderr strings.Builder
	cmd.Stderr = &stderr
	err := cmd.Run()
	return stderr.String(), err
}
