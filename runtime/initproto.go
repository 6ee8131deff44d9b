package runtime

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"strings"
	"sync"

	"golang.org/x/sys/unix"

	"github.com/inhuman/mcp-exec/bundle"
	"github.com/inhuman/mcp-exec/policy"
)

// The sandbox's init (sandboxinit.c) is the same program under every
// runtime, and so is the conversation with it, over its standard input and
// output, in frames of a type byte, a big-endian uint32 length and the
// payload:
//
//	host → init  G config    the init's configuration (initConfig), first
//	init → host  R           the interpreter is started and waits for its code
//	host → init  F path data an input file, written in the work dir as the code's user
//	host → init  I data, J   the code's stdin, then its end
//	host → init  L seconds   the call's CPU seconds (the process runtime's RLIMIT_CPU)
//	host → init  P           a persistent session's call: the interpreter
//	                         lives on after the code, for the next call
//	host → init  C code      the code: the interpreter reads it and runs it
//	init → host  S           the code has it: the timeout counts from here
//	init → host  O, E data   stdout and stderr, at most the cap each
//	host → init  K           kill the code now (the timeout)
//	host → init  Q           interrupt the code (SIGINT: a session's timeout)
//	host → init  H           the call's output is watched live: line-buffer stdout
//	init → host  V repr      the repr of the code's last expression
//	init → host  X status    the main process's wait status, the byte counts
//	                         of stdout and stderr, how long it ran, and why
//	                         the init killed it (exitFlags); every other
//	                         process of the code has been killed
//	init → host  F path data a file from outputs/
//	init → host  T why size path
//	                         an entry of outputs/ left out (u8 a leftOut
//	                         reason, u64 its size, its path; a dir's ends
//	                         in '/'); bare: more than maxLeftOut were
//	init → host  N message   a note for the caller, added to the stderr
//	init → host  D           done: the init exits
//	init → host  Z           a session's call is over and all of it sent;
//	                         the interpreter waits for the next (F, I, J,
//	                         L, C again: a new call)
//	init → host  W message   something the init was asked to do failed
//
// A template's init (forked sandboxes, fork.go) takes the same
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
// its process and to kill it; supervise does the rest, the same for all.
//
// This file is the protocol's one definition: initproto.h, which the C
// side includes, is rendered from protocol below, and TestInitProtocol
// fails while the checked-in header differs (go test ./runtime -run
// TestInitProtocol -update writes it).

// The markers: the first argument that makes this executable something
// else than the server, before the Go runtime starts (sandboxinit.c's
// constructor).
const (
	initMarker  = bundle.InitMarker
	holdMarker  = "__mcp_exec_userns__"
	probeMarker = "__mcp_exec_probe__"
	// probeNamespacesArg follows probeMarker: the probe makes a call's
	// namespaces (probe_namespaces).
	probeNamespacesArg = "namespaces"
	killMarker         = "__mcp_exec_kill__"
	// templateMarker follows the script on a zygote's command line.
	templateMarker = "--mcp-exec-template"
)

// Frame types, host to init.
const (
	hConfig    = 'G'
	hFile      = 'F'
	hStdin     = 'I'
	hStdinEnd  = 'J'
	hCPU       = 'L'
	hCode      = 'C'
	hKill      = 'K'
	hPersist   = 'P'
	hInterrupt = 'Q'
	hLive      = 'H'
	hFork      = 'Y'
)

// Frame types, init to host.
const (
	iReady   = 'R'
	iStarted = 'S'
	iStdout  = 'O'
	iStderr  = 'E'
	iExit    = 'X'
	iOutFile = 'F'
	iSkipped = 'T'
	iNote    = 'N'
	iDone    = 'D'
	iError   = 'W'
	iResult  = 'V'
	iIdle    = 'Z'
	iForked  = 'U'
	iReaped  = 'A'
)

