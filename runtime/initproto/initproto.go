// Package initproto is the protocol between the runtime and the sandbox's
// init, defined once. The init (runtime/sandboxinit) is the same program
// under every runtime, and so is the conversation with it, over its standard input and
// output, in frames of a type byte, a big-endian uint32 length and the
// payload:
//
//	host → init  G config    the init's configuration (initConfig), first
//	init → host  R           the interpreter is started and waits for its code
//	host → init  F path data an input file, written in the work dir as the code's user
//	host → init  I data, J   the code's stdin, then its end
//	host → init  L seconds   the call's CPU seconds (the process runtime's
//	                         RLIMIT_CPU, per process): a second past its CPU
//	                         limit, else its timeout
//	host → init  P           a persistent session's call: the interpreter
//	                         lives on after the code, for the next call
//	host → init  C code      the code: the interpreter reads it and runs it
//	init → host  S           the code has it: the timeout counts from here
//	init → host  O, E data   stdout and stderr: the head of each, its first
//	                         half of the cap
//	init → host  M stream offset data
//	                         a stream past its head: u8 O or E, u64 the
//	                         offset of data in the stream, data. While
//	                         the call is watched (H), the newest bytes of
//	                         each read; at its end, the tail the init kept
//	                         (the last half of the cap at most), which
//	                         replaces what came from its offset on
//	host → init  K           kill the code now (the timeout)
//	host → init  Q           interrupt the code (SIGINT: a session's timeout)
//	host → init  H           the call's output is watched live: line-buffer stdout
//	init → host  V repr      the repr of the code's last expression
//	init → host  X status    the main process's wait status, the byte counts
//	                         of stdout and stderr, how long it ran, and why
//	                         the init killed it (the exit flags); every other
//	                         process of the code has been killed
//	init → host  B path data a file from outputs/
//	init → host  T why size path
//	                         an entry of outputs/ left out (u8 a Left*
//	                         reason, u64 its size, its path; a dir's ends
//	                         in '/'); bare: more than MaxLeftOut were
//	init → host  N message   a note for the caller, added to the stderr
//	init → host  D           done: the init exits
//	init → host  Z           a session's call is over and all of it sent;
//	                         the interpreter waits for the next (F, I, J,
//	                         L, C again: a new call)
//	init → host  W message   something the init was asked to do failed
//
// With the network allowlist on, the init relays each connection the code
// opens to 127.0.0.1:<relay port> in its network namespace to the server's
// egress proxy (init_relay.c), in frames of a NET_ op, a u32 connection
// and the op's payload, each way:
//
//	init → host  m o id      the code opened connection id
//	either way   M/m d id    bytes of it (at most NET_CHUNK a frame)
//	either way   M/m a id n  n bytes of it were taken: the window is open by n more
//	either way   M/m e id    the sender's side ended its writes (half-close)
//	either way   M/m c id    it is closed: forget it
//
// Neither side sends more than NET_WINDOW of one connection that the other
// has not acknowledged.
//
// A template's init (forked sandboxes, runtime/fork.go) takes the same
// configuration, then starts the interpreter as a zygote that never runs
// a caller's code, and serves forks:
//
//	init → host  R           the zygote is ready
//	host → init  Y request   fork a call's sandbox: u32 fds, u32 uid, u32
//	                         gid, the code's seccomp filter; with the call's
//	                         stdin, stdout and stderr and its cgroup.procs
//	                         files as SCM_RIGHTS on the init's stdin (a socket)
//	init → host  U u32 pid   the call's init is forked and in its cgroups,
//	                         and the code's process forked
//	init → host  A u32 st    the call's init has ended (its wait status),
//	                         and the code's process is reaped
//	init → host  W message   the fork failed
//
// The template's init forks the call's init into a new pid namespace, as
// its pid 1, with its descriptors at fixed numbers: the call's stdin,
// stdout and stderr, then from FORKED_FIRST_FD its ends of the code's
// pipes (stdin, stdout, stderr, the driver's ctl and cell), the code's
// exit status at FORKED_STATUS_FD, the call's cgroup.procs files from
// FORKED_PROCS_FD. That init makes its other namespaces, takes the call's
// frames as any init does, with its configuration's fresh mounts, masks,
// hostname and loopback applied first. The zygote forks the code's
// process into its namespaces; the code's process says it is confined
// (driver frame r), and the init moves it into the call's cgroups and
// checks it before it reports ready. The zygote, the code's parent, writes
// its wait status (u32) to the status pipe.
//
// The zygote talks to the template's init over a SOCK_SEQPACKET socket
// (its fd ZYGOTE_FD), a message each: k (a fork: uid, gid, filter; with
// the call's init's pidfd, the code's five pipe ends and the status
// pipe), and back r (ready), f pid (the code's process is forked), x (it
// is reaped, its status written), w message (the fork failed).
//
// The interpreter runs the driver (driver.py), which runs the code as a
// notebook runs a cell and talks to the init over two pipes of its own, in
// frames of the same shape:
//
//	init → driver  o flags         fd 4: the first call's options (optPersist, optLive)
//	init → driver  c flags, u32 n, stdin, code
//	                               fd 4: a session's next call
//	driver → init  v repr          fd 3: the value of the last expression
//	driver → init  d u32 status    fd 3: a session's call ended, its exit status
//	driver → init  r u32 pid       fd 3: a forked interpreter is confined and
//	                               waits
//	init → driver  g               fd 4: it is in the call's cgroups and checked,
//	                               the sandbox made: it warms up, then waits for
//	                               its options, then reads the script
//
// The code can write to those pipes too: the init trusts nothing they carry
// beyond the call's own output (a forged end ends the call early, as an
// exit would).
//
// The init's stderr carries only its own fatal errors. Everything the code
// writes goes through pipes the init drains, so the code is never blocked
// by its own output and the runtime only ever reads what fits the caps. A
// runtime only has to start a container (or a process) with the init as
// its process and to kill it; the runtime's supervision does the rest, the
// same for all.
//
// This package is the protocol's one definition: the C side's
// initproto.h (runtime/sandboxinit) is rendered from protocol and fields
// (Header), the driver's @NAME@s from the same (Link), and
// TestInitProtocol fails while the checked-in header differs (go test
// ./runtime/initproto -run TestInitProtocol -update writes it). The
// package is pure Go: it knows the init's language, not how a sandbox is
// made.
package initproto

