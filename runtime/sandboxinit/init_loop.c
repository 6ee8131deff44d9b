// The init's one loop, and its handlers: the sandbox's init, pid 1 of a
// container, or, in the process runtime, a process of the server's
// machine that is its code's subreaper; and a forked sandbox's init, which
// its template's init forks (init_forked.c). Both begin here (init_begin),
// start or take their code's process, and serve their call here
// (init_serve); main.c's dispatch and forked_init say which.
//
// Its shape is tini's and catatonit's: a list of named steps, then one
// loop that polls what is open in the current phase and dispatches each
// event to its handler. The protocol (frames, configuration keys) is
// runtime/initproto's, rendered into initproto.h.
#include "init.h"

#include <errno.h>
#include <fcntl.h>
#include <grp.h>
#include <limits.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/inotify.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/signalfd.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>
#include <linux/capability.h>

#define CHUNK (64 << 10)
// How often the process runtime's scratch bound is measured when nothing
// told it of a change (a watch the kernel would not add).
#define SCRATCH_POLL_MS 250
// How often the process runtime's init looks at the count of the code's
// process limit at most.
#define NPROC_POLL_MS 250

// The interpreter's life, as the init sees it.
enum phase {
	STARTING, // spawned, not yet reading its script
	READY,    // blocked in open(2) of the script FIFO: I_READY sent
	IDLE,     // a session's call is over: waiting for the next (I_IDLE sent)
	FEEDING,  // the code is being written into the FIFO, or to the driver
	RUNNING,  // the code is all in: it runs (I_STARTED sent)
	EXITED,   // the main process has ended; the rest is killed
};

// stream is one of the code's output pipes. Of its cap, the first half
// is its head, sent as it comes; the last half its tail, kept in a ring
// and sent at the call's end: what a program prints last (its summary,
// its traceback) comes back with what it printed first.
struct stream {
	int fd;
	char type; // I_STDOUT or I_STDERR
	int eof;
	uint64_t total;    // everything written, kept or not
	struct ring tail; // the last bytes past the head
};

struct init {
	struct config c;
	enum phase phase;
	pid_t child;
	int group_gone; // the code's process group has no member left
	pid_t parent;   // who started us: the host is gone when it changes
	int unmapped;   // in a user namespace whose ids the init maps itself
	int status;
	uint32_t exit_flags;
	struct stream out, err;
	int stdin_w; // the code's stdin; -1 once closed
	struct buffer stdin_buf;
	int stdin_end;
	int fifo, ino; // the script FIFO, and the watch that sees it opened
	struct buffer code;
	int code_given;
	struct buffer feed; // what FEEDING writes: the code, or a session's call
	int feed_fd;        // the FIFO, or cellw
	// The driver's pipes (driver.py): its frames, and the calls of a
	// session to it; -1 once closed.
	int ctl, cellw;
	struct buffer ctlbuf;
	int forked;   // a forked sandbox's init: the code's process came made
	int status_fd; // forked: the code's wait status comes here; -1 once in
	int nprocs;    // forked: the call's cgroup.procs files, from FORKED_PROCS_FD
	int persist;  // H_PERSIST: the interpreter lives on after each call
	int live;     // H_LIVE: this call's stdout is watched
	int valued;   // this call's I_RESULT was sent
	int calls;    // a session's calls that ended
	struct buffer cell_stdin; // a session's later call's stdin
	int refused; // a frame of the call could not be taken: its code never runs
	int sfd; // signals
	struct buffer host; // what the host sent, not yet parsed
	struct scratch *scratch;
	struct relay *relay; // the egress relay; NULL without the network
	struct timespec t_started, t_exited;
};

typedef void (*handler)(struct init *in, short revents);

// source is what one poll slot waits for, and who handles it.
struct source {
	int fd;
	short events;
	handler handle;
};

// kill_code kills every process of the code. As pid 1 of the sandbox's
// pid namespace (a container's, or the process runtime's own), that is
// every process but this one. In the process runtime without namespaces
// it is the code's process group and, as this process is their
// subreaper, every orphan that left the group and came back to it. The
// group is killed only while it has members: once it has none, its id may
// be any process's again.
static void kill_code(struct init *in) {
	if (!in->c.process_mode || in->c.namespaces) {
		kill(-1, SIGKILL);
		return;
	}
	if (in->child > 0 && !in->group_gone && kill(-in->child, SIGKILL) < 0 && errno == ESRCH)
		in->group_gone = 1;
	kill_children();
}

// host_gone: nobody will read a verdict. (An init told to play one the
// code subverted stays, for the watchdog to find.)
static void host_gone(struct init *in) {
	if (in->c.no_parent_death)
		for (;;)
			pause();
	kill_code(in);
	_exit(125);
}

// guard runs first, before the configuration and long before the code
// exists: die with whatever started us (the runtime, or runsc's sandbox),
// and be not dumpable, so that /proc/<init> is root's only and no process
// of the code's uid could read or write its memory.
// A forked sandbox's init stays dumpable until its code's process has
// joined its namespaces (setns through a pidfd asks that), which is
// before any code exists (on_forked_ready); a process runtime's init in a
// user namespace it maps itself, until it has written its own uid_map
// (configure), which is before it reads anything but its configuration.
// (The process runtime starts an init in a new pid namespace without a
// parent-death signal: its parent is outside, so the check that the
// parent is still there would fail. It is set here, first.)
static void guard(struct init *in) {
	in->parent = getppid();
	prctl(PR_SET_PDEATHSIG, SIGKILL, 0, 0, 0);
	in->unmapped = ids_unmapped();
	prctl(PR_SET_DUMPABLE, in->forked || in->unmapped ? 1 : 0, 0, 0, 0);
}

