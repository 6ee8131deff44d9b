package policy

import (
	"slices"

	specs "github.com/opencontainers/runtime-spec/specs-go"
	"golang.org/x/sys/unix"
)

// The process runtime runs each call as a process of the server's own
// machine, with no namespaces of its own: what a container would hide, the
// call shares with the server and every other call, unless the code is
// kept from it. These are the rules that keep it, on top of the
// container's: what the code's Landlock domain may read (the interpreter,
// its libraries and packages are under these, the server's files and
// other calls' dirs are not), and the syscalls it may not make.

// ProcessReadable lists what the code of a process-runtime call may read,
// besides its own dir and the interpreter: the system's program and
// library trees, the few files of /etc that the C library and Python
// read, /proc (whose per-process files of anything outside the call's
// domain Landlock refuses) and the CPU topology numeric libraries size
// their thread pools by. An entry ending in * is a glob.
func ProcessReadable() []string {
	return []string{
		"/usr", "/lib", "/lib32", "/lib64", "/libx32", "/bin", "/sbin",
		"/etc/passwd", "/etc/group", "/etc/nsswitch.conf", "/etc/hosts", "/etc/host.conf", "/etc/localtime",
		"/etc/timezone", "/etc/ld.so.cache", "/etc/ld.so.conf", "/etc/ld.so.conf.d", "/etc/ssl",
		"/etc/ca-certificates", "/etc/mime.types", "/etc/os-release", "/etc/alternatives", "/etc/fonts",
		"/etc/matplotlibrc", "/etc/python3*",
		"/proc", "/sys/devices/system/cpu",
	}
}

// ProcessDevices are the device nodes a process-runtime call may open:
// the sandbox's own set.
func ProcessDevices() []string {
	var paths []string
	for _, d := range Devices() {
		paths = append(paths, d.Path)
	}
	return paths
}

// DeniedInProcess returns what the process runtime's filter refuses on top
// of the sandbox's (DeniedSyscalls): the interfaces that a container
// namespaces and this runtime shares.
func DeniedInProcess() []Denied {
	return []Denied{
		{[]string{"shmget", "shmat", "shmdt", "shmctl", "msgget", "msgsnd", "msgrcv", "msgctl",
			"semget", "semop", "semtimedop", "semctl", "mq_open", "mq_unlink", "mq_timedsend",
			"mq_timedreceive", "mq_notify", "mq_getsetattr"},
			"the machine's IPC namespace is the server's and every other call's"},
	}
}

// ProcessSeccomp returns the process runtime's filter: the sandbox's
// (Seccomp), with the DeniedInProcess groups refused, and socket allowed
// only for unix sockets (pipes between the call's own processes, and the
// abstract ones Landlock scopes to the call) and netlink's NETLINK_ROUTE
// (reading its interfaces). IP sockets would be on the machine's own
// network, its loopback shared with the server and every other call, where
// the call has no network namespace of its own; netlink's sock_diag would
// list the machine's sockets, unix ones by path.
//
// unixSockets says whether the call may make unix sockets: only where it
// has a root of its own, which holds no pathname socket of the machine's.
// Without one, Landlock does not mediate connect(2) to a pathname socket
// (a desktop user's D-Bus session bus, ssh-agent, a docker socket reached
// through the user's groups), so socket(AF_UNIX) is refused, and
// socketpair(2) is allowed for stream and seqpacket pairs only (what
// multiprocessing's pipes and asyncio use): a datagram pair could be
// connected, or sent from, to any datagram socket's path (the journal,
// /dev/log), which a connected stream pair cannot.
//
// A call's CPU time here is measured over its process tree (no cgroup
// counts it), where a process's time goes to whoever reaps it. A child
// the kernel reaps itself, because its parent ignores SIGCHLD or set
// SA_NOCLDWAIT, takes its time nowhere: code forking such children
// spent 12 CPU-seconds under a 1 s cpu_limit_s (red team 2, R1). So
// SIGCHLD's disposition may be read, not changed: rt_sigaction is
// allowed for every other signal, and for SIGCHLD only with no new
// action (seccomp cannot read the action itself, behind a pointer).
func ProcessSeccomp(unixSockets bool) *specs.LinuxSeccomp {
	s := Seccomp()
	refused := map[string]bool{"socket": true, "socketpair": !unixSockets, "rt_sigaction": true}
	for _, d := range DeniedInProcess() {
		for _, n := range d.Names {
			refused[n] = true
		}
	}
	var rules []specs.LinuxSyscall
	for _, r := range s.Syscalls {
		if r.Action == specs.ActAllow {
			r.Names = slices.DeleteFunc(slices.Clone(r.Names), func(n string) bool { return refused[n] })
			if len(r.Names) == 0 {
				continue
			}
		}
		rules = append(rules, r)
	}
	if unixSockets {
		rules = append(rules, specs.LinuxSyscall{
			Names:  []string{"socket"},
			Action: specs.ActAllow,
			Args:   []specs.LinuxSeccompArg{{Index: 0, Value: unix.AF_UNIX, Op: specs.OpEqualTo}},
		})
	} else {
		// The type's low bits (below SOCK_NONBLOCK and SOCK_CLOEXEC).
		for _, typ := range []uint64{unix.SOCK_STREAM, unix.SOCK_SEQPACKET} {
			rules = append(rules, specs.LinuxSyscall{
				Names:  []string{"socketpair"},
				Action: specs.ActAllow,
				Args: []specs.LinuxSeccompArg{{Index: 0, Value: unix.AF_UNIX, Op: specs.OpEqualTo},
					{Index: 1, Value: 0xf, ValueTwo: typ, Op: specs.OpMaskedEqual}},
			})
		}
	}
	rules = append(rules, specs.LinuxSyscall{
		Names:  []string{"socket"},
		Action: specs.ActAllow,
		Args: []specs.LinuxSeccompArg{{Index: 0, Value: unix.AF_NETLINK, Op: specs.OpEqualTo},
			{Index: 2, Value: unix.NETLINK_ROUTE, Op: specs.OpEqualTo}},
	})
	rules = append(rules, sigactionRules()...)
	for _, d := range DeniedInProcess() {
		eperm := uint(unix.EPERM)
		rules = append(rules, specs.LinuxSyscall{Names: slices.Clone(d.Names), Action: specs.ActErrno, ErrnoRet: &eperm})
	}
	s.Syscalls = rules
	return s
}

