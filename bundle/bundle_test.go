package bundle

import (
	"encoding/json"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	specs "github.com/opencontainers/runtime-spec/specs-go"

	"github.com/inhuman/mcp-exec/policy"
)

func testConfig() Config {
	return Config{Rootfs: "/var/cache/rootfs", Python: "/usr/bin/python3", Limits: policy.DefaultLimits()}
}

// applyStep runs one named step on a fresh spec.
func applyStep(t *testing.T, name string) *specs.Spec {
	t.Helper()
	s := &specs.Spec{Process: &specs.Process{}, Linux: &specs.Linux{}}
	for _, st := range steps {
		if st.name == name {
			st.apply(s, testConfig(), "/bundle/code")
			return s
		}
	}
	t.Fatalf("no step %q", name)
	return nil
}

func TestStepProcess(t *testing.T) {
	p := applyStep(t, "process").Process
	if want := []string{"/usr/bin/python3", "-I", "-S", "-c", initScript}; !slices.Equal(p.Args, want) {
		t.Errorf("Args = %v, want %v (the fixed init; the code only as a file)", p.Args, want)
	}
	if p.Cwd != "/tmp" {
		t.Errorf("Cwd = %q, want /tmp", p.Cwd)
	}
	if p.User.UID != policy.UID || p.User.GID != policy.GID || len(p.User.AdditionalGids) != 0 {
		t.Errorf("User = %+v, want %d:%d without extra groups", p.User, policy.UID, policy.GID)
	}
	if !p.NoNewPrivileges {
		t.Error("NoNewPrivileges = false")
	}
	if !slices.Equal(p.Env, policy.Env()) {
		t.Errorf("Env = %v, want policy.Env()", p.Env)
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
		{CodeDir, "bind", []string{"ro", "nosuid", "noexec", "nodev"}},
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
	if mounts[CodeDir].Source != "/bundle/code" {
		t.Errorf("code mount source = %q, want the bundle's code dir", mounts[CodeDir].Source)
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

func TestStepMaskingCapabilitiesSeccompRlimits(t *testing.T) {
	if s := applyStep(t, "masking"); !slices.Contains(s.Linux.MaskedPaths, "/proc/kcore") || !slices.Contains(s.Linux.ReadonlyPaths, "/proc/sys") {
		t.Errorf("masking = %v / %v", s.Linux.MaskedPaths, s.Linux.ReadonlyPaths)
	}
	if c := applyStep(t, "capabilities").Process.Capabilities; c == nil || len(c.Bounding)+len(c.Effective)+len(c.Permitted)+len(c.Inheritable)+len(c.Ambient) != 0 {
		t.Errorf("capabilities = %+v, want all five sets empty", c)
	}
	if s := applyStep(t, "seccomp").Linux.Seccomp; s == nil || s.DefaultAction != specs.ActErrno {
		t.Errorf("seccomp = %+v, want the policy filter", s)
	}
	rl := map[string]uint64{}
	for _, r := range applyStep(t, "rlimits").Process.Rlimits {
		if r.Soft != r.Hard {
			t.Errorf("rlimit %s soft %d != hard %d", r.Type, r.Soft, r.Hard)
		}
		rl[r.Type] = r.Hard
	}
	if v, ok := rl["RLIMIT_CORE"]; !ok || v != 0 {
		t.Errorf("RLIMIT_CORE = %d (set %v), want 0", v, ok)
	}
	if rl["RLIMIT_NOFILE"] != policy.DefaultLimits().OpenFiles {
		t.Errorf("RLIMIT_NOFILE = %d", rl["RLIMIT_NOFILE"])
	}
}

func TestStepResources(t *testing.T) {
	r := applyStep(t, "resources").Linux.Resources
	lim := policy.DefaultLimits()
	if r.Memory == nil || *r.Memory.Limit != lim.MemoryBytes || *r.Memory.Swap != lim.MemoryBytes {
		t.Errorf("memory = %+v, want limit %d with swap equal (no swap)", r.Memory, lim.MemoryBytes)
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
	b, err := New(parent, testConfig(), Input{ID: "call-1", Code: []byte("print(1)")})
	if err != nil {
		t.Fatal(err)
	}
	if fi, err := os.Stat(b.Dir); err != nil || fi.Mode().Perm() != 0o700 {
		t.Errorf("bundle dir mode = %v (%v), want 0700", fi.Mode().Perm(), err)
	}
	code := filepath.Join(b.Dir, "code", "main.py")
	if data, err := os.ReadFile(code); err != nil || string(data) != "print(1)" {
		t.Errorf("code file = %q, %v", data, err)
	}
	if fi, _ := os.Stat(code); fi.Mode().Perm() != 0o444 {
		t.Errorf("code file mode = %v, want 0444", fi.Mode().Perm())
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
		{"relative rootfs", Config{Rootfs: "rootfs", Python: "/usr/bin/python3", Limits: policy.DefaultLimits()}, "a", "rootfs path must be absolute"},
		{"bad limits", Config{Rootfs: "/r", Python: "/usr/bin/python3"}, "b", "memory limit"},
		{"id with slash", testConfig(), "../x", "invalid bundle id"},
		{"empty id", testConfig(), "", "invalid bundle id"},
	} {
		_, err := New(parent, tc.cfg, Input{ID: tc.id, Code: []byte("1")})
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("New(%s) = %v, want an error containing %q", tc.name, err, tc.want)
		}
	}
	if entries, _ := os.ReadDir(parent); len(entries) != 0 {
		t.Errorf("failed New left %d entries behind", len(entries))
	}
}