// The zygote's messages (driver.py), on its socket to the template's init.
const (
	zygoteFd = 3
	zFork    = 'k' // a fork request, as hFork's payload, with its fds
	zReady   = 'r' // the zygote waits for forks
	zForked  = 'f' // u32 pid: the code's process is forked
	zReaped  = 'x' // the code's process is reaped, its status sent
	zFailed  = 'w' // a message: the fork failed
	// forkedFirstFd is the first of a forked init's five ends of its
	// code's pipes: stdin, stdout, stderr, the driver's ctl and cell; the
	// code's exit status comes on forkedStatusFd; the call's
	// cgroup.procs files are from forkedProcsFd on.
	forkedFirstFd  = 3
	forkedStatusFd = forkedFirstFd + 5
	forkedProcsFd  = forkedStatusFd + 1
)

// The driver's pipes and frames (driver.py).
const (
	driverCtlFd  = 3   // driver → init
	driverCellFd = 4   // init → driver
	dOptions     = 'o' // the first call's options: u32 opt flags
	dCell        = 'c' // a session's next call: u32 opt flags, u32 stdin length, stdin, code
	dValue       = 'v' // the repr of the last expression
	dDone        = 'd' // a session's call ended: u32 exit status
	dReady       = 'r' // a forked interpreter is confined and waits: u32 its pid
	dGo          = 'g' // to a forked interpreter: it is the call's, checked; the sandbox is made
	// Options of a call, to the driver.
	optPersist = 1 << 0 // a session: wait for the next call after this one
	optLive    = 1 << 1 // someone watches the output: stdout line-buffered
)

// maxFrame bounds a frame either way: a file within the sandbox's limits,
// or a chunk of output.
const maxFrame = 64 << 20

// exitFrameLen is the size of the exit frame's payload: u32 wait status,
// u64 stdout total, u64 stderr total, u64 ns the code ran, u32 exitFlags.
const exitFrameLen = 4 + 8 + 8 + 8 + 4

// Why an entry of outputs/ was left out (a T frame's first byte), and how
// many are named at most: past them a bare T frame says more were.
const (
	leftCount      = 1 // the file count limit
	leftBytes      = 2 // the byte limit of the call's files
	leftUnreadable = 3 // it could not be read
	leftLimits     = 4 // past the walk's bounds (depth, entries, path length)
	maxLeftOut     = 64
)

// exitFlags say why the init itself killed the code.
const (
	// exitScratch: the files under the work dir went past the bound of
	// the process runtime's scratch space.
	exitScratch = 1 << 0
	// exitCell: a session's call ended and its interpreter lives on; the
	// status is the call's (0, 1 for an exception, 130 for an interrupt).
	exitCell = 1 << 1
)

// Configuration keys: the config frame's payload is a sequence of fields,
// each a big-endian u16 key, u32 length and value. Numbers are big-endian
// u64s; strings are their bytes (no NUL); a key marked "each" may repeat.
const (
	cfgUID           = 1  // number: the code's uid
	cfgGID           = 2  // number: the code's gid
	cfgMaxOutput     = 3  // number: cap of each of stdout and stderr
	cfgMaxFiles      = 4  // number: most output files
	cfgMaxFileBytes  = 5  // number: most bytes of output files
	cfgWorkDir       = 6  // string: the code's working directory
	cfgScript        = 7  // string: the FIFO, then the file, the interpreter runs
	cfgArg           = 8  // string, each: the interpreter's command line
	cfgRlimit        = 9  // u32 resource, u64 soft, u64 hard, each
	cfgNoParentDeath = 10 // number: 1 plays an init the code subverted (tests)
	cfgProcess       = 11 // number: 1 runs as a process of the host, not pid 1
	cfgLandlock      = 12 // number: the Landlock ABI whose rights are handled
	cfgRead          = 13 // string, each: a path the code may read
	cfgExec          = 14 // string, each: a path the code may execute
	cfgDevice        = 15 // string, each: a device node the code may read and write
	cfgWrite         = 16 // string, each: a directory the code may write in
	cfgSeccomp       = 17 // bytes: a BPF program (struct sock_filter[], host order)
	cfgScratch       = 18 // number: bound on the bytes under the work dir
	cfgTemplate      = 19 // number: 1 makes the init a template's (a zygote, forks)
	cfgMount         = 20 // u64 flags; target, type, source (u16 n, n bytes each); data: each, a fresh mount the init makes
	cfgMask          = 21 // string, each: a path under /proc the init hides in its fresh one
	cfgReadonly      = 22 // string, each: a path under /proc the init makes read-only in its fresh one
	cfgHostname      = 23 // string: the hostname the init sets in its new UTS namespace
	cfgLoopbackMTU   = 24 // number: a forked sandbox's loopback MTU and segment size (0: the kernel's)
	cfgKeepCaps      = 25 // number: a forked sandbox's init keeps these capabilities (a mask) after its setup
	cfgNamespaces    = 26 // number: 1: the process runtime's init starts in namespaces of its own and makes them the call's
	cfgProcSelf      = 27 // number: 1: of /proc, the code's domain reads only what is the machine's and its own process
)

