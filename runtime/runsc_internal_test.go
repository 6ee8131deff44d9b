package runtime

import (
	"encoding/json"
	"slices"
	"strings"
	"testing"

	specs "github.com/opencontainers/runtime-spec/specs-go"
	"golang.org/x/sys/unix"

	"github.com/inhuman/mcp-exec/policy"
)

func TestGvisorSeccomp(t *testing.T) {
	in := policy.Seccomp()
	before, _ := json.Marshal(in)
	out := gvisorSeccomp(in, map[string]bool{"clone3": true, "kexec_file_load": true})
	after, _ := json.Marshal(in)
	if string(before) != string(after) {
		t.Fatalf("gvisorSeccomp modified its input")
	}
	if out.DefaultAction != in.DefaultAction || *out.DefaultErrnoRet != *in.DefaultErrnoRet {
		t.Errorf("gvisorSeccomp: default %v/%d, want %v/%d", out.DefaultAction, *out.DefaultErrnoRet, in.DefaultAction, *in.DefaultErrnoRet)
	}
	action := func(s *specs.LinuxSeccomp, name string) []specs.LinuxSeccompAction {
		var acts []specs.LinuxSeccompAction
		for _, r := range s.Syscalls {
			if slices.Contains(r.Names, name) {
				acts = append(acts, r.Action)
			}
		}
		return acts
	}
	// clone3: ERRNO(ENOSYS) becomes an allow, since gVisor answers ENOSYS.
	if got := action(out, "clone3"); !slices.Equal(got, []specs.LinuxSeccompAction{specs.ActAllow}) {
		t.Errorf("clone3: actions %v, want [allow] when gVisor does not implement it", got)
	}
	// An EPERM denial stays a denial even if gVisor lacks the syscall.
	if got := action(out, "kexec_file_load"); !slices.Equal(got, action(in, "kexec_file_load")) {
		t.Errorf("kexec_file_load: actions %v, want %v unchanged", got, action(in, "kexec_file_load"))
	}
	// Where gVisor implements the syscall, the ENOSYS rule is kept.
	kept := gvisorSeccomp(in, map[string]bool{})
	for _, r := range kept.Syscalls {
		if slices.Contains(r.Names, "clone3") && (r.Action != specs.ActErrno || r.ErrnoRet == nil || *r.ErrnoRet != uint(unix.ENOSYS)) {
			t.Errorf("clone3 with gVisor implementing it: %+v, want ERRNO(ENOSYS) kept", r)
		}
	}
	// Everything else is passed through in order.
	var inOther, outOther []string
	for _, r := range in.Syscalls {
		if !slices.Contains(r.Names, "clone3") {
			b, _ := json.Marshal(r)
			inOther = append(inOther, string(b))
		}
	}
	for _, r := range out.Syscalls {
		if !slices.Contains(r.Names, "clone3") {
			b, _ := json.Marshal(r)
			outOther = append(outOther, string(b))
		}
	}
	if !slices.Equal(inOther, outOther) {
		t.Errorf("gvisorSeccomp changed rules other than clone3")
	}
}

func TestChoosePlatform(t *testing.T) {
	for _, tc := range []struct {
		want string
		have []string
		got  string
		err  string
	}{
		{"", []string{"kvm", "ptrace"}, "ptrace", ""},
		{"", []string{"kvm", "ptrace", "systrap"}, "systrap", ""},
		{"", []string{"kvm"}, "", "kvm is used only when asked for"},
		{"", nil, "ptrace", ""},
		{"kvm", []string{"kvm", "ptrace"}, "kvm", ""},
		{"systrap", []string{"kvm", "ptrace"}, "", "offers only kvm, ptrace"},
	} {
		got, _, err := choosePlatform(tc.want, tc.have)
		if got != tc.got || (tc.err == "") != (err == nil) || (err != nil && !strings.Contains(err.Error(), tc.err)) {
			t.Errorf("choosePlatform(%q, %v) = %q, %v; want %q, error containing %q", tc.want, tc.have, got, err, tc.got, tc.err)
		}
	}
}

func TestMissingPrivileges(t *testing.T) {
	all := capNames(1<<41 - 1)
	root := Host{EUID: 0, InitialUserNS: true, UIDMap: "0 0 4294967295", Capabilities: all,
		CgroupControllers: []string{"memory", "pids", "cpu"}, CgroupWritable: []string{"memory", "pids", "cpu"}}
	for _, tc := range []struct {
		name string
		edit func(*Host)
		kind Kind
		want []string // substrings of the joined messages; none means no message
	}{
		{"root", func(*Host) {}, Libcontainer, nil},
		{"root runsc", func(*Host) {}, Runsc, nil},
		{"non-root", func(h *Host) { h.EUID = 65532; h.Capabilities = nil; h.CgroupWritable = nil }, Runsc,
			[]string{"root: mcp-exec runs as uid 65532", "docker run --user 0:0", "runAsUser: 0"}},
		{"userns root", func(h *Host) { h.InitialUserNS = false; h.UIDMap = "0 1000 1" }, Libcontainer,
			[]string{`real root: mcp-exec is uid 0 only inside a user namespace (uid_map "0 1000 1")`, "hostUsers: false"}},
		{"no SETPCAP", func(h *Host) {
			h.Capabilities = slices.DeleteFunc(slices.Clone(all), func(c string) bool { return c == "CAP_SETPCAP" })
		},
			Libcontainer, []string{"capabilities: CAP_SETPCAP missing", "bounding set"}},
		{"no SETPCAP runsc", func(h *Host) {
			h.Capabilities = slices.DeleteFunc(slices.Clone(all), func(c string) bool { return c == "CAP_SETPCAP" })
		},
			Runsc, nil},
		{"ro cgroup", func(h *Host) { h.CgroupWritable = []string{"pids", "cpu"} }, Runsc,
			[]string{`writable cgroup "memory"`, "MCP_EXEC_MEMORY_MB", "/sys/fs/cgroup:rw"}},
	} {
		h := root
		tc.edit(&h)
		got := strings.Join(h.missingPrivileges(tc.kind), "\n")
		if len(tc.want) == 0 && got != "" {
			t.Errorf("%s: missingPrivileges(%s) = %q, want nothing", tc.name, tc.kind, got)
		}
		for _, w := range tc.want {
			if !strings.Contains(got, w) {
				t.Errorf("%s: missingPrivileges(%s) = %q, want it to contain %q", tc.name, tc.kind, got, w)
			}
		}
	}
}
