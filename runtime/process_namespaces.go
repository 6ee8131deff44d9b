package runtime

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"syscall"

	"golang.org/x/sys/unix"

	"github.com/inhuman/mcp-exec/bundle"
	"github.com/inhuman/mcp-exec/host"
	"github.com/inhuman/mcp-exec/policy"
	"github.com/inhuman/mcp-exec/runtime/initproto"
)

// The process runtime's namespaces: whether each call gets them
// (Namespaces, the probe), how the init is started in them
// (namespacesAttr) and what it makes of them (callNamespaces, which
// setup_namespaces in init_confine.c applies), and what a call lacks
// without them (namespacesMissing).

// Namespaces says whether the process runtime puts each call in
// namespaces of its own.
type Namespaces string

const (
	// NamespacesAuto: where the host lets the runtime make them, and
	// otherwise the confinement without them, said (ProcessIsolation).
	NamespacesAuto Namespaces = "auto"
	// NamespacesOn: always; the runtime refuses to start without them.
	NamespacesOn Namespaces = "true"
	// NamespacesOff: never.
	NamespacesOff Namespaces = "false"
)

// ParseNamespaces reads auto, true or false.
func ParseNamespaces(s string) (Namespaces, error) {
	switch n := Namespaces(s); n {
	case NamespacesAuto, NamespacesOn, NamespacesOff:
		return n, nil
	}
	return "", fmt.Errorf("want auto, true or false, got %q", s)
}

// namespaceFlags are the namespaces each call gets where the host lets
// the runtime make them: bubblewrap's --unshare-all, but for the cgroup
// namespace (the process runtime makes no cgroup).
const namespaceFlags = syscall.CLONE_NEWUSER | syscall.CLONE_NEWPID | syscall.CLONE_NEWNS | syscall.CLONE_NEWNET |
	syscall.CLONE_NEWIPC | syscall.CLONE_NEWUTS

// namespacesAttr starts a process, the init, as pid 1 of new namespaces.
//
// A server that is not root needs a user namespace to make the others.
// It maps the server's uid and gid to themselves, and nothing else; the
// server may not write those maps (it is not dumpable, so its child's
// /proc files are root's until the child execs), so the init maps its
// own ids itself (map_own_ids), as bubblewrap's child does. Across its
// exec as a uid that is not 0 the init keeps, ambient, the capabilities
// it needs in its namespaces to make them the call's, and gives them all
// up once it has (setup_namespaces).
//
// Root makes them without one: a user namespace root made would charge
// its processes' per-user counts (processes, inotify instances) to
// root's in the host's as well as to the call's uid in it, so that calls
// would share them again; made as the call's uid it would take a process
// more. The init stays root in them, as a container's init, keeps what
// such an init keeps, and starts the code as the call's uid.
//
// No parent-death signal here: os/exec checks that the parent still
// lives by getppid, which is 0 in a new pid namespace, and would kill the
// child; the init sets its own, first thing.
func namespacesAttr(root bool) *syscall.SysProcAttr {
	if root {
		return &syscall.SysProcAttr{Setpgid: true, Cloneflags: namespaceFlags &^ syscall.CLONE_NEWUSER}
	}
	return &syscall.SysProcAttr{Setpgid: true, Cloneflags: namespaceFlags,
		AmbientCaps: []uintptr{unix.CAP_SYS_ADMIN, unix.CAP_NET_ADMIN, unix.CAP_SETPCAP}}
}

// rootInitCaps are the capabilities a root server's init keeps once it
// has made its namespaces: a container's init's, and CAP_SYS_RESOURCE,
// with which it sets the code's CPU limit (the code is another uid).
func rootInitCaps() (uint64, error) {
	var caps uint64
	for _, name := range append(slices.Clone(policy.InitCapabilities().Effective), "CAP_SYS_RESOURCE") {
		c, err := capabilityByName(name)
		if err != nil {
			return 0, err
		}
		caps |= 1 << uint(c)
	}
	return caps, nil
}

// probeNamespaces starts the probe as a call's init is started
// (namespacesAttr) and has it make its namespaces a call's, on the
// runtime's dir, as the init does: nil, or why this host refuses them.
func (r *ProcessRuntime) probeNamespaces() error {
	uid, gid := os.Geteuid(), os.Getegid()
	opts := []string{"nosuid", "nodev", "noexec", "size=65536"}
	paths := rootPaths(slices.Concat(r.read, policy.ProcessDevices()), r.dir)
	ns, err := r.callNamespaces(policy.Hostname, r.dir, opts, r.dir, opts, uid, gid, policy.MaskedPaths(), policy.ReadonlyPaths(), paths)
	if err != nil {
		return err
	}
	cfg := &initproto.Config{Init: bundle.Init{UID: uint32(uid), GID: uint32(gid), WorkDir: r.dir,
		Script: filepath.Join(r.dir, "main.py"), Argv: []string{"python3", "main.py"}},
		Process: &initproto.Process{Namespaces: ns}}
	payload, err := cfg.Encode()
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(context.Background(), host.ProbeTimeout)
	defer cancel()
	cmd := exec.CommandContext(ctx, "/proc/self/exe", initproto.ProbeMarker, initproto.ProbeNamespacesArg)
	cmd.Args[0] = "mcp-exec-probe"
	cmd.Env, cmd.Dir = []string{}, r.dir
	cmd.SysProcAttr = namespacesAttr(r.uids != nil)
	cmd.Stdin = bytes.NewReader(frame(initproto.HConfig, payload))
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		if msg := strings.TrimSpace(stderr.String()); msg != "" {
			return errors.New(strings.TrimPrefix(msg, "mcp-exec init: "))
		}
		return fmt.Errorf("starting a process in new namespaces: %w", err)
	}
	if got := strings.TrimSpace(stdout.String()); got != "namespaces=0" {
		return fmt.Errorf("the namespace probe said %q", got)
	}
	return nil
}

