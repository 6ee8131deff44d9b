package runtime

import (
	"context"
	"debug/elf"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/google/uuid"
	specs "github.com/opencontainers/runtime-spec/specs-go"

	"github.com/inhuman/mcp-exec/bundle"
	"github.com/inhuman/mcp-exec/host"
	"github.com/inhuman/mcp-exec/policy"
	"github.com/inhuman/mcp-exec/runtime/initproto"
)

// The process runtime runs each call as a fresh process of the server's
// own machine: the sandbox's init, started directly, with the host's
// interpreter. There is no container: no cgroups, no root filesystem of
// its own. What an unprivileged process can still do for each call, it
// does (see ProcessIsolation):
//
//   - where the kernel lets an unprivileged process make them (Debian,
//     Ubuntu and Fedora hosts do; docker's default seccomp profile and
//     podman's masked /proc do not), the call is in new user, pid, mount,
//     network, IPC and UTS namespaces, bubblewrap's recipe: the init is their pid 1
//     and sees to it that its /proc shows only the call's processes, /sys
//     and the network only lo, its root is its own, holding only the
//     system's files the interpreter needs, read-only (no socket, home or
//     /tmp of the host's), and its /tmp is a tmpfs of the /tmp size
//     (process_namespaces.go); under a server that is not root, its user
//     namespace maps its uid to itself alone;
//   - the code runs in a Landlock domain of its own: it reads the
//     interpreter, its libraries and the system's files, writes only its
//     own dir (its /tmp), executes only the interpreter, makes no TCP
//     connection, and signals, traces or reads the /proc files of no
//     process outside the domain — not the server, not another call;
//   - it runs under the product's seccomp filter, with IP sockets, SysV IPC
//     and message queues refused too: their namespaces are the machine's;
//     without a root of its own, unix sockets too: Landlock does not
//     mediate connect(2) to a pathname socket;
//   - the init is its subreaper, and the server theirs: every orphan of
//     the call is killed when it ends, even one whose init died;
//   - its dir is bounded in total (the /tmp size), by the tmpfs or,
//     without namespaces, by a measure of the tree and of the files the
//     call's processes hold without a name; it is removed after the call;
//   - without a pid namespace, of /proc the code sees only its own main
//     process and what is the machine's, not another process's;
//   - under root, each concurrent call has a uid of its own, claimed
//     host-wide like libcontainer's call slots;
//   - the environment allowlist and rlimits on memory, processes, file
//     size, CPU time and open files.
//
// It is for a server that itself runs in a locked-down container — the
// mcp-exec 0.5.4 deployment: docker run --read-only --cap-drop ALL --user
// 65532 --network none … — where no per-call container can be made and
// the outer container is the boundary for the rest. It is never chosen
// silently: by name (MCP_EXEC_RUNTIME=process) or by auto, which says so,
// with what this host lacks of the list above, in the tool's description,
// the runtime field of every result, the log and doctor.

// ProcessRuntime runs each call as a fresh, confined process.
type ProcessRuntime struct {
	cfg  Config
	dir  string // the instance's dir: one subdir per call
	live liveSet

	iso     ProcessIsolation
	seccomp []byte // the code's filter; nil when the host refuses one
	// seccompNet is the code's filter with the network allowlist on
	// (process_network.go).
	seccompNet []byte
	read       []string   // what every call's domain may read, besides its own
	uids       *uidPool   // under root: a uid per call
	reaper     *subreaper // nil when the host refuses the subreaper

	interp sync.Map // interpreter path → its rules (interpreterRules)
}

// ProcessIsolation is what the process runtime gives each call on this
// host, as the tool's description and doctor report it.
type ProcessIsolation struct {
	// Namespaces: each call is in new pid, mount, network, IPC and UTS
	// namespaces (and a user namespace, under a server that is not root),
	// its /tmp a tmpfs of the /tmp size.
	Namespaces bool `json:"namespaces"`
	// Landlock is the ABI of the code's Landlock domain; 0 when the host
	// gives none.
	Landlock int `json:"landlock_abi"`
	// Seccomp: the code runs under the seccomp filter.
	Seccomp bool `json:"seccomp"`
	// Subreaper: the server is the subreaper of its calls' processes.
	Subreaper bool `json:"subreaper"`
	// UIDPerCall: each concurrent call has a host uid of its own (root).
	UIDPerCall bool `json:"uid_per_call"`
	// ContainerPids is the process limit of the cgroup the server runs in
	// (a container's --pids-limit), which bounds the server and all calls
	// together; 0 when there is none. A call takes no more than it leaves,
	// less a reserve for the server.
	ContainerPids int64 `json:"container_pids,omitempty"`
	// Missing says what of the process runtime's isolation this host
	// lacks, each with what it costs and how to get it.
	Missing []host.Missing `json:"missing,omitempty"`
}

