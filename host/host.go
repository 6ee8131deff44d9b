// Package host reads what this machine offers for isolation — namespaces,
// user namespaces, cgroups and their controllers, seccomp, this process's
// privileges, runsc and its platforms — and says, as data, what each
// runtime would lack here and how to fix it.
//
// Invariants a maintainer must keep:
//   - it only reads: it never creates a namespace, a cgroup or a file, and
//     the only commands it runs are runsc's read-only ones (--version,
//     flags, help);
//   - a finding is data (what is missing, why it matters, the exact fix),
//     never a decision: runtime refuses on it, doctor reports it;
//   - the advice for a server inside a container (docker, Kubernetes) is
//     given once per runtime, not appended to every finding.
package host

import (
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"

	"github.com/opencontainers/runc/libcontainer/seccomp"
)

// Runtime names a runtime: the one enum of them, here at the bottom of
// the imports so that this package can key each runtime's needs by it and
// package runtime (whose Kind it is) can be built on it.
type Runtime string

const (
	Libcontainer Runtime = "libcontainer"
	Runsc        Runtime = "runsc"
	// Process runs each call as a fresh process, with no container: the
	// server's own (outer) container is the boundary.
	Process Runtime = "process"
	// Auto is the strict sandbox where this host allows it (libcontainer,
	// else runsc), else Process.
	Auto Runtime = "auto"
)

// Missing is one thing a runtime needs and this host lacks.
type Missing struct {
	// What names it: "root", "capabilities", "cgroup controller \"memory\"".
	What string `json:"what"`
	// Why says what the sandbox would lose without it.
	Why string `json:"why"`
	// Fix is the exact change that provides it.
	Fix string `json:"fix"`
	// Privilege: a server in a container gets it from the container
	// engine's settings (ContainerFix).
	Privilege bool `json:"privilege,omitempty"`
}

func (m Missing) String() string {
	s := m.What + ": " + m.Why
	if m.Fix != "" {
		s += "; " + m.Fix
	}
	return s
}

// Join renders findings on one line, for an error message.
func Join(ms []Missing) string {
	parts := make([]string, len(ms))
	for i, m := range ms {
		parts[i] = m.String()
	}
	return strings.Join(parts, "; ")
}

// Explain renders what kind lacks on one line, with the container engine's
// settings once at the end when a privilege is among it.
func Explain(kind Runtime, ms []Missing) string {
	s := Join(ms)
	if slices.ContainsFunc(ms, func(m Missing) bool { return m.Privilege }) {
		f := FixInContainer(kind)
		s += fmt.Sprintf(". If mcp-exec runs in a container, grant the privileges with docker: %s; Kubernetes: %s", f.Docker, f.Kubernetes)
	}
	return s
}

// Host is what this machine offers for isolation, as doctor reports it.
type Host struct {
	EUID int `json:"euid"`
	// Namespaces lists the namespace kinds the kernel offers.
	Namespaces []string `json:"namespaces"`
	// UserNamespaces: an unprivileged process may create a user namespace
	// (each libcontainer sandbox gets one, owned by an unprivileged uid).
	UserNamespaces bool `json:"user_namespaces"`
	// UserNamespacesWhy says what forbids them, when they are forbidden.
	UserNamespacesWhy string `json:"user_namespaces_why,omitempty"`
	// CgroupVersion is "v1", "hybrid" (v1 controllers plus a cgroup2 mount)
	// or "v2".
	CgroupVersion string `json:"cgroup_version"`
	// CgroupControllers lists the usable controllers of the version in use.
	CgroupControllers []string `json:"cgroup_controllers"`
	// SocketMemory: the memory controller can charge socket buffers to a
	// sandbox (cgroup v2 always; v1 through memory.kmem.tcp.limit_in_bytes),
	// unless the kernel was booted with cgroup.memory=nosocket.
	SocketMemory bool `json:"socket_memory"`
	// SeccompKernel: the kernel filters syscalls.
	SeccompKernel bool `json:"seccomp_kernel"`
	// SeccompLibrary is the libseccomp version this binary was built with,
	// empty when it was built without seccomp support.
	SeccompLibrary string `json:"seccomp_library,omitempty"`
	// NoNewPrivs: this process itself runs with no_new_privs set.
	NoNewPrivs bool `json:"no_new_privs"`
	// InitialUserNS: this process runs in the host's initial user
	// namespace, where uid 0 owns the cgroups. In any other user namespace
	// uid 0 is root only over that namespace's own resources.
	InitialUserNS bool `json:"initial_user_ns"`
	// UIDMap is /proc/self/uid_map, one mapping per line.
	UIDMap string `json:"uid_map"`
	// Capabilities lists this process's effective capabilities.
	Capabilities []string `json:"capabilities"`
	// CgroupWritable lists the controllers (required ones only) whose
	// hierarchy this process may create the sandboxes' cgroups in.
	CgroupWritable []string `json:"cgroup_writable"`
	// PtraceScope is kernel.yama.ptrace_scope, -1 without Yama.
	PtraceScope int `json:"ptrace_scope"`
	// AppArmor is this process's AppArmor label, empty without AppArmor.
	AppArmor string `json:"apparmor,omitempty"`
	// SeccompFiltered: this process itself runs under a seccomp filter (as
	// in a container with the engine's default profile).
	SeccompFiltered bool `json:"seccomp_filtered"`
}

