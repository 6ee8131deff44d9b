package bundle

import (
	"encoding/json"
	"os"
	"reflect"
	"slices"
	"strings"
	"testing"

	specs "github.com/opencontainers/runtime-spec/specs-go"

	"github.com/inhuman/mcp-exec/policy"
)

func testConfig() Config {
	return Config{Rootfs: "/var/cache/rootfs", Python: "/usr/bin/python3", Limits: policy.DefaultLimits(),
		InitDir: "/run/mcp-exec/x/init", CallCaps: policy.DefaultCallCaps()}
}

// applyStep runs one named step on a fresh spec.
func applyStep(t *testing.T, name string) *specs.Spec {
	t.Helper()
	s := &specs.Spec{Process: &specs.Process{}, Linux: &specs.Linux{}}
	for _, st := range steps {
		if st.name == name {
			st.apply(s, testConfig())
			return s
		}
	}
	t.Fatalf("no step %q", name)
	return nil
}

func TestStepProcess(t *testing.T) {
	p := applyStep(t, "process").Process
	if want := []string{InitPath, InitMarker}; !slices.Equal(p.Args, want) {
		t.Errorf("Args = %v, want %v (the fixed init; its configuration, and the code, never on argv)", p.Args, want)
	}
	if p.Cwd != "/tmp" {
		t.Errorf("Cwd = %q, want /tmp", p.Cwd)
	}
	// The init is the container's root, the code UID: the init switches.
	if p.User.UID != 0 || p.User.GID != 0 || len(p.User.AdditionalGids) != 0 {
		t.Errorf("User = %+v, want the container's root without extra groups", p.User)
	}
	if !p.NoNewPrivileges {
		t.Error("NoNewPrivileges = false")
	}
	if !slices.Equal(p.Env, policy.Env()) {
		t.Errorf("Env = %v, want policy.Env()", p.Env)
	}
}

// The init's configuration: the code as policy's identity, running the
// script in /tmp, with the configured caps and no core dumps.
func TestInitConfig(t *testing.T) {
	got := initFor(testConfig())
	want := Init{UID: policy.UID, GID: policy.GID, MaxOutputBytes: 1 << 20, MaxFiles: 20, MaxFileBytes: 10 << 20,
		WorkDir: "/tmp", Script: CodePath, Argv: []string{"/usr/bin/python3", CodePath},
		Rlimits: []specs.POSIXRlimit{{Type: "RLIMIT_CORE"}, {Type: "RLIMIT_NOFILE", Hard: 1024, Soft: 1024}}}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("initFor() = %+v, want %+v", got, want)
	}
}

func TestStepRoot(t *testing.T) {
	r := applyStep(t, "root").Root
	if r.Path != "/var/cache/rootfs" || !r.Readonly {
		t.Errorf("Root = %+v, want the rootfs, read-only", r)
	}
}

func TestStepNamespaces(t *testing.T) {
	var got []specs.LinuxNamespaceType
	for _, ns := range applyStep(t, "namespaces").Linux.Namespaces {
		if ns.Path != "" {
			t.Errorf("namespace %s joins %s, want a new one", ns.Type, ns.Path)
		}
		got = append(got, ns.Type)
	}
	for _, want := range []specs.LinuxNamespaceType{specs.PIDNamespace, specs.IPCNamespace, specs.UTSNamespace,
		specs.MountNamespace, specs.NetworkNamespace, specs.CgroupNamespace} {
		if !slices.Contains(got, want) {
			t.Errorf("namespaces %v lack %s", got, want)
		}
	}
}

func TestStepMounts(t *testing.T) {
	mounts := map[string]specs.Mount{}
	for _, m := range applyStep(t, "mounts").Mounts {
		mounts[m.Destination] = m
	}
	lim := policy.DefaultLimits()
	for _, tc := range []struct {
		dest, typ string
		opts      []string
	}{
		{"/proc", "proc", []string{"nosuid", "noexec", "nodev"}},
		{"/dev", "tmpfs", []string{"nosuid", "noexec"}},
		{"/dev/shm", "tmpfs", []string{"nosuid", "noexec", "nodev"}},
		{"/tmp", "tmpfs", []string{"nosuid", "noexec", "nodev", "size=" + itoa(lim.TmpfsBytes)}},
		{CodeDir, "tmpfs", []string{"nosuid", "noexec", "nodev", "mode=755"}},
		{InitDir, "bind", []string{"ro", "nosuid", "nodev"}},
	} {
		m, ok := mounts[tc.dest]
		if !ok {
			t.Errorf("no mount at %s", tc.dest)
			continue
		}
		if m.Type != tc.typ {
			t.Errorf("%s: type %q, want %q", tc.dest, m.Type, tc.typ)
		}
		for _, o := range tc.opts {
			if !slices.Contains(m.Options, o) {
				t.Errorf("%s: options %v lack %q", tc.dest, m.Options, o)
			}
		}
	}
	if mounts[InitDir].Source != "/run/mcp-exec/x/init" || slices.Contains(mounts[InitDir].Options, "noexec") {
		t.Errorf("init mount = %+v, want the init dir, executable", mounts[InitDir])
	}
	if _, ok := mounts["/sys"]; ok {
		t.Error("/sys is mounted; nothing in it is needed")
	}
}

func itoa(n int64) string { b, _ := json.Marshal(n); return string(b) }