// Summary is one sentence of what each call gets.
func (i ProcessIsolation) Summary() string {
	var parts []string
	if i.Namespaces {
		// A root server makes them without a user namespace (namespacesAttr).
		kinds := "pid, mount, network, IPC and UTS"
		if !i.UIDPerCall {
			kinds = "user, " + kinds
		}
		parts = append(parts, kinds+" namespaces of its own (it sees only its own processes, "+
			"no network interface but lo, and a root of its own holding only the interpreter and the system's files, read-only: "+
			"no socket, home or /tmp of the machine's; its /tmp is a tmpfs of the /tmp size, removed after it)")
	}
	if i.Landlock > 0 {
		s := "a Landlock domain of its own (it reads the interpreter and system files, writes only its own working directory, its /tmp, and runs only the interpreter"
		if !i.Namespaces {
			s += "; of /proc it sees only its own main process, not its network, and the machine-wide files"
		}
		if i.Landlock >= 6 {
			s += "; it can signal or trace no process outside itself"
		}
		parts = append(parts, s+")")
	}
	if i.Seccomp {
		s := "the seccomp filter of the container runtimes, plus no IP sockets or System V IPC"
		if !i.Namespaces {
			s = "the seccomp filter of the container runtimes, plus no IP or unix sockets (socket pairs work) or System V IPC"
		}
		parts = append(parts, s)
	}
	if i.UIDPerCall {
		parts = append(parts, "a uid of its own")
	}
	if !i.Namespaces {
		parts = append(parts, "its files, those it holds without a name included, bounded at the /tmp size and removed after it")
	}
	parts = append(parts, "limits on memory, processes, file size and CPU time")
	if i.Subreaper || i.Namespaces {
		parts = append(parts, "every process of it killed when it ends")
	}
	rest := "no container of its own (no namespaces or cgroups): the container the server runs in is the boundary for the rest"
	if i.Namespaces {
		rest = "no container of its own (no cgroups of its own): the container the server runs in bounds the memory and processes of all calls together"
	}
	return "each call is a fresh process with " + strings.Join(parts, "; ") + "; " + rest
}

// NewProcess creates the process runtime, keeping its per-call dirs under
// cfg.WorkDir (the system's temp dir when empty), which it creates 0711.
// It probes what this host lets it apply and refuses only what it cannot
// run at all: a root server that may not change uids.
func NewProcess(cfg Config) (_ *ProcessRuntime, retErr error) {
	cfg.setDefaults()
	if err := initproto.Linked(); err != nil {
		return nil, err
	}
	if cfg.ProcessNamespaces == "" {
		cfg.ProcessNamespaces = NamespacesAuto
	}
	r := &ProcessRuntime{cfg: cfg}
	base := cfg.WorkDir
	if base == "" {
		base = os.TempDir()
	}
	dir, err := os.MkdirTemp(base, "mcp-exec-")
	if err != nil {
		return nil, fmt.Errorf("%w: creating the process runtime's dir under %s: %w", ErrUnsupported, base, err)
	}
	defer func() {
		if retErr != nil {
			os.RemoveAll(dir)
		}
	}()
	// Others need nothing here but to reach their own call's dir.
	if err := os.Chmod(dir, 0o711); err != nil {
		return nil, err
	}
	r.dir = dir
	for _, p := range policy.ProcessReadable() {
		if strings.HasSuffix(p, "*") {
			matches, _ := filepath.Glob(p)
			r.read = append(r.read, matches...)
		} else {
			r.read = append(r.read, p)
		}
	}
	if err := r.probe(); err != nil {
		return nil, err
	}
	if r.iso.Subreaper {
		r.reaper = startSubreaper(r.uids)
	}
	if r.uids == nil {
		raiseOwnProcessLimit()
	}
	for _, m := range r.iso.Missing {
		cfg.Logger.Warn("the process runtime cannot apply this here", "missing", m.What, "why", m.Why, "fix", m.Fix)
	}
	return r, nil
}

