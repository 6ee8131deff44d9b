package policy

import (
	"math"
	"slices"
	"strings"
	"testing"

	specs "github.com/opencontainers/runtime-spec/specs-go"
	"golang.org/x/sys/unix"
)

func TestCapabilitiesAllEmpty(t *testing.T) {
	c := Capabilities()
	for name, set := range map[string][]string{
		"bounding": c.Bounding, "effective": c.Effective, "inheritable": c.Inheritable,
		"permitted": c.Permitted, "ambient": c.Ambient,
	} {
		if set == nil || len(set) != 0 {
			t.Errorf("Capabilities(): %s = %v, want an empty, non-nil set", name, set)
		}
	}
}

func TestFreshValues(t *testing.T) {
	a := MaskedPaths()
	a[0] = "changed"
	if MaskedPaths()[0] == "changed" {
		t.Error("MaskedPaths returns a shared slice")
	}
	s := Seccomp()
	s.Syscalls[0].Names[0] = "changed"
	if Seccomp().Syscalls[0].Names[0] == "changed" {
		t.Error("Seccomp returns shared rules")
	}
	d := DeniedSyscalls()
	d[0].Names[0] = "changed"
	if DeniedSyscalls()[0].Names[0] == "changed" {
		t.Error("DeniedSyscalls returns shared names")
	}
}

func TestSeccompDefaultIsEPERM(t *testing.T) {
	s := Seccomp()
	if s.DefaultAction != specs.ActErrno || s.DefaultErrnoRet == nil || *s.DefaultErrnoRet != 1 {
		t.Errorf("Seccomp(): default action %v errno %v, want SCMP_ACT_ERRNO EPERM", s.DefaultAction, s.DefaultErrnoRet)
	}
	if a := seccompFor("amd64").Architectures; !slices.Equal(a, []specs.Arch{specs.ArchX86_64}) {
		t.Errorf("seccompFor(amd64): architectures %v, want only the native x86_64 (compat ABIs refused)", a)
	}
}

// allowed reports whether any allow rule names syscall.
func allowed(s *specs.LinuxSeccomp, syscall string) bool {
	for _, r := range s.Syscalls {
		if r.Action == specs.ActAllow && slices.Contains(r.Names, syscall) {
			return true
		}
	}
	return false
}

func TestSeccompDeniedNeverAllowed(t *testing.T) {
	for _, goarch := range []string{"amd64", "arm64"} {
		s := seccompFor(goarch)
		for _, d := range DeniedSyscalls() {
			if d.Why == "" {
				t.Errorf("denied group %v has no reason", d.Names)
			}
			for _, n := range d.Names {
				if allowed(s, n) {
					t.Errorf("seccompFor(%s): %s is allowed, want EPERM", goarch, n)
				}
				if !deniedWithEPERM(s, n) {
					t.Errorf("seccompFor(%s): %s has no explicit EPERM rule", goarch, n)
				}
			}
		}
	}
}

func deniedWithEPERM(s *specs.LinuxSeccomp, syscall string) bool {
	for _, r := range s.Syscalls {
		if r.Action == specs.ActErrno && r.ErrnoRet != nil && *r.ErrnoRet == 1 && slices.Contains(r.Names, syscall) {
			return true
		}
	}
	return false
}

func TestSeccompKeepsOrdinaryPython(t *testing.T) {
	s := Seccomp()
	for _, n := range []string{"read", "write", "openat", "mmap", "futex", "clone", "execve", "wait4",
		"arch_prctl", "rt_sigaction", "socket", "getrandom", "epoll_wait", "pipe2"} {
		if !allowed(s, n) {
			t.Errorf("Seccomp(): %s is not allowed, Python needs it", n)
		}
	}
}

func TestSeccompCloneRules(t *testing.T) {
	s := Seccomp()
	var clone, clone3 *specs.LinuxSyscall
	for i, r := range s.Syscalls {
		if slices.Equal(r.Names, []string{"clone"}) {
			clone = &s.Syscalls[i]
		}
		if slices.Equal(r.Names, []string{"clone3"}) {
			clone3 = &s.Syscalls[i]
		}
	}
	if clone == nil || len(clone.Args) != 1 || clone.Args[0].Op != specs.OpMaskedEqual || clone.Args[0].Value != refusedCloneFlags || clone.Args[0].ValueTwo != 0 ||
		clone.Args[0].Value&unix.CLONE_PARENT == 0 || clone.Args[0].Value&unix.CLONE_NEWUSER == 0 {
		t.Errorf("clone rule = %+v, want allow only when no namespace flag and no CLONE_PARENT is set", clone)
	}
	if clone3 == nil || clone3.Action != specs.ActErrno || clone3.ErrnoRet == nil || *clone3.ErrnoRet != 38 {
		t.Errorf("clone3 rule = %+v, want ENOSYS so libc falls back to clone", clone3)
	}
}

func TestLimitsValidate(t *testing.T) {
	ok := DefaultLimits()
	if err := ok.Validate(); err != nil {
		t.Fatalf("DefaultLimits().Validate() = %v", err)
	}
	for _, tc := range []struct {
		name   string
		modify func(*Limits)
		want   string
	}{
		{"memory", func(l *Limits) { l.MemoryBytes = 1 }, "memory limit"},
		{"pids", func(l *Limits) { l.Pids = 0 }, "pids limit"},
		{"cpus zero", func(l *Limits) { l.CPUs = 0 }, "cpus"},
		{"cpus NaN", func(l *Limits) { l.CPUs = math.NaN() }, "cpus"},
		{"tmpfs", func(l *Limits) { l.TmpfsBytes = 0 }, "tmpfs size"},
		{"open files", func(l *Limits) { l.OpenFiles = 1 }, "open files"},
	} {
		l := DefaultLimits()
		tc.modify(&l)
		err := l.Validate()
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("Validate() with bad %s = %v, want an error naming %q", tc.name, err, tc.want)
		}
	}
}

func TestCPUQuota(t *testing.T) {
	l := DefaultLimits()
	l.CPUs = 1.5
	if got, want := l.CPUQuotaUs(), int64(150_000); got != want {
		t.Errorf("CPUQuotaUs() = %d, want %d", got, want)
	}
}

func TestEnvIsSmallAllowlist(t *testing.T) {
	for _, kv := range Env() {
		k, _, ok := strings.Cut(kv, "=")
		if !ok {
			t.Errorf("Env(): %q is not KEY=VALUE", kv)
		}
		if !slices.Contains([]string{"PATH", "HOME", "LANG", "LC_ALL", "TMPDIR", "COLUMNS", "LINES"}, k) && !strings.HasPrefix(k, "PYTHON") {
			t.Errorf("Env(): %s is outside the allowlist (PATH, HOME, LANG, the terminal size, PYTHON*)", k)
		}
	}
}