// callNamespaces is what the init makes of a call's namespaces: a root
// of its own holding root's host paths read-only; in it a fresh /proc
// (the container's masks and read-only paths in it) and /sys, read-only;
// a tmpfs on the work dir with the options of the container's /tmp, the
// call's own (uid and gid, mode 0700), and one on the script's dir with
// those of its /code; the hostname; the capabilities the init keeps.
func (r *ProcessRuntime) callNamespaces(hostname, work string, workOpts []string, code string, codeOpts []string, uid, gid int, masked, readonly, root []string) (*initproto.Fresh, error) {
	f := &initproto.Fresh{
		Mounts: []initproto.Mount{
			{Target: "/proc", Type: "proc", Source: "proc", Flags: unix.MS_NOSUID | unix.MS_NODEV | unix.MS_NOEXEC},
			{Target: "/sys", Type: "sysfs", Source: "sysfs", Flags: unix.MS_RDONLY | unix.MS_NOSUID | unix.MS_NODEV | unix.MS_NOEXEC},
			tmpfsMount(work, workOpts, fmt.Sprintf("mode=0700,uid=%d,gid=%d", uid, gid)),
			tmpfsMount(code, codeOpts, ""),
		},
		Masked: slices.Clone(masked), Readonly: slices.Clone(readonly), Hostname: hostname, Root: root,
	}
	if r.uids != nil {
		caps, err := rootInitCaps()
		if err != nil {
			return nil, err
		}
		f.KeepCaps = caps
	}
	return f, nil
}

// tmpfsMount is a tmpfs on target with a spec mount's options, as
// mount(2) takes them; own, when not empty, replaces their mode.
func tmpfsMount(target string, opts []string, own string) initproto.Mount {
	m := initproto.Mount{Target: target, Type: "tmpfs", Source: "tmpfs"}
	var data []string
	if own != "" {
		data = append(data, own)
	}
	for _, o := range opts {
		switch o {
		case "nosuid":
			m.Flags |= unix.MS_NOSUID
		case "nodev":
			m.Flags |= unix.MS_NODEV
		case "noexec":
			m.Flags |= unix.MS_NOEXEC
		case "ro":
			m.Flags |= unix.MS_RDONLY
		case "rw":
		default:
			if own == "" || !strings.HasPrefix(o, "mode=") {
				data = append(data, o)
			}
		}
	}
	m.Data = strings.Join(data, ",")
	return m
}

// namespacesMissing is what a call lacks without namespaces of its own,
// and how to get them: refused says why the host refused them, nil when
// the configuration turned them off.
func namespacesMissing(refused error, root bool) host.Missing {
	m := host.Missing{What: "namespaces of its own",
		Why: "the call shares the machine's network namespace (it lists the machine's interfaces and addresses over netlink), " +
			"hostname and pid namespace (only Landlock, where the kernel has it, hides every other process's /proc from it); " +
			"its /tmp is bounded by a measure, not a filesystem of that size: a fast writer gets a few MiB past the bound " +
			"before it is killed, a file held without a name only through a memory mapping counts as far as it is mapped, " +
			"and one in flight on a unix socket not at all",
		Fix: "unset {ProcessNamespaces}, which is false"}
	if refused != nil {
		m.Fix = "allow unprivileged user namespaces and a fresh /proc in them (here: " + refused.Error() + "). " +
			"In a container: --security-opt systempaths=unconfined (a masked /proc refuses a fresh one; under podman that is " +
			"all it takes), and under docker --security-opt seccomp=unconfined too (its default profile refuses new namespaces " +
			"to a container without CAP_SYS_ADMIN); Kubernetes: procMount: Unmasked and a seccomp profile that allows " +
			"unshare and clone of namespaces. On a host: " +
			"sysctl user.max_user_namespaces above 0, kernel.unprivileged_userns_clone=1 (older Debian), " +
			"kernel.apparmor_restrict_unprivileged_userns=0 (Ubuntu 23.10 and later); Linux 5.12 or later"
		if root {
			m.Fix = "give the server, as root, CAP_SYS_ADMIN to make them (here: " + refused.Error() + "), " +
				"in a container with a seccomp profile that allows unshare and clone of namespaces and an unmasked /proc " +
				"(docker: --cap-add SYS_ADMIN --security-opt seccomp=unconfined --security-opt systempaths=unconfined); " +
				"or run it as a user that is not root where unprivileged user namespaces are allowed"
		}
	}
	return m
}
