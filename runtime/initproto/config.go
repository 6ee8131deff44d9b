package initproto

import (
	"encoding/binary"
	"fmt"
	"strings"

	"golang.org/x/sys/unix"

	"github.com/inhuman/mcp-exec/bundle"
)

// Config is the init's whole configuration: the C side's struct config is
// its other side, field for field.
type Config struct {
	bundle.Init
	// NoParentDeath plays an init the code has subverted: no parent-death
	// signal and no exit when the host goes (the watchdog's tests only).
	NoParentDeath bool
	// Seccomp, when not nil, is a filter (a BPF program) the init installs
	// in the code's process just before it starts the interpreter: the
	// process runtime's whole filter, and under runsc the exact one.
	Seccomp []byte
	// Process, when not nil, makes the init a process of the server's
	// machine instead of pid 1 of a namespace: the process runtime.
	Process *Process
	// Template makes the init a template's: its interpreter is a zygote.
	Template bool
	// Forked, when not nil, is what a forked sandbox's init sets up
	// before anything else (runtime/fork.go).
	Forked *Fresh
}

// Fresh is what a fresh container gets from its runtime, which an init
// that starts in new namespaces makes itself there: a forked sandbox's,
// and the process runtime's in namespaces of its own.
type Fresh struct {
	// Mounts are the fresh filesystems, in order: proc (which replaces
	// the template's) and the tmpfs ones.
	Mounts []Mount
	// Masked and Readonly are the paths under /proc hidden and made
	// read-only, as the container's were.
	Masked, Readonly []string
	Hostname         string
	// LoopbackMTU shrinks lo (cgroup v1); 0 keeps it.
	LoopbackMTU int
	// KeepCaps are the capabilities the init keeps once set up (bits).
	KeepCaps uint64
	// Root, the process runtime's: when not empty, the init makes the call
	// a root of its own, as bubblewrap does: a tmpfs holding these paths
	// of the host bound read-only at the same place (a symlink made
	// again as a symlink), the mounts above made in it, and nothing else
	// of the host's; it pivots into it, and the host's root is gone.
	Root []string
	// GVisor: the sandbox is a fork inside a gVisor sandbox, whose
	// kernel shows no Seccomp_filters and no NSpid in /proc/<pid>/status:
	// the init checks its code's process by what gVisor does show.
	GVisor bool
}

// Mount is one fresh mount, as mount(2) takes it.
type Mount struct {
	Target, Type, Source, Data string
	Flags                      uint64
}

// Process is what the process runtime's init does in place of a
// container: the code in a Landlock domain of its own, under the seccomp
// filter, its files bounded.
type Process struct {
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
	// else, as a forked sandbox's init does: a root of the call's own,
	// the host's paths of Root in it read-only, a fresh /proc and /sys
	// and a tmpfs on the work dir and one on the script's dir (Mounts);
	// /proc's masks; the hostname; lo up. Then it keeps no capability
	// (KeepCaps is 0) but, under a root server, an init's.
	Namespaces *Fresh
	// ProcSelf narrows the domain's /proc, without a pid namespace of its
	// own, to what is the machine's (not a process's) and the code's own
	// process: no other process, the server's and other calls' included,
	// is visible to it. Read then lists no /proc.
	ProcSelf bool
	// PidsShare, when not 0, is the call's share of processes where its
	// process limit (RLIMIT_NPROC) counts a uid it shares with the server
	// and other calls (the runtime lowers the limit to the uid's count as
	// the call is claimed, plus the share): the init says the limit was
	// reached when the call's own tasks reach the share, or the uid's
	// count, which others move too, the limit.
	PidsShare int64
}

// fresh is what the init makes of the new namespaces it starts in, if
// any.
func (c *Config) fresh() *Fresh {
	if c.Forked != nil {
		return c.Forked
	}
	if c.Process != nil {
		return c.Process.Namespaces
	}
	return nil
}

// field is one key of the config frame, whose payload is a sequence of
// them, each a big-endian u16 key, u32 length and value. Numbers are
// big-endian u64s; strings are their bytes (no NUL); a key marked "each"
// may repeat. name and doc go to the C header; when says whether a
// configuration has the field, and put writes its values.
type field struct {
	key  uint16
	name string
	doc  string
	when func(c *Config) bool
	put  func(w *writer, c *Config)
}

// When a field is sent.
func always(*Config) bool      { return true }
func inProcess(c *Config) bool { return c.Process != nil }
func inFresh(c *Config) bool   { return c.fresh() != nil }

