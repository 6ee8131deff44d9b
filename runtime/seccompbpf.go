//go:build cgo && seccomp

package runtime

import (
	"errors"
	"fmt"
	"io"
	"os"

	specs "github.com/opencontainers/runtime-spec/specs-go"
	libseccomp "github.com/seccomp/libseccomp-golang"
	"golang.org/x/sys/unix"
)

// compileSeccomp turns a spec's seccomp section into the BPF program the
// process runtime's init installs in the code (struct sock_filter[], host
// order): the same rules libcontainer loads in a container, compiled by
// the same library, but handed over instead of loaded here.
func compileSeccomp(s *specs.LinuxSeccomp) ([]byte, error) {
	def, err := seccompAction(s.DefaultAction, s.DefaultErrnoRet)
	if err != nil {
		return nil, fmt.Errorf("compiling the seccomp filter: default action: %w", err)
	}
	f, err := libseccomp.NewFilter(def)
	if err != nil {
		return nil, fmt.Errorf("compiling the seccomp filter: %w", err)
	}
	defer f.Release()
	// A binary tree over the syscall numbers, not libseccomp's default
	// list: the same decisions, in some ten comparisons instead of up to
	// a few hundred. gVisor evaluates every filter a task holds for every
	// syscall number at each fork and each filter installed (its
	// cacheability check): 9.5 ms of a forked runsc call's 30 ms of
	// sampled sentry CPU with the list, 5.6 with the tree. The kernel
	// runs the filter for each syscall its cache cannot answer by number
	// alone. An older libseccomp without the attribute compiles the list.
	_ = f.SetOptimize(2)
	for _, a := range s.Architectures {
		arch, err := libseccomp.GetArchFromString(specArch(a))
		if err != nil {
			return nil, fmt.Errorf("compiling the seccomp filter: %w", err)
		}
		if err := f.AddArch(arch); err != nil {
			return nil, fmt.Errorf("compiling the seccomp filter: %w", err)
		}
	}
	for _, rule := range s.Syscalls {
		if err := addSeccompRule(f, def, rule); err != nil {
			return nil, fmt.Errorf("compiling the seccomp filter: %w", err)
		}
	}
	// Through a memfd: ExportBPFMem needs a newer libseccomp than
	// Debian 12's.
	fd, err := unix.MemfdCreate("mcp-exec-seccomp", unix.MFD_CLOEXEC)
	if err != nil {
		return nil, fmt.Errorf("compiling the seccomp filter: %w", err)
	}
	mem := os.NewFile(uintptr(fd), "seccomp")
	defer mem.Close()
	if err := f.ExportBPF(mem); err != nil {
		return nil, fmt.Errorf("compiling the seccomp filter: %w", err)
	}
	bpf, err := io.ReadAll(io.NewSectionReader(mem, 0, 1<<30))
	if err != nil {
		return nil, fmt.Errorf("compiling the seccomp filter: %w", err)
	}
	return bpf, nil
}

// addSeccompRule adds one rule for each of its names, as runc does: a
// name this libseccomp does not know is a syscall this kernel lacks, and
// conditions on one argument more than once are alternatives.
func addSeccompRule(f *libseccomp.ScmpFilter, def libseccomp.ScmpAction, rule specs.LinuxSyscall) error {
	act, err := seccompAction(rule.Action, rule.ErrnoRet)
	if err != nil {
		return fmt.Errorf("%v: %w", rule.Names, err)
	}
	if act == def {
		return nil
	}
	var conds []libseccomp.ScmpCondition
	perArg := map[uint]int{}
	for _, a := range rule.Args {
		op, ok := seccompOps[a.Op]
		if !ok {
			return fmt.Errorf("%v: unknown operator %q", rule.Names, a.Op)
		}
		c, err := libseccomp.MakeCondition(a.Index, op, a.Value, a.ValueTwo)
		if err != nil {
			return fmt.Errorf("%v: %w", rule.Names, err)
		}
		conds = append(conds, c)
		perArg[a.Index]++
	}
	alternatives := false
	for _, n := range perArg {
		alternatives = alternatives || n > 1
	}
	for _, name := range rule.Names {
		call, err := libseccomp.GetSyscallFromName(name)
		if err != nil {
			continue
		}
		switch {
		case len(conds) == 0:
			err = f.AddRule(call, act)
		case alternatives:
			for _, c := range conds {
				if err = f.AddRuleConditional(call, act, []libseccomp.ScmpCondition{c}); err != nil {
					break
				}
			}
		default:
			err = f.AddRuleConditional(call, act, conds)
		}
		if err != nil {
			return fmt.Errorf("%s: %w", name, err)
		}
	}
	return nil
}

var seccompOps = map[specs.LinuxSeccompOperator]libseccomp.ScmpCompareOp{
	specs.OpEqualTo: libseccomp.CompareEqual, specs.OpNotEqual: libseccomp.CompareNotEqual,
	specs.OpGreaterThan: libseccomp.CompareGreater, specs.OpGreaterEqual: libseccomp.CompareGreaterEqual,
	specs.OpLessThan: libseccomp.CompareLess, specs.OpLessEqual: libseccomp.CompareLessOrEqual,
	specs.OpMaskedEqual: libseccomp.CompareMaskedEqual,
}

func seccompAction(a specs.LinuxSeccompAction, errno *uint) (libseccomp.ScmpAction, error) {
	switch a {
	case specs.ActAllow:
		return libseccomp.ActAllow, nil
	case specs.ActErrno:
		if errno == nil {
			return libseccomp.ActErrno.SetReturnCode(1), nil // EPERM
		}
		return libseccomp.ActErrno.SetReturnCode(int16(*errno)), nil
	case specs.ActKill, specs.ActKillThread:
		return libseccomp.ActKillThread, nil
	case specs.ActKillProcess:
		return libseccomp.ActKillProcess, nil
	}
	return libseccomp.ActInvalid, errors.New("action " + string(a) + " is not one the process runtime uses")
}

// specArch maps the spec's architecture names (SCMP_ARCH_X86_64) to
// libseccomp's Go names (amd64).
func specArch(a specs.Arch) string {
	switch a {
	case specs.ArchX86_64:
		return "amd64"
	case specs.ArchX86:
		return "x86"
	case specs.ArchAARCH64:
		return "arm64"
	case specs.ArchS390X:
		return "s390x"
	case specs.ArchRISCV64:
		return "riscv64"
	case specs.ArchPPC64LE:
		return "ppc64le"
	case specs.ArchLOONGARCH64:
		return "loong64"
	case specs.ArchMIPSEL64:
		return "mipsel64"
	}
	return string(a)
}
