// The sandbox's pid 1, and the holder of a call slot's user namespace.
//
// Both run from an ELF constructor, before the Go runtime starts, when the
// binary (this very executable, bind-mounted into the sandbox) is started
// with a marker argument. Being static and free of the Go runtime, the init
// starts in well under a millisecond in any root filesystem, starts no
// threads, installs no signal handlers but SIGCHLD's, and keeps its memory
// small. See init.go for the protocol and why each step is here.
#define _GNU_SOURCE
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <grp.h>
#include <limits.h>
#include <poll.h>
#include <sched.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/inotify.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/signalfd.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>
#include <linux/capability.h>

#define INIT_ARG "__mcp_exec_init__"
#define HOLD_ARG "__mcp_exec_userns__"

// Frame types, host to init.
#define H_FILE 'F'  // a file to write under /tmp: u16 path length, path, data
#define H_STDIN 'I' // bytes for the code's standard input
#define H_STDIN_END 'J'
#define H_CODE 'C' // the code; the program starts when it is all read
#define H_KILL 'K' // kill the code now, then report as usual
#define H_CPU 'L'  // the call's CPU seconds: RLIMIT_CPU of the code in the process runtime

// Frame types, init to host.
#define I_READY 'R'   // the interpreter waits for its code
#define I_STARTED 'S' // the code is handed over: it runs from now
#define I_STDOUT 'O'
#define I_STDERR 'E'
#define I_EXIT 'X'   // u32 wait status, u64 stdout total, u64 stderr total, u64 ns the code ran
#define I_OUTFILE 'F' // u16 path length, path, u64 size, data
#define I_SKIPPED 'T' // an output file was left out for the limits
#define I_DONE 'D'
#define I_ERROR 'W' // the sandbox could not do what was asked: message

#define MAX_FRAME (64u << 20)
#define CHUNK (64 << 10)

static int out_fd = 1; // frames to the host

static void die(const char *what) {
	char buf[512];
	int n = snprintf(buf, sizeof buf, "mcp-exec init: %s: %s\n", what, strerror(errno));
	if (n > 0)
		(void)!write(2, buf, (size_t)n);
	_exit(125);
}

