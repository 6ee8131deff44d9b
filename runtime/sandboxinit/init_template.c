// A template's init: pid 1 of a container made as every sandbox is, whose
// interpreter (driver.py's zygote) starts, imports what a call would, and
// then only ever forks. No caller's code ever runs in the template's
// namespaces.
//
// A call's sandbox is made in two halves. This init forks the call's init
// into a new pid namespace, as its pid 1; that child moves itself into
// the call's cgroups, makes new mount, network, ipc, uts and cgroup
// namespaces, and becomes the call's init (forked_init). The zygote then
// forks the code's process into those namespaces (through a pidfd of the
// call's init): the interpreter, warm, without a fresh start. The code's
// process gives up every privilege before it reads any code, and the
// call's init checks that from outside. Its parent is the zygote, outside
// the call's pid namespace (as a process docker exec starts is), which
// hands its exit status to the call's init over a pipe.
//
// The zygote keeps the privileges this init has (the template's: enough
// to make namespaces and mount in them, in the call slot's user namespace
// only); the code's process and the call's init give them up.
#define _GNU_SOURCE
#include "init.h"

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <sched.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/signalfd.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#define MAX_FDS 64
// What of the zygote's own output is kept for the host's log: its
// start-up errors, a traceback at most.
#define ZYGOTE_OUTPUT (64 << 10)

struct template {
	const struct config *c;
	int sfd;
	int own_pid_ns; // this init's pid namespace, for the next fork's
	pid_t zygote;
	int zsock; // SOCK_SEQPACKET to the zygote
	int zout;  // its stdout and stderr, merged; -1 at EOF
	size_t zout_sent;
	struct buffer host; // frames from the host, not yet parsed
	int fds[MAX_FDS];   // descriptors that came with them
	int nfds;
	// The fork under way (pending): its init, until reaped, and the
	// zygote, until it has reaped the code's process.
	int pending;
	pid_t call;
	int call_status, zygote_busy;
};

static void closefds(int *fds, int n) {
	for (int i = 0; i < n; i++)
		close(fds[i]);
}

// gone: the template cannot serve; everything in it ends with this init.
static void gone(const char *why, int err) {
	if (why != NULL)
		report(I_ERROR, why, err);
	kill(-1, SIGKILL);
	_exit(125);
}

// start_zygote starts the interpreter on the zygote's socket, with the
// template's privileges (nothing is dropped: each fork drops its own).
static void start_zygote(struct template *t) {
	int sv[2], out[2];
	if (socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, sv) < 0 || pipe2(out, O_CLOEXEC) < 0)
		die("creating the zygote's socket");
	t->zygote = fork();
	if (t->zygote < 0)
		die("fork");
	if (t->zygote == 0) {
		for (int s = 1; s < NSIG; s++)
			signal(s, SIG_DFL);
		sigset_t none;
		sigemptyset(&none);
		sigprocmask(SIG_SETMASK, &none, NULL);
		int null = open("/dev/null", O_RDONLY | O_CLOEXEC);
		if (null < 0 || dup2(null, 0) < 0 || dup2(out[1], 1) < 0 || dup2(out[1], 2) < 0 || dup2(sv[1], ZYGOTE_FD) < 0)
			die("setting up the zygote's fds");
		close_from(ZYGOTE_FD + 1);
		execve(t->c->argv.v[0], t->c->argv.v, environ);
		die("starting the zygote");
	}
	close(sv[1]);
	close(out[1]);
	t->zsock = sv[0];
	t->zout = out[0];
	fcntl(t->zout, F_SETFL, O_NONBLOCK);
}

// place moves fds[0..n) to 0..n-1, by way of numbers above all of them,
// and closes every other descriptor.
static void place(const int *fds, int n) {
	int high[MAX_FDS];
	for (int i = 0; i < n; i++) {
		high[i] = fcntl(fds[i], F_DUPFD_CLOEXEC, MAX_FDS);
		if (high[i] < 0)
			die("placing the call's descriptors");
	}
	for (int i = 0; i < n; i++) {
		if (dup2(high[i], i) < 0)
			die("placing the call's descriptors");
	}
	close_from(n);
}

