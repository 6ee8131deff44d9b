package host

import (
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"golang.org/x/sys/unix"
)

// What follows decides whether this process holds the privileges both
// runtimes need to give the full sandbox, and says exactly what to change
// when it does not.
//
// Findings that shaped it (Debian 12, cgroup v1 hybrid, runsc 2022-12):
//   - A non-root process with no capabilities and no_new_privs can still
//     create a user namespace and, inside it, pid/net/mnt/ipc/uts
//     namespaces, mount /proc and tmpfs, and install seccomp filters; and
//     `runsc --rootless` runs Python. What it cannot do is create a cgroup:
//     every controller's hierarchy belongs to the host's root. Nothing else
//     enforces a memory, pids or CPU limit on a whole sandbox (rlimits are
//     per process or per uid, and tmpfs pages escape RLIMIT_AS), and
//     `runsc --rootless` skips cgroups silently ("Skipping cgroup
//     configuration in rootless mode"). So without root both runtimes
//     refuse rather than run without limits.
//   - uid 0 inside a user namespace (unshare --user --map-root-user, docker
//     --userns-remap, Kubernetes hostUsers: false) is not root over the
//     host's cgroups either: the cgroup files are owned by an unmapped uid.

// CgroupRoot is the cgroup (under every hierarchy) below which the
// runtimes create one cgroup per server instance.
const CgroupRoot = "mcp-exec"

// requiredCaps are the effective capabilities each runtime needs, with
// why. Measured here by dropping one
// capability at a time from root's bounding set (setpriv
// --bounding-set=-CAP) and running a sandbox that prints its capability
// sets and then times out; TestExactCapabilities keeps it exact. Two
// failures were silent and are the reason the list is checked up front:
// without CAP_SETPCAP libcontainer leaves the code's bounding set full
// (CapBnd 000001fffefffeff), and without CAP_KILL it cannot kill a
// timed-out sandbox of uid 65532, so the call hangs. CAP_DAC_OVERRIDE
// creates the instance's cgroups: a cgroup v1 hierarchy's root is mode
// 0555. CAP_SYS_PTRACE and CAP_CHOWN come from each libcontainer
// sandbox's user namespace, whose root is its call slot's own host uid.
// CAP_SETFCAP: a current gVisor starts its gofer in a user namespace that
// maps uid 0, which Linux (5.12 on) allows only with it; without it runsc
// fails with "cannot create gofer process: … operation not permitted".
var requiredCaps = map[Runtime][]struct{ name, why string }{
	Libcontainer: {
		{"CAP_SYS_ADMIN", "namespaces, mounts, pivot_root"},
		{"CAP_NET_ADMIN", "bringing up lo in the sandbox's network namespace"},
		{"CAP_SYS_CHROOT", "joining the sandbox's mount namespace"},
		{"CAP_SETUID", "switching to uid 65532"},
		{"CAP_SETGID", "switching to gid 65532 and clearing the groups"},
		{"CAP_SETPCAP", "emptying the code's capability bounding set (without it the set stays full, silently)"},
		{"CAP_KILL", "killing a timed-out sandbox of uid 65532 (without it the call hangs)"},
		{"CAP_SYS_PTRACE", "opening the namespaces of processes of a call slot's uid (runc init joins the slot's " +
			"user namespace, libcontainer the sandbox's mount namespace)"},
		{"CAP_CHOWN", "handing the container's start FIFO to the sandbox's root, a call slot's uid"},
		{"CAP_DAC_OVERRIDE", "creating the instance's cgroups in hierarchies whose root is mode 0555, and opening " +
			"that FIFO, no longer root's"},
	},
	Runsc: {
		{"CAP_SYS_ADMIN", "the namespaces, mounts and cgroups of the sandbox and gofer"},
		{"CAP_SYS_CHROOT", "the gofer's and sandbox's chroot"},
		{"CAP_SETUID", "runsc runs the sandbox as an unprivileged user"},
		{"CAP_SETGID", "runsc runs the sandbox as an unprivileged group"},
		{"CAP_KILL", "killing what is left in a call's cgroup"},
		{"CAP_DAC_OVERRIDE", "creating the instance's cgroups in hierarchies whose root is mode 0555"},
		{"CAP_SETFCAP", "mapping root into the gofer's user namespace (a current gVisor; the kernel asks for it " +
			"to map uid 0)"},
	},
}

// RequiredCapabilities names the effective capabilities kind needs
// (CAP_SYS_ADMIN, …), checked at start.
func RequiredCapabilities(kind Runtime) []string {
	var names []string
	for _, c := range requiredCaps[kind] {
		names = append(names, c.name)
	}
	return names
}

// ContainerFix is how a server inside a container gets the privileges a
// runtime needs from its container engine.
type ContainerFix struct {
	Docker     string `json:"docker"`
	Kubernetes string `json:"kubernetes"`
}

