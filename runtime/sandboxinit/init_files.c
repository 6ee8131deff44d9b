// Files in and out: the call's input files, written before the code runs,
// and the regular files it left under outputs/, sent once it has ended.
// Both run as the code's user (as_user): what is written in and read out
// is exactly what the code could write and read, owned by it, and no bug
// in handling them runs with the init's privileges.
#include "init.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <grp.h>
#include <limits.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

// as_user runs fn in a child that is the code's user and nothing more,
// and returns what it returned (0 or an errno). The child is waited for
// here, so the main loop never sees it.
int as_user(const struct config *c, int (*fn)(const struct config *, void *), void *arg) {
	pid_t pid = fork();
	if (pid < 0)
		return errno;
	if (pid == 0) {
		prctl(PR_SET_PDEATHSIG, SIGKILL, 0, 0, 0);
		// An unprivileged process runtime is the code's user already.
		if (geteuid() == 0 || !c->process_mode) {
			if (setgroups(0, NULL) < 0 || setresgid(c->gid, c->gid, c->gid) < 0 || setresuid(c->uid, c->uid, c->uid) < 0)
				_exit(EPERM);
		}
		_exit(fn(c, arg) & 0xff);
	}
	int st;
	while (waitpid(pid, &st, 0) < 0) {
		if (errno != EINTR)
			return errno;
	}
	return WIFEXITED(st) ? WEXITSTATUS(st) : EIO;
}

static int open_workdir(const struct config *c) { return open(c->workdir, O_DIRECTORY | O_RDONLY | O_CLOEXEC); }

// make_outputs creates the empty outputs dir, the code's, before it runs.
int make_outputs(const struct config *c, void *arg) {
	(void)arg;
	int work = open_workdir(c);
	if (work < 0)
		return errno;
	int err = mkdirat(work, OUTPUTS_NAME, 0755) < 0 && errno != EEXIST ? errno : 0;
	close(work);
	return err;
}

// safe_rel checks a path the host sent: relative, no "." or ".." element,
// no empty element. The host checks it too; this is the last line.
static int safe_rel(const char *p) {
	if (p[0] == '\0' || p[0] == '/')
		return 0;
	for (const char *s = p; *s;) {
		const char *e = strchr(s, '/');
		size_t n = e ? (size_t)(e - s) : strlen(s);
		if (n == 0 || (n == 1 && s[0] == '.') || (n == 2 && s[0] == '.' && s[1] == '.'))
			return 0;
		s += n;
		if (*s == '/')
			s++;
	}
	return 1;
}

struct input_file {
	const char *path;
	const unsigned char *data;
	size_t n;
};

// write_file writes one input file under the work dir, creating its
// directories without following a link; nothing of the code has run yet.
static int write_file(const struct config *c, void *arg) {
	const struct input_file *in = arg;
	if (!safe_rel(in->path))
		return EINVAL;
	int dir = open_workdir(c);
	if (dir < 0)
		return errno;
	char *copy = strdup(in->path), *s = copy, *slash;
	int err = copy == NULL ? ENOMEM : 0;
	while (err == 0 && (slash = strchr(s, '/')) != NULL) {
		*slash = '\0';
		if (mkdirat(dir, s, 0755) < 0 && errno != EEXIST) {
			err = errno;
			break;
		}
		int next = openat(dir, s, O_DIRECTORY | O_RDONLY | O_NOFOLLOW | O_CLOEXEC);
		if (next < 0) {
			err = errno;
			break;
		}
		close(dir);
		dir = next;
		s = slash + 1;
	}
	if (err == 0) {
		int fd = openat(dir, s, O_WRONLY | O_CREAT | O_TRUNC | O_NOFOLLOW | O_CLOEXEC, 0644);
		if (fd < 0 || write_all(fd, in->data, in->n) < 0)
			err = errno;
		if (fd >= 0 && close(fd) < 0 && err == 0)
			err = errno;
	}
	free(copy);
	close(dir);
	return err;
}

// write_input_file decodes an H_FILE frame (u16 path length, path, data)
// and writes it; path receives the file's path for a message. It returns
// 0, or an errno (EINVAL for a malformed frame).
int write_input_file(const struct config *c, const unsigned char *payload, uint32_t len, char *path, size_t pathcap) {
	path[0] = '\0';
	if (len < 2 || get_u16(payload) > len - 2 || get_u16(payload) >= pathcap)
		return EINVAL;
	uint16_t pn = get_u16(payload);
	memcpy(path, payload + 2, pn);
	path[pn] = '\0';
	if (strlen(path) != pn)
		return EINVAL;
	struct input_file in = {.path = path, .data = payload + 2 + pn, .n = len - 2 - pn};
	return as_user(c, write_file, &in);
}