// configure reads the host's H_CONFIG frame, which comes before anything.
static void configure(struct init *in) {
	char type;
	unsigned char *p;
	uint32_t len;
	if (read_frame_blocking(0, &type, &p, &len) < 0)
		die("usage: init " INIT_ARG ", its configuration on stdin: reading it");
	if (type != H_CONFIG)
		die_errno("the first frame is not the configuration", EPROTO);
	config_decode(&in->c, p, len);
	free(p);
	if (in->unmapped) {
		if (!in->c.process_mode || !in->c.namespaces)
			die_errno("the init started in a user namespace with no ids mapped, and not as a process runtime's in namespaces", EINVAL);
		map_own_ids(in->c.uid, in->c.gid);
		prctl(PR_SET_DUMPABLE, 0, 0, 0, 0);
	}
	if (in->c.no_parent_death) {
		prctl(PR_SET_PDEATHSIG, 0, 0, 0, 0);
	} else if (in->c.process_mode) {
		// A catchable signal: when the server dies, the init kills the
		// code before it goes (a container's pid 1 takes it with it).
		prctl(PR_SET_PDEATHSIG, SIGTERM, 0, 0, 0);
		if (getppid() != in->parent)
			_exit(125);
	}
	// Limits of the code's every process, set here rather than by the
	// runtime: lowering a limit needs no privilege.
	for (int i = 0; i < in->c.nrlimits; i++) {
		struct rlimit rl = {.rlim_cur = in->c.rlimits[i].soft, .rlim_max = in->c.rlimits[i].hard};
		if (setrlimit(in->c.rlimits[i].resource, &rl) < 0)
			die("setting an rlimit of the configuration");
	}
}

// catch_signals turns SIGCHLD (and, in the process runtime, the
// parent-death SIGTERM) into reads of a signalfd.
static void catch_signals(struct init *in) {
	sigset_t set;
	sigemptyset(&set);
	sigaddset(&set, SIGCHLD);
	if (in->c.process_mode)
		sigaddset(&set, SIGTERM);
	sigprocmask(SIG_BLOCK, &set, NULL);
	in->sfd = signalfd(-1, &set, SFD_CLOEXEC | SFD_NONBLOCK);
	if (in->sfd < 0)
		die("signalfd");
	signal(SIGPIPE, SIG_IGN); // a pipe whose reader died gives EPIPE
}

// prepare_script makes the code's outputs dir and the script FIFO. The
// interpreter is started ahead, on the FIFO at the script's path, and
// waits for its code in open(2) and read(2): everything it does before
// (site, preloads) costs the call nothing.
static void prepare_script(struct init *in) {
	int e = as_user(&in->c, make_outputs, NULL);
	if (e != 0)
		die_errno("creating the outputs dir", e);
	if (mknod(in->c.script, S_IFIFO | 0644, 0) < 0)
		die("creating the script FIFO");
	in->fifo = open(in->c.script, O_RDWR | O_NONBLOCK | O_CLOEXEC);
	if (in->fifo < 0)
		die("opening the script FIFO");
	in->ino = inotify_init1(IN_CLOEXEC | IN_NONBLOCK);
	if (in->ino < 0 || inotify_add_watch(in->ino, in->c.script, IN_OPEN) < 0)
		die("watching the script FIFO");
	in->scratch = scratch_open(&in->c);
	if (in->c.process_mode && prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) < 0)
		die("becoming the code's subreaper");
}

// drop_privileges leaves the code's identity and nothing else: no
// capability in any of the five sets, no supplementary group.
static void drop_privileges(const struct config *c) {
	if (geteuid() != 0 && c->process_mode)
		return; // an unprivileged server: it is the code's user already
	for (int cap = 0; cap <= 63; cap++) {
		if (prctl(PR_CAPBSET_DROP, cap, 0, 0, 0) < 0 && errno == EINVAL)
			break;
	}
	if (prctl(PR_CAP_AMBIENT, PR_CAP_AMBIENT_CLEAR_ALL, 0, 0, 0) < 0 && errno != EINVAL)
		die("clearing ambient capabilities");
	if (setgroups(0, NULL) < 0)
		die("clearing supplementary groups");
	if (setresgid(c->gid, c->gid, c->gid) < 0)
		die("setting the gid");
	if (setresuid(c->uid, c->uid, c->uid) < 0)
		die("setting the uid");
	// setresuid to a non-zero uid cleared the permitted and effective
	// sets; the inheritable one goes explicitly.
	struct __user_cap_header_struct h = {.version = _LINUX_CAPABILITY_VERSION_3};
	struct __user_cap_data_struct d[2] = {{0}};
	if (syscall(SYS_capset, &h, d) < 0)
		die("clearing capabilities");
}

