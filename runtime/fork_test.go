package runtime_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/google/uuid"
	specs "github.com/opencontainers/runtime-spec/specs-go"

	"github.com/inhuman/mcp-exec/bundle"
	"github.com/inhuman/mcp-exec/internal/testenv"
	"github.com/inhuman/mcp-exec/policy"
	"github.com/inhuman/mcp-exec/rootfs"
	"github.com/inhuman/mcp-exec/runtime"
)

// Forked sandboxes (fork.go): what is theirs alone. Every sandbox property
// of this suite runs on them too (forEachContainerRuntime's
// libcontainer-fork variants).

// newForkHarness is a libcontainer runtime whose sandboxes are forked
// from templates. Its cleanup fails the test when a sandbox was not a
// fork after all: a template that fails makes a fresh container instead,
// which would pass every property test without testing forks.
func newForkHarness(t *testing.T, limits policy.Limits) *harness {
	t.Helper()
	return newForkHarnessConfig(t, limits, runtime.ForkConfig{Enabled: true}, true)
}

// newForkHarnessKind is newForkHarness on the runtime of kind.
func newForkHarnessKind(t *testing.T, kind runtime.Kind, limits policy.Limits) *harness {
	t.Helper()
	return newForkHarnessConfigKind(t, kind, limits, runtime.ForkConfig{Enabled: true}, true)
}

// forEachForking runs f as a subtest on each runtime whose sandboxes
// fork from templates: libcontainer, and runsc inside gVisor.
func forEachForking(t *testing.T, f func(t *testing.T, kind runtime.Kind)) {
	t.Helper()
	for _, kind := range runtimeKinds(t) {
		t.Run(string(kind), func(t *testing.T) { f(t, kind) })
	}
}

func newForkHarnessConfig(t *testing.T, limits policy.Limits, fork runtime.ForkConfig, mustFork bool) *harness {
	t.Helper()
	return newForkHarnessConfigKind(t, runtime.Libcontainer, limits, fork, mustFork)
}

func newForkHarnessConfigKind(t *testing.T, kind runtime.Kind, limits policy.Limits, fork runtime.ForkConfig, mustFork bool) *harness {
	t.Helper()
	h := newHarnessConfig(t, kind, limits, runtime.Config{Fork: fork})
	if mustFork {
		t.Cleanup(func() {
			if st := h.forking(); st.LastError != "" {
				t.Errorf("a sandbox was a fresh container, not a fork: %s", st.LastError)
			}
		})
	}
	return h
}

func (h *harness) forking() runtime.ForkStatus {
	return h.rt.(interface{ Forking() runtime.ForkStatus }).Forking()
}

// forkedProbe is what a call sees of where it runs: its pid and parent's
// (a fork's parent is its template's interpreter, outside its pid
// namespace), its interpreter's string hash secret (a template's, shared
// by its forks), and what the kernel says of its mounts.
const forkedProbe = `import json, os
print(json.dumps({"pid": os.getpid(), "ppid": os.getppid(), "hash": hash("mcp-exec"),
    "procs": sorted(int(p) for p in os.listdir("/proc") if p.isdigit()),
    "mounts": sorted(l.split()[4] + " " + l.split(" - ")[1].split()[0] for l in open("/proc/self/mountinfo")),
    "tmp": os.listdir("/tmp")}))`

type forked struct {
	PID, PPID   int
	Hash        int64
	Procs       []int
	Mounts, Tmp []string
}

// A forked sandbox is a fresh one to the code: it is pid 2 of its own pid
// namespace beside its init, nothing of its template's processes or
// mounts is in reach (its mounts are a fresh container's, one for one:
// the template's /proc, /tmp, /dev/shm and /code are gone, not covered),
// and /tmp holds only the outputs dir, whatever the template's forks
// before it wrote.
func TestForkedSandboxIsFresh(t *testing.T) {
	forEachForking(t, func(t *testing.T, kind runtime.Kind) {
		testenv.Parallel(t)
		testForkedSandboxIsFresh(t, kind)
	})
}