// initConfig is the init's whole configuration: sandboxinit.c's struct
// config is its other side, field for field.
type initConfig struct {
	bundle.Init
	// NoParentDeath plays an init the code has subverted: no parent-death
	// signal and no exit when the host goes (the watchdog's tests only).
	NoParentDeath bool
	// Seccomp, when not nil, is a filter (a BPF program) the init installs
	// in the code's process just before it starts the interpreter: the
	// process runtime's whole filter, and under runsc the exact one (see
	// runscContainer.initConfig).
	Seccomp []byte
	// Process, when not nil, makes the init a process of the server's
	// machine instead of pid 1 of a namespace: the process runtime.
	Process *processConfig
	// Template makes the init a template's: its interpreter is a zygote.
	Template bool
	// Forked, when not nil, is what a forked sandbox's init sets up
	// before anything else (fork.go).
	Forked *forkedConfig
}

// forkedConfig is a forked sandbox's own: what a fresh container gets
// from its runtime, which the call's init makes in the new namespaces it
// starts in.
type forkedConfig struct {
	// Mounts are the fresh filesystems, in order: proc (which replaces
	// the template's) and the tmpfs ones.
	Mounts []forkedMount
	// Masked and Readonly are the paths under /proc hidden and made
	// read-only, as the container's were.
	Masked, Readonly []string
	Hostname         string
	// LoopbackMTU shrinks lo (cgroup v1, see loopbackMTU); 0 keeps it.
	LoopbackMTU int
	// KeepCaps are the capabilities the init keeps once set up (bits).
	KeepCaps uint64
}

// forkedMount is one fresh mount, as mount(2) takes it.
type forkedMount struct {
	Target, Type, Source, Data string
	Flags                      uint64
}

// processConfig is what the process runtime's init does in place of a
// container: the code in a Landlock domain of its own, under the seccomp
// filter, its files bounded.
type processConfig struct {
	// Landlock is the ABI version whose rights the code's domain handles;
	// 0: no domain (the host has no Landlock).
	Landlock int
	// Read, Exec, Devices and Write are the domain's rules: what the code
	// may read, execute (and read), read and write (device nodes), and the
	// directories it may write in.
	Read, Exec, Devices, Write []string
	// ScratchBytes bounds what the code keeps under the work dir, named
	// or not, by measure; 0 when the work dir is a tmpfs of that size.
	ScratchBytes int64
	// Namespaces, when not nil, says that the init starts as pid 1 of new
	// user, pid, mount, network, IPC and UTS namespaces (the runtime made
	// them as it started it), and what it makes them before anything
	// else, as a forked sandbox's init does: over the host's files, made
	// read-only, a fresh /proc and /sys and a tmpfs on the work dir and
	// one on the script's dir (Mounts); /proc's masks; the hostname; lo
	// up. Then it keeps no capability (KeepCaps is 0).
	Namespaces *forkedConfig
	// ProcSelf narrows the domain's /proc, without a pid namespace of its
	// own, to what is the machine's (not a process's) and the code's own
	// process: no other process, the server's and other calls' included,
	// is visible to it. Read then lists no /proc.
	ProcSelf bool
}

