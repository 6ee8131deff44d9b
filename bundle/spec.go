package bundle

import (
	"encoding/json"
	"fmt"
	"os"
	"slices"
	"strings"

	specs "github.com/opencontainers/runtime-spec/specs-go"

	"github.com/inhuman/mcp-exec/policy"
)

// step adds one concern to the spec.
type step struct {
	name  string
	apply func(s *specs.Spec, cfg Config)
}

// steps are applied in this order; later steps may rely on earlier ones.
var steps = []step{
	{"process", withProcess},
	{"root", withRoot},
	{"hostname", withHostname},
	{"namespaces", withNamespaces},
	{"mounts", withMounts},
	{"network", withNetwork},
	{"devices", withDevices},
	{"masking", withMasking},
	{"capabilities", withCapabilities},
	{"seccomp", withSeccomp},
	{"resources", withResources},
}

// Spec returns the OCI spec of one sandbox.
func Spec(cfg Config) *specs.Spec {
	s := &specs.Spec{
		Version: specs.Version,
		Process: &specs.Process{},
		Linux:   &specs.Linux{},
	}
	for _, st := range steps {
		st.apply(s, cfg)
	}
	return s
}

// Init is what the sandbox's init is told, before anything else, over its
// standard input: the runtime encodes it (runtime/initproto) and the init
// (runtime/sandboxinit) decodes it into its struct config, field for
// field. None
// of it is on the init's command line, which is only InitPath InitMarker.
type Init struct {
	// UID and GID are the code's identity.
	UID, GID uint32
	// MaxOutputBytes caps each of stdout and stderr; MaxFiles and
	// MaxFileBytes the files returned from policy.OutputsDir.
	MaxOutputBytes int64
	MaxFiles       int
	MaxFileBytes   int64
	// WorkDir is the code's working directory: input files are written
	// there, and outputs/ in it comes back.
	WorkDir string
	// Script is where the interpreter reads its code: a FIFO until the
	// call comes, then a file holding the code.
	Script string
	// Argv is the interpreter's command line, the script last.
	Argv []string
	// Rlimits are the code's per-process limits, which the init sets on
	// itself before it starts the code: lowering a limit needs no
	// privilege, while a runtime outside the sandbox's user namespace
	// cannot set them without CAP_SYS_RESOURCE.
	Rlimits []specs.POSIXRlimit
	// RelayPort, when not 0, is where the init listens on the sandbox's
	// 127.0.0.1 for the code's connections to the egress proxy.
	RelayPort int
	// CABundle, when not empty, is written read-only at CABundlePath
	// before the code starts: the certificates its TLS clients trust.
	CABundle     []byte
	CABundlePath string
}

// InitArgs is the init's command line. Everything else reaches the init
// as an Init, over its standard input.
func InitArgs() []string { return []string{InitPath, InitMarker} }

// initFor is the init's configuration of a sandbox of cfg: the code as
// policy's uid and gid, running CodePath in /tmp, with no core dumps (they
// would fill /tmp and leak memory) and a bound on open files.
func initFor(cfg Config) Init {
	lim := func(typ string, v uint64) specs.POSIXRlimit { return specs.POSIXRlimit{Type: typ, Hard: v, Soft: v} }
	in := Init{
		UID: policy.UID, GID: policy.GID,
		MaxOutputBytes: cfg.MaxOutputBytes, MaxFiles: cfg.MaxFiles, MaxFileBytes: cfg.MaxFileBytes,
		WorkDir: policy.WorkDir,
		Script:  CodePath,
		Argv:    []string{cfg.Python, CodePath},
		Rlimits: []specs.POSIXRlimit{lim("RLIMIT_CORE", 0), lim("RLIMIT_NOFILE", cfg.Limits.OpenFiles)},
	}
	if n := cfg.Network; n != nil {
		in.RelayPort, in.CABundle, in.CABundlePath = n.RelayPort, n.Trust(), CABundlePath
	}
	return in
}