func testForkedSandboxIsFresh(t *testing.T, kind runtime.Kind) {
	cold := newHarness(t, kind, policy.DefaultLimits())
	var container forked
	cold.probe(forkedProbe, &container)
	h := newForkHarnessKind(t, kind, policy.DefaultLimits())
	var first forked
	for i := 0; i < 3; i++ {
		var got forked
		h.probe(forkedProbe+`
open("/tmp/left-by-%d" % os.getpid(), "w").write("x")`, &got)
		if got.PID != 2 || got.PPID != 0 || len(got.Procs) != 2 || got.Procs[0] != 1 || got.Procs[1] != 2 {
			t.Errorf("call %d: pid %d, parent %d, /proc %v; want pid 2, parent 0 (outside), only 1 and 2", i, got.PID, got.PPID, got.Procs)
		}
		if kind == runtime.Runsc {
			// gVisor's runsc masks nothing of its /proc, its own; a fork
			// masks what a libcontainer container's masks, as its init
			// does everywhere: more than a fresh gVisor sandbox, never less.
			got.Mounts = slices.DeleteFunc(got.Mounts, func(m string) bool {
				return strings.HasPrefix(m, "/proc/") || strings.HasPrefix(m, "/sys/firmware ")
			})
		}
		if strings.Join(got.Mounts, "\n") != strings.Join(container.Mounts, "\n") {
			t.Errorf("call %d: mounts\n%s\nwant a fresh container's\n%s", i, strings.Join(got.Mounts, "\n"), strings.Join(container.Mounts, "\n"))
		}
		if len(got.Tmp) != 1 || got.Tmp[0] != policy.OutputsName {
			t.Errorf("call %d: /tmp holds %v, want only %s", i, got.Tmp, policy.OutputsName)
		}
		if i == 0 {
			first = got
		} else if got.Hash != first.Hash {
			t.Fatalf("call %d came from another template (hash secret differs): the checks above did not compare forks of one", i)
		}
	}
	if st := h.forking(); st.Forks < 3 {
		t.Errorf("forks %d, want 3", st.Forks)
	}
}

// Nothing a call does to its interpreter reaches the next call forked from
// the same template: not its modules, builtins, import path, environment,
// working directory, signal handlers or open files.
func TestForkedCallsDoNotMeet(t *testing.T) {
	forEachForking(t, func(t *testing.T, kind runtime.Kind) {
		testenv.Parallel(t)
		testForkedCallsDoNotMeet(t, newForkHarnessKind(t, kind, policy.DefaultLimits()))
	})
}

func testForkedCallsDoNotMeet(t *testing.T, h *harness) {
	h.mustRun(`import builtins, json, os, signal, sys
builtins.LEAK = 1
json.LEAK = 1
sys.path.insert(0, "/tmp/evil")
os.environ["LEAK"] = "1"
os.chdir("/")
signal.signal(signal.SIGTERM, signal.SIG_IGN)
keep = open("/proc/self/status")
sys.modules["evil"] = json`)
	var got struct {
		Builtins, JSON, Path, Env, Evil bool
		Cwd                             string
		Term                            bool
		Fds                             []string
	}
	h.probe(`import builtins, json, os, signal, sys
print(json.dumps({"Builtins": hasattr(builtins, "LEAK"), "JSON": hasattr(json, "LEAK"), "Path": "/tmp/evil" in sys.path,
    "Env": "LEAK" in os.environ, "Evil": "evil" in sys.modules, "Cwd": os.getcwd(),
    "Term": signal.getsignal(signal.SIGTERM) == signal.SIG_DFL, "Fds": sorted(os.listdir("/proc/self/fd"))}))`, &got)
	if got.Builtins || got.JSON || got.Path || got.Env || got.Evil || got.Cwd != policy.WorkDir || !got.Term {
		t.Errorf("the second call saw the first: %+v", got)
	}
	// stdin, stdout, stderr, the driver's two pipes, and the listing's own.
	if len(got.Fds) != 6 {
		t.Errorf("open descriptors %v, want 0-4 and the listing's", got.Fds)
	}
}