// FixInContainer returns the minimal engine settings that give kind what it
// needs when mcp-exec itself runs in a container.
func FixInContainer(kind Runtime) ContainerFix {
	// docker's default set has SETUID, SETGID, SETPCAP, SYS_CHROOT, KILL,
	// CHOWN, DAC_OVERRIDE, SETFCAP.
	caps := "--cap-add SYS_ADMIN --cap-add NET_ADMIN --cap-add SYS_PTRACE"
	kcaps := "[SYS_ADMIN, NET_ADMIN, SYS_PTRACE, SYS_CHROOT, SETUID, SETGID, SETPCAP, KILL, CHOWN, DAC_OVERRIDE]"
	// A user namespace may mount /proc only where the engine has not
	// masked parts of its own /proc: systempaths=unconfined, procMount
	// Unmasked.
	extra, kextra := " --security-opt systempaths=unconfined", ", procMount: Unmasked"
	if kind == Runsc {
		caps, kcaps, extra, kextra = "--cap-add SYS_ADMIN", "[SYS_ADMIN, SYS_CHROOT, SETUID, SETGID, KILL, DAC_OVERRIDE, SETFCAP]", "", ""
	}
	return ContainerFix{
		Docker: "docker run --user 0:0 " + caps + " --security-opt seccomp=unconfined --security-opt apparmor=unconfined" + extra +
			" --cgroupns=host -v /sys/fs/cgroup:/sys/fs/cgroup:rw",
		Kubernetes: "securityContext: {runAsUser: 0, runAsNonRoot: false, capabilities: {add: " + kcaps + "}, " +
			"seccompProfile: {type: Unconfined}, appArmorProfile: {type: Unconfined}" + kextra + "} and a read-write hostPath volume " +
			"of /sys/fs/cgroup mounted at /sys/fs/cgroup; or run the pod under a gVisor RuntimeClass with {Runtime}=auto",
	}
}

// missingPrivileges lists what this process lacks to create the full
// sandbox with the given runtime. Empty means nothing.
func (h Host) missingPrivileges(kind Runtime) []Missing {
	var missing []Missing
	switch {
	case h.EUID != 0:
		missing = append(missing, Missing{What: "root", Privilege: true,
			Why: fmt.Sprintf("mcp-exec runs as uid %d, and the %s runtime needs uid 0 in the host's user namespace to create "+
				"each sandbox's namespaces, mounts and cgroups; no rootless mode gives the full sandbox, because without a "+
				"writable cgroup nothing enforces the memory, pids and CPU limits, so mcp-exec refuses instead", h.EUID, kind),
			Fix: "run the server as root"})
	case !h.InitialUserNS:
		missing = append(missing, Missing{What: "real root", Privilege: true,
			Why: fmt.Sprintf("mcp-exec is uid 0 only inside a user namespace (uid_map \"%s\"): the sandbox's uid 65532 exists "+
				"there only if mapped, no device node can be created, and the host's cgroups, which enforce the memory, "+
				"pids and CPU limits, are writable only when host root itself is mapped", h.UIDMap),
			Fix: "run it as root of the host's user namespace, not under unshare --user, docker --userns-remap or Kubernetes hostUsers: false"})
	default:
		var lacking, whys []string
		for _, c := range requiredCaps[kind] {
			if !slices.Contains(h.Capabilities, c.name) {
				lacking = append(lacking, c.name)
				whys = append(whys, c.why)
			}
		}
		if len(lacking) > 0 {
			missing = append(missing, Missing{What: "capabilities " + strings.Join(lacking, ", "), Privilege: true,
				Why: "missing from the effective set (needed for " + strings.Join(whys, "; ") + ")",
				Fix: "grant them to the server"})
		}
	}
	if h.EUID == 0 && h.InitialUserNS {
		for _, c := range RequiredControllers() {
			if slices.Contains(h.CgroupControllers, c) && !slices.Contains(h.CgroupWritable, c) {
				missing = append(missing, Missing{What: fmt.Sprintf("writable cgroup %q", c), Privilege: true,
					Why: fmt.Sprintf("%s is read-only to this process, so the %s limit could not be enforced",
						cgroupHierarchy(h.CgroupVersion, c), limitName(c)),
					Fix: "mount the host's cgroup hierarchy read-write"})
			}
		}
	}
	return missing
}

// EnforceableLimits names the limits (memory, pids, cpu) whose cgroup
// controller this host has and this process may write: what either
// runtime can enforce here.
func (h Host) EnforceableLimits() []string {
	limits := []string{}
	for _, c := range RequiredControllers() {
		if slices.Contains(h.CgroupControllers, c) && slices.Contains(h.CgroupWritable, c) {
			limits = append(limits, c)
		}
	}
	return limits
}

