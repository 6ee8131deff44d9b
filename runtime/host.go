package runtime

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"github.com/opencontainers/runc/libcontainer/seccomp"
)

// Host is what this machine offers for isolation, as doctor reports it.
type Host struct {
	EUID int `json:"euid"`
	// Namespaces lists the namespace kinds the kernel offers.
	Namespaces []string `json:"namespaces"`
	// UserNamespaces: an unprivileged process may create a user namespace.
	UserNamespaces bool `json:"user_namespaces"`
	// CgroupVersion is "v1", "hybrid" (v1 controllers plus a cgroup2 mount)
	// or "v2".
	CgroupVersion string `json:"cgroup_version"`
	// CgroupControllers lists the usable controllers of the version in use.
	CgroupControllers []string `json:"cgroup_controllers"`
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
	// Seccomp: this process itself runs under a seccomp filter (as in a
	// container with the engine's default profile).
	SeccompFiltered bool `json:"seccomp_filtered"`
}

// requiredNamespaces are the namespaces every sandbox gets.
var requiredNamespaces = []string{"pid", "ipc", "uts", "mnt", "net", "cgroup"}

// requiredControllers enforce the memory, pids and CPU limits.
var requiredControllers = []string{"memory", "pids", "cpu"}

// ProbeHost reads what the host offers. It changes nothing.
func ProbeHost() Host {
	h := Host{EUID: os.Geteuid()}
	for _, ns := range []string{"pid", "ipc", "uts", "mnt", "net", "cgroup", "user", "time"} {
		if _, err := os.Lstat("/proc/self/ns/" + ns); err == nil {
			h.Namespaces = append(h.Namespaces, ns)
		}
	}
	h.UserNamespaces = readInt("/proc/sys/user/max_user_namespaces") > 0
	if data, err := os.ReadFile("/proc/sys/kernel/unprivileged_userns_clone"); err == nil && strings.TrimSpace(string(data)) == "0" {
		h.UserNamespaces = false
	}
	h.CgroupVersion, h.CgroupControllers = probeCgroups()
	status, _ := os.ReadFile("/proc/self/status")
	for _, line := range strings.Split(string(status), "\n") {
		k, v, _ := strings.Cut(line, ":")
		switch k {
		case "Seccomp":
			h.SeccompKernel = true
		case "NoNewPrivs":
			h.NoNewPrivs = strings.TrimSpace(v) == "1"
		}
		if k == "Seccomp" && strings.TrimSpace(v) == "2" {
			h.SeccompFiltered = true
		}
		if k == "CapEff" {
			if bits, err := strconv.ParseUint(strings.TrimSpace(v), 16, 64); err == nil {
				h.Capabilities = capNames(bits)
			}
		}
	}
	h.UIDMap, h.InitialUserNS = probeUserNS()
	h.CgroupWritable = probeCgroupWritable(h.CgroupVersion, h.CgroupControllers)
	h.PtraceScope = -1
	if data, err := os.ReadFile("/proc/sys/kernel/yama/ptrace_scope"); err == nil {
		if n, err := strconv.Atoi(strings.TrimSpace(string(data))); err == nil {
			h.PtraceScope = n
		}
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

func probeCgroups() (version string, controllers []string) {
	if _, err := os.Stat("/sys/fs/cgroup/cgroup.controllers"); err == nil {
		data, _ := os.ReadFile("/sys/fs/cgroup/cgroup.controllers")
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

// Missing lists what the libcontainer runtime needs and this host lacks,
// each with the fix. Empty means the full sandbox can be given.
func (h Host) MissingForLibcontainer() []string {
	missing := h.missingPrivileges(Libcontainer)
	for _, ns := range requiredNamespaces {
		if !contains(h.Namespaces, ns) {
			missing = append(missing, fmt.Sprintf("%s namespace: the kernel does not offer it (enable CONFIG_%s_NS)", ns, strings.ToUpper(nsConfig(ns))))
		}
	}
	missing = append(missing, h.missingControllers()...)
	if !h.SeccompKernel {
		missing = append(missing, "seccomp: the kernel has no seccomp filtering (enable CONFIG_SECCOMP_FILTER)")
	}
	if h.SeccompLibrary == "" {
		missing = append(missing, "seccomp: this binary was built without libseccomp (rebuild with cgo and -tags seccomp: apt-get install libseccomp-dev && make build)")
	}
	return missing
}

func nsConfig(ns string) string {
	switch ns {
	case "mnt":
		return "namespaces"
	case "uts":
		return "uts"
	default:
		return ns
	}
}

func contains(list []string, s string) bool {
	for _, x := range list {
		if x == s {
			return true
		}
	}
	return false
}

// LibcontainerUsable returns an error naming everything the libcontainer
// runtime would lack on this host, or nil.
func LibcontainerUsable() error {
	missing := ProbeHost().MissingForLibcontainer()
	if len(missing) == 0 {
		return nil
	}
	return fmt.Errorf("%w: this host cannot provide the full sandbox with libcontainer: %s",
		ErrUnsupported, strings.Join(missing, "; "))
}

// ErrUnsupported marks a host that cannot provide the whole sandbox.
var ErrUnsupported = errors.New("isolation unavailable")