// withProcess makes the init pid 1, as the container's root with the few
// capabilities it needs to start the code unprivileged, in /tmp, with the
// allowlisted environment and no way to gain privileges.
func withProcess(s *specs.Spec, cfg Config) {
	s.Process.Args = InitArgs()
	s.Process.Env = append(policy.Env(), cfg.Env...)
	s.Process.Cwd = policy.WorkDir
	s.Process.User = specs.User{UID: 0, GID: 0, AdditionalGids: []uint32{}}
	s.Process.NoNewPrivileges = true
	s.Process.Terminal = false
}

// withRoot shares the rootfs read-only.
func withRoot(s *specs.Spec, cfg Config) {
	s.Root = &specs.Root{Path: cfg.Rootfs, Readonly: true}
}

func withHostname(s *specs.Spec, _ Config) {
	s.Hostname = policy.Hostname
}

// withNamespaces gives the sandbox its own pid, ipc, uts, mount, network
// and cgroup namespaces. A new network namespace holds only lo.
func withNamespaces(s *specs.Spec, _ Config) {
	s.Linux.Namespaces = []specs.LinuxNamespace{
		{Type: specs.PIDNamespace},
		{Type: specs.IPCNamespace},
		{Type: specs.UTSNamespace},
		{Type: specs.MountNamespace},
		{Type: specs.NetworkNamespace},
		{Type: specs.CgroupNamespace},
	}
}

// withMounts adds /proc, a minimal /dev, /dev/shm, the size-limited /tmp,
// the init's own /code, the init itself, and the packages and data dirs if
// any.
// There is no /sys: nothing in it is needed.
func withMounts(s *specs.Spec, cfg Config) {
	s.Mounts = []specs.Mount{
		{Destination: "/proc", Type: "proc", Source: "proc",
			Options: []string{"nosuid", "noexec", "nodev"}},
		{Destination: "/dev", Type: "tmpfs", Source: "tmpfs",
			Options: []string{"nosuid", "noexec", "strictatime", "mode=755", "size=64k"}},
		{Destination: "/dev/shm", Type: "tmpfs", Source: "shm",
			Options: []string{"nosuid", "noexec", "nodev", "mode=1777", fmt.Sprintf("size=%d", cfg.Limits.ShmBytes)}},
		{Destination: policy.WorkDir, Type: "tmpfs", Source: "tmpfs",
			Options: []string{"nosuid", "noexec", "nodev", "mode=1777", fmt.Sprintf("size=%d", cfg.Limits.TmpfsBytes)}},
		// The init's: only it (the container's root) may write here, so
		// the script the interpreter runs is the one the call sent.
		{Destination: CodeDir, Type: "tmpfs", Source: "tmpfs",
			Options: []string{"nosuid", "noexec", "nodev", "mode=755", fmt.Sprintf("size=%d", codeDirBytes(cfg))}},
		{Destination: InitDir, Type: "bind", Source: cfg.InitDir,
			Options: []string{"bind", "ro", "nosuid", "nodev"}},
	}
	if cfg.PackagesDir != "" {
		// Read-only, nosuid and nodev all the way down: a mount below the
		// dir on the host comes in too (rbind), and a plain "ro" would
		// make only the top one read-only. Extension modules are mapped
		// executable: no noexec here.
		s.Mounts = append(s.Mounts, specs.Mount{Destination: cfg.PackagesMount, Type: "bind", Source: cfg.PackagesDir,
			Options: []string{"rbind", "ro", "nosuid", "nodev", "rro", "rnosuid", "rnodev"}})
	}
	if cfg.DataDir != "" {
		s.Mounts = append(s.Mounts, specs.Mount{Destination: policy.DataDir, Type: "bind", Source: cfg.DataDir,
			Options: policy.DataMountOptions()})
	}
}

// codeDirBytes is the size of /code: the script, and with the network on
// the CA bundle.
func codeDirBytes(cfg Config) int64 {
	n := cfg.MaxCodeBytes + 64<<10
	if cfg.Network != nil {
		n += MaxTrustBytes
	}
	return n
}