// No generator state of a template goes on in its forks: random (CPython
// reseeds it at fork), numpy's legacy global RandomState (np.random.*,
// pandas' sample with random_state=None), the multiprocessing authkey,
// tempfile's names, sympy's module-level generator (its private keys: red
// team F1) and every other generator the red team's probe finds among
// the fork's objects all differ across 10 forks of one template that
// preloaded them. Were they not reseeded, every call of a template — of
// different clients, maybe — would draw the same numbers.
func TestForkedGeneratorsAreReseeded(t *testing.T) {
	testenv.Parallel(t)
	h := newForkHarness(t, policy.DefaultLimits())
	py, err := rootfs.FindPython(context.Background(), "")
	if err != nil {
		need(t, "the host's python3: %v", err)
	}
	opts := rootfs.Options{Packages: []string{"numpy", "pandas", "sympy"}, Preload: []string{"random", "numpy", "pandas", "multiprocessing", "tempfile", "sympy"}}
	dir, err := rootfs.Ensure(context.Background(), py, opts, rootfs.DefaultCacheDir(), nil)
	if err != nil {
		need(t, "a rootfs that preloads numpy, pandas and sympy: %v", err)
	}
	h.cfg.Rootfs = dir
	seen := map[string]map[string]bool{}
	var hash string
	for i := 0; i < 10; i++ {
		var got map[string]any
		h.probe(`import sys, json, gc
preloaded = all(m in sys.modules for m in ("random", "numpy", "pandas", "multiprocessing", "tempfile", "sympy"))
import random, multiprocessing, tempfile
import numpy as np, pandas as pd
from sympy.crypto.crypto import dh_private_key
# The red team's probe (F1): every generator the fork holds, one draw
# each; the template's objects are frozen, so thaw them to see them.
gc.unfreeze()
draws = []
for o in gc.get_objects():
    if isinstance(o, random.Random) and not isinstance(o, random.SystemRandom):
        draws.append(o.random())
    elif isinstance(o, (np.random.RandomState, np.random.Generator)):
        draws.append(float(o.random()))
print(json.dumps({"preloaded": str(preloaded), "hash": str(hash("mcp-exec")),
    "random": repr(random.random()), "numpy": repr(np.random.random()),
    "sample": repr(list(pd.DataFrame({"x": range(1000)}).sample(5)["x"])),
    "authkey": multiprocessing.current_process().authkey.hex(),
    "tempfile": next(tempfile._get_candidate_names()),
    "sympy": repr(dh_private_key(digit=20)[2]),
    "generators": len(draws), "draws": draws}))`, &got)
		if got["preloaded"] != "True" {
			t.Fatalf("call %d: %v: want the modules preloaded by the template", i, got)
		}
		if hash != "" && got["hash"] != hash {
			t.Fatalf("call %d came from another template: the check compares forks of one only", i)
		}
		hash = got["hash"].(string)
		for _, k := range []string{"random", "numpy", "sample", "authkey", "tempfile", "sympy"} {
			if seen[k] == nil {
				seen[k] = map[string]bool{}
			}
			if seen[k][got[k].(string)] {
				t.Errorf("call %d: %s gave %s again: not reseeded in forks", i, k, got[k])
			}
			seen[k][got[k].(string)] = true
		}
		if n, _ := got["generators"].(float64); n < 3 {
			t.Errorf("call %d: the probe found %v generators, want sympy's, numpy's and random's at least", i, got["generators"])
		}
		draws, _ := got["draws"].([]any)
		for _, d := range draws {
			k := fmt.Sprint(d)
			if seen["draws"] == nil {
				seen["draws"] = map[string]bool{}
			}
			if seen["draws"][k] {
				t.Errorf("call %d: a generator drew %s again: shared by forks of one template", i, k)
			}
			seen["draws"][k] = true
		}
	}
}

// A template serves at most MaxCalls calls: then its forks' interpreter,
// and so its hash secret and address-space layout, is a new one.
func TestForkedTemplateReplacedAfterMaxCalls(t *testing.T) {
	forEachForking(t, func(t *testing.T, kind runtime.Kind) {
		testenv.Parallel(t)
		testForkedTemplateReplacedAfterMaxCalls(t, newForkHarnessConfigKind(t, kind, policy.DefaultLimits(), runtime.ForkConfig{Enabled: true, MaxCalls: 2}, true))
	})
}

