// A template's init: pid 1 of a container made as every sandbox is, whose
// interpreter (driver.py's zygote) starts, imports what a call would, and
// then only ever forks: each fork becomes a call's sandbox (init_forked.c).
// This init relays between the host and the zygote: a fork request and
// the call's file descriptors in, what the zygote says of it out. No
// caller's code ever runs in the template's namespaces.
//
// The zygote keeps the privileges this init has (the template's: enough
// to make namespaces and mount in them, in the call slot's user namespace
// only); each fork gives them up before it runs any code.
#include "init.h"

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/signalfd.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#define MAX_FDS 64
// What of the zygote's own output is kept for the host's log: its
// start-up errors, a traceback at most.
#define ZYGOTE_OUTPUT (64 << 10)

struct template {
	const struct config *c;
	int sfd;
	pid_t zygote;
	int zsock;       // SOCK_SEQPACKET to the zygote
	int zout;        // its stdout and stderr, merged; -1 at EOF
	size_t zout_sent;
	struct buffer host; // frames from the host, not yet parsed
	int fds[MAX_FDS];   // descriptors that came with them
	int nfds;
	int busy; // a fork is under way: its init has not been reaped
};

static void closefds(int *fds, int n) {
	for (int i = 0; i < n; i++)
		close(fds[i]);
}

// gone: the template cannot serve; everything in it ends with this init.
static void gone(struct template *t, const char *why, int err) {
	if (why != NULL)
		report(I_ERROR, why, err);
	(void)t;
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

// forward hands one fork request to the zygote with its descriptors:
// the call's stdin, stdout and stderr, then its cgroup.procs files.
static void forward(struct template *t, const unsigned char *p, uint32_t len) {
	uint32_t n = len >= 4 ? get_u32(p) : 0;
	if (len < 12 || n < 3 || n > (uint32_t)t->nfds || t->busy) {
		closefds(t->fds, t->nfds);
		t->nfds = 0;
		report(I_ERROR, t->busy ? "a fork came while the last one's init lives" : "a malformed fork request", EPROTO);
		return;
	}
	char *msg = malloc(len - 4 + 1);
	if (msg == NULL)
		die("allocating");
	msg[0] = Z_FORK;
	memcpy(msg + 1, p + 4, len - 4);
	struct iovec iov = {.iov_base = msg, .iov_len = len - 4 + 1};
	union {
		char buf[CMSG_SPACE(sizeof(int) * MAX_FDS)];
		struct cmsghdr align;
	} u;
	struct msghdr mh = {.msg_iov = &iov, .msg_iovlen = 1, .msg_control = u.buf, .msg_controllen = CMSG_SPACE(sizeof(int) * n)};
	struct cmsghdr *cm = CMSG_FIRSTHDR(&mh);
	cm->cmsg_level = SOL_SOCKET;
	cm->cmsg_type = SCM_RIGHTS;
	cm->cmsg_len = CMSG_LEN(sizeof(int) * n);
	memcpy(CMSG_DATA(cm), t->fds, sizeof(int) * n);
	ssize_t w = sendmsg(t->zsock, &mh, MSG_NOSIGNAL);
	free(msg);
	closefds(t->fds, (int)n);
	memmove(t->fds, t->fds + n, sizeof(int) * (size_t)(t->nfds - (int)n));
	t->nfds -= (int)n;
	if (w < 0)
		gone(t, "handing a fork to the zygote", errno);
	t->busy = 1;
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
		gone(t, r <= 0 ? NULL : "too many descriptors came with a fork", r <= 0 ? 0 : EPROTO);
	buf_append(&t->host, chunk, (size_t)r);
	while (buf_pending(&t->host) >= 5) {
		unsigned char *f = t->host.p + t->host.off;
		uint32_t len = get_u32(f + 1);
		if (len > MAX_FRAME)
			gone(t, "reading a frame from the host", EMSGSIZE);
		if (buf_pending(&t->host) < 5 + (size_t)len)
			break;
		if (f[0] == H_FORK)
			forward(t, f + 5, len);
		else
			report(I_ERROR, "a template takes only forks", EPROTO);
		t->host.off += 5 + (size_t)len;
	}
	if (buf_pending(&t->host) == 0)
		buf_reset(&t->host);
}

// on_zygote turns what the zygote says into the host's frames.
static void on_zygote(struct template *t) {
	unsigned char m[4096];
	ssize_t r = recv(t->zsock, m, sizeof m, 0);
	if (r < 0 && (errno == EINTR || errno == EAGAIN))
		return;
	if (r <= 0)
		gone(t, "the template's interpreter closed its socket", 0);
	switch (m[0]) {
	case Z_READY: frame(I_READY, NULL, 0); break;
	case Z_FORKED:
		if (r == 5)
			frame(I_FORKED, m + 1, 4);
		break;
	case Z_REAPED:
		if (r == 5) {
			t->busy = 0;
			frame(I_REAPED, m + 1, 4);
		}
		break;
	case Z_FAILED: frame(I_ERROR, m + 1, (uint32_t)r - 1); break;
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

// on_signal reaps. The zygote's end is the template's: what it said last
// goes to the host first.
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
			gone(t, why, 0);
		}
	}
}

int template_serve(const struct config *c, int sfd) {
	struct template t = {.c = c, .sfd = sfd, .zout = -1};
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