// call_child is the fork that becomes the call's init, pid 1 of its new
// pid namespace: in the call's cgroups (the procs files came from the
// host, which opened them), in namespaces of its own, with its
// descriptors at the numbers forked_init expects.
static void call_child(const int *fds, int nprocs, int sync_w) {
	// Dies with the template's init (all of its pid namespace does);
	// dumpable until the code's process has joined it (guard).
	prctl(PR_SET_PDEATHSIG, SIGKILL, 0, 0, 0);
	prctl(PR_SET_DUMPABLE, 1, 0, 0, 0);
	for (int i = 0; i < nprocs; i++) {
		if (write(fds[FORKED_PROCS_FD + i], "0", 1) != 1)
			die("moving into the call's cgroups");
	}
	// A kernel without cgroup namespaces (gVisor's) has none to make:
	// the call's cgroups are then its sandbox's, on the host.
	int cgroup_ns = access("/proc/self/ns/cgroup", F_OK) == 0 ? CLONE_NEWCGROUP : 0;
	if (unshare(CLONE_NEWNS | CLONE_NEWNET | CLONE_NEWIPC | CLONE_NEWUTS | cgroup_ns) < 0)
		die("making the call's namespaces");
	int all[MAX_FDS];
	memcpy(all, fds, sizeof(int) * (size_t)(FORKED_PROCS_FD + nprocs));
	all[FORKED_PROCS_FD + nprocs] = sync_w;
	place(all, FORKED_PROCS_FD + nprocs + 1);
	// Made: the code's process may join.
	if (write(FORKED_PROCS_FD + nprocs, "m", 1) != 1)
		_exit(125);
	close(FORKED_PROCS_FD + nprocs);
	forked_init(nprocs);
}

// fork_call makes a call's sandbox from one request of the host. fds
// (what came with it) are the call's stdin, stdout, stderr and its
// cgroup.procs files; the request is u32 nfds, u32 uid, u32 gid, then the
// code's seccomp filter, which goes on to the zygote.
static void fork_call(struct template *t, const unsigned char *p, uint32_t len) {
	uint32_t n = len >= 4 ? get_u32(p) : 0;
	if (len < 12 || n < 3 || n > (uint32_t)t->nfds || n > MAX_FDS - 16 || t->pending) {
		closefds(t->fds, t->nfds);
		t->nfds = 0;
		report(I_ERROR, t->pending ? "a fork came while the last one lives" : "a malformed fork request", EPROTO);
		return;
	}
	int pp[6][2], sync[2];
	for (int i = 0; i < 6; i++) {
		if (pipe2(pp[i], O_CLOEXEC) < 0)
			gone("creating the code's pipes", errno);
	}
	if (pipe2(sync, O_CLOEXEC) < 0)
		gone("creating the code's pipes", errno);
	// The code reads its stdin (0) and the driver's cell pipe (4); it
	// writes the rest, and the zygote its exit status (5).
	int init_fds[MAX_FDS], zygote_fds[8];
	memcpy(init_fds, t->fds, sizeof(int) * 3);
	for (int i = 0; i < 6; i++) {
		int init_reads = i != 0 && i != 4;
		init_fds[FORKED_FIRST_FD + i] = pp[i][init_reads ? 0 : 1];
		zygote_fds[1 + i] = pp[i][init_reads ? 1 : 0];
	}
	memcpy(init_fds + FORKED_PROCS_FD, t->fds + 3, sizeof(int) * (n - 3));
	if (unshare(CLONE_NEWPID) < 0)
		gone("making the call's pid namespace", errno);
	pid_t child = fork();
	if (child == 0)
		call_child(init_fds, (int)n - 3, sync[1]);
	// The next fork's pid namespace is a new one again.
	if (setns(t->own_pid_ns, CLONE_NEWPID) < 0)
		gone("leaving the call's pid namespace", errno);
	close(sync[1]);
	char made = 0;
	ssize_t r = child > 0 ? read(sync[0], &made, 1) : -1;
	close(sync[0]);
	zygote_fds[0] = child > 0 && r == 1 ? (int)syscall(SYS_pidfd_open, child, 0) : -1;
	closefds(init_fds, FORKED_PROCS_FD + (int)n - 3);
	memmove(t->fds, t->fds + n, sizeof(int) * (size_t)(t->nfds - (int)n));
	t->nfds -= (int)n;
	if (child > 0)
		t->call = child, t->pending = 1;
	if (zygote_fds[0] < 0) {
		closefds(zygote_fds + 1, 6);
		report(I_ERROR, child < 0 ? "forking the call's init" : "the call's init did not make its namespaces", child < 0 ? errno : 0);
		return;
	}
	// To the zygote: the request, with the pidfd and the code's ends.
	char *msg = malloc(len - 4 + 1);
	if (msg == NULL)
		die("allocating");
	msg[0] = Z_FORK;
	memcpy(msg + 1, p + 4, len - 4);
	struct iovec iov = {.iov_base = msg, .iov_len = len - 4 + 1};
	union {
		char buf[CMSG_SPACE(sizeof zygote_fds)];
		struct cmsghdr align;
	} u;
	struct msghdr mh = {.msg_iov = &iov, .msg_iovlen = 1, .msg_control = u.buf, .msg_controllen = CMSG_SPACE(sizeof(int) * 7)};
	struct cmsghdr *cm = CMSG_FIRSTHDR(&mh);
	cm->cmsg_level = SOL_SOCKET;
	cm->cmsg_type = SCM_RIGHTS;
	cm->cmsg_len = CMSG_LEN(sizeof(int) * 7);
	memcpy(CMSG_DATA(cm), zygote_fds, sizeof(int) * 7);
	ssize_t w = sendmsg(t->zsock, &mh, MSG_NOSIGNAL);
	free(msg);
	closefds(zygote_fds, 7);
	if (w < 0)
		gone("handing a fork to the zygote", errno);
	t->zygote_busy = 1;
}

