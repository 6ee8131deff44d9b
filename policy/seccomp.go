package policy

import (
	"runtime"
	"slices"

	mobyseccomp "github.com/moby/profiles/seccomp"
	specs "github.com/opencontainers/runtime-spec/specs-go"
	"golang.org/x/sys/unix"
)

// Denied is a group of syscalls that fail with EPERM inside the sandbox,
// with the reason they are denied.
type Denied struct {
	Names []string
	Why   string
}

// DeniedSyscalls returns the syscalls the sandbox refuses on top of the
// baseline. Each group is removed from every allow rule of the baseline and
// given an explicit EPERM rule, so the denial does not hinge on the
// baseline's default action or on which capabilities it was filtered for.
func DeniedSyscalls() []Denied {
	return []Denied{
		{[]string{"mount", "umount", "umount2", "pivot_root", "chroot", "fsopen", "fsconfig", "fsmount", "fspick", "move_mount", "open_tree", "mount_setattr"},
			"filesystem layout is fixed by the runtime; changing it is the first step of most escapes"},
		{[]string{"ptrace", "process_vm_readv", "process_vm_writev", "kcmp", "pidfd_getfd", "process_madvise"},
			"reading or steering another process's memory is never needed by a script"},
		{[]string{"bpf"},
			"eBPF programs run in the host kernel"},
		{[]string{"perf_event_open"},
			"performance counters leak host timing and have a long record of kernel bugs"},
		{[]string{"keyctl", "add_key", "request_key"},
			"the kernel keyring is not namespaced"},
		{[]string{"unshare", "setns"},
			"new namespaces (user namespaces above all) open kernel attack surface meant for root"},
		{[]string{"kexec_load", "kexec_file_load", "init_module", "finit_module", "delete_module"},
			"loading code into the kernel"},
		{[]string{"reboot", "swapon", "swapoff", "acct", "quotactl", "quotactl_fd", "syslog", "vhangup"},
			"host administration"},
		{[]string{"userfaultfd"},
			"lets a process stall kernel page faults at will, a staple of exploit races"},
		{[]string{"open_by_handle_at", "name_to_handle_at"},
			"opens files by handle, bypassing the mount namespace (the shocker escape)"},
		{[]string{"io_uring_setup", "io_uring_enter", "io_uring_register"},
			"a second syscall interface that seccomp cannot see into"},
		{[]string{"io_setup", "io_destroy", "io_submit", "io_cancel", "io_getevents", "io_pgetevents"},
			"Linux AIO contexts come from one host-wide budget (fs.aio-max-nr): one call could take it all for the host; Python does not use them"},
		{[]string{"settimeofday", "clock_settime", "clock_adjtime", "adjtimex", "stime"},
			"the clock is shared with the host"},
		{[]string{"iopl", "ioperm", "modify_ldt", "personality"},
			"raw I/O ports and legacy execution domains; personality can disable ASLR"},
		{[]string{"mbind", "set_mempolicy", "migrate_pages", "move_pages", "set_mempolicy_home_node"},
			"NUMA placement affects other tenants of the host"},
		{[]string{"lookup_dcookie", "nfsservctl", "uselib", "vm86", "vm86old", "_sysctl", "sysfs", "ustat", "fanotify_init"},
			"obsolete or host-inspecting interfaces"},
	}
}

// namespaceFlags are the clone flags that would create a namespace.
const namespaceFlags = unix.CLONE_NEWNS | unix.CLONE_NEWUTS | unix.CLONE_NEWIPC |
	unix.CLONE_NEWUSER | unix.CLONE_NEWPID | unix.CLONE_NEWNET | unix.CLONE_NEWCGROUP |
	unix.CLONE_NEWTIME

// refusedCloneFlags are the clone flags the sandbox refuses: a namespace,
// or CLONE_PARENT, which makes the child a sibling of its maker: a child
// of whatever made the sandbox's process. In a forked sandbox that is the
// template's interpreter, outside the call's pid namespace; a child it
// never waits for would keep the call's pid namespace, and the template,
// from ever ending. Nothing a script runs needs it (fork, threads and
// posix_spawn do not use it).
const refusedCloneFlags = namespaceFlags | unix.CLONE_PARENT

