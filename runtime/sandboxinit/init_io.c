// Frames to and from the host, and the byte queues behind them.
#include "init.h"

#include <dirent.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <unistd.h>

int out_fd = 1; // frames to the host

void die_errno(const char *what, int err) {
	char buf[512];
	int n = snprintf(buf, sizeof buf, "mcp-exec init: %s: %s\n", what, strerror(err));
	if (n > 0)
		(void)!write(2, buf, (size_t)n);
	_exit(125);
}

void die(const char *what) { die_errno(what, errno); }

int write_all(int fd, const void *p, size_t n) {
	const char *b = p;
	while (n > 0) {
		ssize_t w = write(fd, b, n);
		if (w < 0) {
			if (errno == EINTR)
				continue;
			return -1;
		}
		b += w;
		n -= (size_t)w;
	}
	return 0;
}

void put_u16(unsigned char *p, uint16_t v) { p[0] = v >> 8; p[1] = v; }
void put_u32(unsigned char *p, uint32_t v) { for (int i = 0; i < 4; i++) p[i] = v >> (24 - 8 * i); }
void put_u64(unsigned char *p, uint64_t v) { for (int i = 0; i < 8; i++) p[i] = v >> (56 - 8 * i); }
uint16_t get_u16(const unsigned char *p) { return (uint16_t)(p[0] << 8 | p[1]); }
uint32_t get_u32(const unsigned char *p) { return (uint32_t)p[0] << 24 | (uint32_t)p[1] << 16 | (uint32_t)p[2] << 8 | p[3]; }
uint64_t get_u64(const unsigned char *p) { return (uint64_t)get_u32(p) << 32 | get_u32(p + 4); }

// frame_head writes a frame's type and length; its payload follows. A
// host that is gone can read no verdict: the init just ends.
void frame_head(char type, uint32_t len) {
	unsigned char h[5];
	h[0] = (unsigned char)type;
	put_u32(h + 1, len);
	if (write_all(out_fd, h, 5) < 0)
		_exit(125);
}

void frame(char type, const void *p, uint32_t len) {
	frame_head(type, len);
	if (len > 0 && write_all(out_fd, p, len) < 0)
		_exit(125);
}

// report sends an I_ERROR or I_NOTE frame: what, and err's text if err.
void report(char type, const char *what, int err) {
	char buf[1024];
	int n = err ? snprintf(buf, sizeof buf, "%s: %s", what, strerror(err)) : snprintf(buf, sizeof buf, "%s", what);
	if (n < 0)
		n = 0;
	if ((size_t)n >= sizeof buf)
		n = sizeof buf - 1;
	frame(type, buf, (uint32_t)n);
}

void buf_append(struct buffer *b, const void *p, size_t n) {
	if (n == 0)
		return;
	unsigned char *q = realloc(b->p, b->len + n);
	if (q == NULL)
		die("allocating");
	b->p = q;
	memcpy(b->p + b->len, p, n);
	b->len += n;
}

// ring_put keeps the last cap bytes of what was put. Without the memory
// for them it keeps nothing: the bytes are counted all the same, and the
// tail is only shorter.
void ring_put(struct ring *r, size_t cap, const unsigned char *p, size_t n) {
	if (cap == 0 || n == 0)
		return;
	if (r->p == NULL) {
		r->p = malloc(cap);
		if (r->p == NULL)
			return;
		r->cap = cap;
	}
	if (n >= r->cap) {
		memcpy(r->p, p + n - r->cap, r->cap);
		r->start = 0;
		r->len = r->cap;
		return;
	}
	size_t end = (r->start + r->len) % r->cap;
	size_t first = r->cap - end < n ? r->cap - end : n;
	memcpy(r->p + end, p, first);
	memcpy(r->p, p + first, n - first);
	if (r->len + n > r->cap) {
		r->start = (r->start + r->len + n - r->cap) % r->cap;
		r->len = r->cap;
	} else {
		r->len += n;
	}
}

// ring_read copies up to n of the kept bytes from the off-th on (0 is the
// oldest) into p, and returns how many.
size_t ring_read(const struct ring *r, size_t off, unsigned char *p, size_t n) {
	if (off >= r->len)
		return 0;
	if (n > r->len - off)
		n = r->len - off;
	size_t at = (r->start + off) % r->cap;
	size_t first = r->cap - at < n ? r->cap - at : n;
	memcpy(p, r->p + at, first);
	memcpy(p + first, r->p, n - first);
	return n;
}

void ring_reset(struct ring *r) {
	free(r->p);
	*r = (struct ring){0};
}

size_t buf_pending(const struct buffer *b) { return b->len - b->off; }

void buf_reset(struct buffer *b) {
	free(b->p);
	*b = (struct buffer){0};
}

// buf_flush writes what it can of b to a non-blocking fd; it returns -1
// when the reader is gone.
int buf_flush(struct buffer *b, int fd) {
	while (buf_pending(b) > 0) {
		ssize_t w = write(fd, b->p + b->off, buf_pending(b));
		if (w < 0) {
			if (errno == EINTR)
				continue;
			if (errno == EAGAIN)
				return 0;
			return -1;
		}
		b->off += (size_t)w;
	}
	buf_reset(b);
	return 0;
}

static int read_full(int fd, unsigned char *p, size_t n) {
	while (n > 0) {
		ssize_t r = read(fd, p, n);
		if (r < 0 && errno == EINTR)
			continue;
		if (r <= 0)
			return -1;
		p += r;
		n -= (size_t)r;
	}
	return 0;
}

// read_frame_blocking reads one whole frame from a blocking fd: the
// configuration, which comes before anything else.
int read_frame_blocking(int fd, char *type, unsigned char **payload, uint32_t *len) {
	unsigned char h[5];
	if (read_full(fd, h, 5) < 0)
		return -1;
	*type = (char)h[0];
	*len = get_u32(h + 1);
	if (*len > MAX_FRAME) {
		errno = EMSGSIZE;
		return -1;
	}
	*payload = malloc(*len ? *len : 1);
	if (*payload == NULL)
		die("allocating");
	return read_full(fd, *payload, *len);
}

void close_from(int lowfd) {
	if (syscall(SYS_close_range, lowfd, ~0U, 0) == 0)
		return;
	DIR *d = opendir("/proc/self/fd");
	if (d == NULL) {
		for (int fd = lowfd; fd < 65536; fd++)
			close(fd);
		return;
	}
	int dfd = dirfd(d);
	struct dirent *e;
	while ((e = readdir(d)) != NULL) {
		int fd = atoi(e->d_name);
		if (fd >= lowfd && fd != dfd)
			close(fd);
	}
	closedir(d);
}