func testForkedTemplateReplacedAfterMaxCalls(t *testing.T, h *harness) {
	var hashes []int64
	for i := 0; i < 3; i++ {
		var got forked
		h.probe(forkedProbe, &got)
		hashes = append(hashes, got.Hash)
	}
	if hashes[0] != hashes[1] || hashes[2] == hashes[1] {
		t.Errorf("hash secrets of 3 calls %v: want the first two from one template, the third from a new one", hashes)
	}
}

// Past MaxAge a template is replaced too.
func TestForkedTemplateReplacedAfterMaxAge(t *testing.T) {
	testenv.Parallel(t)
	h := newForkHarnessConfig(t, policy.DefaultLimits(), runtime.ForkConfig{Enabled: true, MaxAge: time.Second}, true)
	var first forked
	h.probe(forkedProbe, &first)
	testenv.EventuallyWithin(t, 30*time.Second, "a call from a new template", func() bool {
		var got forked
		h.probe(forkedProbe, &got)
		return got.Hash != first.Hash
	})
}

// zygotes lists the pids of the template interpreters of h's runtime.
func (h *harness) zygotes() []int {
	inst := runtime.InstanceID(h.rt)
	var pids []int
	ents, _ := os.ReadDir("/proc")
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		cmd, _ := os.ReadFile(filepath.Join("/proc", e.Name(), "cmdline"))
		cg, _ := os.ReadFile(filepath.Join("/proc", e.Name(), "cgroup"))
		if strings.Contains(string(cmd), "--mcp-exec-template") && strings.Contains(string(cg), inst) {
			pids = append(pids, pid)
		}
	}
	return pids
}

// A template whose interpreter died is replaced: the next call is a fork
// of a new one, not a failure and not a fresh container.
func TestForkedDeadTemplateReplaced(t *testing.T) {
	testenv.Parallel(t)
	h := newForkHarness(t, policy.DefaultLimits())
	var first forked
	h.probe(forkedProbe, &first)
	z := h.zygotes()
	if len(z) != 1 {
		t.Fatalf("template interpreters %v, want one", z)
	}
	syscall.Kill(z[0], syscall.SIGKILL)
	var got forked
	h.probe(forkedProbe, &got)
	if got.Hash == first.Hash || got.PID != 2 {
		t.Errorf("after its template died a call ran as %+v; want a fork of a new template", got)
	}
	testenv.Eventually(t, "the dead template's processes to be gone", func() bool {
		return !slices.Contains(h.zygotes(), z[0])
	})
}

// A template that does not answer (its interpreter stopped) is given up
// and closed: the call is a fork of a new one.
func TestForkedStuckTemplateGivenUp(t *testing.T) {
	h := newForkHarness(t, policy.DefaultLimits())
	var first forked
	h.probe(forkedProbe, &first)
	z := h.zygotes()
	if len(z) != 1 {
		t.Fatalf("template interpreters %v, want one", z)
	}
	syscall.Kill(z[0], syscall.SIGSTOP)
	defer syscall.Kill(z[0], syscall.SIGCONT)
	runtime.WithForkTimeout(2*time.Second, func() {
		var got forked
		h.probe(forkedProbe, &got)
		if got.PID != 2 || got.Hash == first.Hash {
			t.Errorf("with its template stuck a call ran as %+v; want a fork of another template", got)
		}
	})
	testenv.Eventually(t, "the stuck template to be closed", func() bool {
		return !slices.Contains(h.zygotes(), z[0])
	})
}

// Templates that fail twice for one call make it a fresh container: a
// call is never refused for forking's sake. Three such calls in a row stop
// forking for the runtime's life.
func TestForkedFailuresFallBackToAContainer(t *testing.T) {
	forEachForking(t, func(t *testing.T, kind runtime.Kind) {
		testForkedFailuresFallBack(t, newForkHarnessConfigKind(t, kind, policy.DefaultLimits(), runtime.ForkConfig{Enabled: true}, false))
	})
}

