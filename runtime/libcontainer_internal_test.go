package runtime

import (
	"bytes"
	"slices"
	"testing"

	specs "github.com/opencontainers/runtime-spec/specs-go"
	"golang.org/x/sys/unix"
)

func TestProcessFromSpec(t *testing.T) {
	p := &specs.Process{
		Args: []string{"/usr/bin/python3", "/code/main.py"},
		Env:  []string{"A=1"},
		Cwd:  "/tmp",
		User: specs.User{UID: 65532, GID: 65533},
		Capabilities: &specs.LinuxCapabilities{
			Bounding: []string{}, Effective: []string{}, Inheritable: []string{}, Permitted: []string{}, Ambient: []string{},
		},
		NoNewPrivileges: true,
		Rlimits:         []specs.POSIXRlimit{{Type: "RLIMIT_CORE"}, {Type: "RLIMIT_NOFILE", Hard: 64, Soft: 32}},
	}
	lp, err := processFromSpec(p)
	if err != nil {
		t.Fatal(err)
	}
	if lp.UID != 65532 || lp.GID != 65533 {
		t.Errorf("processFromSpec: UID/GID = %d/%d, want 65532/65533 (zero would be root)", lp.UID, lp.GID)
	}
	if len(lp.AdditionalGroups) != 0 {
		t.Errorf("AdditionalGroups = %v, want none", lp.AdditionalGroups)
	}
	if !slices.Equal(lp.Args, p.Args) || !slices.Equal(lp.Env, p.Env) || lp.Cwd != "/tmp" || !lp.Init {
		t.Errorf("processFromSpec: args %v env %v cwd %q init %v", lp.Args, lp.Env, lp.Cwd, lp.Init)
	}
	if lp.NoNewPrivileges == nil || !*lp.NoNewPrivileges {
		t.Error("NoNewPrivileges not carried over")
	}
	c := lp.Capabilities
	if c == nil || c.Bounding == nil || len(c.Bounding)+len(c.Effective)+len(c.Permitted)+len(c.Inheritable)+len(c.Ambient) != 0 {
		t.Errorf("Capabilities = %+v, want five empty sets (nil would inherit the container's)", c)
	}
	if len(lp.Rlimits) != 2 || lp.Rlimits[0].Type != unix.RLIMIT_CORE || lp.Rlimits[1].Type != unix.RLIMIT_NOFILE || lp.Rlimits[1].Soft != 32 {
		t.Errorf("Rlimits = %+v", lp.Rlimits)
	}
	p.Rlimits = []specs.POSIXRlimit{{Type: "RLIMIT_BOGUS"}}
	if _, err := processFromSpec(p); err == nil {
		t.Error("unknown rlimit accepted")
	}
}

func TestCappedBuffer(t *testing.T) {
	c := newCappedBuffer(5)
	for _, s := range []string{"ab", "cdef", "ghij"} {
		if n, err := c.Write([]byte(s)); n != len(s) || err != nil {
			t.Fatalf("Write(%q) = %d, %v; want %d, nil (never short, never failing)", s, n, err, len(s))
		}
	}
	got, truncated, total := c.result()
	if !bytes.Equal(got, []byte("abcde")) || !truncated || total != 10 {
		t.Errorf("result() = %q, %v, %d; want \"abcde\", true, 10", got, truncated, total)
	}
	c = newCappedBuffer(5)
	c.Write([]byte("abcde"))
	if _, truncated, _ := c.result(); truncated {
		t.Error("exactly the cap reported as truncated")
	}
}
