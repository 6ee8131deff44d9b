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
	out := gvisorSeccomp(in)
	after, _ := json.Marshal(in)
	if string(before) != string(after) {
		t.Fatalf("gvisorSeccomp modified its input")
	}
	if out.DefaultAction != in.DefaultAction || *out.DefaultErrnoRet != *in.DefaultErrnoRet {
		t.Errorf("gvisorSeccomp: default %v/%d, want %v/%d", out.DefaultAction, *out.DefaultErrnoRet, in.DefaultAction, *in.DefaultErrnoRet)
	}
	if len(out.Syscalls) != len(in.Syscalls) {
		t.Fatalf("gvisorSeccomp: %d rules, want the %d of the policy", len(out.Syscalls), len(in.Syscalls))
	}
	sawNosys := false
	for i, r := range in.Syscalls {
		o := out.Syscalls[i]
		if r.Action == specs.ActErrno && r.ErrnoRet != nil && *r.ErrnoRet != uint(unix.EPERM) {
			// runsc would answer EPERM: an allow, which the init's exact
			// filter overrides in the code.
			sawNosys = sawNosys || slices.Contains(r.Names, "clone3")
			if o.Action != specs.ActAllow || !slices.Equal(o.Names, r.Names) {
				t.Errorf("rule %d (%v → errno %d): %+v, want an allow of the same names", i, r.Names, *r.ErrnoRet, o)
			}
			continue
		}
		b, _ := json.Marshal(r)
		c, _ := json.Marshal(o)
		if string(b) != string(c) {
			t.Errorf("rule %d changed: %s → %s, want it passed through", i, b, c)
		}
	}
	if !sawNosys {
		t.Errorf("the policy has no clone3 → ENOSYS rule: this test no longer checks the translation")
	}
}

// TestRunscExactSeccompCached: every call of a server has the same
// section, compiled once.
func TestRunscExactSeccompCached(t *testing.T) {
	r := &RunscRuntime{}
	a, err := r.filters.compile(policy.Seccomp())
	if err != nil {
		t.Fatal(err)
	}
	b, err := r.filters.compile(policy.Seccomp())
	if err != nil {
		t.Fatal(err)
	}
	if len(a) == 0 || len(a)%8 != 0 || &a[0] != &b[0] {
		t.Errorf("filters.compile: %d bytes, cached %v; want one compiled program", len(a), &a[0] == &b[0])
	}
}