// RequiredNamespaces are the namespaces every sandbox gets.
func RequiredNamespaces() []string { return []string{"pid", "ipc", "uts", "mnt", "net", "cgroup"} }

// RequiredControllers enforce the memory, pids and CPU limits.
func RequiredControllers() []string { return []string{"memory", "pids", "cpu"} }

// Probe reads what the host offers. It changes nothing.
func Probe() Host {
	h := Host{EUID: os.Geteuid()}
	for _, ns := range []string{"pid", "ipc", "uts", "mnt", "net", "cgroup", "user", "time"} {
		if _, err := os.Lstat("/proc/self/ns/" + ns); err == nil {
			h.Namespaces = append(h.Namespaces, ns)
		}
	}
	h.UserNamespaces, h.UserNamespacesWhy = probeUserNamespaces()
	h.CgroupVersion, h.CgroupControllers = probeCgroups()
	h.SocketMemory = probeSocketMemory(h.CgroupVersion)
	status, _ := os.ReadFile("/proc/self/status")
	for _, line := range strings.Split(string(status), "\n") {
		k, v, _ := strings.Cut(line, ":")
		v = strings.TrimSpace(v)
		switch k {
		case "Seccomp":
			h.SeccompKernel = true
			h.SeccompFiltered = v == "2"
		case "NoNewPrivs":
			h.NoNewPrivs = v == "1"
		case "CapEff":
			if bits, err := strconv.ParseUint(v, 16, 64); err == nil {
				h.Capabilities = capNames(bits)
			}
		}
	}
	h.UIDMap, h.InitialUserNS = probeUserNS()
	h.CgroupWritable = probeCgroupWritable(h.CgroupVersion, h.CgroupControllers)
	h.PtraceScope = -1
	if n, ok := readInt("/proc/sys/kernel/yama/ptrace_scope"); ok {
		h.PtraceScope = int(n)
	}
	for _, p := range []string{"/proc/self/attr/apparmor/current", "/proc/self/attr/current"} {
		if data, err := os.ReadFile(p); err == nil {
			if label := strings.TrimSpace(strings.TrimRight(string(data), "\x00")); label != "" {
				h.AppArmor = label
				break
			}
		}
	}
	if maj, min, micro := seccomp.Version(); maj+min+micro > 0 {
		h.SeccompLibrary = fmt.Sprintf("%d.%d.%d", maj, min, micro)
	}
	return h
}

func readInt(path string) (int64, bool) {
	data, err := os.ReadFile(path)
	if err != nil {
		return 0, false
	}
	n, err := strconv.ParseInt(strings.TrimSpace(string(data)), 10, 64)
	return n, err == nil
}