// subvertedInits are the bundles whose init plays one the code subverted
// (initConfig.NoParentDeath): the watchdog's tests set it, nothing else.
var subvertedInits sync.Map

// containerInit is the configuration of the init of a container: the
// bundle's, as it is.
func containerInit(b *bundle.Bundle) *initConfig {
	_, subverted := subvertedInits.Load(b.ID)
	return &initConfig{Init: b.Init, NoParentDeath: subverted}
}

// encode renders the configuration as the config frame's payload.
func (c *initConfig) encode() ([]byte, error) {
	var b bytes.Buffer
	field := func(key uint16, val []byte) {
		var h [6]byte
		binary.BigEndian.PutUint16(h[:], key)
		binary.BigEndian.PutUint32(h[2:], uint32(len(val)))
		b.Write(h[:])
		b.Write(val)
	}
	num := func(key uint16, v uint64) { field(key, binary.BigEndian.AppendUint64(nil, v)) }
	var bad []string
	str := func(key uint16, s string) {
		if strings.IndexByte(s, 0) >= 0 || s == "" {
			bad = append(bad, fmt.Sprintf("%q", s))
		}
		field(key, []byte(s))
	}
	flag := func(key uint16, on bool) {
		if on {
			num(key, 1)
		}
	}
	num(cfgUID, uint64(c.UID))
	num(cfgGID, uint64(c.GID))
	num(cfgMaxOutput, uint64(c.MaxOutputBytes))
	num(cfgMaxFiles, uint64(c.MaxFiles))
	num(cfgMaxFileBytes, uint64(c.MaxFileBytes))
	str(cfgWorkDir, c.WorkDir)
	str(cfgScript, c.Script)
	if len(c.Argv) >= 2 {
		argv := driverArgv(c.Argv)
		if c.Template {
			argv = append(argv, templateMarker)
		}
		for _, a := range argv {
			str(cfgArg, a)
		}
	}
	for _, rl := range c.Rlimits {
		res, ok := rlimits[rl.Type]
		if !ok {
			return nil, fmt.Errorf("the init's configuration: unknown rlimit %q", rl.Type)
		}
		v := binary.BigEndian.AppendUint32(nil, uint32(res))
		v = binary.BigEndian.AppendUint64(v, rl.Soft)
		field(cfgRlimit, binary.BigEndian.AppendUint64(v, rl.Hard))
	}
	flag(cfgNoParentDeath, c.NoParentDeath)
	if p := c.Process; p != nil {
		num(cfgProcess, 1)
		num(cfgLandlock, uint64(p.Landlock))
		for _, l := range []struct {
			key   uint16
			paths []string
		}{{cfgRead, p.Read}, {cfgExec, p.Exec}, {cfgDevice, p.Devices}, {cfgWrite, p.Write}} {
			for _, path := range l.paths {
				str(l.key, path)
			}
		}
		num(cfgScratch, uint64(p.ScratchBytes))
		flag(cfgProcSelf, p.ProcSelf)
	}
	if len(c.Seccomp) > 0 {
		field(cfgSeccomp, c.Seccomp)
	}
	flag(cfgTemplate, c.Template)
	fresh := c.Forked
	if c.Process != nil && c.Process.Namespaces != nil {
		if fresh != nil {
			return nil, fmt.Errorf("the init's configuration is both a forked sandbox's and the process runtime's")
		}
		fresh = c.Process.Namespaces
		num(cfgNamespaces, 1)
	}
	if f := fresh; f != nil {
		for _, m := range f.Mounts {
			v := binary.BigEndian.AppendUint64(nil, m.Flags)
			for _, s := range []string{m.Target, m.Type, m.Source} {
				if strings.IndexByte(s, 0) >= 0 || s == "" || len(s) > 4096 {
					bad = append(bad, fmt.Sprintf("mount %q", m.Target))
				}
				v = binary.BigEndian.AppendUint16(v, uint16(len(s)))
				v = append(v, s...)
			}
			if strings.IndexByte(m.Data, 0) >= 0 {
				bad = append(bad, fmt.Sprintf("mount %q", m.Target))
			}
			field(cfgMount, append(v, m.Data...))
		}
		for _, p := range f.Masked {
			str(cfgMask, p)
		}
		for _, p := range f.Readonly {
			str(cfgReadonly, p)
		}
		str(cfgHostname, f.Hostname)
		num(cfgLoopbackMTU, uint64(f.LoopbackMTU))
		num(cfgKeepCaps, f.KeepCaps)
	}
	if len(bad) > 0 {
		return nil, fmt.Errorf("the init's configuration has empty strings or strings with a NUL byte: %s", strings.Join(bad, ", "))
	}
	if len(c.Argv) < 2 || c.Argv[len(c.Argv)-1] == "" {
		return nil, fmt.Errorf("the init's configuration has no interpreter and script: %q", c.Argv)
	}
	if b.Len() > maxFrame {
		return nil, fmt.Errorf("the init's configuration is %d bytes, over a frame's %d", b.Len(), maxFrame)
	}
	return b.Bytes(), nil
}