// exec_code is the code's process from fork to exec: default signal
// dispositions, an empty mask, the pipes as stdio, the first to die of
// memory pressure, then the identity and the confinement.
static void exec_code(const struct config *c, const int fds[5]) {
	for (int s = 1; s < NSIG; s++)
		signal(s, SIG_DFL);
	sigset_t none;
	sigemptyset(&none);
	sigprocmask(SIG_SETMASK, &none, NULL);
	// Above every target first, so that no dup2 closes a source.
	int high[5];
	for (int i = 0; i < 5; i++) {
		high[i] = fcntl(fds[i], F_DUPFD_CLOEXEC, 10);
		if (high[i] < 0)
			die("setting up stdio");
	}
	for (int i = 0; i < 5; i++) {
		if (dup2(high[i], i) < 0)
			die("setting up stdio");
	}
	if (c->process_mode)
		setpgid(0, 0); // the code's own group, killed whole
	int adj = open("/proc/self/oom_score_adj", O_WRONLY | O_CLOEXEC);
	if (adj >= 0) {
		(void)!write(adj, "1000", 4); // the init outlives an OOM to report it
		close(adj);
	}
	close_from(DRIVER_CELL_FD + 1);
	drop_privileges(c);
	confine(c);
	execve(c->argv.v[0], c->argv.v, environ);
	die("starting the interpreter");
}

// adopt_code takes the pipes of the code's process a forked sandbox's
// zygote makes beside this init: at FORKED_FIRST_FD on, the code's exit
// status after them. The process is the code's once it says it is
// confined (on_forked_ready), which this init then checks.
static void adopt_code(struct init *in) {
	int fd = FORKED_FIRST_FD;
	in->stdin_w = fd++;
	in->out = (struct stream){.fd = fd++, .type = I_STDOUT};
	in->err = (struct stream){.fd = fd++, .type = I_STDERR};
	in->ctl = fd++;
	in->cellw = fd++;
	in->status_fd = fd++;
	for (int i = FORKED_FIRST_FD; i < FORKED_PROCS_FD + in->nprocs; i++) {
		if (fcntl(i, F_SETFD, FD_CLOEXEC) < 0)
			die("taking the code's pipes");
		if (i != in->cellw && i < FORKED_PROCS_FD)
			fcntl(i, F_SETFL, O_NONBLOCK);
	}
	// The outputs dir is the forked interpreter's to make, as the code's
	// user, before it takes any code (driver.py): a child of this init
	// for it would cost a process creation, several milliseconds of
	// gVisor's, on every call.
}

// start_code spawns the interpreter on three fresh pipes.
static void start_code(struct init *in) {
	int pin[2], pout[2], perr[2], pctl[2], pcell[2];
	if (pipe2(pin, O_CLOEXEC) < 0 || pipe2(pout, O_CLOEXEC) < 0 || pipe2(perr, O_CLOEXEC) < 0 ||
	    pipe2(pctl, O_CLOEXEC) < 0 || pipe2(pcell, O_CLOEXEC) < 0)
		die("creating pipes");
	in->child = fork();
	if (in->child < 0)
		die("fork");
	if (in->child == 0)
		exec_code(&in->c, (int[5]){pin[0], pout[1], perr[1], pctl[1], pcell[0]});
	if (in->c.process_mode)
		setpgid(in->child, in->child); // both sides, so that no kill can miss it
	close(pin[0]);
	close(pout[1]);
	close(perr[1]);
	close(pctl[1]);
	close(pcell[0]);
	in->ctl = pctl[0];
	in->cellw = pcell[1];
	fcntl(in->ctl, F_SETFL, O_NONBLOCK);
	in->stdin_w = pin[1];
	in->out = (struct stream){.fd = pout[0], .type = I_STDOUT};
	in->err = (struct stream){.fd = perr[0], .type = I_STDERR};
	fcntl(in->stdin_w, F_SETFL, O_NONBLOCK);
	fcntl(in->out.fd, F_SETFL, O_NONBLOCK);
	fcntl(in->err.fd, F_SETFL, O_NONBLOCK);
}

// write_script: the interpreter holds the FIFO open, so from now on the
// path names a plain file with the same code, for tracebacks and for code
// that reads its own source.
static void write_script(struct init *in) {
	char tmp[PATH_MAX];
	snprintf(tmp, sizeof tmp, "%s.tmp", in->c.script);
	int fd = open(tmp, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0444);
	if (fd < 0 || write_all(fd, in->code.p, in->code.len) < 0 || close(fd) < 0 || rename(tmp, in->c.script) < 0)
		die("writing the script");
}

static void on_input_file(struct init *in, const unsigned char *p, uint32_t len) {
	char path[PATH_MAX + 1];
	int e = in->code_given ? EINVAL : write_input_file(&in->c, p, len, path, sizeof path);
	if (e == 0)
		return;
	char what[PATH_MAX + 64];
	if (path[0] == '\0' || in->code_given)
		snprintf(what, sizeof what, "an input file came in a malformed frame, or after the code");
	else
		snprintf(what, sizeof what, "writing input file %s", path);
	in->refused = 1;
	// A session's later call that cannot have its files (the session
	// filled /tmp) fails as a call, not as the sandbox: the session stays.
	int mine = in->calls > 0 && path[0] != '\0' && !in->code_given;
	report(mine ? I_NOTE : I_ERROR, what, e);
}

