package main

import (
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/inhuman/mcp-exec/internal/testenv"
)

// A server killed mid-call takes its containers with it, and its
// watchdog removes what it left: cgroups, state, the instance dir's mount.
// Should the watchdog be killed too, the next server to start on the same
// state dir removes it all. With the host under load, as on a busy
// machine; the same for a server whose pool holds sandboxes prepared
// ahead.
func TestKilledServerIsCleanedUp(t *testing.T) {
	requireSandbox(t)
	for range 4 {
		spin := exec.Command("/bin/sh", "-c", "while :; do :; done")
		if err := spin.Start(); err != nil {
			t.Fatal(err)
		}
		defer func() { spin.Process.Kill(); spin.Wait() }()
	}
	for _, tc := range []struct {
		name string
		args []string
		env  []string
		// procs is how many processes of the instance's containers show
		// that it is ready to be killed.
		procs int
	}{
		// The init and the interpreter: the init set its parent-death
		// signal before it started the interpreter, so there is no window
		// left to wait out.
		{"mid-call", []string{"run", "--timeout", "120", "-c", "import time; time.sleep(120)"}, nil, 2},
		// Two prepared sandboxes, each an init and an interpreter waiting
		// for code; stdin stays open, so the server serves on.
		{"pool", []string{"serve"}, []string{"MCP_EXEC_POOL_SIZE=2"}, 4},
	} {
		for _, killWatchdog := range []bool{false, true} {
			name := tc.name + map[bool]string{false: "/watchdog", true: "/next-server"}[killWatchdog]
			t.Run(name, func(t *testing.T) { killedServer(t, tc.args, tc.env, tc.procs, killWatchdog) })
		}
	}
}

// killedServer starts the server with args, waits for procs processes of
// its containers, kills it (and its watchdog too, when asked), and checks
// that nothing of it is left.
func killedServer(t *testing.T, args, extraEnv []string, procs int, killWatchdog bool) {
	state := filepath.Join(t.TempDir(), "state")
	env := append([]string{"PATH=" + os.Getenv("PATH"), "MCP_EXEC_STATE_DIR=" + state}, extraEnv...)

	cmd := exec.Command(binaryPath(t), args...)
	cmd.Env = env
	stdin, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	defer stdin.Close()
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer cmd.Process.Kill()
	// Wait for the instance to exist and its containers' processes to run.
	var instance string
	testenv.EventuallyWithin(t, 60*time.Second, fmt.Sprintf("%d processes of the instance's containers to start", procs), func() bool {
		if entries, _ := os.ReadDir(state); len(entries) == 1 && !strings.HasPrefix(entries[0].Name(), ".") {
			instance = entries[0].Name()
			return len(processesIn(instance)) >= procs
		}
		return false
	})
	watchdog := pidOf("mcp-exec-watchdog\x00__mcp_exec_watchdog__\x00" + instance)
	if watchdog == 0 {
		t.Fatal("the instance's watchdog is not running")
	}
	if killWatchdog {
		syscall.Kill(watchdog, syscall.SIGKILL)
	}
	cmd.Process.Signal(syscall.SIGKILL)
	cmd.Wait()

	// The parent-death signal ends the containers at once; the watchdog
	// would within a second or two. With the watchdog killed too, nothing
	// else would end them at all, so the bound need not be tight: on a
	// busy machine the exit of a template's interpreter and the reaping of
	// its orphans have taken over 5 s.
	testenv.EventuallyWithin(t, 30*time.Second, "the killed server's containers' processes to be gone", func() bool {
		return len(processesIn(instance)) == 0
	})
	mounted := func() bool {
		mi, _ := os.ReadFile("/proc/self/mountinfo")
		return bytes.Contains(mi, []byte(instance))
	}
	cgroupsLeft := func() {
		for _, root := range []string{"memory", "pids", "cpu", "freezer", "devices"} {
			if _, err := os.Stat(filepath.Join("/sys/fs/cgroup", root, "mcp-exec", instance)); err == nil {
				t.Errorf("cgroup %s/mcp-exec/%s of the killed server still exists", root, instance)
			}
		}
	}
	if !killWatchdog {
		testenv.EventuallyWithin(t, 10*time.Second, "the watchdog to remove the dead server's state and mount", func() bool {
			_, err := os.Stat(filepath.Join(state, instance))
			return os.IsNotExist(err) && !mounted()
		})
		cgroupsLeft()
		return
	}
	if _, err := os.Stat(filepath.Join(state, instance)); err != nil {
		t.Fatalf("the killed server's state is already gone (%v); the test proves nothing", err)
	}
	// The next instance sweeps it.
	next := exec.Command(binaryPath(t), "run", "-c", "print(1)")
	next.Env = env
	if b, err := next.CombinedOutput(); err != nil || string(b) != "1\n" {
		t.Fatalf("next run: %v %q", err, b)
	}
	if entries, _ := os.ReadDir(state); len(entries) != 0 {
		t.Errorf("state dir after the next run holds %d entries, want none", len(entries))
	}
	cgroupsLeft()
	if mounted() {
		t.Errorf("the killed server's instance dir is still mounted after the next run")
	}
}

// processesIn lists the live processes in a cgroup whose path holds id.
func processesIn(id string) []string {
	var pids []string
	entries, _ := os.ReadDir("/proc")
	for _, e := range entries {
		cg, err := os.ReadFile(filepath.Join("/proc", e.Name(), "cgroup"))
		if err != nil || !bytes.Contains(cg, []byte(id)) {
			continue
		}
		if st, err := os.ReadFile(filepath.Join("/proc", e.Name(), "stat")); err == nil {
			if f := strings.Fields(string(st[bytes.LastIndexByte(st, ')')+1:])); len(f) > 0 && f[0] == "Z" {
				continue
			}
		}
		pids = append(pids, e.Name())
	}
	return pids
}
