package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/inhuman/mcp-exec/host"
	"github.com/inhuman/mcp-exec/internal/testenv"
)

// Tests of the built binary without root: under setpriv (uid 65532, no
// capabilities, no_new_privs: what `docker run --user 65532:65532
// --cap-drop ALL --security-opt no-new-privileges` gives) and under
// `unshare --user --map-root-user` (uid 0 of a child user namespace). In
// each the server must either give the whole sandbox or refuse with exit
// status 125, naming the missing privilege and the settings that grant it,
// and leave nothing behind. On this kind of host it refuses: no cgroup is
// writable without root, and nothing else would enforce the limits.

// nonrootProbe prints what the sandbox looks like from inside, should the
// server ever start without root.
const nonrootProbe = `import json, os, socket
st = dict((k, v.strip()) for k, v in (l.split(":", 1) for l in open("/proc/self/status").read().splitlines() if ":" in l))
print(json.dumps({"uid": os.getuid(), "CapEff": st.get("CapEff"), "CapBnd": st.get("CapBnd"), "Seccomp": st.get("Seccomp"),
  "ifaces": [n for _, n in socket.if_nameindex()]}))`

type wrapper struct {
	name string
	argv []string // prefix before the binary
	want []string // what the refusal must say
}

func nonrootWrappers(t *testing.T) []wrapper {
	for _, tool := range []string{"setpriv", "unshare"} {
		if _, err := exec.LookPath(tool); err != nil {
			testenv.Missing(t, "%s is not installed (util-linux)", tool)
		}
	}
	if os.Geteuid() != 0 {
		// Already not root: the binary itself is the case under test.
		return []wrapper{{"as-is", nil, []string{"root: mcp-exec runs as uid"}}}
	}
	return []wrapper{
		{"setpriv", []string{"setpriv", "--reuid=65532", "--regid=65532", "--clear-groups", "--inh-caps=-all",
			"--bounding-set=-all", "--no-new-privs"}, []string{"root: mcp-exec runs as uid 65532", "docker run --user 0:0", "runAsUser: 0"}},
		{"unshare", []string{"unshare", "--user", "--map-root-user"},
			[]string{"real root: mcp-exec is uid 0 only inside a user namespace (uid_map", "hostUsers: false"}},
	}
}