// Seccomp returns the sandbox's seccomp filter for the architecture the
// server was built for.
//
// It starts from the maintained default profile of Moby (github.com/moby/
// profiles/seccomp), evaluated for a process with no capabilities, then
// removes DeniedSyscalls from it. Anything not allowed fails with EPERM,
// never a kill, so a Python that probes an interface gets an exception it can
// handle. clone is allowed only without namespace flags or CLONE_PARENT
// (refusedCloneFlags); clone3, whose flags
// sit behind a pointer that seccomp cannot read, fails with ENOSYS so that
// the C library falls back to clone, where the flags are checked.
func Seccomp() *specs.LinuxSeccomp {
	return seccompFor(runtime.GOARCH)
}

func seccompFor(goarch string) *specs.LinuxSeccomp {
	profile := mobyseccomp.DefaultProfile()
	eperm := uint(unix.EPERM)
	nosys := uint(unix.ENOSYS)

	denied := map[string]bool{}
	for _, d := range DeniedSyscalls() {
		for _, n := range d.Names {
			denied[n] = true
		}
	}

	out := &specs.LinuxSeccomp{
		DefaultAction:   specs.ActErrno,
		DefaultErrnoRet: &eperm,
		Architectures:   architectures(goarch),
	}
	for _, call := range profile.Syscalls {
		if !applies(call, goarch) {
			continue
		}
		names := slices.DeleteFunc(slices.Clone(call.Names), func(n string) bool {
			// clone3, clone, mknod and mknodat get explicit rules below.
			return denied[n] || n == "clone" || n == "clone3" || n == "mknod" || n == "mknodat"
		})
		if len(names) == 0 || call.Action != specs.ActAllow {
			continue
		}
		rule := call.LinuxSyscall
		rule.Names = names
		rule.Args = slices.Clone(call.Args)
		out.Syscalls = append(out.Syscalls, rule)
	}

	cloneFlagsArg := uint(0)
	if goarch == "s390x" {
		cloneFlagsArg = 1 // s390 swaps clone's first two arguments
	}
	out.Syscalls = append(out.Syscalls,
		specs.LinuxSyscall{
			Names:  []string{"clone"},
			Action: specs.ActAllow,
			Args: []specs.LinuxSeccompArg{{
				Index: cloneFlagsArg, Value: refusedCloneFlags, ValueTwo: 0, Op: specs.OpMaskedEqual,
			}},
		},
		specs.LinuxSyscall{
			Names:    []string{"clone3"},
			Action:   specs.ActErrno,
			ErrnoRet: &nosys,
		},
	)
	// mknod makes FIFOs, sockets and plain files, never a device node: a
	// capability check forbids those under libcontainer, but gVisor lets an
	// unprivileged process make nodes of its own emulated devices, which
	// would make /tmp's nodev a promise the filter keeps instead.
	for _, call := range []struct {
		name string
		mode uint // index of the mode argument
	}{{"mknod", 1}, {"mknodat", 2}} {
		if call.name == "mknod" && !hasLegacyMknod(goarch) {
			continue
		}
		for _, kind := range []uint64{unix.S_IFIFO, unix.S_IFSOCK, unix.S_IFREG, 0} {
			out.Syscalls = append(out.Syscalls, specs.LinuxSyscall{
				Names:  []string{call.name},
				Action: specs.ActAllow,
				Args:   []specs.LinuxSeccompArg{{Index: call.mode, Value: unix.S_IFMT, ValueTwo: kind, Op: specs.OpMaskedEqual}},
			})
		}
	}
	for _, d := range DeniedSyscalls() {
		errno := eperm
		out.Syscalls = append(out.Syscalls, specs.LinuxSyscall{
			Names:    slices.Clone(d.Names),
			Action:   specs.ActErrno,
			ErrnoRet: &errno,
		})
	}
	return out
}

