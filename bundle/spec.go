package bundle

import (
	"encoding/json"
	"fmt"
	"os"

	specs "github.com/opencontainers/runtime-spec/specs-go"

	"github.com/inhuman/mcp-exec/policy"
)

// step adds one concern to the spec.
type step struct {
	name  string
	apply func(s *specs.Spec, cfg Config, codeDir string)
}

// steps are applied in this order; later steps may rely on earlier ones.
var steps = []step{
	{"process", withProcess},
	{"root", withRoot},
	{"hostname", withHostname},
	{"namespaces", withNamespaces},
	{"mounts", withMounts},
	{"devices", withDevices},
	{"masking", withMasking},
	{"capabilities", withCapabilities},
	{"rlimits", withRlimits},
	{"seccomp", withSeccomp},
	{"resources", withResources},
}

// Spec returns the OCI spec of one sandbox whose code is in codeDir on the
// host.
func Spec(cfg Config, codeDir string) *specs.Spec {
	s := &specs.Spec{
		Version: specs.Version,
		Process: &specs.Process{},
		Linux:   &specs.Linux{},
	}
	for _, st := range steps {
		st.apply(s, cfg, codeDir)
	}
	return s
}

// withProcess runs the code file as __main__, under a small init (see
// initScript), as the unprivileged user, in /tmp, with the allowlisted
// environment and no way to gain privileges.
func withProcess(s *specs.Spec, cfg Config, _ string) {
	s.Process.Args = []string{cfg.Python, "-I", "-S", "-c", initScript}
	s.Process.Env = policy.Env()
	s.Process.Cwd = "/tmp"
	s.Process.User = specs.User{UID: policy.UID, GID: policy.GID, AdditionalGids: []uint32{}}
	s.Process.NoNewPrivileges = true
	s.Process.Terminal = false
}

// withRoot shares the rootfs read-only.
func withRoot(s *specs.Spec, cfg Config, _ string) {
	s.Root = &specs.Root{Path: cfg.Rootfs, Readonly: true}
}

func withHostname(s *specs.Spec, _ Config, _ string) {
	s.Hostname = policy.Hostname
}

// withNamespaces gives the sandbox its own pid, ipc, uts, mount, network
// and cgroup namespaces. A new network namespace holds only lo.
func withNamespaces(s *specs.Spec, _ Config, _ string) {
	s.Linux.Namespaces = []specs.LinuxNamespace{
		{Type: specs.PIDNamespace},
		{Type: specs.IPCNamespace},
		{Type: specs.UTSNamespace},
		{Type: specs.MountNamespace},
		{Type: specs.NetworkNamespace},
		{Type: specs.CgroupNamespace},
	}
}

// withMounts adds /proc, a minimal /dev, /dev/shm, the size-limited /tmp
// and the read-only code dir. There is no /sys: nothing in it is needed.
func withMounts(s *specs.Spec, cfg Config, codeDir string) {
	s.Mounts = []specs.Mount{
		{Destination: "/proc", Type: "proc", Source: "proc",
			Options: []string{"nosuid", "noexec", "nodev"}},
		{Destination: "/dev", Type: "tmpfs", Source: "tmpfs",
			Options: []string{"nosuid", "noexec", "strictatime", "mode=755", "size=64k"}},
		{Destination: "/dev/shm", Type: "tmpfs", Source: "shm",
			Options: []string{"nosuid", "noexec", "nodev", "mode=1777", fmt.Sprintf("size=%d", cfg.Limits.ShmBytes)}},
		{Destination: "/tmp", Type: "tmpfs", Source: "tmpfs",
			Options: []string{"nosuid", "noexec", "nodev", "mode=1777", fmt.Sprintf("size=%d", cfg.Limits.TmpfsBytes)}},
		{Destination: CodeDir, Type: "bind", Source: codeDir,
			Options: []string{"bind", "ro", "nosuid", "noexec", "nodev"}},
	}
}

// withDevices creates exactly policy.Devices in /dev and allows only them
// in the devices cgroup.
func withDevices(s *specs.Spec, _ Config, _ string) {
	var zero uint32
	s.Linux.Resources = ensureResources(s.Linux.Resources)
	s.Linux.Resources.Devices = []specs.LinuxDeviceCgroup{{Allow: false, Access: "rwm"}}
	for _, d := range policy.Devices() {
		fm := os.FileMode(0o666)
		major, minor := d.Major, d.Minor
		s.Linux.Devices = append(s.Linux.Devices, specs.LinuxDevice{
			Path: d.Path, Type: "c", Major: major, Minor: minor,
			FileMode: &fm, UID: &zero, GID: &zero,
		})
		s.Linux.Resources.Devices = append(s.Linux.Resources.Devices, specs.LinuxDeviceCgroup{
			Allow: true, Type: "c", Major: &major, Minor: &minor, Access: "rwm",
		})
	}
}

func withMasking(s *specs.Spec, _ Config, _ string) {
	s.Linux.MaskedPaths = policy.MaskedPaths()
	s.Linux.ReadonlyPaths = policy.ReadonlyPaths()
}

func withCapabilities(s *specs.Spec, _ Config, _ string) {
	s.Process.Capabilities = policy.Capabilities()
}

// withRlimits: no core dumps (they would fill /tmp and leak memory), and a
// bound on open files per process.
func withRlimits(s *specs.Spec, cfg Config, _ string) {
	s.Process.Rlimits = []specs.POSIXRlimit{
		{Type: "RLIMIT_CORE", Hard: 0, Soft: 0},
		{Type: "RLIMIT_NOFILE", Hard: cfg.Limits.OpenFiles, Soft: cfg.Limits.OpenFiles},
	}
}

func withSeccomp(s *specs.Spec, _ Config, _ string) {
	s.Linux.Seccomp = policy.Seccomp()
}

// withResources sets the cgroup limits. Swap equals the memory limit, which
// in cgroup terms means no swap at all: the limit is the limit.
func withResources(s *specs.Spec, cfg Config, _ string) {
	r := ensureResources(s.Linux.Resources)
	mem := cfg.Limits.MemoryBytes
	swap := cfg.Limits.MemoryBytes
	r.Memory = &specs.LinuxMemory{Limit: &mem, Swap: &swap}
	pids := cfg.Limits.Pids
	r.Pids = &specs.LinuxPids{Limit: &pids}
	quota := cfg.Limits.CPUQuotaUs()
	period := uint64(policy.CPUPeriodUs)
	r.CPU = &specs.LinuxCPU{Quota: &quota, Period: &period}
	s.Linux.Resources = r
}

func ensureResources(r *specs.LinuxResources) *specs.LinuxResources {
	if r == nil {
		return &specs.LinuxResources{}
	}
	return r
}

func jsonMarshal(s *specs.Spec) ([]byte, error) {
	return json.MarshalIndent(s, "", "\t")
}