// on_cpu: without a cgroup's quota, the code's CPU time is bounded per
// process by RLIMIT_CPU: SIGXCPU at the call's seconds, SIGKILL one later.
// cpu_seconds is the CPU time a process has used, rounded up: a session's
// interpreter carries its earlier calls' time into each limit.
static unsigned long long cpu_seconds(pid_t pid) {
	char path[64], buf[1024];
	snprintf(path, sizeof path, "/proc/%d/stat", (int)pid);
	int fd = open(path, O_RDONLY | O_CLOEXEC);
	if (fd < 0)
		return 0;
	ssize_t n = read(fd, buf, sizeof buf - 1);
	close(fd);
	if (n <= 0)
		return 0;
	buf[n] = '\0';
	char *p = strrchr(buf, ')');
	unsigned long long ut = 0, st = 0;
	// After the name: state (3), then fields 4 to 13, then utime, stime.
	if (p == NULL || sscanf(p + 2, "%*c %*s %*s %*s %*s %*s %*s %*s %*s %*s %*s %llu %llu", &ut, &st) != 2)
		return 0;
	long hz = sysconf(_SC_CLK_TCK);
	return hz > 0 ? (ut + st + (unsigned long long)hz - 1) / (unsigned long long)hz : 0;
}

static void on_cpu(struct init *in, const unsigned char *p, uint32_t len) {
	if (!in->c.process_mode || len == 0 || len >= 32 || in->child <= 0)
		return;
	char num[32];
	memcpy(num, p, len);
	num[len] = '\0';
	char *end;
	unsigned long long secs = strtoull(num, &end, 10);
	if (*end != '\0')
		return;
	if (in->calls > 0)
		secs += cpu_seconds(in->child);
	struct rlimit rl = {.rlim_cur = secs, .rlim_max = secs + 1};
	prlimit(in->child, RLIMIT_CPU, &rl, NULL);
}

static void dispatch(struct init *in, char type, const unsigned char *p, uint32_t len) {
	switch (type) {
	case H_FILE: on_input_file(in, p, len); break;
	case H_STDIN:
		if (in->calls > 0)
			buf_append(&in->cell_stdin, p, len);
		else if (in->stdin_w >= 0)
			buf_append(&in->stdin_buf, p, len);
		break;
	case H_STDIN_END: in->stdin_end = 1; break;
	case H_CODE:
		if (!in->code_given) {
			in->code_given = 1;
			buf_append(&in->code, p, len);
		}
		break;
	case H_KILL: kill_code(in); break;
	case H_PERSIST: in->persist = 1; break;
	case H_LIVE: in->live = 1; break;
	case H_INTERRUPT:
		if (in->phase == RUNNING && in->child > 0)
			kill(in->child, SIGINT);
		break;
	case H_CPU: on_cpu(in, p, len); break;
	case H_NET: relay_host(in->relay, p, len); break;
	default:
		in->refused = 1;
		report(I_ERROR, "the host sent a frame of an unknown type, or a second configuration", EPROTO);
	}
}

// on_host reads what the host sent and dispatches each whole frame.
static void on_host(struct init *in, short revents) {
	(void)revents;
	unsigned char chunk[CHUNK];
	ssize_t r = read(0, chunk, sizeof chunk);
	if (r < 0 && (errno == EINTR || errno == EAGAIN))
		return;
	if (r <= 0)
		host_gone(in);
	buf_append(&in->host, chunk, (size_t)r);
	while (buf_pending(&in->host) >= 5) {
		unsigned char *f = in->host.p + in->host.off;
		uint32_t len = get_u32(f + 1);
		if (len > MAX_FRAME)
			die_errno("reading a frame from the host", EMSGSIZE);
		if (buf_pending(&in->host) < 5 + (size_t)len)
			break;
		dispatch(in, (char)f[0], f + 5, len);
		in->host.off += 5 + (size_t)len;
	}
	if (buf_pending(&in->host) == 0)
		buf_reset(&in->host);
}

// on_ready: the interpreter has opened its script: it is ready.
static void on_ready(struct init *in, short revents) {
	(void)revents;
	char ev[sizeof(struct inotify_event) + NAME_MAX + 1];
	if (read(in->ino, ev, sizeof ev) <= 0)
		return;
	close(in->ino);
	in->ino = -1;
	in->phase = READY;
	frame(I_READY, NULL, 0);
}

// started: the code has all it needs; its time runs from now.
static void started(struct init *in) {
	if (!in->persist && in->cellw >= 0) {
		close(in->cellw);
		in->cellw = -1;
	}
	in->phase = RUNNING;
	clock_gettime(CLOCK_MONOTONIC, &in->t_started);
	frame(I_STARTED, NULL, 0);
}

// on_feed feeds the code; once it is all in, the code runs. Closing the
// FIFO gives the interpreter its EOF; the driver's pipe stays open for a
// session's next call, and closes otherwise.
static void on_feed(struct init *in, short revents) {
	(void)revents;
	if (buf_flush(&in->feed, in->feed_fd) == 0 && buf_pending(&in->feed) > 0)
		return;
	buf_reset(&in->feed);
	if (in->feed_fd == in->fifo) {
		close(in->fifo);
		in->fifo = -1;
	}
	started(in);
}


// driver_flags are the call's options for the driver.
static uint32_t driver_flags(const struct init *in) { return (in->persist ? OPT_PERSIST : 0) | (in->live ? OPT_LIVE : 0); }