// rlimits maps the spec's rlimit names to the kernel's numbers.
var rlimits = map[string]int{
	"RLIMIT_AS": unix.RLIMIT_AS, "RLIMIT_CORE": unix.RLIMIT_CORE, "RLIMIT_CPU": unix.RLIMIT_CPU,
	"RLIMIT_DATA": unix.RLIMIT_DATA, "RLIMIT_FSIZE": unix.RLIMIT_FSIZE, "RLIMIT_LOCKS": unix.RLIMIT_LOCKS,
	"RLIMIT_MEMLOCK": unix.RLIMIT_MEMLOCK, "RLIMIT_MSGQUEUE": unix.RLIMIT_MSGQUEUE, "RLIMIT_NICE": unix.RLIMIT_NICE,
	"RLIMIT_NOFILE": unix.RLIMIT_NOFILE, "RLIMIT_NPROC": unix.RLIMIT_NPROC, "RLIMIT_RSS": unix.RLIMIT_RSS,
	"RLIMIT_RTPRIO": unix.RLIMIT_RTPRIO, "RLIMIT_RTTIME": unix.RLIMIT_RTTIME, "RLIMIT_SIGPENDING": unix.RLIMIT_SIGPENDING,
	"RLIMIT_STACK": unix.RLIMIT_STACK,
}

// protoDef is one definition the C side shares: a marker, a frame type, a
// configuration key, a size.
type protoDef struct {
	name  string
	value any // string, a byte (a frame letter) or an int
	doc   string
}