import (
	"fmt"
	"strings"

	"github.com/inhuman/mcp-exec/bundle"
	"github.com/inhuman/mcp-exec/policy"
)

// The markers: the first argument that makes this executable something
// else than the server, before the Go runtime starts (the C
// constructor of runtime/sandboxinit).
const (
	InitMarker  = bundle.InitMarker
	HoldMarker  = "__mcp_exec_userns__"
	ProbeMarker = "__mcp_exec_probe__"
	// ProbeNamespacesArg follows ProbeMarker: the probe makes a call's
	// namespaces (probe_namespaces).
	ProbeNamespacesArg = "namespaces"
	KillMarker         = "__mcp_exec_kill__"
	// TemplateMarker follows the script on a zygote's command line.
	TemplateMarker = "--mcp-exec-template"
)

// Frame types, host to init.
const (
	HConfig    = 'G'
	HFile      = 'F'
	HStdin     = 'I'
	HStdinEnd  = 'J'
	HCPU       = 'L'
	HCode      = 'C'
	HKill      = 'K'
	HPersist   = 'P'
	HInterrupt = 'Q'
	HLive      = 'H'
	HFork      = 'Y'
	HNet       = 'M'
)

// Frame types, init to host.
const (
	IReady   = 'R'
	IStarted = 'S'
	IStdout  = 'O'
	IStderr  = 'E'
	ITail    = 't'
	IExit    = 'X'
	IOutFile = 'B'
	ISkipped = 'T'
	INote    = 'N'
	IDone    = 'D'
	IError   = 'W'
	IResult  = 'V'
	IIdle    = 'Z'
	IForked  = 'U'
	IReaped  = 'A'
	INet     = 'm'
	// IUsage, the process runtime's (no cgroup counts for it), comes just
	// before IExit: u64 CPU ns and u64 peak memory bytes of the call's
	// processes, as the init measured them.
	IUsage = 'u'
)

// The egress relay's ops (the first byte of an H_NET or I_NET frame), and
// its bounds.
const (
	NetOpen  = 'o'
	NetData  = 'd'
	NetAck   = 'a'
	NetEOF   = 'e'
	NetClose = 'c'
	// NetChunk bounds a data frame's bytes; NetWindow what one
	// connection may have in flight each way; NetMaxConns the
	// connections the relay holds at once.
	NetChunk    = 64 << 10
	NetWindow   = 256 << 10
	NetMaxConns = 64
)