// sigactionRules allow rt_sigaction for every signal but SIGCHLD, and
// for SIGCHLD with no new action (ProcessSeccomp). The kernel reads the
// signal as an int, its low 32 bits, where seccomp compares all 64, so
// no rule may let a number through that is SIGCHLD in its low half: a
// bare "not SIGCHLD" let 1<<32|SIGCHLD through (red team 3, F1). And
// conditions on one argument are alternatives (as runc takes them), not
// all required, so the signals around SIGCHLD are spelled as ranges
// whose high bits are all zero: below it, then 18-19, 20-23, 24-31,
// 32-63 and 64 (the last real-time signal). Any other number is no
// signal (EINVAL) and is refused.
func sigactionRules() []specs.LinuxSyscall {
	sigchld := uint64(unix.SIGCHLD)
	rule := func(args ...specs.LinuxSeccompArg) specs.LinuxSyscall {
		return specs.LinuxSyscall{Names: []string{"rt_sigaction"}, Action: specs.ActAllow, Args: args}
	}
	masked := func(low, size uint64) specs.LinuxSyscall {
		return rule(specs.LinuxSeccompArg{Index: 0, Value: ^(size - 1), ValueTwo: low, Op: specs.OpMaskedEqual})
	}
	return []specs.LinuxSyscall{
		rule(specs.LinuxSeccompArg{Index: 0, Value: sigchld, Op: specs.OpLessThan}),
		masked(18, 2), masked(20, 4), masked(24, 8), masked(32, 32),
		rule(specs.LinuxSeccompArg{Index: 0, Value: 64, Op: specs.OpEqualTo}),
		rule(specs.LinuxSeccompArg{Index: 0, Value: sigchld, Op: specs.OpEqualTo},
			specs.LinuxSeccompArg{Index: 1, Value: 0, Op: specs.OpEqualTo}),
	}
}

// ProcessSeccompNetwork is the process runtime's filter for a call with
// the network allowlist on, which the runtime gives only a call in
// namespaces of its own: ProcessSeccomp, with IPv4 sockets allowed too.
// Its network namespace has only lo, where the egress relay listens (and
// the code's Landlock domain may connect to the relay's port and no other,
// bind none), so they reach the relay and nothing of the machine's.
func ProcessSeccompNetwork() *specs.LinuxSeccomp {
	s := ProcessSeccomp(true) // the network needs the call's own namespaces
	s.Syscalls = append(s.Syscalls, specs.LinuxSyscall{
		Names:  []string{"socket"},
		Action: specs.ActAllow,
		Args:   []specs.LinuxSeccompArg{{Index: 0, Value: uint64(unix.AF_INET), Op: specs.OpEqualTo}},
	})
	return s
}

// ProcessNetworkReadable is what a process-runtime call with the network
// allowlist reads besides ProcessReadable: what pip reads of the system
// to name it in its User-Agent.
func ProcessNetworkReadable() []string {
	return []string{"/etc/debian_version", "/etc/lsb-release"}
}