// probeUserNamespaces reads the knobs that forbid unprivileged user
// namespaces: the count limit, Debian's and Ubuntu's switches.
func probeUserNamespaces() (bool, string) {
	if _, err := os.Lstat("/proc/self/ns/user"); err != nil {
		return false, "the kernel has no user namespaces (CONFIG_USER_NS)"
	}
	if n, ok := readInt("/proc/sys/user/max_user_namespaces"); ok && n == 0 {
		return false, "user.max_user_namespaces is 0"
	}
	if n, ok := readInt("/proc/sys/kernel/unprivileged_userns_clone"); ok && n == 0 {
		return false, "kernel.unprivileged_userns_clone is 0"
	}
	if n, ok := readInt("/proc/sys/kernel/apparmor_restrict_unprivileged_userns"); ok && n == 1 {
		return false, "kernel.apparmor_restrict_unprivileged_userns is 1"
	}
	return true, ""
}

func probeCgroups() (version string, controllers []string) {
	if data, err := os.ReadFile("/sys/fs/cgroup/cgroup.controllers"); err == nil {
		return "v2", strings.Fields(string(data))
	}
	version = "v1"
	if _, err := os.Stat("/sys/fs/cgroup/unified/cgroup.controllers"); err == nil {
		version = "hybrid"
	}
	for _, c := range []string{"memory", "pids", "cpu", "cpuacct", "cpuset", "devices", "freezer", "blkio"} {
		if _, err := os.Stat(filepath.Join("/sys/fs/cgroup", c, "cgroup.procs")); err == nil {
			controllers = append(controllers, c)
		}
	}
	return version, controllers
}

// probeSocketMemory reports whether socket buffers can be charged to a
// sandbox's memory cgroup.
func probeSocketMemory(version string) bool {
	if cmdline, err := os.ReadFile("/proc/cmdline"); err == nil {
		for _, arg := range strings.Fields(string(cmdline)) {
			if k, v, ok := strings.Cut(arg, "="); ok && k == "cgroup.memory" && slices.Contains(strings.Split(v, ","), "nosocket") {
				return false
			}
		}
	}
	if version == "v2" {
		return true
	}
	_, err := os.Stat("/sys/fs/cgroup/memory/memory.kmem.tcp.limit_in_bytes")
	return err == nil
}

// ForLibcontainer lists what the libcontainer runtime needs and this host
// lacks. Empty means the full sandbox can be given.
func (h Host) ForLibcontainer() []Missing {
	missing := h.missingPrivileges(Libcontainer)
	for _, ns := range RequiredNamespaces() {
		if !slices.Contains(h.Namespaces, ns) {
			missing = append(missing, Missing{What: ns + " namespace", Why: "the kernel does not offer it",
				Fix: fmt.Sprintf("enable CONFIG_%s_NS", strings.ToUpper(nsConfig(ns)))})
		}
	}
	if !h.UserNamespaces {
		missing = append(missing, Missing{What: "user namespaces",
			Why: "each sandbox gets its own user namespace, owned by an unprivileged uid of its call slot, so that " +
				"concurrent calls share no per-user kernel limit and the sandbox's init is out of the code's reach; " +
				"here " + h.UserNamespacesWhy,
			Fix: "allow them (sysctl user.max_user_namespaces=15000, kernel.unprivileged_userns_clone=1, " +
				"kernel.apparmor_restrict_unprivileged_userns=0), or use {Runtime}=runsc"})
	}
	missing = append(missing, h.missingControllers()...)
	missing = append(missing, h.missingSocketMemory()...)
	if !h.SeccompKernel {
		missing = append(missing, Missing{What: "seccomp", Why: "the kernel has no seccomp filtering",
			Fix: "enable CONFIG_SECCOMP_FILTER"})
	}
	if h.SeccompLibrary == "" {
		missing = append(missing, Missing{What: "seccomp library", Why: "this binary was built without libseccomp",
			Fix: "rebuild with cgo and -tags seccomp: apt-get install libseccomp-dev && make build"})
	}
	return missing
}

func (h Host) missingSocketMemory() []Missing {
	if h.SocketMemory {
		return nil
	}
	return []Missing{{What: "socket memory accounting",
		Why: "the memory controller cannot charge socket buffers to a sandbox, so a call could queue gigabytes " +
			"in loopback sockets outside its memory limit",
		Fix: "boot without cgroup.memory=nosocket (and, on cgroup v1, with a kernel that has memory.kmem.tcp.limit_in_bytes)"}}
}

func nsConfig(ns string) string {
	switch ns {
	case "mnt":
		return "namespaces"
	default:
		return ns
	}
}