// fields are the configuration's keys, in their order: the C side decodes
// them in any order, and refuses a key it does not know.
var fields = []field{
	{1, "CFG_UID", "number: the code's uid", always, func(w *writer, c *Config) { w.num(uint64(c.UID)) }},
	{2, "CFG_GID", "number: the code's gid", always, func(w *writer, c *Config) { w.num(uint64(c.GID)) }},
	{3, "CFG_MAX_OUTPUT", "number: cap of each of stdout and stderr", always,
		func(w *writer, c *Config) { w.num(uint64(c.MaxOutputBytes)) }},
	{4, "CFG_MAX_FILES", "number: most output files", always, func(w *writer, c *Config) { w.num(uint64(c.MaxFiles)) }},
	{5, "CFG_MAX_FILE_BYTES", "number: most bytes of output files", always,
		func(w *writer, c *Config) { w.num(uint64(c.MaxFileBytes)) }},
	{6, "CFG_WORKDIR", "string: the code's working directory", always, func(w *writer, c *Config) { w.str(c.WorkDir) }},
	{7, "CFG_SCRIPT", "string: the FIFO, then the file, the interpreter runs", always,
		func(w *writer, c *Config) { w.str(c.Script) }},
	{8, "CFG_ARG", "string, each: the interpreter's command line", always, putArgv},
	{9, "CFG_RLIMIT", "u32 resource, u64 soft, u64 hard, each", always, putRlimits},
	{10, "CFG_NO_PARENT_DEATH", "number: 1 plays an init the code subverted (tests)",
		func(c *Config) bool { return c.NoParentDeath }, putOne},
	{11, "CFG_PROCESS", "number: 1 runs as a process of the host, not pid 1", inProcess, putOne},
	{12, "CFG_LANDLOCK", "number: the Landlock ABI whose rights are handled", inProcess,
		func(w *writer, c *Config) { w.num(uint64(c.Process.Landlock)) }},
	{13, "CFG_READ", "string, each: a path the code may read", inProcess, func(w *writer, c *Config) { w.strs(c.Process.Read) }},
	{14, "CFG_EXEC", "string, each: a path the code may execute", inProcess, func(w *writer, c *Config) { w.strs(c.Process.Exec) }},
	{15, "CFG_DEVICE", "string, each: a device node the code may read and write", inProcess,
		func(w *writer, c *Config) { w.strs(c.Process.Devices) }},
	{16, "CFG_WRITE", "string, each: a directory the code may write in", inProcess,
		func(w *writer, c *Config) { w.strs(c.Process.Write) }},
	{17, "CFG_SECCOMP", "bytes: a BPF program (struct sock_filter[], host order)",
		func(c *Config) bool { return len(c.Seccomp) > 0 }, func(w *writer, c *Config) { w.put(c.Seccomp) }},
	{18, "CFG_SCRATCH", "number: bound on the bytes under the work dir", inProcess,
		func(w *writer, c *Config) { w.num(uint64(c.Process.ScratchBytes)) }},
	{19, "CFG_TEMPLATE", "number: 1 makes the init a template's", func(c *Config) bool { return c.Template }, putOne},
	{20, "CFG_MOUNT", "u64 flags, then target, type, source each a u16 n and n bytes, then data; each: a fresh mount", inFresh, putMounts},
	{21, "CFG_MASK", "string, each: a path under /proc the init hides in its fresh one", inFresh,
		func(w *writer, c *Config) { w.strs(c.fresh().Masked) }},
	{22, "CFG_READONLY", "string, each: a path under /proc the init makes read-only in its fresh one", inFresh,
		func(w *writer, c *Config) { w.strs(c.fresh().Readonly) }},
	{23, "CFG_HOSTNAME", "string: the hostname the init sets in its new UTS namespace", inFresh,
		func(w *writer, c *Config) { w.str(c.fresh().Hostname) }},
	{24, "CFG_LOOPBACK_MTU", "number: a forked sandbox's loopback MTU (0: the kernel's)", inFresh,
		func(w *writer, c *Config) { w.num(uint64(c.fresh().LoopbackMTU)) }},
	{25, "CFG_KEEP_CAPS", "number: the capabilities a forked sandbox's init keeps after its setup", inFresh,
		func(w *writer, c *Config) { w.num(c.fresh().KeepCaps) }},
	{30, "CFG_GVISOR", "number: 1: a forked sandbox inside gVisor, whose /proc has no Seccomp_filters nor NSpid",
		func(c *Config) bool { f := c.fresh(); return f != nil && f.GVisor }, putOne},
	{26, "CFG_NAMESPACES", "number: 1: the process runtime's init makes the namespaces it starts in the call's",
		func(c *Config) bool { return c.Process != nil && c.Process.Namespaces != nil }, putOne},
	{27, "CFG_PROC_SELF", "number: 1: of /proc the code reads only the machine's entries and its own process",
		func(c *Config) bool { return c.Process != nil && c.Process.ProcSelf }, putOne},
	{28, "CFG_ROOT", "string, each: a host path bound read-only at its place into the call's own root (the process runtime's)",
		func(c *Config) bool {
			return c.Process != nil && c.Process.Namespaces != nil && len(c.Process.Namespaces.Root) > 0
		},
		func(w *writer, c *Config) { w.strs(c.Process.Namespaces.Root) }},
	{29, "CFG_PIDS_SHARE", "number: the call's share of processes, its RLIMIT_NPROC counting a uid shared with others",
		func(c *Config) bool { return c.Process != nil && c.Process.PidsShare > 0 },
		func(w *writer, c *Config) { w.num(uint64(c.Process.PidsShare)) }},
	{40, "CFG_RELAY_PORT", "number: the egress relay's port on the sandbox's 127.0.0.1",
		func(c *Config) bool { return c.RelayPort != 0 && !c.Template }, func(w *writer, c *Config) { w.num(uint64(c.RelayPort)) }},
	{41, "CFG_CA_BUNDLE", "bytes: the CA certificates the code trusts, written read-only at CFG_CA_PATH",
		withTrust, func(w *writer, c *Config) { w.put(c.CABundle) }},
	{42, "CFG_CA_PATH", "string: where the init writes CFG_CA_BUNDLE", withTrust, func(w *writer, c *Config) { w.str(c.CABundlePath) }},
}