// mark_usage notes, in the process runtime, what the call's processes
// had used before it: before the code is in, since an interpreter that
// has it runs it at once, before this init, on a busy machine, may look
// again (a session's 0.1 s cell was told 70 ms).
static void mark_usage(struct init *in) {
	if (in->c.process_mode)
		usage_mark(&in->c, in->calls > 0);
}

// feed_first: the script file, the options on the driver's pipe (it reads
// them once its code is in), then the code into the FIFO. A forked
// interpreter has no FIFO: the options tell it to read the file.
static void feed_first(struct init *in) {
	mark_usage(in);
	write_script(in);
	unsigned char o[9] = {D_OPTIONS};
	put_u32(o + 1, 4);
	put_u32(o + 5, driver_flags(in));
	if (write_all(in->cellw, o, sizeof o) < 0) {
		close(in->cellw); // the interpreter is gone: the code never runs
		in->cellw = -1;
	}
	if (in->forked) {
		buf_reset(&in->code);
		started(in);
		return;
	}
	in->feed = in->code;
	in->code = (struct buffer){0};
	in->feed_fd = in->fifo;
	in->phase = FEEDING;
}

// feed_next: a session's later call, as one frame on the driver's pipe.
static void feed_next(struct init *in) {
	mark_usage(in);
	size_t n = 8 + buf_pending(&in->cell_stdin) + buf_pending(&in->code);
	unsigned char h[13] = {D_CELL};
	put_u32(h + 1, (uint32_t)n);
	put_u32(h + 5, driver_flags(in));
	put_u32(h + 9, (uint32_t)buf_pending(&in->cell_stdin));
	buf_append(&in->feed, h, sizeof h);
	buf_append(&in->feed, in->cell_stdin.p, buf_pending(&in->cell_stdin));
	buf_append(&in->feed, in->code.p, buf_pending(&in->code));
	buf_reset(&in->cell_stdin);
	buf_reset(&in->code);
	fcntl(in->cellw, F_SETFL, O_NONBLOCK);
	in->feed_fd = in->cellw;
	in->phase = FEEDING;
}

static void close_stdin(struct init *in) {
	buf_reset(&in->stdin_buf);
	close(in->stdin_w);
	in->stdin_w = -1;
}

static void on_stdin(struct init *in, short revents) {
	(void)revents;
	if (buf_flush(&in->stdin_buf, in->stdin_w) < 0)
		close_stdin(in); // the code closed its stdin: the rest is dropped
}

// head_cap is how much of a stream's cap is its head; the rest, cap / 2,
// is its tail.
static uint64_t head_cap(uint64_t cap) { return cap - cap / 2; }

// send_past sends bytes of a stream past its head, at their offset in it.
static void send_past(const struct stream *s, uint64_t off, const unsigned char *p, size_t n) {
	unsigned char h[9];
	h[0] = (unsigned char)s->type;
	put_u64(h + 1, off);
	frame_head(I_TAIL, (uint32_t)(sizeof h + n));
	if (write_all(out_fd, h, sizeof h) < 0 || write_all(out_fd, p, n) < 0)
		_exit(125);
}

// send_tail sends what the ring kept of a stream past its head, the
// stream's end, and forgets it: the host keeps it in place of whatever a
// watched call sent of it before.
static void send_tail(struct stream *s) {
	unsigned char chunk[CHUNK];
	uint64_t start = s->total - s->tail.len;
	for (size_t off = 0; off < s->tail.len;) {
		size_t n = ring_read(&s->tail, off, chunk, sizeof chunk);
		send_past(s, start + off, chunk, n);
		off += n;
	}
	ring_reset(&s->tail);
}

// drain reads a chunk of one output stream: within the head it goes to
// the host, past it into the tail's ring, which keeps the newest bytes
// and drops the oldest. Every byte is counted; the program is never
// blocked by its own output. While the call is watched the newest bytes
// of each read past the head go to the host too, for progress. It returns
// whether it read anything. Between a session's calls what the code's
// leftovers write belongs to no call, and is dropped.
static int drain(struct init *in, struct stream *s, int keep) {
	unsigned char chunk[CHUNK];
	ssize_t r = read(s->fd, chunk, sizeof chunk);
	if (r < 0 && (errno == EINTR || errno == EAGAIN))
		return 0;
	if (r <= 0) {
		s->eof = 1;
		close(s->fd);
		return 0;
	}
	if (!keep)
		return 1;
	uint64_t before = s->total, head = head_cap(in->c.max_output);
	s->total += (uint64_t)r;
	size_t sent = 0;
	if (before < head) {
		sent = head - before < (uint64_t)r ? (size_t)(head - before) : (size_t)r;
		frame(s->type, chunk, (uint32_t)sent);
	}
	size_t past = (size_t)r - sent;
	if (past > 0) {
		ring_put(&s->tail, (size_t)(in->c.max_output / 2), chunk + sent, past);
		if (in->live) {
			size_t n = past < LIVE_TAIL_BYTES ? past : LIVE_TAIL_BYTES;
			send_past(s, s->total - n, chunk + r - n, n);
		}
	}
	return 1;
}

static void on_stdout(struct init *in, short revents) { (void)revents; drain(in, &in->out, in->phase != IDLE); }
static void on_stderr(struct init *in, short revents) { (void)revents; drain(in, &in->err, in->phase != IDLE); }