func testForkedFailuresFallBack(t *testing.T, h *harness) {
	runtime.WithForksAsUID(h.rt, 0, func() {
		for i := 0; i < 3; i++ {
			var got forked
			h.probe(forkedProbe, &got)
			if got.PPID != 1 {
				t.Errorf("call %d: with every fork failing it ran as %+v; want a fresh container's (the init its parent)", i, got)
			}
			if st := h.forking(); st.LastError == "" || (st.Disabled != "") != (i == 2) {
				t.Errorf("after call %d: forking %+v; want the failure noted, forking off after the third", i, st)
			}
		}
	})
	var got forked
	h.probe(forkedProbe, &got)
	if got.PPID != 1 {
		t.Errorf("with forking off a call ran as %+v; want a fresh container's", got)
	}
}

// The call's init checks the code's process from outside before any code
// reaches it: a fork that did not take the code's uid (a template gone
// wrong) is refused, the call gets a fresh container, and the template is
// replaced. Without the check the code would run as the slot's root.
func TestForkedUnconfinedIsRefused(t *testing.T) {
	forEachForking(t, func(t *testing.T, kind runtime.Kind) {
		testForkedUnconfinedIsRefused(t, newForkHarnessConfigKind(t, kind, policy.DefaultLimits(), runtime.ForkConfig{Enabled: true}, false))
	})
}

func testForkedUnconfinedIsRefused(t *testing.T, h *harness) {
	runtime.WithForksAsUID(h.rt, 0, func() {
		var got struct{ UID, PPID int }
		h.probe(`import json, os; print(json.dumps({"UID": os.getuid(), "PPID": os.getppid()}))`, &got)
		if got.UID != policy.UID || got.PPID != 1 {
			t.Errorf("a call whose fork kept uid 0 ran as %+v; want uid %d in a fresh container", got, policy.UID)
		}
	})
	if st := h.forking(); !strings.Contains(st.LastError, "not confined: its uids are not the code's") {
		t.Errorf("forking: %+v; want the check's refusal", st)
	}
}

// Calls at once run on templates of their own, each in its call slot:
// concurrency makes templates, and they serve later calls.
func TestForkedConcurrentCallsUseTemplatesOfTheirOwn(t *testing.T) {
	forEachForking(t, func(t *testing.T, kind runtime.Kind) {
		testenv.Parallel(t)
		testForkedConcurrentCalls(t, newForkHarnessKind(t, kind, policy.DefaultLimits()))
	})
}

func testForkedConcurrentCalls(t *testing.T, h *harness) {
	var wg sync.WaitGroup
	hashes := make([]int64, 3)
	for i := range hashes {
		b, err := bundle.New(runtime.BundleDir(h.rt), h.cfg, uuid.NewString())
		if err != nil {
			t.Fatal(err)
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			res, err := runtime.RunBundle(context.Background(), h.rt, b, runtime.Request{Code: []byte(`import json, time; time.sleep(1); print(json.dumps(hash("mcp-exec")))`),
				Timeout: 30 * time.Second, MaxOutputBytes: 1 << 20})
			if err != nil || json.Unmarshal(res.Stdout, &hashes[i]) != nil {
				t.Errorf("call %d: %v, stdout %q, stderr %q", i, err, res.Stdout, res.Stderr)
			}
		}()
	}
	wg.Wait()
	if hashes[0] == hashes[1] || hashes[1] == hashes[2] || hashes[0] == hashes[2] {
		t.Errorf("3 calls at once: hash secrets %v, want 3 templates", hashes)
	}
	if st := h.forking(); st.Idle != 3 {
		t.Errorf("templates idle after: %d, want 3", st.Idle)
	}
}

// instanceProcs lists the pids of every process in h's instance's cgroups:
// its templates', its calls'.
func (h *harness) instanceProcs() []int {
	inst := runtime.InstanceID(h.rt)
	var pids []int
	ents, _ := os.ReadDir("/proc")
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		if cg, _ := os.ReadFile(filepath.Join("/proc", e.Name(), "cgroup")); strings.Contains(string(cg), inst) {
			pids = append(pids, pid)
		}
	}
	return pids
}

// allowCloneParent opens the hole in the filter that the attack below
// goes through: clone with CLONE_PARENT, which the policy refuses.
func allowCloneParent(s *specs.LinuxSeccomp) {
	for i, r := range s.Syscalls {
		if slices.Equal(r.Names, []string{"clone"}) && len(r.Args) == 1 {
			s.Syscalls[i].Args[0].Value &^= syscall.CLONE_PARENT
		}
	}
}