// withTrust: the sandbox gets a CA bundle (the network allowlist is on);
// a template's init, which runs no call, does not.
func withTrust(c *Config) bool { return len(c.CABundle) > 0 && !c.Template }

func putOne(w *writer, _ *Config) { w.num(1) }

// putArgv: the interpreter, its options, the driver, the script, and for
// a template the marker that makes the driver a zygote.
func putArgv(w *writer, c *Config) {
	if len(c.Argv) < 2 {
		return // refused by Encode
	}
	w.strs(Argv(c.Argv, c.Template))
}

func putRlimits(w *writer, c *Config) {
	for _, rl := range c.Rlimits {
		res, ok := rlimits[rl.Type]
		if !ok {
			w.fail(fmt.Errorf("the init's configuration: unknown rlimit %q", rl.Type))
			continue
		}
		v := binary.BigEndian.AppendUint32(nil, uint32(res))
		v = binary.BigEndian.AppendUint64(v, rl.Soft)
		w.put(binary.BigEndian.AppendUint64(v, rl.Hard))
	}
}

func putMounts(w *writer, c *Config) {
	for _, m := range c.fresh().Mounts {
		v := binary.BigEndian.AppendUint64(nil, m.Flags)
		for _, s := range []string{m.Target, m.Type, m.Source} {
			if strings.IndexByte(s, 0) >= 0 || s == "" || len(s) > 4096 {
				w.bad = append(w.bad, fmt.Sprintf("mount %q", m.Target))
			}
			v = binary.BigEndian.AppendUint16(v, uint16(len(s)))
			v = append(v, s...)
		}
		if strings.IndexByte(m.Data, 0) >= 0 {
			w.bad = append(w.bad, fmt.Sprintf("mount %q", m.Target))
		}
		w.put(append(v, m.Data...))
	}
}

// writer writes the values of one field after another.
type writer struct {
	buf []byte
	key uint16
	bad []string // strings no C string can hold
	err error
}

func (w *writer) put(val []byte) {
	w.buf = binary.BigEndian.AppendUint16(w.buf, w.key)
	w.buf = binary.BigEndian.AppendUint32(w.buf, uint32(len(val)))
	w.buf = append(w.buf, val...)
}

func (w *writer) num(v uint64) { w.put(binary.BigEndian.AppendUint64(nil, v)) }

func (w *writer) str(s string) {
	if strings.IndexByte(s, 0) >= 0 || s == "" {
		w.bad = append(w.bad, fmt.Sprintf("%q", s))
	}
	w.put([]byte(s))
}

func (w *writer) strs(l []string) {
	for _, s := range l {
		w.str(s)
	}
}

func (w *writer) fail(err error) {
	if w.err == nil {
		w.err = err
	}
}

// Encode renders the configuration as the config frame's payload,
// refusing one the init could not take whole.
func (c *Config) Encode() ([]byte, error) {
	if err := Linked(); err != nil {
		return nil, err
	}
	if c.Forked != nil && c.Process != nil && c.Process.Namespaces != nil {
		return nil, fmt.Errorf("the init's configuration is both a forked sandbox's and the process runtime's")
	}
	w := &writer{}
	for _, f := range fields {
		if f.when(c) {
			w.key = f.key
			f.put(w, c)
		}
	}
	if w.err != nil {
		return nil, w.err
	}
	if len(w.bad) > 0 {
		return nil, fmt.Errorf("the init's configuration has empty strings or strings with a NUL byte: %s", strings.Join(w.bad, ", "))
	}
	if len(c.Argv) < 2 || c.Argv[len(c.Argv)-1] == "" {
		return nil, fmt.Errorf("the init's configuration has no interpreter and script: %q", c.Argv)
	}
	if len(w.buf) > MaxFrame {
		return nil, fmt.Errorf("the init's configuration is %d bytes, over a frame's %d", len(w.buf), MaxFrame)
	}
	return w.buf, nil
}

// Rlimit is the kernel's number of the spec's rlimit name.
func Rlimit(name string) (int, bool) {
	n, ok := rlimits[name]
	return n, ok
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
