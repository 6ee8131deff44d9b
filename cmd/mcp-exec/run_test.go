package main

import (
	"bytes"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/inhuman/mcp-exec/internal/testenv"
	"github.com/inhuman/mcp-exec/runtime"
)

// cli runs the built binary with env added to a minimal environment and
// returns its stdout, stderr and exit status. Each run gets its own state
// dir, which must be empty again afterwards: nothing left behind.
func cli(t *testing.T, env []string, args ...string) (string, string, int) {
	t.Helper()
	state := filepath.Join(t.TempDir(), "state")
	cmd := exec.Command(binaryPath(t), args...)
	cmd.Env = append([]string{"PATH=" + os.Getenv("PATH"), "MCP_EXEC_STATE_DIR=" + state}, env...)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	err := cmd.Run()
	code := 0
	if ee, ok := err.(*exec.ExitError); ok {
		code = ee.ExitCode()
	} else if err != nil {
		t.Fatalf("running %v: %v", args, err)
	}
	if entries, err := os.ReadDir(state); err == nil && len(entries) != 0 {
		var names []string
		for _, e := range entries {
			names = append(names, e.Name())
		}
		t.Errorf("mcp-exec %v left state behind: %v", args, names)
	}
	return stdout.String(), stderr.String(), code
}

func TestRunCommand(t *testing.T) {
	requireSandbox(t)
	dir := t.TempDir()
	script := filepath.Join(dir, "rev.py")
	os.WriteFile(script, []byte("import sys\nprint(sys.stdin.read()[::-1])\nsys.exit(7)\n"), 0o644)
	input := filepath.Join(dir, "in.txt")
	os.WriteFile(input, []byte("olleh"), 0o644)

	for _, tc := range []struct {
		name       string
		env        []string
		args       []string
		wantOut    string
		wantErr    string // substring of stderr
		wantStatus int
	}{
		{"print", nil, []string{"run", "-c", "print(1)"}, "1\n", "", 0},
		{"file and stdin", nil, []string{"run", "--stdin", input, script}, "hello\n", "", 7},
		{"stderr and status", nil, []string{"run", "-c", "import sys; sys.stderr.write('oops'); sys.exit(3)"}, "", "oops", 3},
		{"timeout", nil, []string{"run", "--timeout", "1", "-c", "print('start', flush=True)\nwhile True: pass"}, "start\n", "timed out after 1s", 137},
		{"oom", []string{"MCP_EXEC_MEMORY_MB=64"}, []string{"run", "-c", "b = bytearray(512 << 20)"}, "", "memory limit (64 MiB)", 137},
		{"missing code file", nil, []string{"run", filepath.Join(dir, "nope.py")}, "", "reading code file", 125},
		{"unusable rootfs", []string{"MCP_EXEC_ROOTFS=" + dir}, []string{"run", "-c", "1"}, "", "is not a usable rootfs", 125},
		{"stdin over limit", []string{"MCP_EXEC_MAX_STDIN_BYTES=2"}, []string{"run", "--stdin", input, "-c", "1"}, "", "MCP_EXEC_MAX_STDIN_BYTES", 125},
		{"timeout over max", []string{"MCP_EXEC_MAX_TIMEOUT_S=5"}, []string{"run", "--timeout", "10", "-c", "1"}, "", "MCP_EXEC_MAX_TIMEOUT_S", 2},
		{"invalid config", []string{"MCP_EXEC_MEMORY_MB=lots"}, []string{"run", "-c", "1"}, "", "MCP_EXEC_MEMORY_MB", 2},
		{"both code and file", nil, []string{"run", "-c", "1", script}, "", "not both", 2},
	} {
		t.Run(tc.name, func(t *testing.T) {
			out, errOut, status := cli(t, tc.env, tc.args...)
			if status != tc.wantStatus || out != tc.wantOut || !strings.Contains(errOut, tc.wantErr) {
				t.Errorf("mcp-exec %v:\nstatus %d, want %d\nstdout %q, want %q\nstderr %q, want it to contain %q",
					tc.args, status, tc.wantStatus, out, tc.wantOut, errOut, tc.wantErr)
			}
			if tc.wantStatus == 125 && strings.Count(strings.TrimSpace(errOut), "\n") != 0 {
				t.Errorf("sandbox failure message is not one line: %q", errOut)
			}
		})
	}
}