// The zygote's messages (driver.py), on its socket to the template's init.
const (
	ZygoteFd = 3
	ZFork    = 'k' // a fork request, as HFork's payload, with its fds
	ZReady   = 'r' // the zygote waits for forks
	ZForked  = 'f' // u32 pid: the code's process is forked
	ZReaped  = 'x' // the code's process is reaped, its status sent
	ZFailed  = 'w' // a message: the fork failed
	// ForkedFirstFd is the first of a forked init's five ends of its
	// code's pipes: stdin, stdout, stderr, the driver's ctl and cell; the
	// code's exit status comes on ForkedStatusFd; the call's
	// cgroup.procs files are from ForkedProcsFd on.
	ForkedFirstFd  = 3
	ForkedStatusFd = ForkedFirstFd + 5
	ForkedProcsFd  = ForkedStatusFd + 1
)

// The driver's pipes and frames (driver.py).
const (
	DriverCtlFd  = 3   // driver → init
	DriverCellFd = 4   // init → driver
	DOptions     = 'o' // the first call's options: u32 opt flags
	DCell        = 'c' // a session's next call: u32 opt flags, u32 stdin length, stdin, code
	DValue       = 'v' // the repr of the last expression
	DDone        = 'd' // a session's call ended: u32 exit status
	DReady       = 'r' // a forked interpreter is confined and waits: u32 its pid
	DGo          = 'g' // to a forked interpreter: it is the call's, checked; the sandbox is made
	DMemory      = 'm' // an uncaught MemoryError ended the call's code
	// Options of a call, to the driver.
	OptPersist = 1 << 0 // a session: wait for the next call after this one
	OptLive    = 1 << 1 // someone watches the output: stdout line-buffered
)

// Why an entry of outputs/ was left out (a T frame's first byte), and how
// many are named at most: past them a bare T frame says more were.
const (
	LeftCount      = 1 // the file count limit
	LeftBytes      = 2 // the byte limit of the call's files
	LeftUnreadable = 3 // it could not be read
	LeftLimits     = 4 // past the walk's bounds (depth, entries, path length)
	MaxLeftOut     = 64
)

// MaxFrame bounds a frame either way: a file within the sandbox's limits,
// or a chunk of output.
const MaxFrame = 64 << 20

// ExitFrameLen is the size of the exit frame's payload: u32 wait status,
// u64 stdout total, u64 stderr total, u64 ns the code ran, u32 exit flags.
const ExitFrameLen = 4 + 8 + 8 + 8 + 4

// The exit flags say why the init itself killed the code.
const (
	// ExitScratch: the files under the work dir went past the bound of
	// the process runtime's scratch space.
	ExitScratch = 1 << 0
	// ExitCell: a session's call ended and its interpreter lives on; the
	// status is the call's (0, 1 for an exception, 130 for an interrupt).
	ExitCell = 1 << 1
	// ExitPids, the process runtime's (bits from 8 up): the count the
	// code's process limit (RLIMIT_NPROC) counts reached it while the
	// code ran, so that a fork or a thread could fail there.
	ExitPids = 1 << 8
	// ExitMemory, the process runtime's: an uncaught MemoryError ended
	// the code, which its memory limit (RLIMIT_DATA) refusing an
	// allocation raises.
	ExitMemory = 1 << 9
)

// LiveTailBytes is how much of each read past a stream's head the init
// sends while the call is watched: the newest output, for progress.
const LiveTailBytes = 512

// def is one definition the C side shares: a marker, a frame type, a
// configuration key, a size.
type def struct {
	name  string
	value any // string, a byte (a frame letter) or an int
	doc   string
}