// probe finds out what this host lets the runtime apply: it runs the
// confinement steps in a throwaway child (initproto.ProbeMarker) and compiles the
// filter.
func (r *ProcessRuntime) probe() error {
	h := host.Probe()
	if h.EUID == 0 {
		if !slices.Contains(h.Capabilities, "CAP_SETUID") || !slices.Contains(h.Capabilities, "CAP_SETGID") {
			return fmt.Errorf("%w: the process runtime runs as root without CAP_SETUID and CAP_SETGID, so it cannot give each call "+
				"a uid of its own, and the code would be the container's root: run the server as a non-root user "+
				"(docker run --user 65532:65532; Kubernetes runAsUser: 65532), or grant it those two capabilities "+
				"(docker --cap-add SETUID --cap-add SETGID)", ErrUnsupported)
		}
		r.uids = &uidPool{claims: slotClaims{dir: r.cfg.SlotDir, base: r.cfg.UIDBase}}
	}
	out, err := exec.Command("/proc/self/exe", initproto.ProbeMarker).Output()
	if err != nil {
		return fmt.Errorf("%w: probing what the process runtime can apply: %w", ErrSandbox, err)
	}
	r.iso = readProbe(out, h.EUID, r.uids != nil)
	r.iso.ContainerPids = OuterPidsMax()
	var refused error
	if r.cfg.ProcessNamespaces != NamespacesOff {
		refused = r.probeNamespaces()
	}
	if refused != nil && r.cfg.ProcessNamespaces == NamespacesOn {
		return fmt.Errorf("%w: {ProcessNamespaces} is true, but this host refuses the process runtime namespaces of its own: %w", ErrUnsupported, refused)
	}
	r.iso.Namespaces = r.cfg.ProcessNamespaces != NamespacesOff && refused == nil
	if !r.iso.Namespaces {
		r.iso.Missing = append(r.iso.Missing, namespacesMissing(refused, r.uids != nil))
	}
	// Unix sockets only in a root of the call's own: without one they
	// reach every pathname socket the server's user may connect to.
	if r.iso.Seccomp {
		if r.seccomp, err = compileSeccomp(policy.ProcessSeccomp(r.iso.Namespaces)); err != nil {
			r.iso.Seccomp = false
			r.iso.Missing = append(r.iso.Missing, host.Missing{What: "seccomp", Why: "the code may make every syscall the outer container allows", Fix: err.Error()})
		}
		if r.iso.Namespaces {
			r.seccompNet, _ = compileNetworkSeccomp() // NetworkUsable refuses without it
		}
	}
	return nil
}