// TemplateSeccomp returns the filter of a template's init and interpreter
// (forked sandboxes): Seccomp, except what making a call's sandbox takes.
// The template's init makes each call's pid namespace (unshare, and setns
// back to its own for the next one), the call's init the others, and the
// code's process joins them (setns); the call's init replaces the
// template's /proc and tmpfs mounts with fresh ones (mount, umount2) and
// sets the hostname. A user namespace is never
// among them. Every fork stacks Seccomp on this before it reads any code,
// and so does the call's init once the sandbox is made: the code only ever
// runs under both.
func TemplateSeccomp() *specs.LinuxSeccomp {
	return templateSeccompFor(runtime.GOARCH)
}

// templateSyscalls are what TemplateSeccomp allows that Seccomp denies.
var templateSyscalls = []string{"mount", "umount2", "unshare", "setns", "sethostname"}

func templateSeccompFor(goarch string) *specs.LinuxSeccomp {
	s := seccompFor(goarch)
	var rules []specs.LinuxSyscall
	for _, r := range s.Syscalls {
		r.Names = slices.DeleteFunc(slices.Clone(r.Names), func(n string) bool { return slices.Contains(templateSyscalls, n) })
		if len(r.Names) > 0 {
			rules = append(rules, r)
		}
	}
	s.Syscalls = append(rules,
		specs.LinuxSyscall{Names: []string{"mount", "umount2", "sethostname"}, Action: specs.ActAllow},
		specs.LinuxSyscall{Names: []string{"unshare"}, Action: specs.ActAllow,
			Args: []specs.LinuxSeccompArg{{Index: 0, Value: unix.CLONE_NEWUSER, ValueTwo: 0, Op: specs.OpMaskedEqual}}},
		specs.LinuxSyscall{Names: []string{"setns"}, Action: specs.ActAllow,
			Args: []specs.LinuxSeccompArg{{Index: 1, Value: unix.CLONE_NEWUSER, ValueTwo: 0, Op: specs.OpMaskedEqual}}},
	)
	return s
}

// hasLegacyMknod reports whether goarch's syscall table has mknod besides
// mknodat (the newer architectures have only the *at form).
func hasLegacyMknod(goarch string) bool {
	switch goarch {
	case "arm64", "riscv64", "loong64":
		return false
	}
	return true
}

// applies evaluates the baseline's conditions for a process that has no
// capabilities at all on goarch. Kernel-version conditions are taken as met:
// every kernel the runtimes support is newer than the baseline's oldest gate.
func applies(call *mobyseccomp.Syscall, goarch string) bool {
	arch := nativeArch(goarch)
	if inc := call.Includes; inc != nil {
		if len(inc.Caps) > 0 {
			return false // we grant no capability
		}
		if len(inc.Arches) > 0 && !slices.Contains(inc.Arches, arch) {
			return false
		}
	}
	if exc := call.Excludes; exc != nil {
		if len(exc.Arches) > 0 && slices.Contains(exc.Arches, arch) {
			return false
		}
		if exc.MinKernel != nil {
			return false
		}
	}
	return true
}

// nativeArch maps a GOARCH to the names the baseline's conditions use
// (libseccomp's, which differ from Go's only for these).
func nativeArch(goarch string) string {
	switch goarch {
	case "386":
		return "x86"
	case "loong64":
		return "loongarch64"
	case "mips64p32":
		return "mips64n32"
	case "mips64p32le":
		return "mips3l64n32"
	case "mips64le":
		return "mipsel64"
	case "mipsle":
		return "mipsel"
	default:
		return goarch
	}
}

// architectures is the native ABI alone. Compat ABIs (x86's int 0x80 and
// x32 on amd64, arm on arm64) are a classic way around a filter written
// for the native syscall table, and the sandbox only ever runs the
// native interpreter: syscalls through them are refused outright rather
// than filtered twice. Leaving them out also halves the filter libseccomp
// has to build for every call.
func architectures(goarch string) []specs.Arch {
	return []specs.Arch{map[string]specs.Arch{
		"amd64": specs.ArchX86_64, "arm64": specs.ArchAARCH64, "386": specs.ArchX86,
		"s390x": specs.ArchS390X, "riscv64": specs.ArchRISCV64, "loong64": specs.ArchLOONGARCH64,
		"ppc64le": specs.ArchPPC64LE, "mips64le": specs.ArchMIPSEL64,
	}[goarch]}
}