// sample_usage looks, in the process runtime, at what a cgroup would have
// counted: whether the count the code's process limit counts has reached
// it, so that a fork or a thread may have failed there (EXIT_PIDS), and
// the peak memory of the call's processes. At most every NPROC_POLL_MS
// while the code runs, and as its main process ends: a burst of threads
// that fails and is gone between two looks goes unseen, as does the peak
// of a child the code reaps within one.
static void sample_usage(struct init *in, int now_anyway) {
	static struct timespec next;
	struct timespec now;
	clock_gettime(CLOCK_MONOTONIC, &now);
	if (!in->c.process_mode || (!now_anyway && (now.tv_sec < next.tv_sec || (now.tv_sec == next.tv_sec && now.tv_nsec < next.tv_nsec))))
		return;
	next = now;
	next.tv_nsec += NPROC_POLL_MS * 1000000L;
	next.tv_sec += next.tv_nsec / 1000000000L;
	next.tv_nsec %= 1000000000L;
	if (!(in->exit_flags & EXIT_PIDS) && nproc_at_limit(&in->c))
		in->exit_flags |= EXIT_PIDS;
	usage_sample();
}

// on_signal reaps; the end of the code's main process ends the rest of
// it. In the process runtime each death after that may hand the init more
// orphans (the children of what it just killed), which are killed in turn.
static void on_signal(struct init *in, short revents) {
	(void)revents;
	struct signalfd_siginfo si;
	while (read(in->sfd, &si, sizeof si) > 0) {
		if (si.ssi_signo == SIGTERM)
			host_gone(in); // the process runtime's parent-death signal
	}
	// What the main process leaves is sampled before it is reaped, while
	// the count of its process limit still counts it.
	siginfo_t exited = {0};
	if (in->phase != EXITED && in->child > 0 && waitid(P_PID, (id_t)in->child, &exited, WEXITED | WNOHANG | WNOWAIT) == 0 &&
	    exited.si_pid == in->child)
		sample_usage(in, 1);
	int reaped = 0;
	for (;;) {
		int st;
		pid_t w = waitpid(-1, &st, WNOHANG);
		if (w <= 0)
			break;
		reaped = 1;
		if (w == in->child && in->phase != EXITED) {
			in->phase = EXITED;
			in->status = st;
			clock_gettime(CLOCK_MONOTONIC, &in->t_exited);
		}
	}
	if (reaped && in->phase == EXITED)
		kill_code(in);
}

static void send_exit(struct init *in);

// on_status: a forked sandbox's code process has ended; its parent, the
// zygote, sent its wait status. The end of the code's main process ends
// the rest of it. (Nothing sent: the zygote is gone, and the code with it.)
static void on_status(struct init *in, short revents) {
	(void)revents;
	unsigned char st[4];
	ssize_t r = read(in->status_fd, st, sizeof st);
	if (r < 0 && (errno == EINTR || errno == EAGAIN))
		return;
	close(in->status_fd);
	in->status_fd = -1;
	if (in->phase == EXITED)
		return;
	in->phase = EXITED;
	in->status = r == 4 ? (int)get_u32(st) : SIGKILL;
	clock_gettime(CLOCK_MONOTONIC, &in->t_exited);
	kill_code(in);
}

// cell_done ends a session's call that the driver says is over: what the
// call wrote before it said so is in the pipes (at most their capacity),
// so it is taken, then the verdict and the files go, and the outputs dir
// is emptied for the next call.
static void end_call(struct init *in, uint32_t status);

static void cell_done(struct init *in, uint32_t status) {
	clock_gettime(CLOCK_MONOTONIC, &in->t_exited);
	sample_usage(in, 1);
	for (int i = 0; i < 32 && !in->out.eof && drain(in, &in->out, 1); i++)
		;
	for (int i = 0; i < 32 && !in->err.eof && drain(in, &in->err, 1); i++)
		;
	if (in->stdin_w >= 0)
		close_stdin(in);
	end_call(in, status);
}

// skip_call ends a session's call whose files could not be written
// without running its code: exit status 1, the reason in a note.
static void skip_call(struct init *in) {
	clock_gettime(CLOCK_MONOTONIC, &in->t_started);
	in->t_exited = in->t_started;
	frame(I_STARTED, NULL, 0);
	buf_reset(&in->code);
	buf_reset(&in->cell_stdin);
	end_call(in, 1);
}

// end_call reports a session's call and readies the init for the next.
static void end_call(struct init *in, uint32_t status) {
	in->status = (int)((status & 0xff) << 8);
	in->exit_flags |= EXIT_CELL;
	send_exit(in);
	if (!outputs_empty(&in->c)) {
		as_user(&in->c, export_outputs, NULL);
		as_user(&in->c, empty_outputs, NULL);
	}
	frame(I_IDLE, NULL, 0);
	in->out.total = in->err.total = 0;
	in->exit_flags = 0;
	in->code_given = in->refused = in->live = in->valued = 0;
	in->t_started = (struct timespec){0};
	in->calls++;
	in->phase = IDLE;
}

// enter_cgroups moves the code's process into the call's cgroups: the
// zygote forked it in the template's.
static const char *enter_cgroups(struct init *in, pid_t pid) {
	char num[24];
	int n = snprintf(num, sizeof num, "%d", (int)pid);
	const char *why = NULL;
	for (int i = 0; i < in->nprocs; i++) {
		if (why == NULL && write(FORKED_PROCS_FD + i, num, (size_t)n) != n)
			why = "it could not be moved into the call's cgroups";
		close(FORKED_PROCS_FD + i);
	}
	in->nprocs = 0;
	return why;
}

