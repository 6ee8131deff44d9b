// The sandbox's init: pid 1 of a container, or, in the process runtime, a
// process of the server's machine that is its code's subreaper. It runs
// from an ELF constructor, before the Go runtime starts, when this very
// executable (bound read-only into the sandbox) is started with INIT_ARG.
// Static and free of the Go runtime, it starts in well under a millisecond
// in any root filesystem, starts no threads and keeps its memory small.
//
// Its shape is tini's and catatonit's: main is a list of named steps, then
// one loop that polls what is open in the current phase and dispatches
// each event to its handler. The protocol (frames, configuration keys) is
// runtime/initproto.go's, rendered into initproto.h.
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

// The interpreter's life, as the init sees it.
enum phase {
	STARTING, // spawned, not yet reading its script
	READY,    // blocked in open(2) of the script FIFO: I_READY sent
	FEEDING,  // the code is being written into the FIFO
	RUNNING,  // the FIFO is closed: the code runs (I_STARTED sent)
	EXITED,   // the main process has ended; the rest is killed
};

// stream is one of the code's output pipes.
struct stream {
	int fd;
	char type; // I_STDOUT or I_STDERR
	int eof;
	uint64_t total; // everything written, kept or not
};

struct init {
	struct config c;
	enum phase phase;
	pid_t child;
	int group_gone; // the code's process group has no member left
	pid_t parent;   // who started us: the host is gone when it changes
	int status;
	uint32_t exit_flags;
	struct stream out, err;
	int stdin_w; // the code's stdin; -1 once closed
	struct buffer stdin_buf;
	int stdin_end;
	int fifo, ino; // the script FIFO, and the watch that sees it opened
	struct buffer code;
	int code_given;
	int refused; // a frame of the call could not be taken: its code never runs
	int sfd; // signals
	struct buffer ctl; // what the host sent, not yet parsed
	struct scratch *scratch;
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
// pid namespace, that is every process but this one. In the process
// runtime it is the code's process group and, as this process is their
// subreaper, every orphan that left the group and came back to it. The
// group is killed only while it has members: once it has none, its id may
// be any process's again.
static void kill_code(struct init *in) {
	if (!in->c.process_mode) {
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
static void guard(struct init *in) {
	in->parent = getppid();
	prctl(PR_SET_PDEATHSIG, SIGKILL, 0, 0, 0);
	prctl(PR_SET_DUMPABLE, 0, 0, 0, 0);
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
static void exec_code(const struct config *c, int in, int out, int err) {
	for (int s = 1; s < NSIG; s++)
		signal(s, SIG_DFL);
	sigset_t none;
	sigemptyset(&none);
	sigprocmask(SIG_SETMASK, &none, NULL);
	if (dup2(in, 0) < 0 || dup2(out, 1) < 0 || dup2(err, 2) < 0)
		die("setting up stdio");
	if (c->process_mode)
		setpgid(0, 0); // the code's own group, killed whole
	int adj = open("/proc/self/oom_score_adj", O_WRONLY | O_CLOEXEC);
	if (adj >= 0) {
		(void)!write(adj, "1000", 4); // the init outlives an OOM to report it
		close(adj);
	}
	close_from(3);
	drop_privileges(c);
	confine(c);
	execve(c->argv.v[0], c->argv.v, environ);
	die("starting the interpreter");
}

// start_code spawns the interpreter on three fresh pipes.
static void start_code(struct init *in) {
	int pin[2], pout[2], perr[2];
	if (pipe2(pin, O_CLOEXEC) < 0 || pipe2(pout, O_CLOEXEC) < 0 || pipe2(perr, O_CLOEXEC) < 0)
		die("creating pipes");
	in->child = fork();
	if (in->child < 0)
		die("fork");
	if (in->child == 0)
		exec_code(&in->c, pin[0], pout[1], perr[1]);
	if (in->c.process_mode)
		setpgid(in->child, in->child); // both sides, so that no kill can miss it
	close(pin[0]);
	close(pout[1]);
	close(perr[1]);
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
	report(I_ERROR, what, e);
}

// on_cpu: without a cgroup's quota, the code's CPU time is bounded per
// process by RLIMIT_CPU: SIGXCPU at the call's seconds, SIGKILL one later.
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
	struct rlimit rl = {.rlim_cur = secs, .rlim_max = secs + 1};
	prlimit(in->child, RLIMIT_CPU, &rl, NULL);
}

static void dispatch(struct init *in, char type, const unsigned char *p, uint32_t len) {
	switch (type) {
	case H_FILE: on_input_file(in, p, len); break;
	case H_STDIN:
		if (in->stdin_w >= 0)
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
	case H_CPU: on_cpu(in, p, len); break;
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
	buf_append(&in->ctl, chunk, (size_t)r);
	while (buf_pending(&in->ctl) >= 5) {
		unsigned char *f = in->ctl.p + in->ctl.off;
		uint32_t len = get_u32(f + 1);
		if (len > MAX_FRAME)
			die_errno("reading a frame from the host", EMSGSIZE);
		if (buf_pending(&in->ctl) < 5 + (size_t)len)
			break;
		dispatch(in, (char)f[0], f + 5, len);
		in->ctl.off += 5 + (size_t)len;
	}
	if (buf_pending(&in->ctl) == 0)
		buf_reset(&in->ctl);
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

// on_fifo feeds the code; once it is all in, closing the FIFO gives the
// interpreter its EOF, and the code runs.
static void on_fifo(struct init *in, short revents) {
	(void)revents;
	if (buf_flush(&in->code, in->fifo) == 0 && buf_pending(&in->code) > 0)
		return;
	close(in->fifo);
	in->fifo = -1;
	in->phase = RUNNING;
	clock_gettime(CLOCK_MONOTONIC, &in->t_started);
	frame(I_STARTED, NULL, 0);
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

// drain reads a chunk of one output stream. Past the cap the bytes are
// counted and dropped: the program is never blocked by its own output.
static void drain(struct stream *s, uint64_t cap) {
	unsigned char chunk[CHUNK];
	ssize_t r = read(s->fd, chunk, sizeof chunk);
	if (r < 0 && (errno == EINTR || errno == EAGAIN))
		return;
	if (r <= 0) {
		s->eof = 1;
		close(s->fd);
		return;
	}
	uint64_t before = s->total;
	s->total += (uint64_t)r;
	if (before < cap) {
		uint64_t keep = cap - before;
		frame(s->type, chunk, (uint32_t)(keep < (uint64_t)r ? keep : (uint64_t)r));
	}
}

static void on_stdout(struct init *in, short revents) { (void)revents; drain(&in->out, in->c.max_output); }
static void on_stderr(struct init *in, short revents) { (void)revents; drain(&in->err, in->c.max_output); }

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

// measure_scratch measures the work dir when one is due: after a change
// (periodic 0), or at the poll's timeout (periodic 1).
static void measure_scratch(struct init *in, int periodic) {
	char why[256];
	if (in->phase == EXITED || !scratch_over(in->scratch, periodic, why, sizeof why))
		return;
	in->exit_flags |= EXIT_SCRATCH;
	report(I_NOTE, why, 0);
	kill_code(in);
}

static void on_scratch(struct init *in, short revents) {
	(void)revents;
	measure_scratch(in, 0);
}

// gather lists what to poll in the current phase.
static int gather(struct init *in, struct source *s) {
	int n = 0;
	s[n++] = (struct source){0, POLLIN, on_host};
	if (in->phase == STARTING)
		s[n++] = (struct source){in->ino, POLLIN, on_ready};
	if (in->phase == FEEDING)
		s[n++] = (struct source){in->fifo, POLLOUT, on_fifo};
	if (in->stdin_w >= 0 && buf_pending(&in->stdin_buf) > 0)
		s[n++] = (struct source){in->stdin_w, POLLOUT, on_stdin};
	if (!in->out.eof)
		s[n++] = (struct source){in->out.fd, POLLIN, on_stdout};
	if (!in->err.eof)
		s[n++] = (struct source){in->err.fd, POLLIN, on_stderr};
	if (in->scratch != NULL)
		s[n++] = (struct source){scratch_fd(in->scratch), POLLIN, on_scratch};
	s[n++] = (struct source){in->sfd, POLLIN, on_signal};
	return n;
}

// advance takes the steps that follow from the state the handlers left.
static void advance(struct init *in) {
	if (in->phase == READY && in->code_given && !in->refused) {
		write_script(in);
		in->phase = FEEDING;
	}
	if (in->stdin_w >= 0 && in->stdin_end && buf_pending(&in->stdin_buf) == 0 && in->phase >= RUNNING)
		close_stdin(in);
}

// serve is the one loop: until the code has ended and its streams are
// drained, wait for what the phase needs and hand each event on.
static void serve(struct init *in) {
	while (!(in->phase == EXITED && in->out.eof && in->err.eof)) {
		struct source src[8];
		struct pollfd p[8];
		int n = gather(in, src);
		for (int i = 0; i < n; i++)
			p[i] = (struct pollfd){.fd = src[i].fd, .events = src[i].events};
		int timeout = in->scratch != NULL && in->phase == RUNNING ? scratch_timeout(in->scratch, SCRATCH_POLL_MS) : -1;
		int r = poll(p, (nfds_t)n, timeout);
		if (r < 0 && errno == EINTR)
			continue;
		if (r < 0)
			die("poll");
		if (r == 0)
			measure_scratch(in, 1);
		for (int i = 0; i < n; i++) {
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

// finish reports the verdict, then the output files, then done.
static void finish(struct init *in) {
	reap_all(in);
	unsigned char x[EXIT_FRAME_LEN];
	put_u32(x, (uint32_t)in->status);
	put_u64(x + 4, in->out.total);
	put_u64(x + 12, in->err.total);
	int64_t ran = 0;
	if (in->t_started.tv_sec != 0 || in->t_started.tv_nsec != 0)
		ran = (int64_t)(in->t_exited.tv_sec - in->t_started.tv_sec) * 1000000000 + (in->t_exited.tv_nsec - in->t_started.tv_nsec);
	put_u64(x + 20, ran > 0 ? (uint64_t)ran : 0);
	put_u32(x + 28, in->exit_flags);
	frame(I_EXIT, x, sizeof x);
	if (!outputs_empty(&in->c))
		as_user(&in->c, export_outputs, NULL);
	frame(I_DONE, NULL, 0);
}

static int sandbox_init(void) {
	struct init in = {.stdin_w = -1, .fifo = -1, .ino = -1, .phase = STARTING};
	guard(&in);
	configure(&in);
	catch_signals(&in);
	prepare_script(&in);
	start_code(&in);
	serve(&in);
	finish(&in);
	return 0;
}

__attribute__((constructor)) static void mcp_exec_reexec(int argc, char **argv, char **envp) {
	(void)envp;
	if (argc < 2 || argv == NULL || argv[1] == NULL)
		return;
	if (strcmp(argv[1], INIT_ARG) == 0)
		_exit(sandbox_init());
	if (strcmp(argv[1], HOLD_ARG) == 0)
		_exit(userns_hold());
	if (strcmp(argv[1], PROBE_ARG) == 0)
		_exit(probe_confinement());
	if (strcmp(argv[1], KILL_ARG) == 0)
		_exit(kill_own_uid());
}