// readProbe turns the probe's line (probe_confinement in init_helpers.c)
// into what each call gets and what this host lacks of it.
func readProbe(out []byte, euid int, uidPerCall bool) ProcessIsolation {
	got := map[string]int{}
	for _, kv := range strings.Fields(string(out)) {
		if k, v, ok := strings.Cut(kv, "="); ok {
			got[k], _ = strconv.Atoi(v)
		}
	}
	errno := func(k string) error {
		if n, ok := got[k]; !ok || n != 0 {
			return syscall.Errno(n)
		}
		return nil
	}
	iso := ProcessIsolation{UIDPerCall: uidPerCall}
	const noLandlock = "the code could read the server's files and other calls', and write wherever the server may"
	switch abi := got["landlock"]; {
	case abi == 0:
		iso.Missing = append(iso.Missing, host.Missing{What: "Landlock", Why: noLandlock,
			Fix: "Linux 5.13 or later with Landlock enabled (lsm=landlock), and a container engine whose seccomp profile allows the landlock_* syscalls"})
	case errno("restrict") != nil:
		iso.Missing = append(iso.Missing, host.Missing{What: "a Landlock domain", Why: noLandlock,
			Fix: fmt.Sprintf("the kernel has Landlock ABI %d, but entering a domain failed (%v): allow landlock_restrict_self in the container's seccomp profile", abi, errno("restrict"))})
	default:
		iso.Landlock = abi
		if abi < 6 {
			iso.Missing = append(iso.Missing, host.Missing{What: "Landlock scoping (ABI 6)",
				Why: "the code may signal, and reach the abstract unix sockets of, the server and other calls of its uid",
				Fix: fmt.Sprintf("Linux 6.12 or later (this kernel has Landlock ABI %d)", abi)})
		}
	}
	if err := errno("seccomp"); err != nil {
		iso.Missing = append(iso.Missing, host.Missing{What: "seccomp", Why: "the code may make every syscall the outer container allows, IP sockets and System V IPC among them, " +
			"and without namespaces unix sockets to every path the server's user may connect to (his session bus, ssh-agent, a docker socket of his groups)",
			Fix: fmt.Sprintf("installing a filter failed (%v): allow seccomp(2) in the container's profile", err)})
	} else {
		iso.Seccomp = true
	}
	if err := errno("subreaper"); err != nil {
		iso.Missing = append(iso.Missing, host.Missing{What: "the child subreaper", Why: "a process of a call whose init died would outlive the call",
			Fix: fmt.Sprintf("prctl(PR_SET_CHILD_SUBREAPER) failed: %v", err)})
	} else {
		iso.Subreaper = true
	}
	if !uidPerCall {
		iso.Missing = append(iso.Missing, host.Missing{What: "a uid per call",
			Why: fmt.Sprintf("every call runs as the server's uid %d and shares the kernel's per-user limits with the others (processes, inotify instances, message queue bytes)", euid),
			Fix: "run the server as root with CAP_SETUID and CAP_SETGID (docker --user 0:0 --cap-add SETUID --cap-add SETGID)"})
	}
	return iso
}

func (r *ProcessRuntime) Kind() Kind { return Process }

// Dir is the runtime's own dir, where its calls' bundles are: removed
// when it closes.
func (r *ProcessRuntime) Dir() string { return r.dir }

// processInitDir: the process runtime's init is this executable itself.
const processInitDir = "/proc/self"

// Isolation is what each call gets on this host.
func (r *ProcessRuntime) Isolation() ProcessIsolation { return r.iso }

// Close kills what still runs and removes the runtime's dir.
func (r *ProcessRuntime) Close() error {
	err := r.live.closeAll()
	if r.reaper != nil {
		r.reaper.stop()
	}
	if r.uids != nil {
		r.uids.close()
	}
	makeWritable(r.dir)
	return errors.Join(err, os.RemoveAll(r.dir))
}

// Prepare starts the init for b's process in a fresh working dir, and
// returns once the interpreter waits for its code.
func (r *ProcessRuntime) Prepare(ctx context.Context, cfg bundle.Config) (Sandbox, error) {
	if cfg.Network != nil {
		if err := r.NetworkUsable(); err != nil {
			return nil, err
		}
	}
	b, err := newBundle(r.dir, processInitDir, cfg, uuid.NewString())
	if err != nil {
		return nil, err
	}
	return r.prepareBundle(ctx, b)
}

// prepareBundle prepares the sandbox of b, which it owns from then on.
func (r *ProcessRuntime) prepareBundle(ctx context.Context, b *bundle.Bundle) (Sandbox, error) {
	return prepare(ctx, &r.live, b, &procContainer{rt: r, b: b})
}

// procContainer is one call's init, a process of the server's machine.
type procContainer struct {
	rt   *ProcessRuntime
	b    *bundle.Bundle
	cfg  *initproto.Config
	work string
	code string
	uid  *claim // root: the call's own uid

	mu  sync.Mutex
	cmd *exec.Cmd
	// watch: the session is frozen (freeze.go).
	watch *stopWatch
	// ranFrozen says what of the frozen session ran, which ended it.
	ranFrozen string
	// claimed: the call's own process limit is set (a uid shared with
	// the server's: claimProcessLimit).
	claimed bool
}