func TestDoctor(t *testing.T) {
	requireSandbox(t)
	out, errOut, status := cli(t, nil, "doctor", "--json")
	if status != 0 {
		t.Fatalf("doctor --json: status %d\n%s\n%s", status, out, errOut)
	}
	var r struct {
		OK     bool
		Rootfs struct {
			PythonVersion string `json:"python_version"`
		}
		Runtimes []struct {
			Kind      string
			Available bool
		}
		Runtime struct {
			Sandboxes string
			Fork      *runtime.ForkStatus
		}
	}
	if err := json.Unmarshal([]byte(out), &r); err != nil {
		t.Fatalf("doctor --json output: %v\n%s", err, out)
	}
	if !r.OK || r.Rootfs.PythonVersion == "" || len(r.Runtimes) < 2 {
		t.Errorf("doctor --json = %s; want ok, a Python version and both runtimes", out)
	}
	// Which sandboxes the server makes, from its proving run: forks.
	if f := r.Runtime.Fork; !strings.HasPrefix(r.Runtime.Sandboxes, "forked from a template") || f == nil || f.Forks < 1 || f.LastError != "" {
		t.Errorf("doctor --json: sandboxes %q, fork %+v; want forked, proved by a fork", r.Runtime.Sandboxes, r.Runtime.Fork)
	}
	out, _, status = cli(t, nil, "doctor")
	if status != 0 || !strings.Contains(out, "verdict: OK") || !strings.Contains(out, "sandboxes: forked from a template") {
		t.Errorf("doctor: status %d\n%s", status, out)
	}
	out, _, status = cli(t, []string{"MCP_EXEC_FORK=false"}, "doctor")
	if status != 0 || !strings.Contains(out, "sandboxes: a fresh container per call (MCP_EXEC_FORK=false)") {
		t.Errorf("doctor with MCP_EXEC_FORK=false: status %d\n%s", status, out)
	}
	if _, errOut, status := cli(t, []string{"MCP_EXEC_FORK=sometimes"}, "doctor"); status != 2 || !strings.Contains(errOut, "MCP_EXEC_FORK") {
		t.Errorf("doctor with MCP_EXEC_FORK=sometimes: status %d, %s; want 2 and the variable named", status, errOut)
	}
	// A selected runtime that cannot give the sandbox: non-zero, with a fix.
	out, _, status = cli(t, []string{"MCP_EXEC_RUNSC=/nonexistent/runsc", "MCP_EXEC_RUNTIME=runsc"}, "doctor")
	if status == 0 || !strings.Contains(out, "NOT OK") {
		t.Errorf("doctor with a missing runsc: status %d\n%s", status, out)
	}
}

func TestRootfsBuildCommand(t *testing.T) {
	testenv.Real(t)
	if os.Geteuid() != 0 {
		requireSandbox(t) // skips or fails with the reason
	}
	tmp := t.TempDir()
	out := filepath.Join(tmp, "rootfs")
	stdout, stderr, status := cli(t, nil, "rootfs", "build", "--out", out)
	if status != 0 || !strings.Contains(stdout, "built "+out) {
		t.Fatalf("rootfs build: status %d\n%s\n%s", status, stdout, stderr)
	}
	if _, err := os.Stat(filepath.Join(out, "usr/bin/python3")); err != nil {
		t.Errorf("built rootfs has no /usr/bin/python3: %v", err)
	}
	// The rootfs it built is usable as MCP_EXEC_ROOTFS, once the sandbox's
	// unprivileged uids can reach it: the test's temp dirs are 0700.
	stdout, stderr, status = cli(t, []string{"MCP_EXEC_ROOTFS=" + out}, "run", "-c", "print('ok')")
	if status != exitSandboxFailed || !strings.Contains(stderr, "chmod o+x") {
		t.Errorf("run on a rootfs behind a 0700 dir: status %d\n%s\n%s; want a refusal naming the fix", status, stdout, stderr)
	}
	for _, d := range []string{tmp, filepath.Dir(tmp)} {
		if err := os.Chmod(d, 0o711); err != nil {
			t.Fatal(err)
		}
	}
	stdout, stderr, status = cli(t, []string{"MCP_EXEC_ROOTFS=" + out}, "run", "-c", "print('ok')")
	if status != 0 || stdout != "ok\n" {
		t.Errorf("run on the built rootfs: status %d\n%s\n%s", status, stdout, stderr)
	}
	// It refuses to overwrite.
	if _, stderr, status := cli(t, nil, "rootfs", "build", "--out", out); status == 0 || stderr == "" {
		t.Errorf("rootfs build over an existing dir: status %d, stderr %q", status, stderr)
	}
}