static int write_all(int fd, const void *p, size_t n) {
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

static void put_u16(unsigned char *p, uint16_t v) { p[0] = v >> 8; p[1] = v; }
static void put_u32(unsigned char *p, uint32_t v) { for (int i = 0; i < 4; i++) p[i] = v >> (24 - 8 * i); }
static void put_u64(unsigned char *p, uint64_t v) { for (int i = 0; i < 8; i++) p[i] = v >> (56 - 8 * i); }
static uint16_t get_u16(const unsigned char *p) { return (uint16_t)(p[0] << 8 | p[1]); }
static uint32_t get_u32(const unsigned char *p) { return (uint32_t)p[0] << 24 | (uint32_t)p[1] << 16 | (uint32_t)p[2] << 8 | p[3]; }

// frame_head writes a frame's type and length; its payload follows.
static void frame_head(char type, uint32_t len) {
	unsigned char h[5];
	h[0] = (unsigned char)type;
	put_u32(h + 1, len);
	if (write_all(out_fd, h, 5) < 0)
		_exit(125); // the host is gone
}

static void frame(char type, const void *p, uint32_t len) {
	frame_head(type, len);
	if (len > 0 && write_all(out_fd, p, len) < 0)
		_exit(125);
}

static void report_error(const char *what, int err) {
	char buf[512];
	int n = snprintf(buf, sizeof buf, "%s: %s", what, strerror(err));
	frame(I_ERROR, buf, n > 0 ? (uint32_t)n : 0);
}

struct config {
	uid_t uid;
	gid_t gid;
	uint64_t max_output;  // per stream
	uint64_t max_files;   // output files
	uint64_t max_file_bytes;
	const char *workdir;  // the code's working directory; input files go here, output files come from outputs/ in it
	int process_mode;     // not pid 1 of a namespace: a process of the server's machine (the process runtime)
	const char *script;   // the FIFO, then the file, the interpreter runs
	char **argv;          // the interpreter's command line
};

// as_user runs fn in a child that is the code's user and nothing more, and
// returns what it returned (0 or an errno): files written in and read out
// are exactly what the code could write and read, owned by it, and no bug
// in handling them runs with the init's privileges. The child is waited
// for here, so the main loop never sees it.
static int as_user(const struct config *c, int (*fn)(const struct config *, void *), void *arg) {
	pid_t pid = fork();
	if (pid < 0)
		return errno;
	if (pid == 0) {
		prctl(PR_SET_PDEATHSIG, SIGKILL, 0, 0, 0);
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
	if (WIFEXITED(st))
		return WEXITSTATUS(st);
	return EIO;
}

// drop_privileges leaves the child with the code's identity and nothing else:
// no capability in any of the five sets, no supplementary group.
static void drop_privileges(const struct config *c) {
	if (geteuid() != 0 && c->process_mode)
		return; // the process runtime under an unprivileged server: it is the code's user already
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
	// setresuid to a non-zero uid cleared the permitted and effective sets;
	// the inheritable one goes explicitly.
	struct __user_cap_header_struct h = {.version = _LINUX_CAPABILITY_VERSION_3};
	struct __user_cap_data_struct d[2] = {{0}};
	if (syscall(SYS_capset, &h, d) < 0)
		die("clearing capabilities");
}

static void close_from(int lowfd) {
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

// spawn starts the interpreter with the code's identity, default signal
// dispositions, an empty signal mask and the three pipes as its stdio.
static pid_t spawn(const struct config *c, int in, int out, int err) {
	pid_t pid = fork();
	if (pid != 0)
		return pid;
	for (int s = 1; s < NSIG; s++)
		signal(s, SIG_DFL);
	sigset_t none;
	sigemptyset(&none);
	sigprocmask(SIG_SETMASK, &none, NULL);
	if (dup2(in, 0) < 0 || dup2(out, 1) < 0 || dup2(err, 2) < 0)
		die("setting up stdio");
	if (c->process_mode)
		setpgid(0, 0); // the code's own group, killed whole
	close_from(3);
	drop_privileges(c);
	execve(c->argv[0], c->argv, environ);
	die("starting the interpreter");
	return -1;
}

// buffer is a growable byte queue.
struct buffer {
	unsigned char *p;
	size_t len, off;
};

static void buf_append(struct buffer *b, const void *p, size_t n) {
	unsigned char *q = realloc(b->p, b->len + n);
	if (q == NULL && b->len + n > 0)
		die("allocating");
	b->p = q;
	memcpy(b->p + b->len, p, n);
	b->len += n;
}

static size_t buf_pending(const struct buffer *b) { return b->len - b->off; }

// flush writes what it can of b to a non-blocking fd; it returns -1 when
// the reader is gone.
static int flush(struct buffer *b, int fd) {
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
	free(b->p);
	b->p = NULL;
	b->len = b->off = 0;
	return 0;
}

// safe_rel checks a path the host sent: relative, no "." or ".." element,
// no empty element. The host checks it too; this is the last line.
static int safe_rel(const char *p) {
	if (p[0] == '\0' || p[0] == '/')
		return 0;
	const char *s = p;
	while (*s) {
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
// directories; it runs as the code's user (as_user), and nothing of the
// code has run yet, so nothing can race it.
static int write_file(const struct config *c, void *arg) {
	const struct input_file *in = arg;
	const char *path = in->path;
	if (!safe_rel(path))
		return EINVAL;
	int err = 0;
	int dir = open(c->workdir, O_DIRECTORY | O_RDONLY | O_CLOEXEC);
	if (dir < 0)
		return errno;
	char *copy = strdup(path);
	char *s = copy, *slash;
	while ((slash = strchr(s, '/')) != NULL) {
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

// make_outputs creates the empty outputs dir, the code's, before it runs.
static int make_outputs(const struct config *c, void *arg) {
	(void)arg;
	int work = open(c->workdir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	if (work < 0)
		return errno;
	int err = 0;
	if (mkdirat(work, "outputs", 0755) < 0 && errno != EEXIST)
		err = errno;
	close(work);
	return err;
}

// export walks /tmp/outputs once every process of the code is gone, and
// sends its regular files, never following a symlink or opening a device
// or a FIFO, within the file count and byte limits. Visited entries and
// depth are bounded too, so a million files or a deep tree cost bounded
// time and memory.
struct exporter {
	const struct config *c;
	uint64_t files, bytes, visited;
	int skipped;
};

#define MAX_DEPTH 32
#define MAX_VISITED 100000
#define MAX_DIR_ENTRIES 4096

static int cmp_names(const void *a, const void *b) { return strcmp(*(char *const *)a, *(char *const *)b); }

static void send_file(struct exporter *x, int dir, const char *name, const char *rel) {
	int fd = openat(dir, name, O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC | O_NOCTTY);
	if (fd < 0) {
		x->skipped = 1;
		return;
	}
	struct stat st;
	if (fstat(fd, &st) < 0 || !S_ISREG(st.st_mode)) {
		close(fd);
		return;
	}
	uint64_t size = (uint64_t)st.st_size;
	size_t rl = strlen(rel);
	if (x->files >= x->c->max_files || size > x->c->max_file_bytes - x->bytes || rl > 4096) {
		x->skipped = 1;
		close(fd);
		return;
	}
	// Read it whole first: a file that shrank is not sent half.
	unsigned char *data = malloc(size ? size : 1);
	if (data == NULL) {
		x->skipped = 1;
		close(fd);
		return;
	}
	uint64_t got = 0;
	while (got < size) {
		ssize_t r = read(fd, data + got, size - got);
		if (r < 0 && errno == EINTR)
			continue;
		if (r <= 0)
			break;
		got += (uint64_t)r;
	}
	close(fd);
	if (got != size) {
		free(data);
		x->skipped = 1;
		return;
	}
	unsigned char head[2 + 8];
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

static void walk(struct exporter *x, int dir, const char *prefix, int depth) {
	DIR *d = fdopendir(dir);
	if (d == NULL) {
		close(dir);
		return;
	}
	char **names = NULL;
	size_t n = 0;
	struct dirent *e;
	while ((e = readdir(d)) != NULL) {
		if (strcmp(e->d_name, ".") == 0 || strcmp(e->d_name, "..") == 0)
			continue;
		if (++x->visited > MAX_VISITED || n >= MAX_DIR_ENTRIES) {
			x->skipped = 1;
			break;
		}
		char **more = realloc(names, (n + 1) * sizeof *names);
		if (more == NULL)
			break;
		names = more;
		names[n++] = strdup(e->d_name);
	}
	qsort(names, n, sizeof *names, cmp_names);
	for (size_t i = 0; i < n; i++) {
		char rel[PATH_MAX];
		if (names[i] == NULL || snprintf(rel, sizeof rel, "%s%s", prefix, names[i]) >= (int)sizeof rel) {
			x->skipped = 1;
			continue;
		}
		struct stat st;
		if (fstatat(dirfd(d), names[i], &st, AT_SYMLINK_NOFOLLOW) < 0)
			continue;
		if (S_ISREG(st.st_mode)) {
			send_file(x, dirfd(d), names[i], rel);
		} else if (S_ISDIR(st.st_mode)) {
			if (depth >= MAX_DEPTH) {
				x->skipped = 1;
				continue;
			}
			int sub = openat(dirfd(d), names[i], O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
			if (sub < 0) {
				x->skipped = 1;
				continue;
			}
			char subprefix[PATH_MAX];
			if (snprintf(subprefix, sizeof subprefix, "%s/", rel) >= (int)sizeof subprefix) {
				close(sub);
				x->skipped = 1;
				continue;
			}
			walk(x, sub, subprefix, depth + 1);
		}
		// Symlinks, devices, FIFOs and sockets are never followed nor sent.
	}
	for (size_t i = 0; i < n; i++)
		free(names[i]);
	free(names);
	closedir(d);
}

// export_outputs runs as the code's user (as_user), after every process
// of the code is gone, and writes its frames straight to the host.
static int export_outputs(const struct config *c, void *arg) {
	(void)arg;
	struct exporter x = {.c = c};
	int work = open(c->workdir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	int dir = work < 0 ? -1 : openat(work, "outputs", O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
	if (work >= 0)
		close(work);
	if (dir >= 0)
		walk(&x, dir, "", 0);
	if (x.skipped)
		frame(I_SKIPPED, NULL, 0);
	return 0;
}

// outputs_empty says whether the outputs dir is there and holds nothing,
// as most calls leave it: then there is nothing to export and no child to
// fork for it. It only lists the one directory, whose name it does not
// follow; anything else (an error, a link, an entry) means "export", which
// runs as the code's user and decides for itself.
static int outputs_empty(const struct config *c) {
	int work = open(c->workdir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	if (work < 0)
		return 0;
	int fd = openat(work, "outputs", O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
	close(work);
	if (fd < 0)
		return 0;
	DIR *d = fdopendir(fd);
	if (d == NULL) {
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

static pid_t code_group; // the process runtime: the code's process group

// kill_all kills every process of the code. As pid 1 of the sandbox's pid
// namespace, that is every process but this one. In the process runtime it
// is the code's process group and, as this process is their subreaper,
// every orphan that left the group (setsid) and came back to it.
static void kill_all(void) {
	if (!code_group) {
		kill(-1, SIGKILL);
		return;
	}
	kill(-code_group, SIGKILL);
	DIR *d = opendir("/proc");
	if (d == NULL)
		return;
	pid_t self = getpid();
	struct dirent *e;
	while ((e = readdir(d)) != NULL) {
		if (e->d_name[0] < '0' || e->d_name[0] > '9')
			continue;
		char path[300], buf[512];
		snprintf(path, sizeof path, "/proc/%s/stat", e->d_name);
		int fd = open(path, O_RDONLY | O_CLOEXEC);
		if (fd < 0)
			continue;
		ssize_t n = read(fd, buf, sizeof buf - 1);
		close(fd);
		if (n <= 0)
			continue;
		buf[n] = '\0';
		char *rp = strrchr(buf, ')');
		int ppid = 0;
		if (rp != NULL && sscanf(rp + 1, " %*c %d", &ppid) == 1 && ppid == self)
			kill(atoi(e->d_name), SIGKILL);
	}
	closedir(d);
}

static uint64_t parse_u64(const char *key, const char *s) {
	char *end;
	errno = 0;
	unsigned long long v = strtoull(s, &end, 10);
	if (errno != 0 || *end != '\0' || end == s) {
		char what[128];
		snprintf(what, sizeof what, "parsing the init's %s=%s", key, s);
		errno = EINVAL;
		die(what);
	}
	return v;
}

static void set_rlimit(int resource, uint64_t v, const char *what) {
	struct rlimit rl = {.rlim_cur = v, .rlim_max = v};
	if (setrlimit(resource, &rl) < 0)
		die(what);
}

static int sandbox_init(int argc, char **argv) {
	// Die with whatever started us: the runtime, or runsc's sandbox. Set
	// first, before the code exists, so that no window is left. (Only the
	// watchdog's test turns this off, and the exit when the host goes, to
	// play an init the code has subverted.)
	int subverted = argc > 2 && strcmp(argv[2], "test_no_parent_death=1") == 0;
	if (!subverted)
		prctl(PR_SET_PDEATHSIG, SIGKILL, 0, 0, 0);
	// Not dumpable: the code, another uid, could not open /proc/1/mem
	// anyway; this also keeps /proc/1's other files root's only.
	prctl(PR_SET_DUMPABLE, 0, 0, 0, 0);

	// KEY=VALUE settings, then "--" and the interpreter's command line,
	// whose last argument is the script.
	struct config c = {.uid = (uid_t)-1, .gid = (gid_t)-1, .workdir = "/tmp"};
	int i = 2;
	for (; i < argc && strcmp(argv[i], "--") != 0; i++) {
		char *eq = strchr(argv[i], '=');
		if (eq == NULL) {
			errno = EINVAL;
			die(argv[i]);
		}
		*eq = '\0';
		const char *k = argv[i], *v = eq + 1;
		if (strcmp(k, "uid") == 0)
			c.uid = (uid_t)parse_u64(k, v);
		else if (strcmp(k, "gid") == 0)
			c.gid = (gid_t)parse_u64(k, v);
		else if (strcmp(k, "max_output") == 0)
			c.max_output = parse_u64(k, v);
		else if (strcmp(k, "max_files") == 0)
			c.max_files = parse_u64(k, v);
		else if (strcmp(k, "max_file_bytes") == 0)
			c.max_file_bytes = parse_u64(k, v);
		else if (strcmp(k, "workdir") == 0)
			c.workdir = v;
		else if (strcmp(k, "test_no_parent_death") == 0)
			; // handled first thing
		else if (strcmp(k, "mode") == 0 && strcmp(v, "process") == 0)
			c.process_mode = 1;
		else if (strcmp(k, "rlimit_data") == 0)
			set_rlimit(RLIMIT_DATA, parse_u64(k, v), "setting RLIMIT_DATA");
		else if (strcmp(k, "rlimit_nproc") == 0)
			set_rlimit(RLIMIT_NPROC, parse_u64(k, v), "setting RLIMIT_NPROC");
		else if (strcmp(k, "rlimit_fsize") == 0)
			set_rlimit(RLIMIT_FSIZE, parse_u64(k, v), "setting RLIMIT_FSIZE");

		// Limits of the code's every process, set here rather than by the
		// runtime: lowering a limit needs no privilege, and a runtime
		// outside the sandbox's user namespace may not touch them.
		else if (strcmp(k, "rlimit_core") == 0)
			set_rlimit(RLIMIT_CORE, parse_u64(k, v), "setting RLIMIT_CORE");
		else if (strcmp(k, "rlimit_nofile") == 0)
			set_rlimit(RLIMIT_NOFILE, parse_u64(k, v), "setting RLIMIT_NOFILE");
		else {
			errno = EINVAL;
			die(k);
		}
	}
	if (i + 2 >= argc || c.uid == (uid_t)-1 || c.gid == (gid_t)-1) {
		errno = EINVAL;
		die("usage: init " INIT_ARG " uid=UID gid=GID [KEY=VALUE...] -- COMMAND... SCRIPT");
	}
	c.argv = argv + i + 1;
	c.script = argv[argc - 1];

	sigset_t chld;
	sigemptyset(&chld);
	sigaddset(&chld, SIGCHLD);
	sigprocmask(SIG_BLOCK, &chld, NULL);
	int sfd = signalfd(-1, &chld, SFD_CLOEXEC | SFD_NONBLOCK);
	if (sfd < 0)
		die("signalfd");
	signal(SIGPIPE, SIG_IGN); // a pipe whose reader died gives EPIPE

	// The code's one writable place for results.
	int e = as_user(&c, make_outputs, NULL);
	if (e != 0) {
		errno = e;
		die("creating the outputs dir");
	}

	// The interpreter is started ahead, on a FIFO at the script's path, and
	// waits for its code in open(2) and read(2): everything it does before
	// (site, preloads) costs the call nothing.
	if (mknod(c.script, S_IFIFO | 0644, 0) < 0)
		die("creating the script FIFO");
	int fifo = open(c.script, O_RDWR | O_NONBLOCK | O_CLOEXEC);
	if (fifo < 0)
		die("opening the script FIFO");
	int ino = inotify_init1(IN_CLOEXEC | IN_NONBLOCK);
	if (ino < 0 || inotify_add_watch(ino, c.script, IN_OPEN) < 0)
		die("watching the script FIFO");

	int in[2], out[2], err[2];
	if (pipe2(in, O_CLOEXEC) < 0 || pipe2(out, O_CLOEXEC) < 0 || pipe2(err, O_CLOEXEC) < 0)
		die("creating pipes");
	if (c.process_mode)
		prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0); // orphans come back to us
	pid_t child = spawn(&c, in[0], out[1], err[1]);
	if (child < 0)
		die("fork");
	if (c.process_mode) {
		setpgid(child, child); // both sides, so that no kill can miss it
		code_group = child;
	}
	close(in[0]);
	close(out[1]);
	close(err[1]);
	int stdin_w = in[1], out_r = out[0], err_r = err[0];
	fcntl(stdin_w, F_SETFL, O_NONBLOCK);
	fcntl(out_r, F_SETFL, O_NONBLOCK);
	fcntl(err_r, F_SETFL, O_NONBLOCK);

	// The host end stays blocking for writes; reads are framed.
	struct buffer ctl = {0}; // what the host sent, not yet parsed
	struct buffer stdin_buf = {0}, code_buf = {0};
	int stdin_end = 0, opened = 0, code_given = 0, renamed = 0, started = 0;
	int exited = 0, out_eof = 0, err_eof = 0;
	int status = 0;
	uint64_t out_total = 0, err_total = 0;
	// When the code had all of itself, and when its main process ended:
	// measured here, not where the host reads the frames, which a busy
	// host may read together.
	struct timespec t_started = {0}, t_exited = {0};
	unsigned char chunk[CHUNK];

	for (;;) {
		if (exited && out_eof && err_eof)
			break;
		struct pollfd p[7];
		int np = 0;
		int ih, io = -1, ie = -1, iw = -1, ic = -1, ii = -1, is;
		ih = np;
		p[np++] = (struct pollfd){.fd = 0, .events = POLLIN};
		if (!out_eof) {
			io = np;
			p[np++] = (struct pollfd){.fd = out_r, .events = POLLIN};
		}
		if (!err_eof) {
			ie = np;
			p[np++] = (struct pollfd){.fd = err_r, .events = POLLIN};
		}
		if (stdin_w >= 0 && buf_pending(&stdin_buf) > 0) {
			iw = np;
			p[np++] = (struct pollfd){.fd = stdin_w, .events = POLLOUT};
		}
		if (fifo >= 0 && code_given && opened) {
			ic = np;
			p[np++] = (struct pollfd){.fd = fifo, .events = POLLOUT};
		}
		if (ino >= 0) {
			ii = np;
			p[np++] = (struct pollfd){.fd = ino, .events = POLLIN};
		}
		is = np;
		p[np++] = (struct pollfd){.fd = sfd, .events = POLLIN};
		if (poll(p, (nfds_t)np, -1) < 0) {
			if (errno == EINTR)
				continue;
			die("poll");
		}

		if (ii >= 0 && (p[ii].revents & POLLIN)) {
			char ev[sizeof(struct inotify_event) + NAME_MAX + 1];
			ssize_t r = read(ino, ev, sizeof ev);
			if (r > 0) {
				// The interpreter has opened its script: it is ready.
				close(ino);
				ino = -1;
				opened = 1;
				frame(I_READY, NULL, 0);
			}
		}

		if (ih >= 0 && (p[ih].revents & (POLLIN | POLLHUP | POLLERR))) {
			ssize_t r = read(0, chunk, sizeof chunk);
			if (r < 0 && errno != EINTR && errno != EAGAIN)
				r = 0;
			if (r == 0 && subverted) {
				pause();
			}
			if (r == 0) {
				// The host is gone: nobody will read a verdict.
				kill_all();
				_exit(125);
			}
			if (r > 0)
				buf_append(&ctl, chunk, (size_t)r);
			while (buf_pending(&ctl) >= 5) {
				unsigned char *f = ctl.p + ctl.off;
				uint32_t len = get_u32(f + 1);
				if (len > MAX_FRAME) {
					errno = EMSGSIZE;
					die("reading a frame from the host");
				}
				if (buf_pending(&ctl) < 5 + (size_t)len)
					break;
				unsigned char *pl = f + 5;
				switch (f[0]) {
				case H_FILE: {
					if (code_given || len < 2 || get_u16(pl) > len - 2 || get_u16(pl) > PATH_MAX) {
						report_error("an input file came in a malformed frame", EINVAL);
						break;
					}
					uint16_t pn = get_u16(pl);
					char path[PATH_MAX + 1];
					memcpy(path, pl + 2, pn);
					path[pn] = '\0';
					struct input_file in = {.path = path, .data = pl + 2 + pn, .n = len - 2 - pn};
					int e = as_user(&c, write_file, &in);
					if (e != 0) {
						char what[PATH_MAX + 64];
						snprintf(what, sizeof what, "writing input file %s", path);
						report_error(what, e);
					}
					break;
				}
				case H_STDIN:
					if (stdin_w >= 0)
						buf_append(&stdin_buf, pl, len);
					break;
				case H_STDIN_END:
					stdin_end = 1;
					break;
				case H_CODE:
					if (code_given)
						break;
					code_given = 1;
					buf_append(&code_buf, pl, len);
					break;
				case H_KILL:
					kill_all();
					break;
				case H_CPU:
					// Without a cgroup's quota, the code's CPU time is
					// bounded per process by RLIMIT_CPU: SIGXCPU at the
					// call's seconds, SIGKILL one later.
					if (c.process_mode && len > 0 && len < 32) {
						char num[32];
						memcpy(num, pl, len);
						num[len] = '\0';
						uint64_t secs = parse_u64("cpu", num);
						struct rlimit rl = {.rlim_cur = secs, .rlim_max = secs + 1};
						prlimit(child, RLIMIT_CPU, &rl, NULL);
					}
					break;
				}
				ctl.off += 5 + (size_t)len;
			}
			if (buf_pending(&ctl) == 0) {
				free(ctl.p);
				ctl = (struct buffer){0};
			}
		}

		if (ic >= 0 && !renamed) {
			// The interpreter holds the FIFO open: from now on the path
			// names a plain file with the same code, for tracebacks and for
			// code that reads its own source.
			char tmp[PATH_MAX];
			snprintf(tmp, sizeof tmp, "%s.tmp", c.script);
			int fd = open(tmp, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0444);
			if (fd < 0 || write_all(fd, code_buf.p, code_buf.len) < 0 || close(fd) < 0 || rename(tmp, c.script) < 0)
				die("writing the script");
			renamed = 1;
		}
		if (ic >= 0 && (p[ic].revents & (POLLOUT | POLLERR | POLLHUP))) {
			if (flush(&code_buf, fifo) < 0 || buf_pending(&code_buf) == 0) {
				// All of it is in: closing the FIFO gives the interpreter
				// its EOF, and the code runs.
				close(fifo);
				fifo = -1;
				started = 1;
				clock_gettime(CLOCK_MONOTONIC, &t_started);
				frame(I_STARTED, NULL, 0);
			}
		}

		if (iw >= 0 && (p[iw].revents & (POLLOUT | POLLERR | POLLHUP))) {
			if (flush(&stdin_buf, stdin_w) < 0) {
				// The code closed its stdin: the rest is dropped.
				free(stdin_buf.p);
				stdin_buf = (struct buffer){0};
				close(stdin_w);
				stdin_w = -1;
			}
		}
		if (stdin_w >= 0 && stdin_end && buf_pending(&stdin_buf) == 0 && started) {
			close(stdin_w);
			stdin_w = -1;
		}

		int *eofs[2] = {&out_eof, &err_eof};
		int fds[2] = {out_r, err_r};
		int idx[2] = {io, ie};
		uint64_t *totals[2] = {&out_total, &err_total};
		char types[2] = {I_STDOUT, I_STDERR};
		for (int k = 0; k < 2; k++) {
			if (idx[k] < 0 || !(p[idx[k]].revents & (POLLIN | POLLHUP | POLLERR)))
				continue;
			ssize_t r = read(fds[k], chunk, sizeof chunk);
			if (r < 0 && (errno == EINTR || errno == EAGAIN))
				continue;
			if (r <= 0) {
				*eofs[k] = 1;
				close(fds[k]);
				continue;
			}
			// Past the cap the bytes are counted and dropped: the program is
			// never blocked by its own output.
			uint64_t before = *totals[k];
			*totals[k] += (uint64_t)r;
			if (before < c.max_output) {
				uint64_t keep = c.max_output - before;
				frame(types[k], chunk, (uint32_t)(keep < (uint64_t)r ? keep : (uint64_t)r));
			}
		}

		if (p[is].revents & POLLIN) {
			struct signalfd_siginfo si;
			while (read(sfd, &si, sizeof si) > 0) {
			}
			for (;;) {
				int st;
				pid_t w = waitpid(-1, &st, WNOHANG);
				if (w <= 0)
					break;
				if (w == child && !exited) {
					exited = 1;
					status = st;
					clock_gettime(CLOCK_MONOTONIC, &t_exited);
					// The code's main process is done: so is the rest of it.
					kill_all();
				}
			}
		}
	}

	// Reap whatever the kill left, so the outputs no longer change. In the
	// process runtime orphans keep coming back to this subreaper while
	// their parents die: kill again until none is left.
	for (;;) {
		if (code_group)
			kill_all();
		pid_t w = waitpid(-1, NULL, 0);
		if (w < 0 && errno == EINTR)
			continue;
		if (w < 0)
			break;
	}
	unsigned char x[4 + 8 + 8 + 8];
	put_u32(x, (uint32_t)status);
	put_u64(x + 4, out_total);
	put_u64(x + 12, err_total);
	int64_t ran = 0;
	if (started && exited)
		ran = (int64_t)(t_exited.tv_sec - t_started.tv_sec) * 1000000000 + (t_exited.tv_nsec - t_started.tv_nsec);
	put_u64(x + 20, ran > 0 ? (uint64_t)ran : 0);
	frame(I_EXIT, x, sizeof x);
	if (!outputs_empty(&c))
		as_user(&c, export_outputs, NULL);
	frame(I_DONE, NULL, 0);
	return 0;
}

// userns_hold runs as the unprivileged owner of a call slot: it creates a
// user namespace that the slot's sandboxes join, so that every per-user
// kernel count of their code is charged to the slot's own uid, and holds it
// until its stdin closes.
static int userns_hold(void) {
	prctl(PR_SET_PDEATHSIG, SIGKILL, 0, 0, 0);
	// Not dumpable: its /proc files are then root's, so the server writes
	// its uid_map without CAP_DAC_OVERRIDE; and no process of the slot's
	// uid (the code's, on the host) could read or trace it.
	prctl(PR_SET_DUMPABLE, 0, 0, 0, 0);
	if (unshare(CLONE_NEWUSER) < 0) {
		char buf[256];
		int n = snprintf(buf, sizeof buf, "error: unshare(CLONE_NEWUSER): %s\n", strerror(errno));
		(void)!write(1, buf, (size_t)n);
		return 1;
	}
	if (write_all(1, "ok\n", 3) < 0)
		return 1;
	char b;
	for (;;) {
		ssize_t r = read(0, &b, 1);
		if (r == 0 || (r < 0 && errno != EINTR))
			return 0;
	}
}

__attribute__((constructor)) static void mcp_exec_reexec(int argc, char **argv, char **envp) {
	(void)envp;
	if (argc < 2 || argv == NULL || argv[1] == NULL)
		return;
	if (strcmp(argv[1], INIT_ARG) == 0)
		_exit(sandbox_init(argc, argv));
	if (strcmp(argv[1], HOLD_ARG) == 0)
		_exit(userns_hold());
}