// create makes the code's working dir (its /tmp) and the dir of its script
// (its /code), each its own and empty, and, under root, takes the call's
// uid, which owns the working dir.
func (pc *procContainer) create(context.Context) error {
	b := pc.b
	if err := pc.rt.dataUnavailable(b.Config); err != nil {
		return err
	}
	work, code := filepath.Join(b.Dir, "work"), filepath.Join(b.Dir, "code")
	for _, d := range []string{work, code} {
		if err := os.Mkdir(d, 0o700); err != nil {
			return fmt.Errorf("%w: %w", ErrSandbox, err)
		}
	}
	if b.Config.Network != nil {
		if err := makeSiteDir(b); err != nil {
			return err
		}
	}
	if err := os.Chmod(b.Dir, 0o711); err != nil {
		return fmt.Errorf("%w: %w", ErrSandbox, err)
	}
	// An unprivileged server's calls run as its own ids; under root each
	// has a uid of its own, which owns its work dir.
	uid, gid := os.Geteuid(), os.Getegid()
	if pc.rt.uids != nil {
		var err error
		if pc.uid, err = pc.rt.uids.get(); err != nil {
			return err
		}
		_, uid = pc.rt.uids.claims.ids(pc.uid.index)
		gid = uid
		pc.rt.reaper.addUID(uid)
		if err := os.Chown(work, uid, gid); err != nil {
			return fmt.Errorf("%w: %w", ErrSandbox, err)
		}
		if err := os.Chmod(code, 0o755); err != nil {
			return fmt.Errorf("%w: %w", ErrSandbox, err)
		}
	}
	cfg, err := pc.rt.initConfig(b, work, code, uid, gid)
	if err != nil {
		return fmt.Errorf("%w: %w", ErrSandbox, err)
	}
	pc.cfg, pc.work, pc.code = cfg, work, code
	return nil
}

func (pc *procContainer) initConfig() (*initproto.Config, error)        { return pc.cfg, nil }
func (pc *procContainer) stdio() (child, parent [3]*os.File, err error) { return pipes() }

// start starts the init, in a process group of its own so that the whole
// of it is killed at once, as one of the subreaper's own children; where
// the host lets it, in namespaces of its own, as their pid 1.
func (pc *procContainer) start(child [3]*os.File) error {
	cmd := exec.Command("/proc/self/exe", initproto.InitMarker)
	cmd.Args[0] = "mcp-exec-init"
	cmd.Env = networkEnv(processEnv(pc.b.Spec.Process.Env, pc.work), pc.b, pc.code)
	cmd.Dir = pc.work
	cmd.Stdin, cmd.Stdout, cmd.Stderr = child[0], child[1], child[2]
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	if pc.rt.iso.Namespaces {
		cmd.SysProcAttr = namespacesAttr(pc.uid != nil)
	}
	if err := pc.rt.reaper.start(cmd); err != nil {
		return err
	}
	pc.mu.Lock()
	pc.cmd = cmd
	pc.mu.Unlock()
	return nil
}

func (pc *procContainer) wait() {
	pc.cmd.Wait()
	pc.rt.reaper.exited(pc.cmd.Process.Pid)
}

func (pc *procContainer) started() error { return nil }

// kill SIGKILLs the init's process group; the init, the code's subreaper,
// kills the code's when it sees the host go, and the server is the
// subreaper of what is left should the init be gone. In namespaces of its
// own the init is pid 1 of the call's: everything of the call dies with
// it.
func (pc *procContainer) kill() {
	pc.mu.Lock()
	cmd := pc.cmd
	pc.mu.Unlock()
	if cmd != nil && cmd.Process != nil {
		syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
	}
}

// verdict: without a cgroup there is no OOM counter or accounting here;
// the init measures the call's processes and says when the code reached
// its process limit, or ended of a MemoryError (its memory limit is an
// rlimit), with its verdict (supervise.go). Its CPU time is measured over
// its process tree (process_cpu.go).
func (pc *procContainer) verdict(*Result)               {}
func (pc *procContainer) sockets() (int64, int64, bool) { return 0, 0, false }

// foreground: no cgroup, no weight; a prepared process waits idle. Where
// the call's process limit counts the server's uid, it is set now, as the
// call is claimed: the share above what the uid runs now.
func (pc *procContainer) foreground() error {
	pc.mu.Lock()
	defer pc.mu.Unlock()
	if pc.claimed || pc.cfg == nil || pc.cfg.Process == nil || pc.cfg.Process.PidsShare == 0 || pc.cmd == nil {
		return nil
	}
	pc.claimed = true
	return claimProcessLimit(pc.cmd.Process.Pid, os.Geteuid(), pc.cfg.Process.PidsShare)
}
func (pc *procContainer) deadline(time.Time)      {}
func (pc *procContainer) waitsForExit() bool      { return false }
func (pc *procContainer) explain(err error) error { return err }