// on_forked_ready: a forked interpreter says it is confined. It is ready
// once it is in the call's cgroups and this init has seen for itself
// that it is confined.
static void on_forked_ready(struct init *in, const unsigned char *p, uint32_t len) {
	if (!in->forked || in->phase != STARTING || len != 4 || in->child != 0)
		return;
	pid_t pid = (pid_t)get_u32(p);
	if (pid <= 1)
		return;
	in->child = pid;
	prctl(PR_SET_DUMPABLE, 0, 0, 0, 0); // joined: nothing more may
	const char *why = enter_cgroups(in, pid);
	if (why == NULL)
		why = check_confined(&in->c, pid);
	if (why != NULL) {
		kill(in->child, SIGKILL);
		in->refused = 1;
		char msg[320];
		snprintf(msg, sizeof msg, "the forked interpreter is not confined: %s", why);
		report(I_ERROR, msg, 0);
		return;
	}
	unsigned char go[5] = {D_GO};
	if (write_all(in->cellw, go, sizeof go) < 0)
		return; // gone: its end says so
	in->phase = READY;
	frame(I_READY, NULL, 0);
}

// driver_frame takes one frame of the driver. The code could have written
// it: nothing in it is more than the call's own output.
static void driver_frame(struct init *in, char type, const unsigned char *p, uint32_t len) {
	switch (type) {
	case D_READY: on_forked_ready(in, p, len); break;
	case D_VALUE:
		if ((in->phase == RUNNING || in->phase == EXITED) && !in->valued) {
			in->valued = 1;
			// One byte past the cap, so that the host can tell a cut.
			uint64_t room = in->c.max_output + 1;
			frame(I_RESULT, p, len < room ? len : (uint32_t)room);
		}
		break;
	case D_DONE:
		if (in->persist && in->phase == RUNNING && len == 4)
			cell_done(in, get_u32(p));
		break;
	case D_MEMORY:
		// The process runtime's memory limit is an rlimit: it refuses an
		// allocation rather than kill.
		if (in->c.process_mode && (in->phase == RUNNING || in->phase == EXITED))
			in->exit_flags |= EXIT_MEMORY;
		break;
	}
}

static void close_ctl(struct init *in) {
	close(in->ctl);
	in->ctl = -1;
	buf_reset(&in->ctlbuf);
}

// on_ctl reads the driver's frames; a malformed one ends the listening.
static void on_ctl(struct init *in, short revents) {
	(void)revents;
	unsigned char chunk[CHUNK];
	ssize_t r = read(in->ctl, chunk, sizeof chunk);
	if (r < 0 && (errno == EINTR || errno == EAGAIN))
		return;
	if (r <= 0) {
		close_ctl(in);
		return;
	}
	buf_append(&in->ctlbuf, chunk, (size_t)r);
	while (in->ctl >= 0 && buf_pending(&in->ctlbuf) >= 5) {
		unsigned char *f = in->ctlbuf.p + in->ctlbuf.off;
		uint32_t len = get_u32(f + 1);
		if (len > MAX_FRAME || (f[0] != D_VALUE && f[0] != D_DONE && f[0] != D_READY && f[0] != D_MEMORY)) {
			close_ctl(in);
			return;
		}
		if (buf_pending(&in->ctlbuf) < 5 + (size_t)len)
			break;
		in->ctlbuf.off += 5 + (size_t)len;
		driver_frame(in, (char)f[0], f + 5, len);
	}
	if (in->ctl >= 0 && buf_pending(&in->ctlbuf) == 0)
		buf_reset(&in->ctlbuf);
}

// measure_scratch measures the work dir when one is due: after a change
// (periodic 0), or at the poll's timeout (periodic 1).
static void measure_scratch(struct init *in, int periodic) {
	char why[256];
	if (in->phase == EXITED || (in->exit_flags & EXIT_SCRATCH) || !scratch_over(in->scratch, periodic, why, sizeof why))
		return;
	in->exit_flags |= EXIT_SCRATCH;
	report(I_NOTE, why, 0);
	kill_code(in);
}

static void on_scratch(struct init *in, short revents) {
	(void)revents;
	measure_scratch(in, 0);
}

static void on_relay(struct init *in, short revents) {
	(void)revents;
	relay_events(in->relay);
}

// gather lists what to poll in the current phase.
static int gather(struct init *in, struct source *s) {
	int n = 0;
	s[n++] = (struct source){0, POLLIN, on_host};
	if (in->phase == STARTING && in->ino >= 0)
		s[n++] = (struct source){in->ino, POLLIN, on_ready};
	if (in->phase == FEEDING)
		s[n++] = (struct source){in->feed_fd, POLLOUT, on_feed};
	if (in->ctl >= 0)
		s[n++] = (struct source){in->ctl, POLLIN, on_ctl};
	if (in->stdin_w >= 0 && buf_pending(&in->stdin_buf) > 0)
		s[n++] = (struct source){in->stdin_w, POLLOUT, on_stdin};
	if (!in->out.eof)
		s[n++] = (struct source){in->out.fd, POLLIN, on_stdout};
	if (!in->err.eof)
		s[n++] = (struct source){in->err.fd, POLLIN, on_stderr};
	if (in->scratch != NULL)
		s[n++] = (struct source){scratch_fd(in->scratch), POLLIN, on_scratch};
	if (in->status_fd >= 0)
		s[n++] = (struct source){in->status_fd, POLLIN, on_status};
	if (in->relay != NULL)
		s[n++] = (struct source){relay_fd(in->relay), POLLIN, on_relay};
	s[n++] = (struct source){in->sfd, POLLIN, on_signal};
	return n;
}