// outputs_empty says whether the outputs dir is there and holds nothing,
// as most calls leave it: then no child is forked to export it. Anything
// else (an error, a link, an entry) means "export", which runs as the
// code's user and decides for itself.
int outputs_empty(const struct config *c) {
	int work = open_workdir(c);
	if (work < 0)
		return 0;
	int fd = openat(work, OUTPUTS_NAME, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
	close(work);
	DIR *d = fd < 0 ? NULL : fdopendir(fd);
	if (d == NULL) {
		if (fd >= 0)
			close(fd);
		return 0;
	}
	int empty = 1;
	struct dirent *e;
	errno = 0;
	while ((e = readdir(d)) != NULL) {
		if (strcmp(e->d_name, ".") != 0 && strcmp(e->d_name, "..") != 0) {
			empty = 0;
			break;
		}
	}
	if (errno != 0)
		empty = 0;
	closedir(d);
	return empty;
}

// The export walks outputs/ once every process of the code is gone, and
// sends its regular files, never following a symlink or opening a device
// or a FIFO, within the file count and byte limits, in the order the code
// wrote them: by modification time, then by name as people number things
// (figure-2 before figure-10), so that what the limits leave out is what
// came last. Visited entries and depth are bounded too, so a million
// files or a deep tree cost bounded time and memory. What it cannot read
// it says: the file list would otherwise be silently short.
struct found {
	char *rel; // relative to outputs/
	struct timespec mtime;
	uint64_t size;
};

struct exporter {
	const struct config *c;
	uint64_t files, bytes, visited;
	int unreadable; // a dir or file that could not be opened
	int named;      // left out and named in an I_SKIPPED frame
	int unnamed;    // left out past MAX_LEFT_OUT, or with no name to give
	struct found *found; // the regular files the walk found
	size_t nfound, capfound;
};

#define MAX_DEPTH 32
#define MAX_VISITED 100000
#define MAX_DIR_ENTRIES 4096

static int cmp_names(const void *a, const void *b) { return strcmp(*(char *const *)a, *(char *const *)b); }

static int is_digit(char c) { return c >= '0' && c <= '9'; }

// cmp_natural compares two paths as people number things: a run of
// digits by its value, the rest byte by byte.
static int cmp_natural(const char *a, const char *b) {
	while (*a && *b) {
		if (is_digit(*a) && is_digit(*b)) {
			const char *da = a, *db = b;
			while (*da == '0')
				da++;
			while (*db == '0')
				db++;
			const char *ea = da, *eb = db;
			while (is_digit(*ea))
				ea++;
			while (is_digit(*eb))
				eb++;
			if (ea - da != eb - db)
				return ea - da < eb - db ? -1 : 1;
			int c = memcmp(da, db, (size_t)(ea - da));
			if (c != 0)
				return c;
			if (ea - a != eb - b) // the same value: fewer zeros first
				return ea - a < eb - b ? -1 : 1;
			a = ea;
			b = eb;
			continue;
		}
		if (*a != *b)
			return (unsigned char)*a - (unsigned char)*b;
		a++;
		b++;
	}
	return (unsigned char)*a - (unsigned char)*b;
}

// cmp_written orders files as the code wrote them.
static int cmp_written(const void *pa, const void *pb) {
	const struct found *a = pa, *b = pb;
	if (a->mtime.tv_sec != b->mtime.tv_sec)
		return a->mtime.tv_sec < b->mtime.tv_sec ? -1 : 1;
	if (a->mtime.tv_nsec != b->mtime.tv_nsec)
		return a->mtime.tv_nsec < b->mtime.tv_nsec ? -1 : 1;
	return cmp_natural(a->rel, b->rel);
}

// leave_out says that rel (a file, or a dir ending in '/') was left out,
// why (a LEFT_ code) and its size: an I_SKIPPED frame of u8 why, u64 size
// and the path, for the first MAX_LEFT_OUT; past them, one bare frame at
// the end says more were.
static void leave_out(struct exporter *x, int why, const char *rel, uint64_t size) {
	size_t rl = strlen(rel);
	if (x->named >= MAX_LEFT_OUT || rl > 4096) {
		x->unnamed = 1;
		return;
	}
	unsigned char head[9];
	head[0] = (unsigned char)why;
	put_u64(head + 1, size);
	frame_head(I_SKIPPED, (uint32_t)(sizeof head + rl));
	if (write_all(out_fd, head, sizeof head) < 0 || write_all(out_fd, rel, rl) < 0)
		_exit(125);
	x->named++;
}

// read_whole reads size bytes of fd: a file that shrank is not sent half.
static unsigned char *read_whole(int fd, uint64_t size) {
	unsigned char *data = malloc(size ? size : 1);
	uint64_t got = 0;
	while (data != NULL && got < size) {
		ssize_t r = read(fd, data + got, size - got);
		if (r < 0 && errno == EINTR)
			continue;
		if (r <= 0)
			break;
		got += (uint64_t)r;
	}
	if (data != NULL && got != size) {
		free(data);
		return NULL;
	}
	return data;
}

// open_beneath opens the file rel below the dir root for reading, never
// following a symlink on the way: the tree may have changed since the
// walk (a session's code runs on), and what it finds now is what it
// sends, or nothing.
static int open_beneath(int root, const char *rel) {
	char *copy = strdup(rel), *s = copy, *slash;
	if (copy == NULL)
		return -1;
	int dir = dup(root), fd = -1;
	while (dir >= 0 && (slash = strchr(s, '/')) != NULL) {
		*slash = '\0';
		int next = openat(dir, s, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
		close(dir);
		dir = next;
		s = slash + 1;
	}
	if (dir >= 0) {
		fd = openat(dir, s, O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC | O_NOCTTY);
		close(dir);
	}
	free(copy);
	return fd;
}

// send_file sends one file the walk found, within the limits, or says
// why it was left out.
static void send_file(struct exporter *x, int root, const struct found *f) {
	const char *rel = f->rel;
	size_t rl = strlen(rel);
	if (x->files >= x->c->max_files || rl > 4096) {
		leave_out(x, rl > 4096 ? LEFT_LIMITS : LEFT_COUNT, rel, f->size);
		return;
	}
	int fd = open_beneath(root, rel);
	if (fd < 0) {
		x->unreadable = 1;
		leave_out(x, LEFT_UNREADABLE, rel, f->size);
		return;
	}
	struct stat st;
	if (fstat(fd, &st) < 0 || !S_ISREG(st.st_mode)) {
		close(fd);
		return;
	}
	uint64_t size = (uint64_t)st.st_size;
	if (size > x->c->max_file_bytes - x->bytes) {
		leave_out(x, LEFT_BYTES, rel, size);
		close(fd);
		return;
	}
	unsigned char *data = read_whole(fd, size);
	close(fd);
	if (data == NULL) {
		leave_out(x, LEFT_UNREADABLE, rel, size);
		return;
	}
	unsigned char head[8];
	frame_head(I_OUTFILE, (uint32_t)(2 + rl + 8 + size));
	put_u16(head, (uint16_t)rl);
	if (write_all(out_fd, head, 2) < 0 || write_all(out_fd, rel, rl) < 0)
		_exit(125);
	put_u64(head, size);
	if (write_all(out_fd, head, 8) < 0 || write_all(out_fd, data, size) < 0)
		_exit(125);
	free(data);
	x->files++;
	x->bytes += size;
}

// found_file keeps a regular file the walk found, to be sent in order.
static void found_file(struct exporter *x, const char *rel, const struct stat *st) {
	if (x->nfound == x->capfound) {
		size_t cap = x->capfound ? 2 * x->capfound : 64;
		struct found *more = realloc(x->found, cap * sizeof *more);
		if (more == NULL) {
			x->unnamed = 1;
			return;
		}
		x->found = more;
		x->capfound = cap;
	}
	char *r = strdup(rel);
	if (r == NULL) {
		x->unnamed = 1;
		return;
	}
	x->found[x->nfound++] = (struct found){.rel = r, .mtime = st->st_mtim, .size = (uint64_t)st->st_size};
}

// list_dir returns d's entry names, sorted, within the walk's bounds;
// prefix names d.
static char **list_dir(struct exporter *x, DIR *d, const char *prefix, size_t *n) {
	char **names = NULL;
	struct dirent *e;
	*n = 0;
	while ((e = readdir(d)) != NULL) {
		if (strcmp(e->d_name, ".") == 0 || strcmp(e->d_name, "..") == 0)
			continue;
		if (++x->visited > MAX_VISITED || *n >= MAX_DIR_ENTRIES) {
			leave_out(x, LEFT_LIMITS, prefix[0] ? prefix : "./", 0);
			break;
		}
		char **more = realloc(names, (*n + 1) * sizeof *names);
		if (more == NULL)
			break;
		names = more;
		names[(*n)++] = strdup(e->d_name);
	}
	if (*n > 0)
		qsort(names, *n, sizeof *names, cmp_names);
	return names;
}

static void walk(struct exporter *x, int dir, const char *prefix, int depth);

static void walk_entry(struct exporter *x, int dir, const char *name, const char *prefix, int depth) {
	char rel[PATH_MAX];
	if (name == NULL || snprintf(rel, sizeof rel, "%s%s", prefix, name) >= (int)sizeof rel) {
		x->unnamed = 1;
		return;
	}
	struct stat st;
	if (fstatat(dir, name, &st, AT_SYMLINK_NOFOLLOW) < 0)
		return;
	if (S_ISREG(st.st_mode)) {
		found_file(x, rel, &st);
	} else if (S_ISDIR(st.st_mode)) {
		// Symlinks, devices, FIFOs and sockets are never followed nor sent.
		char subprefix[PATH_MAX + 1];
		if (snprintf(subprefix, sizeof subprefix, "%s/", rel) >= (int)sizeof subprefix) {
			x->unnamed = 1;
			return;
		}
		int sub = depth >= MAX_DEPTH ? -1 : openat(dir, name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
		if (sub < 0) {
			x->unreadable |= depth < MAX_DEPTH;
			leave_out(x, depth < MAX_DEPTH ? LEFT_UNREADABLE : LEFT_LIMITS, subprefix, 0);
		} else {
			walk(x, sub, subprefix, depth + 1);
		}
	}
}

static void walk(struct exporter *x, int dir, const char *prefix, int depth) {
	DIR *d = fdopendir(dir);
	if (d == NULL) {
		close(dir);
		x->unreadable = 1;
		leave_out(x, LEFT_UNREADABLE, prefix[0] ? prefix : "./", 0);
		return;
	}
	size_t n;
	char **names = list_dir(x, d, prefix, &n);
	for (size_t i = 0; i < n; i++) {
		walk_entry(x, dirfd(d), names[i], prefix, depth);
		free(names[i]);
	}
	free(names);
	closedir(d);
}

// export_outputs runs as the code's user, after every process of the
// code is gone, and writes its frames straight to the host.
int export_outputs(const struct config *c, void *arg) {
	(void)arg;
	struct exporter x = {.c = c};
	int work = open_workdir(c);
	int dir = work < 0 ? -1 : openat(work, OUTPUTS_NAME, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
	int err = errno;
	if (work >= 0)
		close(work);
	if (dir >= 0) {
		int root = dup(dir);
		walk(&x, dir, "", 0);
		qsort(x.found, x.nfound, sizeof *x.found, cmp_written);
		for (size_t i = 0; i < x.nfound; i++) {
			if (root >= 0)
				send_file(&x, root, &x.found[i]);
			free(x.found[i].rel);
		}
		free(x.found);
		if (root >= 0)
			close(root);
	} else if (err != ENOENT) {
		x.unreadable = 1; // there, but not a dir it may read
		leave_out(&x, LEFT_UNREADABLE, "./", 0);
	}
	if (x.unnamed)
		frame(I_SKIPPED, NULL, 0);
	if (x.unreadable)
		report(I_NOTE, "some of outputs/ could not be read (the code took away its permissions): what it held there is not returned", 0);
	return 0;
}

// clear_dir removes what dir holds, as far as depth goes, giving each
// subdir its owner's rights back first (the code may have taken them).
static void clear_dir(int dir, int depth) {
	DIR *d = fdopendir(dir);
	if (d == NULL) {
		close(dir);
		return;
	}
	struct dirent *e;
	while ((e = readdir(d)) != NULL) {
		if (strcmp(e->d_name, ".") == 0 || strcmp(e->d_name, "..") == 0)
			continue;
		if (unlinkat(dirfd(d), e->d_name, 0) == 0 || errno != EISDIR || depth >= 64)
			continue;
		int sub = openat(dirfd(d), e->d_name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
		if (sub < 0)
			continue;
		fchmod(sub, 0700);
		clear_dir(sub, depth + 1);
		unlinkat(dirfd(d), e->d_name, AT_REMOVEDIR);
	}
	closedir(d);
}

// empty_outputs runs as the code's user after a session's call has been
// exported: the next call's outputs/ holds only what it writes.
int empty_outputs(const struct config *c, void *arg) {
	(void)arg;
	int work = open_workdir(c);
	if (work < 0)
		return errno;
	int dir = openat(work, OUTPUTS_NAME, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
	if (dir < 0 && errno != ENOENT) {
		// A file or a link where the dir was: the code's; put the dir back.
		unlinkat(work, OUTPUTS_NAME, 0);
	}
	if (dir >= 0) {
		fchmod(dir, 0755);
		clear_dir(dir, 0);
	}
	int err = mkdirat(work, OUTPUTS_NAME, 0755) < 0 && errno != EEXIST ? errno : 0;
	close(work);
	return err;
}
