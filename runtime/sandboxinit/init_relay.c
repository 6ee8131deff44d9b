// The egress relay: with the network allowlist on, the init listens on
// 127.0.0.1:<relay port> in the sandbox's own network namespace, which
// still has only lo and no route out, and hands every connection the code
// opens there to the server, as I_NET frames on the init's own stdout;
// the server's proxy (package egress) answers in H_NET frames on its
// stdin. The relay parses nothing of what the code sends: it moves bytes,
// and holds nothing worth stealing. (docs/network.md says why the
// connections go over the init's standard streams: they are the one
// channel every runtime already gives the init, gVisor's included.)
//
// Each connection has a window each way (NET_WINDOW): the init reads from
// the code's socket only while the server has acknowledged all but a
// window of what it was sent, and the server sends no more than a window
// the init has not acknowledged writing to the code; so a slow reader on
// one side stalls its own connection only, and the init's memory for the
// relay is bounded by NET_MAX_CONNS windows. A connection past
// NET_MAX_CONNS is closed as it is accepted.
//
// Nothing here runs without the allowlist: relay_open returns NULL and
// nothing listens.
#include "init.h"

#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

// rconn is one connection of the code to the relay.
struct rconn {
	int fd; // -1: the slot is free
	uint32_t id;
	uint32_t events;         // what epoll waits for on fd now
	struct buffer to_code;   // what the server sent, not yet written to the code
	uint32_t unacked;        // sent to the server, not yet acknowledged
	int code_eof;            // the code ended its writes: NET_EOF sent
	int server_eof;          // the server ended its writes: shut the code's side once to_code is written
	int shut;                // shutdown(SHUT_WR) done
};

struct relay {
	int ep;  // epoll: the listener and every connection
	int lfd; // the listener
	uint32_t next;
	struct rconn c[NET_MAX_CONNS];
};

// LISTENER is the listener's tag in epoll; a connection's is its slot + 1.
#define LISTENER 0

static void send_op(uint8_t op, uint32_t id, const void *data, uint32_t n) {
	unsigned char h[5];
	h[0] = op;
	put_u32(h + 1, id);
	frame_head(I_NET, 5 + n);
	if (write_all(out_fd, h, 5) < 0 || (n > 0 && write_all(out_fd, data, n) < 0))
		_exit(125);
}

static void send_ack(uint32_t id, uint32_t n) {
	unsigned char v[4];
	put_u32(v, n);
	send_op(NET_ACK, id, v, 4);
}

// rearm has epoll wait for what c can take now: bytes from the code while
// the server has room for them, room in the code's socket while bytes for
// it wait. With neither, c leaves the epoll set: a socket the code hung up
// on would otherwise be reported, and the loop spin, until an ack comes.
static void rearm(struct relay *r, struct rconn *c) {
	uint32_t want = 0;
	if (!c->code_eof && c->unacked < NET_WINDOW)
		want |= EPOLLIN;
	if (buf_pending(&c->to_code) > 0)
		want |= EPOLLOUT;
	if (want == c->events)
		return;
	struct epoll_event ev = {.events = want, .data.u32 = (uint32_t)(c - r->c) + 1};
	int op = c->events == 0 ? EPOLL_CTL_ADD : want == 0 ? EPOLL_CTL_DEL : EPOLL_CTL_MOD;
	if (epoll_ctl(r->ep, op, c->fd, &ev) < 0)
		die("watching a relayed connection");
	c->events = want;
}

// drop closes c; tell says whether the server must hear of it (it did
// not ask for it).
static void drop(struct relay *r, struct rconn *c, int tell) {
	(void)r;
	if (tell)
		send_op(NET_CLOSE, c->id, NULL, 0);
	close(c->fd); // leaves the epoll set with it
	buf_reset(&c->to_code);
	*c = (struct rconn){.fd = -1};
}

// settle closes c once both ways have ended and all is written.
static void settle(struct relay *r, struct rconn *c) {
	if (c->server_eof && !c->shut && buf_pending(&c->to_code) == 0) {
		shutdown(c->fd, SHUT_WR);
		c->shut = 1;
	}
	if (c->code_eof && c->shut) {
		drop(r, c, 1);
		return;
	}
	rearm(r, c);
}

static struct rconn *find(struct relay *r, uint32_t id) {
	for (int i = 0; i < NET_MAX_CONNS; i++) {
		if (r->c[i].fd >= 0 && r->c[i].id == id)
			return &r->c[i];
	}
	return NULL;
}

// on_accept takes every connection waiting, and tells the server of each.
static void on_accept(struct relay *r) {
	for (;;) {
		int fd = accept4(r->lfd, NULL, NULL, SOCK_NONBLOCK | SOCK_CLOEXEC);
		if (fd < 0)
			return; // EAGAIN, or a connection reset before it was taken
		struct rconn *c = NULL;
		for (int i = 0; i < NET_MAX_CONNS && c == NULL; i++) {
			if (r->c[i].fd < 0)
				c = &r->c[i];
		}
		if (c == NULL) {
			close(fd); // past the bound: the code's client sees it closed
			continue;
		}
		int one = 1;
		setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
		*c = (struct rconn){.fd = fd, .id = ++r->next};
		send_op(NET_OPEN, c->id, NULL, 0);
		rearm(r, c);
	}
}