// advance takes the steps that follow from the state the handlers left.
static void advance(struct init *in) {
	if (in->phase == READY && in->code_given && !in->refused)
		feed_first(in);
	if (in->phase == IDLE && in->code_given && !in->refused)
		feed_next(in);
	if (in->phase == IDLE && in->code_given && in->refused)
		skip_call(in);
	if (in->stdin_w >= 0 && in->stdin_end && buf_pending(&in->stdin_buf) == 0 && in->phase >= RUNNING)
		close_stdin(in);
}

// serve is the one loop: until the code has ended and its streams are
// drained, wait for what the phase needs and hand each event on.
static void serve(struct init *in) {
	while (!(in->phase == EXITED && in->out.eof && in->err.eof && in->ctl < 0)) {
		struct source src[12];
		struct pollfd p[12];
		int n = gather(in, src);
		for (int i = 0; i < n; i++)
			p[i] = (struct pollfd){.fd = src[i].fd, .events = src[i].events};
		int timeout = in->scratch != NULL && in->phase == RUNNING ? scratch_timeout(in->scratch, SCRATCH_POLL_MS) : -1;
		if (in->c.process_mode && in->phase == RUNNING && (timeout < 0 || timeout > NPROC_POLL_MS))
			timeout = NPROC_POLL_MS;
		int r = poll(p, (nfds_t)n, timeout);
		if (r < 0 && errno == EINTR)
			continue;
		if (r < 0)
			die("poll");
		if (r == 0) {
			if (in->scratch != NULL)
				measure_scratch(in, 1);
			if (in->phase == RUNNING)
				sample_usage(in, 0);
		}
		for (int i = 0; i < n; i++) {
			if (p[i].revents & POLLNVAL)
				die_errno("polling a descriptor that is not open", EBADF);
			if (p[i].revents & (src[i].events | POLLHUP | POLLERR))
				src[i].handle(in, p[i].revents);
		}
		advance(in);
	}
}

// reap_all waits for every process the kill left, so that the outputs no
// longer change. In the process runtime orphans keep coming back to this
// subreaper while their parents die: kill again until none is left.
static void reap_all(struct init *in) {
	for (;;) {
		if (in->c.process_mode)
			kill_code(in);
		pid_t w = waitpid(-1, NULL, 0);
		if (w < 0 && errno == EINTR)
			continue;
		if (w < 0)
			return;
	}
}

// send_exit reports the verdict of the call, after the tails of its
// streams.
static void send_exit(struct init *in) {
	send_tail(&in->out);
	send_tail(&in->err);
	unsigned char x[EXIT_FRAME_LEN];
	put_u32(x, (uint32_t)in->status);
	put_u64(x + 4, in->out.total);
	put_u64(x + 12, in->err.total);
	int64_t ran = 0;
	if (in->t_started.tv_sec != 0 || in->t_started.tv_nsec != 0)
		ran = (int64_t)(in->t_exited.tv_sec - in->t_started.tv_sec) * 1000000000 + (in->t_exited.tv_nsec - in->t_started.tv_nsec);
	put_u64(x + 20, ran > 0 ? (uint64_t)ran : 0);
	put_u32(x + 28, in->exit_flags);
	if (in->c.process_mode)
		usage_send();
	frame(I_EXIT, x, sizeof x);
}

// finish reports the verdict, then the output files, then done.
static void finish(struct init *in) {
	reap_all(in);
	send_exit(in);
	if (!outputs_empty(&in->c))
		as_user(&in->c, export_outputs, NULL);
	frame(I_DONE, NULL, 0);
}

// the_init is this process's init: one a process.
static struct init the_init;

// init_begin makes this process an init: guarded, configured by the host,
// its signals caught. forked: a forked sandbox's, with nprocs cgroup.procs
// files of its call from FORKED_PROCS_FD.
struct init *init_begin(int forked, int nprocs) {
	struct init *in = &the_init;
	*in = (struct init){.stdin_w = -1, .fifo = -1, .ino = -1, .ctl = -1, .cellw = -1, .feed_fd = -1, .status_fd = -1,
			    .phase = STARTING, .forked = forked, .nprocs = nprocs};
	guard(in);
	configure(in);
	catch_signals(in);
	return in;
}

const struct config *init_config(const struct init *in) { return &in->c; }

int init_signals(const struct init *in) { return in->sfd; }

// init_start_code starts the code's interpreter, waiting for its code on
// the script FIFO: a container's init, and the process runtime's.
void init_start_code(struct init *in) {
	prepare_script(in);
	write_trust(&in->c);
	start_code(in);
}

// init_adopt_code takes the code's process a forked sandbox's zygote made.
void init_adopt_code(struct init *in) {
	adopt_code(in);
	write_trust(&in->c);
}

// init_serve serves the call until the code has ended and all of it is
// sent: the verdict, the output files, done.
void init_serve(struct init *in) {
	in->relay = relay_open(&in->c);
	serve(in);
	finish(in);
}