// missingControllers lists the controllers that enforce a limit and are
// not available at all.
func (h Host) missingControllers() []Missing {
	var missing []Missing
	for _, c := range RequiredControllers() {
		if !slices.Contains(h.CgroupControllers, c) {
			missing = append(missing, Missing{What: fmt.Sprintf("cgroup controller %q", c),
				Why: fmt.Sprintf("not available (%s), so the %s limit could not be enforced", h.CgroupVersion, limitName(c)),
				Fix: "mount it, or on cgroup v2 enable it in the parent's cgroup.subtree_control"})
		}
	}
	return missing
}

// Advice lists what may make sandboxes fail to start although nothing
// required is missing; doctor prints it, the runtimes do not refuse for it
// (the first sandbox the server runs at start proves the matter).
func (h Host) Advice() []string {
	var advice []string
	if h.AppArmor != "" && h.AppArmor != "unconfined" && strings.Contains(h.AppArmor, "enforce") {
		advice = append(advice, fmt.Sprintf("AppArmor profile %q confines mcp-exec; a container engine's default profile "+
			"denies mount (docker: --security-opt apparmor=unconfined; Kubernetes: appArmorProfile: {type: Unconfined})", h.AppArmor))
	}
	if h.SeccompFiltered {
		advice = append(advice, "mcp-exec itself runs under a seccomp filter; a container engine's default profile denies "+
			"keyctl and other calls runtimes make (docker: --security-opt seccomp=unconfined; Kubernetes: "+
			"seccompProfile: {type: Unconfined})")
	}
	return advice
}

func limitName(controller string) string {
	switch controller {
	case "memory":
		return "memory ({MemoryBytes})"
	case "pids":
		return "process ({Pids})"
	case "cpu":
		return "CPU ({CPUs})"
	}
	return controller
}

func cgroupHierarchy(version, controller string) string {
	if version == "v2" {
		return "/sys/fs/cgroup"
	}
	return filepath.Join("/sys/fs/cgroup", controller)
}

// probeUserNS reads this process's uid map; the initial user namespace maps
// every uid to itself.
func probeUserNS() (uidMap string, initial bool) {
	data, err := os.ReadFile("/proc/self/uid_map")
	if err != nil {
		return "", true // no user namespaces: there is only the initial one
	}
	var lines []string
	for _, l := range strings.Split(strings.TrimSpace(string(data)), "\n") {
		lines = append(lines, strings.Join(strings.Fields(l), " "))
	}
	uidMap = strings.Join(lines, ", ")
	return uidMap, uidMap == "0 0 4294967295"
}

// probeCgroupWritable returns the required controllers whose hierarchy this
// process may create cgroups in: where the instance cgroups go (the
// mcp-exec dir when it exists, else the hierarchy's root) is writable with
// this process's effective ids and capabilities, on a writable mount.
func probeCgroupWritable(version string, available []string) []string {
	var ok []string
	for _, c := range RequiredControllers() {
		if !slices.Contains(available, c) {
			continue
		}
		dir := cgroupHierarchy(version, c)
		if _, err := os.Stat(filepath.Join(dir, CgroupRoot)); err == nil {
			dir = filepath.Join(dir, CgroupRoot)
		}
		if unix.Faccessat(unix.AT_FDCWD, dir, unix.W_OK|unix.X_OK, unix.AT_EACCESS) == nil {
			ok = append(ok, c)
		}
	}
	return ok
}

// capNames names the capabilities set in a capability mask.
func capNames(mask uint64) []string {
	names := []string{
		"CAP_CHOWN", "CAP_DAC_OVERRIDE", "CAP_DAC_READ_SEARCH", "CAP_FOWNER", "CAP_FSETID", "CAP_KILL",
		"CAP_SETGID", "CAP_SETUID", "CAP_SETPCAP", "CAP_LINUX_IMMUTABLE", "CAP_NET_BIND_SERVICE",
		"CAP_NET_BROADCAST", "CAP_NET_ADMIN", "CAP_NET_RAW", "CAP_IPC_LOCK", "CAP_IPC_OWNER", "CAP_SYS_MODULE",
		"CAP_SYS_RAWIO", "CAP_SYS_CHROOT", "CAP_SYS_PTRACE", "CAP_SYS_PACCT", "CAP_SYS_ADMIN", "CAP_SYS_BOOT",
		"CAP_SYS_NICE", "CAP_SYS_RESOURCE", "CAP_SYS_TIME", "CAP_SYS_TTY_CONFIG", "CAP_MKNOD", "CAP_LEASE",
		"CAP_AUDIT_WRITE", "CAP_AUDIT_CONTROL", "CAP_SETFCAP", "CAP_MAC_OVERRIDE", "CAP_MAC_ADMIN", "CAP_SYSLOG",
		"CAP_WAKE_ALARM", "CAP_BLOCK_SUSPEND", "CAP_AUDIT_READ", "CAP_PERFMON", "CAP_BPF", "CAP_CHECKPOINT_RESTORE",
	}
	out := []string{}
	for i, n := range names {
		if mask&(1<<uint(i)) != 0 {
			out = append(out, n)
		}
	}
	return out
}