// withNetwork, with the network allowlist on, gives pip a place to install
// into: a tmpfs at SiteDir, the code's, whose pages count against the
// call's memory as /tmp's do, and as large as the memory limit (which
// bounds it first). Unlike /tmp it is not noexec: the extension modules
// of what pip installs are mapped executable (and so the code can run
// what it writes there, as it can run what it downloads into memory). The
// environment makes it pip's user base, where `pip install` puts packages
// (PIP_USER), with no cache in /tmp, and the driver puts its site dir on
// sys.path; Python's user site is on for it (PYTHONNOUSERSITE goes), so
// that the interpreters the code starts find what pip installed too.
// Python's own TLS, urllib's, requests' and pip's trust the CA bundle the
// init writes; the proxy's settings are the caller's to add (Env).
func withNetwork(s *specs.Spec, cfg Config) {
	if cfg.Network == nil {
		return
	}
	s.Mounts = append(s.Mounts, specs.Mount{Destination: SiteDir, Type: "tmpfs", Source: "tmpfs",
		Options: []string{"nosuid", "nodev", "mode=1777", fmt.Sprintf("size=%d", cfg.Limits.MemoryBytes)}})
	s.Process.Env = slices.DeleteFunc(s.Process.Env, func(kv string) bool { return strings.HasPrefix(kv, "PYTHONNOUSERSITE=") })
	s.Process.Env = append(s.Process.Env, NetworkEnv()...)
}

// NetworkEnv is what withNetwork adds to the sandbox's environment.
func NetworkEnv() []string {
	return []string{
		"PYTHONUSERBASE=" + SiteDir, "PIP_USER=1", "PIP_NO_CACHE_DIR=1", "PIP_NO_WARN_SCRIPT_LOCATION=1",
		// Debian marks its Python externally managed (PEP 668), which
		// refuses user installs too: the site dir is the sandbox's own.
		"PIP_BREAK_SYSTEM_PACKAGES=1",
		"SSL_CERT_FILE=" + CABundlePath, "REQUESTS_CA_BUNDLE=" + CABundlePath, "PIP_CERT=" + CABundlePath,
	}
}

// withDevices creates exactly policy.Devices in /dev and allows only them
// in the devices cgroup.
func withDevices(s *specs.Spec, _ Config) {
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

func withMasking(s *specs.Spec, _ Config) {
	s.Linux.MaskedPaths = policy.MaskedPaths()
	s.Linux.ReadonlyPaths = policy.ReadonlyPaths()
}

// withCapabilities gives the init what policy allows it; the init starts
// the code with all five sets empty (policy.Capabilities).
func withCapabilities(s *specs.Spec, cfg Config) {
	s.Process.Capabilities = policy.InitCapabilities()
	if cfg.Template {
		s.Process.Capabilities = policy.TemplateCapabilities()
	}
}

func withSeccomp(s *specs.Spec, cfg Config) {
	s.Linux.Seccomp = policy.Seccomp()
	if cfg.Template {
		s.Linux.Seccomp = policy.TemplateSeccomp()
	}
}

// withResources sets the cgroup limits. Swap equals the memory limit, which
// in cgroup terms means no swap at all: the limit is the limit. Socket
// buffers are bounded too: on cgroup v2 the memory controller charges them
// to memory.current; on v1 they are charged to a separate counter, bounded
// by KernelTCP (memory.kmem.tcp.limit_in_bytes, which the runtimes set
// themselves, as libcontainer no longer does).
func withResources(s *specs.Spec, cfg Config) {
	r := ensureResources(s.Linux.Resources)
	mem := cfg.Limits.MemoryBytes
	swap := cfg.Limits.MemoryBytes
	tcp := cfg.Limits.SocketBytes()
	r.Memory = &specs.LinuxMemory{Limit: &mem, Swap: &swap, KernelTCP: &tcp}
	pids := cfg.Limits.Pids
	r.Pids = &specs.LinuxPids{Limit: &pids}
	quota := cfg.Limits.CPUQuotaUs()
	period := uint64(policy.CPUPeriodUs)
	r.CPU = &specs.LinuxCPU{Quota: &quota, Period: &period}
	if cfg.Ahead {
		shares := uint64(policy.CPUSharesPreparing)
		r.CPU.Shares = &shares
	}
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