func TestStepDevices(t *testing.T) {
	s := applyStep(t, "devices")
	var paths []string
	for _, d := range s.Linux.Devices {
		paths = append(paths, d.Path)
	}
	if want := []string{"/dev/null", "/dev/zero", "/dev/full", "/dev/random", "/dev/urandom", "/dev/tty"}; !slices.Equal(paths, want) {
		t.Errorf("devices = %v, want %v", paths, want)
	}
	if r := s.Linux.Resources.Devices; len(r) == 0 || r[0].Allow || r[0].Access != "rwm" {
		t.Errorf("device cgroup rules start with %+v, want deny all", r)
	}
}

func TestStepMaskingCapabilitiesSeccomp(t *testing.T) {
	if s := applyStep(t, "masking"); !slices.Contains(s.Linux.MaskedPaths, "/proc/kcore") || !slices.Contains(s.Linux.MaskedPaths, "/proc/cmdline") ||
		!slices.Contains(s.Linux.ReadonlyPaths, "/proc/sys") {
		t.Errorf("masking = %v / %v", s.Linux.MaskedPaths, s.Linux.ReadonlyPaths)
	}
	if c := applyStep(t, "capabilities").Process.Capabilities; c == nil || !slices.Equal(c.Effective, policy.InitCapabilities().Effective) ||
		len(c.Inheritable)+len(c.Ambient) != 0 {
		t.Errorf("capabilities = %+v, want the init's (policy.InitCapabilities)", c)
	}
	if s := applyStep(t, "seccomp").Linux.Seccomp; s == nil || s.DefaultAction != specs.ActErrno {
		t.Errorf("seccomp = %+v, want the policy filter", s)
	}
	if r := applyStep(t, "process").Process.Rlimits; len(r) != 0 {
		t.Errorf("rlimits = %v in the spec, want them on the init's command line (the init sets them)", r)
	}
}

func TestStepResources(t *testing.T) {
	r := applyStep(t, "resources").Linux.Resources
	lim := policy.DefaultLimits()
	if r.Memory == nil || *r.Memory.Limit != lim.MemoryBytes || *r.Memory.Swap != lim.MemoryBytes {
		t.Errorf("memory = %+v, want limit %d with swap equal (no swap)", r.Memory, lim.MemoryBytes)
	}
	if r.Memory == nil || r.Memory.KernelTCP == nil || *r.Memory.KernelTCP != lim.SocketBytes() { //nolint:staticcheck // the runtimes apply it
		t.Errorf("memory = %+v, want socket buffers bounded by %d", r.Memory, lim.SocketBytes())
	}
	if r.Pids == nil || *r.Pids.Limit != lim.Pids {
		t.Errorf("pids = %+v, want %d", r.Pids, lim.Pids)
	}
	if r.CPU == nil || *r.CPU.Quota != lim.CPUQuotaUs() || *r.CPU.Period != policy.CPUPeriodUs {
		t.Errorf("cpu = %+v, want quota %d per %d", r.CPU, lim.CPUQuotaUs(), policy.CPUPeriodUs)
	}
}

func TestNewWritesBundle(t *testing.T) {
	parent := t.TempDir()
	b, err := New(parent, testConfig(), "call-1")
	if err != nil {
		t.Fatal(err)
	}
	if fi, err := os.Stat(b.Dir); err != nil || fi.Mode().Perm() != 0o700 {
		t.Errorf("bundle dir mode = %v (%v), want 0700", fi.Mode().Perm(), err)
	}
	if entries, _ := os.ReadDir(b.Dir); len(entries) != 0 {
		t.Errorf("new bundle dir holds %d entries, want none (the spec is written by a runtime that reads it)", len(entries))
	}
	if err := b.WriteSpec(); err != nil {
		t.Fatal(err)
	}
	if entries, _ := os.ReadDir(b.Dir); len(entries) != 1 {
		t.Errorf("bundle dir holds %d entries, want config.json only (the code comes through the init)", len(entries))
	}
	var spec specs.Spec
	data, _ := os.ReadFile(b.ConfigPath())
	if err := json.Unmarshal(data, &spec); err != nil || spec.Version != specs.Version || spec.Root.Path != "/var/cache/rootfs" {
		t.Errorf("config.json = %s (%v)", data, err)
	}
	if err := b.Remove(); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(b.Dir); !os.IsNotExist(err) {
		t.Errorf("bundle dir still exists after Remove")
	}
}

func TestNewRejectsBadInput(t *testing.T) {
	parent := t.TempDir()
	for _, tc := range []struct {
		name string
		cfg  Config
		id   string
		want string
	}{
		{"relative rootfs", func() Config { c := testConfig(); c.Rootfs = "rootfs"; return c }(), "a", "rootfs path must be absolute"},
		{"bad limits", func() Config { c := testConfig(); c.Limits = policy.Limits{}; return c }(), "b", "memory limit"},
		{"env outside the allowlist", func() Config { c := testConfig(); c.Env = []string{"MCP_EXEC_AUTH_TOKEN=x"}; return c }(), "c", "allowlist"},
		{"id with slash", testConfig(), "../x", "invalid bundle id"},
		{"empty id", testConfig(), "", "invalid bundle id"},
	} {
		_, err := New(parent, tc.cfg, tc.id)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("New(%s) = %v, want an error containing %q", tc.name, err, tc.want)
		}
	}
	if entries, _ := os.ReadDir(parent); len(entries) != 0 {
		t.Errorf("failed New left %d entries behind", len(entries))
	}
}