// kill_call ends the call under way, if its init lives: pid 1 of the
// call's pid namespace, whose end takes every process of the call with
// it. Where the host cannot tell the call's processes from the
// template's (inside gVisor every one is the sentry's), this is its kill.
static void kill_call(struct template *t) {
	if (t->pending && t->call > 0)
		kill(t->call, SIGKILL);
}

// on_host reads what the host sent, with any descriptors, and handles
// each whole frame.
static void on_host(struct template *t) {
	unsigned char chunk[64 << 10];
	union {
		char buf[CMSG_SPACE(sizeof(int) * MAX_FDS)];
		struct cmsghdr align;
	} u;
	struct iovec iov = {.iov_base = chunk, .iov_len = sizeof chunk};
	struct msghdr mh = {.msg_iov = &iov, .msg_iovlen = 1, .msg_control = u.buf, .msg_controllen = sizeof u.buf};
	ssize_t r = recvmsg(0, &mh, MSG_CMSG_CLOEXEC);
	if (r < 0 && (errno == EINTR || errno == EAGAIN))
		return;
	for (struct cmsghdr *cm = CMSG_FIRSTHDR(&mh); cm != NULL; cm = CMSG_NXTHDR(&mh, cm)) {
		if (cm->cmsg_level != SOL_SOCKET || cm->cmsg_type != SCM_RIGHTS)
			continue;
		int n = (int)((cm->cmsg_len - CMSG_LEN(0)) / sizeof(int));
		int *fds = (int *)CMSG_DATA(cm);
		for (int i = 0; i < n; i++) {
			if (t->nfds < MAX_FDS)
				t->fds[t->nfds++] = fds[i];
			else
				close(fds[i]);
		}
	}
	if (r <= 0 || (mh.msg_flags & MSG_CTRUNC))
		gone(r <= 0 ? NULL : "too many descriptors came with a fork", r <= 0 ? 0 : EPROTO);
	buf_append(&t->host, chunk, (size_t)r);
	while (buf_pending(&t->host) >= 5) {
		unsigned char *f = t->host.p + t->host.off;
		uint32_t len = get_u32(f + 1);
		if (len > MAX_FRAME)
			gone("reading a frame from the host", EMSGSIZE);
		if (buf_pending(&t->host) < 5 + (size_t)len)
			break;
		if (f[0] == H_FORK)
			fork_call(t, f + 5, len);
		else if (f[0] == H_KILL)
			kill_call(t);
		else
			report(I_ERROR, "a template takes only forks", EPROTO);
		t->host.off += 5 + (size_t)len;
	}
	if (buf_pending(&t->host) == 0)
		buf_reset(&t->host);
}