// destroy kills, under root, whatever of the call's uid is left, wherever
// it went: only then may another call have the uid.
func (pc *procContainer) destroy() error {
	pc.unwatch()
	if pc.uid == nil {
		return nil
	}
	_, id := pc.rt.uids.claims.ids(pc.uid.index)
	err := pc.rt.reaper.killUID(id)
	pc.rt.reaper.removeUID(id)
	pc.rt.uids.put(pc.uid, err == nil)
	return err
}

// initConfig is the bundle's init configuration in the process runtime's
// terms: the work dir and the script in the call's own dirs (the script
// named relative to the work dir, so that no other process sees where the
// call's dir is on its command line), the limits a cgroup would have
// enforced as rlimits (memory as data, processes, file size; processes are
// counted per uid by the kernel: process_limits.go), the code's
// confinement, and, where the host lets it, the call's namespaces. The code runs as uid and gid: an
// unprivileged server's own, or, under root, the call's.
func (r *ProcessRuntime) initConfig(b *bundle.Bundle, work, code string, uid, gid int) (*initproto.Config, error) {
	in := b.Init
	in.WorkDir = work
	in.Script = filepath.Join(code, "main.py")
	in.Argv = append(slices.Clone(in.Argv[:len(in.Argv)-1]), filepath.Join("..", filepath.Base(code), "main.py"))
	in.Rlimits = slices.Clone(in.Rlimits)
	in.UID, in.GID = uint32(uid), uint32(gid)
	lim := func(typ string, v int64) {
		in.Rlimits = append(in.Rlimits, specs.POSIXRlimit{Type: typ, Soft: uint64(v), Hard: uint64(v)})
	}
	res := b.Spec.Linux.Resources
	if res != nil && res.Memory != nil && res.Memory.Limit != nil {
		lim("RLIMIT_DATA", *res.Memory.Limit)
	}
	sharedUID := r.uids == nil && !r.iso.Namespaces
	var pidsShare int64
	if res != nil && res.Pids != nil && res.Pids.Limit != nil {
		limit, share := processLimit(*res.Pids.Limit, sharedUID)
		lim("RLIMIT_NPROC", limit)
		if sharedUID {
			pidsShare = share
		}
	}
	scratch := tmpfsSize(b.Spec)
	if scratch > 0 {
		lim("RLIMIT_FSIZE", scratch)
	}
	exe, read, err := r.interpreterRules(in.Argv[0])
	if err != nil {
		return nil, err
	}
	p := &initproto.Process{
		Read:         append(append(slices.Clone(r.read), read...), code),
		Exec:         slices.Concat(exe, r.cfg.Executables),
		Devices:      policy.ProcessDevices(),
		Write:        []string{work},
		ScratchBytes: scratch,
		PidsShare:    pidsShare,
	}
	if r.iso.Landlock > 0 {
		p.Landlock = r.iso.Landlock
	}
	for _, kv := range b.Spec.Process.Env {
		if v, ok := strings.CutPrefix(kv, "PYTHONPATH="); ok {
			p.Read = append(p.Read, filepath.SplitList(v)...)
		}
	}
	if r.iso.Namespaces {
		// The tmpfs is the bound; /proc is the call's own; the root holds
		// what the domain may read or run, the interpreter as named
		// included, and nothing else of the host's.
		p.ScratchBytes = 0
		root := rootPaths(slices.Concat(p.Read, p.Exec, p.Devices, in.Argv[:1]), work, code)
		if p.Namespaces, err = r.callNamespaces(b.Spec.Hostname, work, specMount(b.Spec, policy.WorkDir).Options, code,
			specMount(b.Spec, bundle.CodeDir).Options, int(in.UID), int(in.GID), b.Spec.Linux.MaskedPaths, b.Spec.Linux.ReadonlyPaths, root); err != nil {
			return nil, err
		}
		if d := b.Config.DataDir; d != "" {
			// Mounted over its place in the call's own root, after the
			// root's binds: nothing of the host's /data is in it.
			p.Namespaces.Mounts = append(p.Namespaces.Mounts, dataMount(d))
			p.Read = append(p.Read, policy.DataDir)
		}
	} else if p.Landlock > 0 {
		p.ProcSelf = true
		p.Read = slices.DeleteFunc(p.Read, func(path string) bool { return path == "/proc" })
	}
	seccomp := r.seccomp
	if b.Config.Network != nil {
		if seccomp, err = r.withNetwork(b, &in, p, code, uid, gid); err != nil {
			return nil, err
		}
	}
	return &initproto.Config{Init: in, Process: p, Seccomp: seccomp}, nil
}