// cloneParentAttack makes a child whose parent is the code's parent — in a
// forked sandbox the template's interpreter, outside the call's pid
// namespace — and returns at once, leaving it to whoever reaps it.
const cloneParentAttack = `import ctypes, os, signal
libc = ctypes.CDLL(None, use_errno=True)
pid = libc.syscall(56, 0x8000 | signal.SIGCHLD, 0, 0, 0, 0)
if pid == 0:
    os._exit(0)
print(pid, ctypes.get_errno())`

// A child the code made its template interpreter's (CLONE_PARENT, were
// the filter to let it through) is reaped by the template like the
// code's own process: the call ends, and the template serves the next,
// with no process, template or call slot left behind. The filter is
// opened for this test (TestSeccompDeniesDangerousSyscalls keeps it
// shut); without the zygote reaping every child, each call's pid
// namespace stays up and the template either wedges for good or, with
// the bound on its report, is killed and replaced after every call.
func TestForkedCloneParentChildIsReaped(t *testing.T) {
	h := newForkHarness(t, policy.DefaultLimits())
	runtime.WithForkSeccomp(h.rt, allowCloneParent, func() {
		h.mustRun("print(1)")
		z := h.zygotes()
		before := len(h.instanceProcs())
		if len(z) != 1 {
			t.Fatalf("template interpreters %v, want one", z)
		}
		for i := 0; i < 20; i++ {
			res := h.mustRun(cloneParentAttack)
			f := strings.Fields(string(res.Stdout))
			if len(f) != 2 || f[0] == "-1" {
				t.Fatalf("call %d: stdout %q stderr %q: the clone was refused, so this test attacks nothing", i, res.Stdout, res.Stderr)
			}
		}
		testenv.Eventually(t, "the instance's processes back to what they were", func() bool {
			return len(h.instanceProcs()) <= before
		})
		if got := h.zygotes(); !slices.Equal(got, z) {
			t.Errorf("template interpreters after 20 calls %v, want the one that served them all, %v", got, z)
		}
		if st := h.forking(); st.Forks != 21 || st.Idle != 1 || st.Busy != 0 || st.LastError != "" {
			t.Errorf("forking after 21 calls: %+v; want 21 forks of one template, idle", st)
		}
	})
}

// A template that does not report a call reaped (its interpreter stopped
// mid-call, so the code's process is never waited for) is killed within
// the bound once the call ends, and replaced: it does not keep its call
// slot and processes for ever, and the next call is a fork of a new one.
func TestForkedUnreportedReapReplacesTemplate(t *testing.T) {
	h := newForkHarness(t, policy.DefaultLimits())
	var first forked
	h.probe(forkedProbe, &first)
	z := h.zygotes()
	if len(z) != 1 {
		t.Fatalf("template interpreters %v, want one", z)
	}
	defer syscall.Kill(z[0], syscall.SIGCONT)
	runtime.WithReapTimeout(time.Second, func() {
		done := make(chan runtime.Result, 1)
		go func() {
			res, _ := h.run(`import time; time.sleep(1)`, func(o *runOpts) { o.timeout = 3 * time.Second })
			done <- res
		}()
		testenv.Eventually(t, "the call's code to run", func() bool { return len(h.instanceProcs()) > 3 })
		syscall.Kill(z[0], syscall.SIGSTOP)
		<-done
		testenv.EventuallyWithin(t, 30*time.Second, "the template that did not report to be gone", func() bool {
			return !slices.Contains(h.zygotes(), z[0])
		})
	})
	var got forked
	h.probe(forkedProbe, &got)
	if got.PID != 2 || got.Hash == first.Hash {
		t.Errorf("after its template was given up a call ran as %+v; want a fork of a new template", got)
	}
}

