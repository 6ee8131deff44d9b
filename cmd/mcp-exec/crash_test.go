package main

import (
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"
)

// A server killed mid-call takes its containers with it, and the next one
// to start on the same state dir removes what it left; with the host under
// load, as on a busy machine.
func TestKilledServerIsCleanedUp(t *testing.T) {
	requireSandbox(t)
	for range 4 {
		spin := exec.Command("/bin/sh", "-c", "while :; do :; done")
		if err := spin.Start(); err != nil {
			t.Fatal(err)
		}
		defer func() { spin.Process.Kill(); spin.Wait() }()
	}
	state := filepath.Join(t.TempDir(), "state")
	env := []string{"PATH=" + os.Getenv("PATH"), "MCP_EXEC_STATE_DIR=" + state}

	cmd := exec.Command(binaryPath(t), "run", "--timeout", "120", "-c", "import time; time.sleep(120)")
	cmd.Env = env
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer cmd.Process.Kill()
	// Wait for the instance to exist and its container's processes to run.
	var instance string
	deadline := time.Now().Add(30 * time.Second)
	for {
		if entries, _ := os.ReadDir(state); len(entries) == 1 && !strings.HasPrefix(entries[0].Name(), ".") {
			instance = entries[0].Name()
			// The init and the interpreter: the init set its parent-death
			// signal before it started the interpreter, so there is no
			// window left to wait out.
			if len(processesIn(instance, 0)) >= 2 {
				break
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("the sandboxed code did not start within 30s (instance %q)", instance)
		}
		time.Sleep(20 * time.Millisecond)
	}

	cmd.Process.Signal(syscall.SIGKILL)
	cmd.Wait()

	// The parent-death signal ends the container at once; the watchdog
	// would within a second or two.
	if pids := processesIn(instance, 5*time.Second); len(pids) != 0 {
		t.Errorf("processes of the killed server's containers still run: %v", pids)
	}
	if _, err := os.Stat(filepath.Join(state, instance)); err != nil {
		t.Fatalf("the killed server's state is already gone (%v); the test proves nothing", err)
	}

	// The next instance sweeps it.
	cmd = exec.Command(binaryPath(t), "run", "-c", "print(1)")
	cmd.Env = env
	if b, err := cmd.CombinedOutput(); err != nil || string(b) != "1\n" {
		t.Fatalf("next run: %v %q", err, b)
	}
	if entries, _ := os.ReadDir(state); len(entries) != 0 {
		t.Errorf("state dir after the next run holds %d entries, want none", len(entries))
	}
	for _, root := range []string{"memory", "pids", "cpu", "freezer", "devices"} {
		if _, err := os.Stat(filepath.Join("/sys/fs/cgroup", root, "mcp-exec", instance)); err == nil {
			t.Errorf("cgroup %s/mcp-exec/%s of the killed server still exists", root, instance)
		}
	}
}

// processesIn lists live host processes whose cgroup names id, waiting up
// to wait for the list to empty. Zombies are dead already: reaping them is
// the job of the host's init, which the server was not.
func processesIn(id string, wait time.Duration) []string {
	deadline := time.Now().Add(wait)
	for {
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
		if len(pids) == 0 || time.Now().After(deadline) {
			return pids
		}
		time.Sleep(50 * time.Millisecond)
	}
}
