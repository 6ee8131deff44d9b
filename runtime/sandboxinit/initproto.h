// Code generated from runtime/initproto by TestInitProtocol; DO NOT EDIT.
// The protocol between the runtime and the sandbox's init: see runtime/initproto.
#pragma once

#define INIT_ARG             "__mcp_exec_init__"    // makes this executable the sandbox's init
#define HOLD_ARG             "__mcp_exec_userns__"  // makes it the holder of a call slot's user namespace
#define PROBE_ARG            "__mcp_exec_probe__"   // makes it report what the process runtime can apply here
#define PROBE_NAMESPACES     "namespaces"           // after PROBE_ARG: the probe makes a call's namespaces, as the init would
#define KILL_ARG             "__mcp_exec_kill__"    // makes it kill every process of its own uid
#define TEMPLATE_ARG         "--mcp-exec-template"  // after the script: the interpreter is a template's zygote
#define OUTPUTS_NAME         "outputs"              // the dir under the work dir whose files come back
#define MAX_FRAME            (64u << 20)            // bound on a frame's payload, either way
#define EXIT_FRAME_LEN       32                     // u32 status, u64 stdout, u64 stderr, u64 ns ran, u32 flags
#define EXIT_SCRATCH         1                      // exit flag: the files under the work dir went past their bound
#define EXIT_CELL            2                      // exit flag: a session's call ended, its interpreter lives on
#define EXIT_PIDS            256                    // exit flag (process runtime): the code's process count reached its RLIMIT_NPROC
#define EXIT_MEMORY          512                    // exit flag (process runtime): an uncaught MemoryError ended the code
#define LIVE_TAIL_BYTES      512                    // of each read past a stream's head, what a watched call sends at once
#define DRIVER_CTL_FD        3                      // the driver's frames to the init
#define DRIVER_CELL_FD       4                      // the init's frames to the driver
#define D_OPTIONS            'o'                    // to the driver: the first call's options, u32 OPT_ flags
#define D_CELL               'c'                    // to the driver: a session's next call, u32 flags, u32 stdin length, stdin, code
#define D_VALUE              'v'                    // from the driver: the repr of the last expression
#define D_DONE               'd'                    // from the driver: a session's call ended, u32 exit status
#define D_READY              'r'                    // from a forked driver: it is confined and waits, u32 its pid
#define D_GO                 'g'                    // to a forked driver: it is the call's and checked, the sandbox made
#define D_MEMORY             'm'                    // from the driver: an uncaught MemoryError ended the call's code
#define OPT_PERSIST          1                      // a session: the interpreter waits for the next call
#define OPT_LIVE             2                      // the output is watched: stdout line-buffered
#define H_CONFIG             'G'                    // the init's configuration: CFG_ fields, first and once
#define H_FILE               'F'                    // an input file: u16 path length, path, data
#define H_STDIN              'I'                    // bytes of the code's stdin
#define H_STDIN_END          'J'                    // the end of the code's stdin
#define H_CPU                'L'                    // the call's CPU seconds, decimal: RLIMIT_CPU of the code in the process runtime
#define H_CODE               'C'                    // the code; it runs when it is all read
#define H_KILL               'K'                    // kill the code now, then report as usual
#define H_PERSIST            'P'                    // a persistent session's call: the interpreter lives on
#define H_INTERRUPT          'Q'                    // SIGINT to the interpreter: a session's timeout
#define H_LIVE               'H'                    // the call's output is watched: stdout line-buffered
#define H_FORK               'Y'                    // to a template: fork a call, u32 fds, u32 uid, u32 gid, BPF; fds as SCM_RIGHTS
#define H_NET                'M'                    // the egress relay, to the init: u8 NET_ op, u32 connection, its payload
#define I_NET                'm'                    // the egress relay, from the init: u8 NET_ op, u32 connection, its payload
#define NET_OPEN             'o'                    // relay op, from the init: the code opened the connection
#define NET_DATA             'd'                    // relay op: bytes of the connection
#define NET_ACK              'a'                    // relay op: u32 bytes of the connection were taken
#define NET_EOF              'e'                    // relay op: the sender ended its writes
#define NET_CLOSE            'c'                    // relay op: the connection is closed
#define NET_CHUNK            65536                  // bound on a relay data frame's bytes
#define NET_WINDOW           262144                 // bytes of one connection in flight each way, unacknowledged
#define NET_MAX_CONNS        64                     // connections the relay holds at once
#define I_READY              'R'                    // the interpreter waits for its code
#define I_STARTED            'S'                    // the code is handed over: it runs from now
#define I_STDOUT             'O'                    // stdout bytes, within the head (the first half of the cap)
#define I_STDERR             'E'                    // stderr bytes, within the head (the first half of the cap)
#define I_TAIL               't'                    // a stream past its head: u8 I_STDOUT or I_STDERR, u64 offset, bytes
#define I_EXIT               'X'                    // EXIT_FRAME_LEN bytes: the main process ended, every other is killed
#define I_OUTFILE            'B'                    // u16 path length, path, u64 size, data
#define I_SKIPPED            'T'                    // an entry of outputs/ left out: u8 LEFT_ why, u64 size, path; bare: more than MAX_LEFT_OUT
#define LEFT_COUNT           1                      // left out: the file count limit
#define LEFT_BYTES           2                      // left out: the byte limit of the call's files
#define LEFT_UNREADABLE      3                      // left out: it could not be read
#define LEFT_LIMITS          4                      // left out: past the walk's bounds (depth, entries, path length)
#define MAX_LEFT_OUT         64                     // entries of outputs/ left out that are named at most
#define I_NOTE               'N'                    // a note for the caller, added to the stderr
#define I_DONE               'D'                    // all is sent: the init exits
#define I_ERROR              'W'                    // the sandbox could not do what was asked: message
#define I_RESULT             'V'                    // the repr of the code's last expression, one byte past the cap at most
#define I_IDLE               'Z'                    // a session's call is over, all of it sent: the next may come
#define I_FORKED             'U'                    // from a template: the call's init is forked and in its cgroups, u32 pid
#define I_REAPED             'A'                    // from a template: the call's init ended, u32 wait status
#define I_USAGE              'u'                    // the process runtime's, before I_EXIT: u64 CPU ns, u64 peak memory bytes of the call's processes
#define ZYGOTE_FD            3                      // the zygote's socket to its template's init
#define Z_FORK               'k'                    // to the zygote: a fork request, as H_FORK's, with its fds
#define Z_READY              'r'                    // from the zygote: it waits for forks
#define Z_FORKED             'f'                    // from the zygote: u32 pid of the code's process
#define Z_REAPED             'x'                    // from the zygote: the code's process is reaped, its status sent
#define Z_FAILED             'w'                    // from the zygote: a fork failed, a message
#define FORKED_FIRST_FD      3                      // a forked init's code pipes: stdin, stdout, stderr, ctl, cell from here
#define FORKED_STATUS_FD     8                      // a forked init's pipe of its code's wait status (u32)
#define FORKED_PROCS_FD      9                      // a forked init's call cgroup.procs files from here
#define CFG_UID              1                      // number: the code's uid
#define CFG_GID              2                      // number: the code's gid
#define CFG_MAX_OUTPUT       3                      // number: cap of each of stdout and stderr
#define CFG_MAX_FILES        4                      // number: most output files
#define CFG_MAX_FILE_BYTES   5                      // number: most bytes of output files
#define CFG_WORKDIR          6                      // string: the code's working directory
#define CFG_SCRIPT           7                      // string: the FIFO, then the file, the interpreter runs
#define CFG_ARG              8                      // string, each: the interpreter's command line
#define CFG_RLIMIT           9                      // u32 resource, u64 soft, u64 hard, each
#define CFG_NO_PARENT_DEATH  10                     // number: 1 plays an init the code subverted (tests)
#define CFG_PROCESS          11                     // number: 1 runs as a process of the host, not pid 1
#define CFG_LANDLOCK         12                     // number: the Landlock ABI whose rights are handled
#define CFG_READ             13                     // string, each: a path the code may read
#define CFG_EXEC             14                     // string, each: a path the code may execute
#define CFG_DEVICE           15                     // string, each: a device node the code may read and write
#define CFG_WRITE            16                     // string, each: a directory the code may write in
#define CFG_SECCOMP          17                     // bytes: a BPF program (struct sock_filter[], host order)
#define CFG_SCRATCH          18                     // number: bound on the bytes under the work dir
#define CFG_TEMPLATE         19                     // number: 1 makes the init a template's
#define CFG_MOUNT            20                     // u64 flags, then target, type, source each a u16 n and n bytes, then data; each: a fresh mount
#define CFG_MASK             21                     // string, each: a path under /proc the init hides in its fresh one
#define CFG_READONLY         22                     // string, each: a path under /proc the init makes read-only in its fresh one
#define CFG_HOSTNAME         23                     // string: the hostname the init sets in its new UTS namespace
#define CFG_LOOPBACK_MTU     24                     // number: a forked sandbox's loopback MTU (0: the kernel's)
#define CFG_KEEP_CAPS        25                     // number: the capabilities a forked sandbox's init keeps after its setup
#define CFG_GVISOR           30                     // number: 1: a forked sandbox inside gVisor, whose /proc has no Seccomp_filters nor NSpid
#define CFG_NAMESPACES       26                     // number: 1: the process runtime's init makes the namespaces it starts in the call's
#define CFG_PROC_SELF        27                     // number: 1: of /proc the code reads only the machine's entries and its own process
#define CFG_ROOT             28                     // string, each: a host path bound read-only at its place into the call's own root (the process runtime's)
#define CFG_PIDS_SHARE       29                     // number: the call's share of processes, its RLIMIT_NPROC counting a uid shared with others
#define CFG_RELAY_PORT       40                     // number: the egress relay's port on the sandbox's 127.0.0.1
#define CFG_CA_BUNDLE        41                     // bytes: the CA certificates the code trusts, written read-only at CFG_CA_PATH
#define CFG_CA_PATH          42                     // string: where the init writes CFG_CA_BUNDLE