// What a call leaves anywhere a process of its own could reach — files in
// /tmp and /dev/shm, a SysV shared memory segment, an abstract unix
// socket, a listening port on lo, a process that left its session — is
// gone for the next call forked from the same template (under runsc, in
// the same gVisor kernel): each call has namespaces of its own, and the
// end of its pid namespace ends its processes.
func TestForkedCallsLeaveNothing(t *testing.T) {
	forEachForking(t, func(t *testing.T, kind runtime.Kind) {
		testenv.Parallel(t)
		h := newForkHarnessKind(t, kind, policy.DefaultLimits())
		var first forked
		h.probe(forkedProbe, &first)
		nsProbe := `import json, os
print(json.dumps({n: os.readlink("/proc/self/ns/" + n) for n in ("mnt", "net", "ipc", "uts", "pid")}))`
		var nsA, nsB map[string]string
		h.probe(nsProbe, &nsA)
		h.mustRun(`import ctypes, os, socket, time
open("/tmp/left", "w").write("secret")
open("/dev/shm/left", "w").write("secret")
libc = ctypes.CDLL(None, use_errno=True)
shm = libc.shmget(0x6d6370, 4096, 0o1666)
assert shm >= 0, ctypes.get_errno()
u = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
u.bind("\0mcp-exec-left")
u.listen()
l = socket.socket()
l.bind(("127.0.0.1", 4444))
l.listen()
if os.fork() == 0:
    os.setsid()
    if os.fork() == 0:
        time.sleep(600)
    os._exit(0)
print("left")`)
		var got struct {
			Tmp, Shm         bool
			SysV, Unix, Port int
			Procs            []int
			Hash             int64
		}
		h.probe(`import ctypes, json, os, socket
libc = ctypes.CDLL(None, use_errno=True)
def errno_of(f):
    try:
        f()
        return 0
    except OSError as e:
        return e.errno
u = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
print(json.dumps({"Tmp": os.path.exists("/tmp/left"), "Shm": os.path.exists("/dev/shm/left"),
    "SysV": libc.shmget(0x6d6370, 4096, 0o666),
    "Unix": errno_of(lambda: u.connect("\0mcp-exec-left")),
    "Port": errno_of(lambda: socket.create_connection(("127.0.0.1", 4444), timeout=2)),
    "Procs": sorted(int(p) for p in os.listdir("/proc") if p.isdigit()), "Hash": hash("mcp-exec")}))`, &got)
		h.probe(nsProbe, &nsB)
		if got.Hash != first.Hash {
			t.Fatalf("the calls came from two templates: this test compares forks of one")
		}
		if kind == runtime.Libcontainer {
			// The host sees the template: no call is in one of its
			// namespaces. (Two calls' own may well have the same number:
			// the kernel gives a freed namespace's to the next one made.)
			tmpl := templateNamespaces(runtime.InstanceID(h.rt))
			if len(tmpl) == 0 {
				t.Fatalf("no process of the instance's templates found on the host: the test proves nothing")
			}
			for _, ns := range []map[string]string{nsA, nsB} {
				for n, id := range ns {
					if tmpl[id] {
						t.Errorf("a call is in its template's %s namespace (%s)", n, id)
					}
				}
			}
		} else {
			// Inside gVisor, whose namespaces the host does not see, two
			// calls' must differ.
			for n, a := range nsA {
				if nsB[n] == a {
					t.Errorf("two calls of one template share their %s namespace (%s)", n, a)
				}
			}
		}
		if got.Tmp || got.Shm || got.SysV >= 0 || got.Unix == 0 || got.Port == 0 || len(got.Procs) != 2 {
			t.Errorf("the next call of the template found what the last left: %+v; want no file, no segment (-1), both connections refused, only pids 1 and 2", got)
		}
	})
}

// templateNamespaces are the namespaces ("net:[4026531840]") of the
// processes of instance inst's templates, as the host sees them.
func templateNamespaces(inst string) map[string]bool {
	set := map[string]bool{}
	entries, _ := os.ReadDir("/proc")
	for _, e := range entries {
		cg, err := os.ReadFile(filepath.Join("/proc", e.Name(), "cgroup"))
		if err != nil || !bytes.Contains(cg, []byte(inst+".templates")) {
			continue
		}
		for _, n := range []string{"mnt", "net", "ipc", "uts", "pid"} {
			if id, err := os.Readlink(filepath.Join("/proc", e.Name(), "ns", n)); err == nil {
				set[id] = true
			}
		}
	}
	return set
}