// call_over: the call's init is reaped and the zygote has reaped the
// code's process: the host may send the next fork.
static void call_over(struct template *t) {
	if (!t->pending || t->call != 0 || t->zygote_busy)
		return;
	unsigned char st[4];
	put_u32(st, (uint32_t)t->call_status);
	frame(I_REAPED, st, 4);
	t->pending = 0;
}

// on_zygote turns what the zygote says into the host's frames.
static void on_zygote(struct template *t) {
	unsigned char m[4096];
	ssize_t r = recv(t->zsock, m, sizeof m, 0);
	if (r < 0 && (errno == EINTR || errno == EAGAIN))
		return;
	if (r <= 0)
		gone("the template's interpreter closed its socket", 0);
	switch (m[0]) {
	case Z_READY: frame(I_READY, NULL, 0); break;
	case Z_FORKED:
		if (r == 5)
			frame(I_FORKED, m + 1, 4);
		break;
	case Z_REAPED:
		t->zygote_busy = 0;
		call_over(t);
		break;
	case Z_FAILED:
		t->zygote_busy = 0;
		frame(I_ERROR, m + 1, (uint32_t)r - 1);
		call_over(t);
		break;
	}
}

// on_output keeps the zygote's output for the host's log, within a bound.
static void on_output(struct template *t) {
	unsigned char chunk[64 << 10];
	ssize_t r = read(t->zout, chunk, sizeof chunk);
	if (r < 0 && (errno == EINTR || errno == EAGAIN))
		return;
	if (r <= 0) {
		close(t->zout);
		t->zout = -1;
		return;
	}
	if (t->zout_sent < ZYGOTE_OUTPUT) {
		size_t n = (size_t)r < ZYGOTE_OUTPUT - t->zout_sent ? (size_t)r : ZYGOTE_OUTPUT - t->zout_sent;
		frame(I_STDERR, chunk, (uint32_t)n);
		t->zout_sent += n;
	}
}

// on_signal reaps the calls' inits. The zygote's end is the template's:
// what it said last goes to the host first.
static void on_signal(struct template *t) {
	struct signalfd_siginfo si;
	while (read(t->sfd, &si, sizeof si) > 0)
		;
	for (;;) {
		int st;
		pid_t w = waitpid(-1, &st, WNOHANG);
		if (w <= 0)
			return;
		if (w == t->zygote) {
			while (t->zout >= 0)
				on_output(t);
			char why[96];
			snprintf(why, sizeof why, "the template's interpreter ended (wait status %#x)", st);
			gone(why, 0);
		}
		if (w == t->call) {
			t->call = 0;
			t->call_status = st;
			call_over(t);
		}
	}
}

void template_serve(const struct config *c, int sfd) {
	struct template t = {.c = c, .sfd = sfd, .zout = -1};
	t.own_pid_ns = open("/proc/self/ns/pid", O_RDONLY | O_CLOEXEC);
	if (t.own_pid_ns < 0)
		die("opening the template's pid namespace");
	start_zygote(&t);
	for (;;) {
		struct pollfd p[4] = {{.fd = 0, .events = POLLIN}, {.fd = t.zsock, .events = POLLIN},
				      {.fd = t.sfd, .events = POLLIN}, {.fd = t.zout, .events = POLLIN}};
		if (poll(p, t.zout >= 0 ? 4 : 3, -1) < 0) {
			if (errno == EINTR)
				continue;
			die("poll");
		}
		if (p[3].revents & (POLLIN | POLLHUP | POLLERR))
			on_output(&t);
		if (p[1].revents & (POLLIN | POLLHUP | POLLERR))
			on_zygote(&t);
		if (p[0].revents & (POLLIN | POLLHUP | POLLERR))
			on_host(&t);
		if (p[2].revents & POLLIN)
			on_signal(&t);
	}
}
