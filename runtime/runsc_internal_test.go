package runtime

import (
	"encoding/json"
	"slices"
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