// publicBinary copies the built binary where uid 65532 can run it.
func publicBinary(t *testing.T) (bin, dir string) {
	t.Helper()
	dir, err := os.MkdirTemp("", "mcp-exec-nonroot-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	if err := os.Chmod(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	data, err := os.ReadFile(binaryPath(t))
	if err != nil {
		t.Fatal(err)
	}
	bin = filepath.Join(dir, "mcp-exec")
	if err := os.WriteFile(bin, data, 0o755); err != nil {
		t.Fatal(err)
	}
	home := filepath.Join(dir, "home")
	if err := os.Mkdir(home, 0o755); err != nil {
		t.Fatal(err)
	}
	if os.Geteuid() == 0 {
		os.Chown(home, 65532, 65532)
	}
	return bin, dir
}

func TestNonRootRefusesOrGivesFullSandbox(t *testing.T) {
	testenv.Real(t)
	wrappers := nonrootWrappers(t)
	bin, dir := publicBinary(t)
	for _, w := range wrappers {
		for _, kind := range []string{"libcontainer", "runsc"} {
			t.Run(w.name+"/"+kind, func(t *testing.T) {
				stateDir := filepath.Join(dir, "state-"+w.name+"-"+kind)
				cmd := exec.Command(w.argv[0], append(append(w.argv[1:], bin), "run", "-c", nonrootProbe)...)
				if len(w.argv) == 0 {
					cmd = exec.Command(bin, "run", "-c", nonrootProbe)
				}
				cmd.Env = []string{"PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
					"HOME=" + filepath.Join(dir, "home"), "MCP_EXEC_RUNTIME=" + kind, "MCP_EXEC_STATE_DIR=" + stateDir}
				var stdout, stderr bytes.Buffer
				cmd.Stdout, cmd.Stderr = &stdout, &stderr
				cmd.WaitDelay = 5 * time.Second
				err := cmd.Run()
				code := 0
				var exitErr *exec.ExitError
				if errors.As(err, &exitErr) {
					code = exitErr.ExitCode()
				} else if err != nil {
					t.Fatalf("running %v: %v", cmd.Args, err)
				}
				switch code {
				case 0:
					// It started: then it must be the whole sandbox.
					var got struct {
						UID                     int
						CapEff, CapBnd, Seccomp string
						Ifaces                  []string
					}
					if err := json.Unmarshal(stdout.Bytes(), &got); err != nil {
						t.Fatalf("started, but the probe printed %q: %v", stdout.String(), err)
					}
					if got.UID != 65532 || got.CapEff != "0000000000000000" || got.CapBnd != "0000000000000000" ||
						got.Seccomp != "2" || strings.Join(got.Ifaces, ",") != "lo" {
						t.Errorf("started without root with less than the full sandbox: %+v", got)
					}
				case exitSandboxFailed:
					msg := stderr.String()
					for _, want := range w.want {
						if !strings.Contains(msg, want) {
							t.Errorf("refusal does not say %q:\n%s", want, msg)
						}
					}
					if !strings.Contains(msg, "isolation unavailable") || !strings.Contains(msg, kind) {
						t.Errorf("refusal does not name the runtime %s:\n%s", kind, msg)
					}
				default:
					t.Errorf("exit status %d, want 0 (full sandbox) or %d (refusal); stderr:\n%s", code, exitSandboxFailed, stderr.String())
				}
				// A refused server creates nothing: no state dir, hence no
				// instance, hence no cgroup; and no process of it is left.
				if _, err := os.Stat(stateDir); code != 0 && !os.IsNotExist(err) {
					t.Errorf("refused, yet state dir %s exists (err %v)", stateDir, err)
				}
				if _, err := os.Stat(filepath.Join(dir, "home", ".cache")); code != 0 && !os.IsNotExist(err) {
					t.Errorf("refused, yet a rootfs cache was started in HOME (err %v)", err)
				}
				assertNoProcessRunning(t, bin)
			})
		}
	}
}

func TestNonRootDoctorNamesTheFix(t *testing.T) {
	testenv.Real(t)
	wrappers := nonrootWrappers(t)
	bin, dir := publicBinary(t)
	for _, w := range wrappers {
		t.Run(w.name, func(t *testing.T) {
			args := append(append(w.argv, bin), "doctor", "--json")
			cmd := exec.Command(args[0], args[1:]...)
			cmd.Env = []string{"PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
				"HOME=" + filepath.Join(dir, "home"), "MCP_EXEC_STATE_DIR=" + filepath.Join(dir, "doctor-state")}
			out, err := cmd.Output()
			var exitErr *exec.ExitError
			if !errors.As(err, &exitErr) || exitErr.ExitCode() != 1 {
				t.Fatalf("doctor: err %v, want exit status 1 (no runtime gives the full sandbox)", err)
			}
			var r report
			if err := json.Unmarshal(out, &r); err != nil {
				t.Fatalf("doctor --json: %v\n%s", err, out)
			}
			if r.OK || r.Runtime.Mode != modeRefuse || len(r.Runtimes) != 2 {
				t.Errorf("doctor: ok %v mode %q runtimes %d, want false, %q, 2", r.OK, r.Runtime.Mode, len(r.Runtimes), modeRefuse)
			}
			for _, c := range r.Runtimes {
				joined := host.Join(c.Missing)
				if c.Available || !strings.Contains(joined, w.want[0]) {
					t.Errorf("doctor: %s available %v missing %q, want unavailable naming %q", c.Kind, c.Available, joined, w.want[0])
				}
			}
			if r.Runtimes[1].Runsc == nil {
				t.Errorf("doctor: no runsc probe in the report")
			}
		})
	}
}

func assertNoProcessRunning(t *testing.T, bin string) {
	t.Helper()
	found := ""
	testenv.EventuallyWithin(t, time.Second, "no process of "+bin+" to run", func() bool {
		found = ""
		entries, _ := os.ReadDir("/proc")
		for _, e := range entries {
			cmd, err := os.ReadFile(filepath.Join("/proc", e.Name(), "cmdline"))
			if err == nil && bytes.Contains(cmd, []byte(bin)) {
				found = string(bytes.ReplaceAll(cmd, []byte{0}, []byte{' '}))
			}
		}
		return found == ""
	})
}

// With the privileges of mcp-exec 0.5.4's drop-in deployment (uid 65532,
// no capabilities, no_new_privs: docker --user 65532:65532 --cap-drop ALL
// --security-opt no-new-privileges), auto chooses the process runtime and
// says so; a call is a fresh process with the environment allowlist, its
// own working dir, its files in and out, and nothing of it outlives it.
func TestAutoFallsBackToProcess(t *testing.T) {
	testenv.Real(t)
	testenv.Root(t) // it drops to uid 65532 with setpriv
	wrappers := nonrootWrappers(t)
	bin, dir := publicBinary(t)
	tmp := filepath.Join(dir, "tmp")
	if err := os.Mkdir(tmp, 0o1777); err != nil {
		t.Fatal(err)
	}
	os.Chmod(tmp, 0o1777)
	cmd := exec.Command(wrappers[0].argv[0], append(wrappers[0].argv[1:], bin, "serve")...)
	cmd.Env = []string{"PATH=/usr/bin:/bin", "HOME=" + filepath.Join(dir, "home"), "TMPDIR=" + tmp,
		"MCP_EXEC_RUNTIME=auto", "MCP_EXEC_AUTH_TOKEN=not-for-the-code-0123456789", "MCP_EXEC_POOL_SIZE=0"}
	var stderr testenv.SyncBuffer
	cmd.Stderr = &stderr
	ctx := context.Background()
	cs, err := mcp.NewClient(&mcp.Implementation{Name: "t", Version: "1"}, nil).Connect(ctx, &mcp.CommandTransport{Command: cmd}, nil)
	if err != nil {
		t.Fatalf("connecting: %v\n%s", err, stderr.String())
	}
	defer cs.Close()
	tools, err := cs.ListTools(ctx, nil)
	if err != nil || len(tools.Tools) != 1 || !strings.Contains(tools.Tools[0].Description, "no container of its own") {
		t.Errorf("the tool's description does not say the calls run with no container: %v %v", err, tools)
	}
	if !strings.Contains(stderr.String(), `runtime=process`) {
		t.Errorf("the log does not say the process runtime was chosen:\n%s", stderr.String())
	}
	res, err := cs.CallTool(ctx, &mcp.CallToolParams{Name: "exec", Arguments: map[string]any{
		"code": `import os, subprocess, sys
print(os.getuid(), sorted(os.environ), os.listdir("."), open("in.txt").read())
open("outputs/out.txt", "w").write("back")
subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)  # mcp-exec-orphan"], start_new_session=True)
import time; time.sleep(30)`,
		"timeout_s": 2,
		"files":     []map[string]any{{"path": "in.txt", "content": "given"}},
	}})
	if err != nil || res.IsError {
		t.Fatalf("exec: %v %v\n%s", err, res, stderr.String())
	}
	out := decodeOutput(t, res)
	var full struct {
		Files []struct{ Path string } `json:"files"`
	}
	remarshal(t, res.StructuredContent, &full)
	if out.Runtime != "process" || !out.TimedOut || out.ExitCode != 137 {
		t.Errorf("runtime %q, timed out %v, exit %d; want process, a timeout, 137", out.Runtime, out.TimedOut, out.ExitCode)
	}
	// With the host's matplotlib, the process runtime gives it the
	// rootfs's backend as a container has it: its dir on PYTHONPATH.
	env := "'COLUMNS', 'HOME', 'LANG', 'LC_ALL', 'LINES', 'MKL_NUM_THREADS', 'NUMEXPR_MAX_THREADS', 'OMP_NUM_THREADS', 'OPENBLAS_NUM_THREADS', 'PATH', 'PYTHONDONTWRITEBYTECODE', 'PYTHONIOENCODING', 'PYTHONNOUSERSITE', 'PYTHONUNBUFFERED', 'TMPDIR'"
	if exec.Command("/usr/bin/python3", "-c", "import matplotlib").Run() == nil { // the server's, on its PATH
		env = strings.Replace(strings.Replace(env, "'NUMEXPR", "'MPLBACKEND', 'NUMEXPR", 1), "'PYTHONUNBUFFERED'", "'PYTHONPATH', 'PYTHONUNBUFFERED'", 1)
	}
	if want := "65532 [" + env + "] ['in.txt', 'outputs'] given\n"; out.Stdout != want {
		t.Errorf("stdout %q, want %q", out.Stdout, want)
	}
	if len(full.Files) != 1 || full.Files[0].Path != "out.txt" {
		t.Errorf("output files %v, want out.txt", full.Files)
	}
	// The orphan that left the process group is gone too, and so is the
	// call's dir.
	testenv.EventuallyWithin(t, 5*time.Second, "the call's setsid grandchild to be gone", func() bool {
		b, _ := exec.Command("pgrep", "-f", "mcp-exec-orphan").Output()
		return len(bytes.TrimSpace(b)) == 0
	})
	// Its teardown runs after its result, off the call's time.
	testenv.EventuallyWithin(t, 10*time.Second, "the call's dirs to be removed", func() bool {
		entries, _ := filepath.Glob(filepath.Join(tmp, "mcp-exec-*", "*-*"))
		return len(entries) == 0
	})
}

// As root with exactly the capabilities host.RequiredCapabilities names,
// each runtime gives the full sandbox; with any one of them dropped it
// refuses, naming it; with docker's default set plus the flags doctor
// prints, too. Container engines grant capabilities one by one (docker
// --cap-add, Kubernetes capabilities.add, systemd's
// CapabilityBoundingSet), and the list is what the docs tell operators:
// one short is a refusal in production. (That each is needed was
// measured by hand, with the check disabled: see host.requiredCaps.)
func TestExactCapabilities(t *testing.T) {
	testenv.Real(t)
	testenv.Root(t)
	if _, err := exec.LookPath("setpriv"); err != nil {
		testenv.Missing(t, "setpriv is not installed (util-linux)")
	}
	bin, dir := publicBinary(t)
	for _, kind := range []host.Runtime{host.Libcontainer, host.Runsc} {
		required := host.RequiredCapabilities(kind)
		runWith := func(t *testing.T, caps []string) (int, string, string) {
			bounding := "-all"
			for _, c := range caps {
				bounding += ",+" + strings.ToLower(strings.TrimPrefix(c, "CAP_"))
			}
			cmd := exec.Command("setpriv", "--bounding-set="+bounding, "--inh-caps=-all", bin, "run", "-c", nonrootProbe)
			cmd.Env = []string{"PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
				"MCP_EXEC_RUNTIME=" + string(kind), "MCP_EXEC_STATE_DIR=" + filepath.Join(dir, "state-caps")}
			var stdout, stderr bytes.Buffer
			cmd.Stdout, cmd.Stderr = &stdout, &stderr
			cmd.WaitDelay = 5 * time.Second
			err := cmd.Run()
			var exitErr *exec.ExitError
			if errors.As(err, &exitErr) {
				return exitErr.ExitCode(), stdout.String(), stderr.String()
			} else if err != nil {
				t.Fatalf("running %v: %v", cmd.Args, err)
			}
			return 0, stdout.String(), stderr.String()
		}
		// What FixInContainer tells docker users: its default set plus
		// the --cap-add flags it names.
		docker := []string{"CAP_CHOWN", "CAP_DAC_OVERRIDE", "CAP_FSETID", "CAP_FOWNER", "CAP_MKNOD", "CAP_NET_RAW",
			"CAP_SETGID", "CAP_SETUID", "CAP_SETFCAP", "CAP_SETPCAP", "CAP_NET_BIND_SERVICE", "CAP_SYS_CHROOT",
			"CAP_KILL", "CAP_AUDIT_WRITE"}
		for _, f := range regexp.MustCompile(`--cap-add (\w+)`).FindAllStringSubmatch(host.FixInContainer(kind).Docker, -1) {
			docker = append(docker, "CAP_"+f[1])
		}
		for _, tc := range []struct {
			name string
			caps []string
		}{{"exactly", required}, {"docker", docker}} {
			t.Run(string(kind)+"/"+tc.name, func(t *testing.T) {
				expectFullSandbox(t, tc.caps, runWith)
			})
		}
		for i, c := range required {
			t.Run(string(kind)+"/without-"+c, func(t *testing.T) {
				fewer := append(append([]string{}, required[:i]...), required[i+1:]...)
				code, _, stderr := runWith(t, fewer)
				if code != exitSandboxFailed || !strings.Contains(stderr, c) {
					t.Errorf("without %s: exit status %d, want %d and a refusal naming it; stderr:\n%s", c, code, exitSandboxFailed, stderr)
				}
			})
		}
	}
	assertNoProcessRunning(t, bin)
}

func expectFullSandbox(t *testing.T, caps []string, runWith func(*testing.T, []string) (int, string, string)) {
	t.Helper()
	code, stdout, stderr := runWith(t, caps)
	if code != 0 {
		t.Fatalf("with %v: exit status %d, want 0; stderr:\n%s", caps, code, stderr)
	}
	var got struct {
		UID                     int
		CapEff, CapBnd, Seccomp string
		Ifaces                  []string
	}
	if err := json.Unmarshal([]byte(stdout), &got); err != nil {
		t.Fatalf("the probe printed %q: %v", stdout, err)
	}
	// gVisor's status has the same lines for these.
	if got.UID != 65532 || got.CapEff != "0000000000000000" || got.CapBnd != "0000000000000000" ||
		got.Seccomp != "2" || strings.Join(got.Ifaces, ",") != "lo" {
		t.Errorf("with %v: less than the full sandbox: %+v", caps, got)
	}
}

// Under the 0.5.4 drop-in's privileges doctor says auto would run the
// process runtime, what each call gets from it here, and what this host
// lacks of it: with namespaces of its own where this host allows them,
// and without them when they are turned off, naming the setting.
func TestDoctorProcessIsolation(t *testing.T) {
	testenv.Root(t)
	wrappers := nonrootWrappers(t)
	bin, dir := publicBinary(t)
	tmp := filepath.Join(dir, "tmp")
	if err := os.Mkdir(tmp, 0o1777); err != nil {
		t.Fatal(err)
	}
	os.Chmod(tmp, 0o1777)
	// What this kernel has (the container engine's profile aside, which
	// setpriv has none of).
	abi, _, _ := syscall.Syscall(444, 0, 0, 1) // landlock_create_ruleset(NULL, 0, VERSION)
	var lacks []string
	if int(abi) <= 0 {
		abi, lacks = 0, []string{"Landlock"}
	}
	userns := host.Probe().UserNamespaces
	for _, tc := range []struct {
		setting string
		ns      bool
	}{{"auto", userns}, {"false", false}} {
		t.Run("namespaces="+tc.setting, func(t *testing.T) {
			args := append(append([]string{}, wrappers[0].argv...), bin, "doctor")
			env := []string{"PATH=/usr/bin:/bin", "HOME=" + filepath.Join(dir, "home"), "TMPDIR=" + tmp, "MCP_EXEC_RUNTIME=auto",
				"MCP_EXEC_PROCESS_NAMESPACES=" + tc.setting}
			cmd := exec.Command(args[0], append(args[1:], "--json")...)
			cmd.Env = env
			out, _ := cmd.Output()
			var r report
			if err := json.Unmarshal(out, &r); err != nil {
				t.Fatalf("doctor --json: %v\n%s", err, out)
			}
			p := r.Runtime.Process
			if r.Runtime.Mode != modeProcess || p == nil {
				t.Fatalf("doctor under the drop-in's privileges: mode %q, process %+v; want %q with its isolation", r.Runtime.Mode, p, modeProcess)
			}
			if p.Landlock != int(abi) || !p.Seccomp || !p.Subreaper || p.UIDPerCall || p.Namespaces != tc.ns {
				t.Errorf("doctor: process isolation %+v, want Landlock ABI %d, seccomp and the subreaper, no uid per call (unprivileged), namespaces %v",
					*p, abi, tc.ns)
			}
			wantMissing := append(slices.Clone(lacks), "a uid per call")
			if !tc.ns {
				wantMissing = append(wantMissing, "namespaces of its own")
			}
			var names []string
			for _, m := range p.Missing {
				names = append(names, m.What)
				if m.What == "namespaces of its own" && tc.setting == "false" && !strings.Contains(m.Fix, "MCP_EXEC_PROCESS_NAMESPACES") {
					t.Errorf("doctor: the fix for namespaces turned off is %q, want the variable named", m.Fix)
				}
			}
			if strings.Join(names, ",") != strings.Join(wantMissing, ",") {
				t.Errorf("doctor: missing %v, want %v", names, wantMissing)
			}
			// And in words, as an operator reads it.
			cmd = exec.Command(args[0], args[1:]...)
			cmd.Env = env
			text, _ := cmd.Output()
			says := "sandboxes: a fresh confined process per call, in user, pid, mount, network, IPC and UTS namespaces of its own"
			if !tc.ns {
				says = "missing: namespaces of its own"
			}
			if !strings.Contains(string(text), says) {
				t.Errorf("doctor does not say %q:\n%s", says, text)
			}
			t.Logf("doctor (MCP_EXEC_PROCESS_NAMESPACES=%s):\n%s", tc.setting, text)
		})
	}
}