// protocol is what initproto.h defines, in its order.
var protocol = []protoDef{
	{"INIT_ARG", initMarker, "makes this executable the sandbox's init"},
	{"HOLD_ARG", holdMarker, "makes it the holder of a call slot's user namespace"},
	{"PROBE_ARG", probeMarker, "makes it report what the process runtime can apply here"},
	{"PROBE_NAMESPACES", probeNamespacesArg, "after PROBE_ARG: the probe makes a call's namespaces, as the init would"},
	{"KILL_ARG", killMarker, "makes it kill every process of its own uid"},
	{"TEMPLATE_ARG", templateMarker, "after the script: the interpreter is a template's zygote"},
	{"OUTPUTS_NAME", policy.OutputsName, "the dir under the work dir whose files come back"},
	{"MAX_FRAME", maxFrame, "bound on a frame's payload, either way"},
	{"EXIT_FRAME_LEN", exitFrameLen, "u32 status, u64 stdout, u64 stderr, u64 ns ran, u32 flags"},
	{"EXIT_SCRATCH", exitScratch, "exit flag: the files under the work dir went past their bound"},
	{"EXIT_CELL", exitCell, "exit flag: a session's call ended, its interpreter lives on"},
	{"DRIVER_CTL_FD", driverCtlFd, "the driver's frames to the init"},
	{"DRIVER_CELL_FD", driverCellFd, "the init's frames to the driver"},
	{"D_OPTIONS", byte(dOptions), "to the driver: the first call's options, u32 OPT_ flags"},
	{"D_CELL", byte(dCell), "to the driver: a session's next call, u32 flags, u32 stdin length, stdin, code"},
	{"D_VALUE", byte(dValue), "from the driver: the repr of the last expression"},
	{"D_DONE", byte(dDone), "from the driver: a session's call ended, u32 exit status"},
	{"D_READY", byte(dReady), "from a forked driver: it is confined and waits, u32 its pid"},
	{"D_GO", byte(dGo), "to a forked driver: it is the call's and checked, the sandbox made"},
	{"OPT_PERSIST", optPersist, "a session: the interpreter waits for the next call"},
	{"OPT_LIVE", optLive, "the output is watched: stdout line-buffered"},
	{"H_CONFIG", byte(hConfig), "the init's configuration: CFG_ fields, first and once"},
	{"H_FILE", byte(hFile), "an input file: u16 path length, path, data"},
	{"H_STDIN", byte(hStdin), "bytes of the code's stdin"},
	{"H_STDIN_END", byte(hStdinEnd), "the end of the code's stdin"},
	{"H_CPU", byte(hCPU), "the call's CPU seconds, decimal: RLIMIT_CPU of the code in the process runtime"},
	{"H_CODE", byte(hCode), "the code; it runs when it is all read"},
	{"H_KILL", byte(hKill), "kill the code now, then report as usual"},
	{"H_PERSIST", byte(hPersist), "a persistent session's call: the interpreter lives on"},
	{"H_INTERRUPT", byte(hInterrupt), "SIGINT to the interpreter: a session's timeout"},
	{"H_LIVE", byte(hLive), "the call's output is watched: stdout line-buffered"},
	{"H_FORK", byte(hFork), "to a template: fork a call, u32 fds, u32 uid, u32 gid, BPF; fds as SCM_RIGHTS"},
	{"I_READY", byte(iReady), "the interpreter waits for its code"},
	{"I_STARTED", byte(iStarted), "the code is handed over: it runs from now"},
	{"I_STDOUT", byte(iStdout), "stdout bytes, within the cap"},
	{"I_STDERR", byte(iStderr), "stderr bytes, within the cap"},
	{"I_EXIT", byte(iExit), "EXIT_FRAME_LEN bytes: the main process ended, every other is killed"},
	{"I_OUTFILE", byte(iOutFile), "u16 path length, path, u64 size, data"},
	{"I_SKIPPED", byte(iSkipped), "an entry of outputs/ left out: u8 LEFT_ why, u64 size, path; bare: more than MAX_LEFT_OUT"},
	{"LEFT_COUNT", leftCount, "left out: the file count limit"},
	{"LEFT_BYTES", leftBytes, "left out: the byte limit of the call's files"},
	{"LEFT_UNREADABLE", leftUnreadable, "left out: it could not be read"},
	{"LEFT_LIMITS", leftLimits, "left out: past the walk's bounds (depth, entries, path length)"},
	{"MAX_LEFT_OUT", maxLeftOut, "entries of outputs/ left out that are named at most"},
	{"I_NOTE", byte(iNote), "a note for the caller, added to the stderr"},
	{"I_DONE", byte(iDone), "all is sent: the init exits"},
	{"I_ERROR", byte(iError), "the sandbox could not do what was asked: message"},
	{"I_RESULT", byte(iResult), "the repr of the code's last expression, one byte past the cap at most"},
	{"I_IDLE", byte(iIdle), "a session's call is over, all of it sent: the next may come"},
	{"I_FORKED", byte(iForked), "from a template: the call's init is forked and in its cgroups, u32 pid"},
	{"I_REAPED", byte(iReaped), "from a template: the call's init ended, u32 wait status"},
	{"ZYGOTE_FD", zygoteFd, "the zygote's socket to its template's init"},
	{"Z_FORK", byte(zFork), "to the zygote: a fork request, as H_FORK's, with its fds"},
	{"Z_READY", byte(zReady), "from the zygote: it waits for forks"},
	{"Z_FORKED", byte(zForked), "from the zygote: u32 pid of the code's process"},
	{"Z_REAPED", byte(zReaped), "from the zygote: the code's process is reaped, its status sent"},
	{"Z_FAILED", byte(zFailed), "from the zygote: a fork failed, a message"},
	{"FORKED_FIRST_FD", forkedFirstFd, "a forked init's code pipes: stdin, stdout, stderr, ctl, cell from here"},
	{"FORKED_STATUS_FD", forkedStatusFd, "a forked init's pipe of its code's wait status (u32)"},
	{"FORKED_PROCS_FD", forkedProcsFd, "a forked init's call cgroup.procs files from here"},
	{"CFG_UID", cfgUID, "number: the code's uid"},
	{"CFG_GID", cfgGID, "number: the code's gid"},
	{"CFG_MAX_OUTPUT", cfgMaxOutput, "number: cap of each of stdout and stderr"},
	{"CFG_MAX_FILES", cfgMaxFiles, "number: most output files"},
	{"CFG_MAX_FILE_BYTES", cfgMaxFileBytes, "number: most bytes of output files"},
	{"CFG_WORKDIR", cfgWorkDir, "string: the code's working directory"},
	{"CFG_SCRIPT", cfgScript, "string: the FIFO, then the file, the interpreter runs"},
	{"CFG_ARG", cfgArg, "string, each: the interpreter's command line"},
	{"CFG_RLIMIT", cfgRlimit, "u32 resource, u64 soft, u64 hard, each"},
	{"CFG_NO_PARENT_DEATH", cfgNoParentDeath, "number: 1 plays an init the code subverted (tests)"},
	{"CFG_PROCESS", cfgProcess, "number: 1 runs as a process of the host, not pid 1"},
	{"CFG_LANDLOCK", cfgLandlock, "number: the Landlock ABI whose rights are handled"},
	{"CFG_READ", cfgRead, "string, each: a path the code may read"},
	{"CFG_EXEC", cfgExec, "string, each: a path the code may execute"},
	{"CFG_DEVICE", cfgDevice, "string, each: a device node the code may read and write"},
	{"CFG_WRITE", cfgWrite, "string, each: a directory the code may write in"},
	{"CFG_SECCOMP", cfgSeccomp, "bytes: a BPF program (struct sock_filter[], host order)"},
	{"CFG_SCRATCH", cfgScratch, "number: bound on the bytes under the work dir"},
	{"CFG_TEMPLATE", cfgTemplate, "number: 1 makes the init a template's"},
	{"CFG_MOUNT", cfgMount, "u64 flags, then target, type, source each a u16 n and n bytes, then data; each: a fresh mount"},
	{"CFG_MASK", cfgMask, "string, each: a path under /proc the init hides in its fresh one"},
	{"CFG_READONLY", cfgReadonly, "string, each: a path under /proc the init makes read-only in its fresh one"},
	{"CFG_HOSTNAME", cfgHostname, "string: the hostname the init sets in its new UTS namespace"},
	{"CFG_LOOPBACK_MTU", cfgLoopbackMTU, "number: a forked sandbox's loopback MTU (0: the kernel's)"},
	{"CFG_KEEP_CAPS", cfgKeepCaps, "number: the capabilities a forked sandbox's init keeps after its setup"},
	{"CFG_NAMESPACES", cfgNamespaces, "number: 1: the process runtime's init makes the namespaces it starts in the call's"},
	{"CFG_PROC_SELF", cfgProcSelf, "number: 1: of /proc the code reads only the machine's entries and its own process"},
}

// protocolHeader renders protocol as C.
func protocolHeader() string {
	var b strings.Builder
	b.WriteString("// Code generated from runtime/initproto.go by TestInitProtocol; DO NOT EDIT.\n")
	b.WriteString("// The protocol between the runtime and the sandbox's init: see initproto.go.\n")
	b.WriteString("#pragma once\n\n")
	for _, d := range protocol {
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
