package runtime

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
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
	var missing []string
	if h.EUID != 0 {
		missing = append(missing, "root: the libcontainer runtime creates namespaces and cgroups and needs uid 0 "+
			"(run mcp-exec as root, or use MCP_EXEC_RUNTIME=runsc where it is supported)")
	}
	for _, ns := range requiredNamespaces {
		if !contains(h.Namespaces, ns) {
			missing = append(missing, fmt.Sprintf("%s namespace: the kernel does not offer it (enable CONFIG_%s_NS)", ns, strings.ToUpper(nsConfig(ns))))
		}
	}
	for _, c := range requiredControllers {
		if !contains(h.CgroupControllers, c) {
			missing = append(missing, fmt.Sprintf("cgroup controller %q: not available (%s); mount it, or on cgroup v2 enable it in the parent's cgroup.subtree_control", c, h.CgroupVersion))
		}
	}
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