// protocol is what initproto.h defines before the configuration's keys
// (fields), in its order.
var protocol = []def{
	{"INIT_ARG", InitMarker, "makes this executable the sandbox's init"},
	{"HOLD_ARG", HoldMarker, "makes it the holder of a call slot's user namespace"},
	{"PROBE_ARG", ProbeMarker, "makes it report what the process runtime can apply here"},
	{"PROBE_NAMESPACES", ProbeNamespacesArg, "after PROBE_ARG: the probe makes a call's namespaces, as the init would"},
	{"KILL_ARG", KillMarker, "makes it kill every process of its own uid"},
	{"TEMPLATE_ARG", TemplateMarker, "after the script: the interpreter is a template's zygote"},
	{"OUTPUTS_NAME", policy.OutputsName, "the dir under the work dir whose files come back"},
	{"MAX_FRAME", MaxFrame, "bound on a frame's payload, either way"},
	{"EXIT_FRAME_LEN", ExitFrameLen, "u32 status, u64 stdout, u64 stderr, u64 ns ran, u32 flags"},
	{"EXIT_SCRATCH", ExitScratch, "exit flag: the files under the work dir went past their bound"},
	{"EXIT_CELL", ExitCell, "exit flag: a session's call ended, its interpreter lives on"},
	{"EXIT_PIDS", ExitPids, "exit flag (process runtime): the code's process count reached its RLIMIT_NPROC"},
	{"EXIT_MEMORY", ExitMemory, "exit flag (process runtime): an uncaught MemoryError ended the code"},
	{"LIVE_TAIL_BYTES", LiveTailBytes, "of each read past a stream's head, what a watched call sends at once"},
	{"DRIVER_CTL_FD", DriverCtlFd, "the driver's frames to the init"},
	{"DRIVER_CELL_FD", DriverCellFd, "the init's frames to the driver"},
	{"D_OPTIONS", byte(DOptions), "to the driver: the first call's options, u32 OPT_ flags"},
	{"D_CELL", byte(DCell), "to the driver: a session's next call, u32 flags, u32 stdin length, stdin, code"},
	{"D_VALUE", byte(DValue), "from the driver: the repr of the last expression"},
	{"D_DONE", byte(DDone), "from the driver: a session's call ended, u32 exit status"},
	{"D_READY", byte(DReady), "from a forked driver: it is confined and waits, u32 its pid"},
	{"D_GO", byte(DGo), "to a forked driver: it is the call's and checked, the sandbox made"},
	{"D_MEMORY", byte(DMemory), "from the driver: an uncaught MemoryError ended the call's code"},
	{"OPT_PERSIST", OptPersist, "a session: the interpreter waits for the next call"},
	{"OPT_LIVE", OptLive, "the output is watched: stdout line-buffered"},
	{"H_CONFIG", byte(HConfig), "the init's configuration: CFG_ fields, first and once"},
	{"H_FILE", byte(HFile), "an input file: u16 path length, path, data"},
	{"H_STDIN", byte(HStdin), "bytes of the code's stdin"},
	{"H_STDIN_END", byte(HStdinEnd), "the end of the code's stdin"},
	{"H_CPU", byte(HCPU), "the call's CPU seconds, decimal: RLIMIT_CPU of the code in the process runtime"},
	{"H_CODE", byte(HCode), "the code; it runs when it is all read"},
	{"H_KILL", byte(HKill), "kill the code now, then report as usual"},
	{"H_PERSIST", byte(HPersist), "a persistent session's call: the interpreter lives on"},
	{"H_INTERRUPT", byte(HInterrupt), "SIGINT to the interpreter: a session's timeout"},
	{"H_LIVE", byte(HLive), "the call's output is watched: stdout line-buffered"},
	{"H_FORK", byte(HFork), "to a template: fork a call, u32 fds, u32 uid, u32 gid, BPF; fds as SCM_RIGHTS"},
	{"H_NET", byte(HNet), "the egress relay, to the init: u8 NET_ op, u32 connection, its payload"},
	{"I_NET", byte(INet), "the egress relay, from the init: u8 NET_ op, u32 connection, its payload"},
	{"NET_OPEN", byte(NetOpen), "relay op, from the init: the code opened the connection"},
	{"NET_DATA", byte(NetData), "relay op: bytes of the connection"},
	{"NET_ACK", byte(NetAck), "relay op: u32 bytes of the connection were taken"},
	{"NET_EOF", byte(NetEOF), "relay op: the sender ended its writes"},
	{"NET_CLOSE", byte(NetClose), "relay op: the connection is closed"},
	{"NET_CHUNK", NetChunk, "bound on a relay data frame's bytes"},
	{"NET_WINDOW", NetWindow, "bytes of one connection in flight each way, unacknowledged"},
	{"NET_MAX_CONNS", NetMaxConns, "connections the relay holds at once"},
	{"I_READY", byte(IReady), "the interpreter waits for its code"},
	{"I_STARTED", byte(IStarted), "the code is handed over: it runs from now"},
	{"I_STDOUT", byte(IStdout), "stdout bytes, within the head (the first half of the cap)"},
	{"I_STDERR", byte(IStderr), "stderr bytes, within the head (the first half of the cap)"},
	{"I_TAIL", byte(ITail), "a stream past its head: u8 I_STDOUT or I_STDERR, u64 offset, bytes"},
	{"I_EXIT", byte(IExit), "EXIT_FRAME_LEN bytes: the main process ended, every other is killed"},
	{"I_OUTFILE", byte(IOutFile), "u16 path length, path, u64 size, data"},
	{"I_SKIPPED", byte(ISkipped), "an entry of outputs/ left out: u8 LEFT_ why, u64 size, path; bare: more than MAX_LEFT_OUT"},
	{"LEFT_COUNT", LeftCount, "left out: the file count limit"},
	{"LEFT_BYTES", LeftBytes, "left out: the byte limit of the call's files"},
	{"LEFT_UNREADABLE", LeftUnreadable, "left out: it could not be read"},
	{"LEFT_LIMITS", LeftLimits, "left out: past the walk's bounds (depth, entries, path length)"},
	{"MAX_LEFT_OUT", MaxLeftOut, "entries of outputs/ left out that are named at most"},
	{"I_NOTE", byte(INote), "a note for the caller, added to the stderr"},
	{"I_DONE", byte(IDone), "all is sent: the init exits"},
	{"I_ERROR", byte(IError), "the sandbox could not do what was asked: message"},
	{"I_RESULT", byte(IResult), "the repr of the code's last expression, one byte past the cap at most"},
	{"I_IDLE", byte(IIdle), "a session's call is over, all of it sent: the next may come"},
	{"I_FORKED", byte(IForked), "from a template: the call's init is forked and in its cgroups, u32 pid"},
	{"I_REAPED", byte(IReaped), "from a template: the call's init ended, u32 wait status"},
	{"I_USAGE", byte(IUsage), "the process runtime's, before I_EXIT: u64 CPU ns, u64 peak memory bytes of the call's processes"},
	{"ZYGOTE_FD", ZygoteFd, "the zygote's socket to its template's init"},
	{"Z_FORK", byte(ZFork), "to the zygote: a fork request, as H_FORK's, with its fds"},
	{"Z_READY", byte(ZReady), "from the zygote: it waits for forks"},
	{"Z_FORKED", byte(ZForked), "from the zygote: u32 pid of the code's process"},
	{"Z_REAPED", byte(ZReaped), "from the zygote: the code's process is reaped, its status sent"},
	{"Z_FAILED", byte(ZFailed), "from the zygote: a fork failed, a message"},
	{"FORKED_FIRST_FD", ForkedFirstFd, "a forked init's code pipes: stdin, stdout, stderr, ctl, cell from here"},
	{"FORKED_STATUS_FD", ForkedStatusFd, "a forked init's pipe of its code's wait status (u32)"},
	{"FORKED_PROCS_FD", ForkedProcsFd, "a forked init's call cgroup.procs files from here"},
}

// Header renders protocol and the configuration's keys as C: the
// sandbox init's initproto.h.
func Header() string {
	var b strings.Builder
	b.WriteString("// Code generated from runtime/initproto by TestInitProtocol; DO NOT EDIT.\n")
	b.WriteString("// The protocol between the runtime and the sandbox's init: see runtime/initproto.\n")
	b.WriteString("#pragma once\n\n")
	defs := append([]def{}, protocol...)
	for _, f := range fields {
		defs = append(defs, def{f.name, int(f.key), f.doc})
	}
	for _, d := range defs {
		var v string
		switch x := d.value.(type) {
		case string:
			v = fmt.Sprintf("%q", x)
		case byte:
			v = fmt.Sprintf("'%c'", x)
		case int:
			v = fmt.Sprint(x)
			if x >= 1<<20 {
				v = fmt.Sprintf("(%du << 20)", x>>20)
			}
		}
		fmt.Fprintf(&b, "#define %-20s %-22s // %s\n", d.name, v, d.doc)
	}
	return b.String()
}