// from_code passes on what the code sent, within the window.
static void from_code(struct relay *r, struct rconn *c) {
	static unsigned char chunk[NET_CHUNK];
	uint32_t room = NET_WINDOW - c->unacked;
	if (room == 0)
		return; // the server has a window's worth: its ack comes first
	ssize_t n = read(c->fd, chunk, room < sizeof chunk ? room : sizeof chunk);
	if (n < 0 && (errno == EINTR || errno == EAGAIN))
		return;
	if (n < 0) {
		drop(r, c, 1); // reset: the server's side goes too
		return;
	}
	if (n == 0) {
		c->code_eof = 1;
		send_op(NET_EOF, c->id, NULL, 0);
		settle(r, c);
		return;
	}
	c->unacked += (uint32_t)n;
	send_op(NET_DATA, c->id, chunk, (uint32_t)n);
	rearm(r, c);
}

// to_code writes what the server sent, and acknowledges what went.
static void to_code(struct relay *r, struct rconn *c) {
	size_t before = buf_pending(&c->to_code);
	if (buf_flush(&c->to_code, c->fd) < 0) {
		drop(r, c, 1);
		return;
	}
	size_t wrote = before - buf_pending(&c->to_code);
	if (wrote > 0)
		send_ack(c->id, (uint32_t)wrote);
	settle(r, c);
}

void relay_events(struct relay *r) {
	struct epoll_event evs[16];
	int n = epoll_wait(r->ep, evs, 16, 0);
	for (int i = 0; i < n; i++) {
		uint32_t tag = evs[i].data.u32;
		if (tag == LISTENER) {
			on_accept(r);
			continue;
		}
		struct rconn *c = &r->c[tag - 1];
		if (c->fd < 0)
			continue; // dropped by an earlier event of this round
		uint32_t got = evs[i].events;
		if (got & EPOLLOUT)
			to_code(r, c);
		if (c->fd < 0)
			continue;
		if (got & EPOLLERR)
			drop(r, c, 1); // reset: the server's side goes too
		else if ((got & (EPOLLIN | EPOLLHUP)) && !c->code_eof)
			from_code(r, c);
		else if (got & EPOLLHUP)
			drop(r, c, 1);
	}
}

// relay_host takes an H_NET frame: u8 op, u32 connection, then the data
// (NET_DATA) or u32 bytes (NET_ACK). A frame for a connection that is
// gone is stale (it crossed the init's close) and dropped.
void relay_host(struct relay *r, const unsigned char *p, uint32_t len) {
	if (r == NULL || len < 5)
		return;
	uint8_t op = p[0];
	struct rconn *c = find(r, get_u32(p + 1));
	if (c == NULL)
		return;
	p += 5;
	len -= 5;
	switch (op) {
	case NET_DATA:
		// The server keeps within the window; one that does not is
		// broken, and its connection ends.
		if (c->server_eof || buf_pending(&c->to_code) + len > NET_WINDOW) {
			drop(r, c, 1);
			return;
		}
		buf_append(&c->to_code, p, len);
		rearm(r, c);
		break;
	case NET_ACK:
		if (len == 4) {
			uint32_t n = get_u32(p);
			c->unacked -= n < c->unacked ? n : c->unacked;
			rearm(r, c);
		}
		break;
	case NET_EOF:
		c->server_eof = 1;
		settle(r, c);
		break;
	case NET_CLOSE: drop(r, c, 0); break;
	}
}

int relay_fd(const struct relay *r) { return r->ep; }

// relay_open listens on 127.0.0.1:<relay port> in the sandbox's network
// namespace, where lo is up by now. The listener is the init's alone: the
// code, started already or forked by the zygote, never holds it, and
// cannot bind the port while the init does.
struct relay *relay_open(const struct config *c) {
	if (c->relay_port == 0)
		return NULL;
	static struct relay r;
	r = (struct relay){.ep = -1, .lfd = -1};
	for (int i = 0; i < NET_MAX_CONNS; i++)
		r.c[i].fd = -1;
	r.lfd = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
	if (r.lfd < 0)
		die("making the egress relay's socket");
	struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)c->relay_port),
				.sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
	if (bind(r.lfd, (struct sockaddr *)&a, sizeof a) < 0)
		die("binding the egress relay to 127.0.0.1 in the sandbox");
	if (listen(r.lfd, 64) < 0)
		die("listening for the egress relay");
	r.ep = epoll_create1(EPOLL_CLOEXEC);
	struct epoll_event ev = {.events = EPOLLIN, .data.u32 = LISTENER};
	if (r.ep < 0 || epoll_ctl(r.ep, EPOLL_CTL_ADD, r.lfd, &ev) < 0)
		die("watching the egress relay");
	return &r;
}

// write_trust writes the CA certificates the code's TLS clients trust
// (SSL_CERT_FILE and friends name the file), read-only, in the init's own
// dir of the script (/code), where the code cannot write: nothing the code
// does changes whom it trusts for the next call of a session.
void write_trust(const struct config *c) {
	if (c->ca_path == NULL || c->ca_bundle == NULL)
		return;
	int fd = open(c->ca_path, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC | O_NOFOLLOW, 0444);
	if (fd < 0 || write_all(fd, c->ca_bundle, c->ca_bundle_len) < 0 || fchmod(fd, 0444) < 0 || close(fd) < 0)
		die("writing the sandbox's CA bundle");
}