// interpreterRules are what the code must execute to run the interpreter
// (the interpreter and its ELF loader, which execve opens for execution
// too) and, when the interpreter lives outside the system's trees, its
// prefix (dirname(dirname(python)), where Python finds its lib).
func (r *ProcessRuntime) interpreterRules(python string) (exe, read []string, err error) {
	type rules struct{ exe, read []string }
	if v, ok := r.interp.Load(python); ok {
		return v.(rules).exe, v.(rules).read, nil
	}
	real, err := filepath.EvalSymlinks(python)
	if err != nil {
		return nil, nil, fmt.Errorf("resolving the interpreter %s: %w", python, err)
	}
	f, err := elf.Open(real)
	if err != nil {
		return nil, nil, fmt.Errorf("reading the interpreter %s: %w", real, err)
	}
	defer f.Close()
	exe = []string{real}
	for _, p := range f.Progs {
		if p.Type != elf.PT_INTERP {
			continue
		}
		buf := make([]byte, p.Filesz)
		if _, err := p.ReadAt(buf, 0); err != nil {
			return nil, nil, fmt.Errorf("reading the interpreter's loader: %w", err)
		}
		exe = append(exe, strings.TrimRight(string(buf), "\x00"))
	}
	for _, e := range exe {
		if !slices.ContainsFunc(r.read, func(d string) bool { return within(e, d) }) {
			read = append(read, filepath.Dir(filepath.Dir(e)))
		}
	}
	r.interp.Store(python, rules{exe, read})
	return exe, read, nil
}

// rootPaths are the host paths bound into a call's own root: each of
// paths but what the init mounts fresh (/proc, /sys, the call's own dirs
// in skip), and none below another (a bind brings what is below it).
func rootPaths(paths []string, skip ...string) []string {
	var out []string
	for _, p := range paths {
		p = filepath.Clean(p)
		if !filepath.IsAbs(p) || within(p, "/proc") || within(p, "/sys") || slices.ContainsFunc(skip, func(d string) bool { return within(p, d) }) {
			continue
		}
		out = append(out, p)
	}
	slices.Sort(out)
	var kept []string
	for _, p := range slices.Compact(out) {
		if !slices.ContainsFunc(kept, func(d string) bool { return within(p, d) }) {
			kept = append(kept, p)
		}
	}
	return kept
}

// within reports whether p is dir or below it.
func within(p, dir string) bool {
	return p == dir || strings.HasPrefix(p, strings.TrimSuffix(dir, "/")+"/")
}

// specMount is the spec's mount at dest, or a zero one.
func specMount(s *specs.Spec, dest string) specs.Mount {
	for _, m := range s.Mounts {
		if m.Destination == dest {
			return m
		}
	}
	return specs.Mount{}
}

// tmpfsSize is the size of the spec's /tmp, or 0.
func tmpfsSize(s *specs.Spec) int64 {
	for _, o := range specMount(s, "/tmp").Options {
		if v, ok := strings.CutPrefix(o, "size="); ok {
			if n, err := strconv.ParseInt(v, 10, 64); err == nil {
				return n
			}
		}
	}
	return 0
}

// processEnv is the sandbox's environment with its home and temp dir the
// call's own work dir.
func processEnv(env []string, work string) []string {
	out := make([]string, 0, len(env))
	for _, kv := range env {
		switch k, _, _ := strings.Cut(kv, "="); k {
		case "HOME", "TMPDIR":
			kv = k + "=" + work
		}
		out = append(out, kv)
	}
	return out
}
