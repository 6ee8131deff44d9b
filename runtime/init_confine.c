// The process runtime's confinement of the code, in place of a container:
// a Landlock domain of its own (what it may read, execute and write; no
// signal, ptrace or abstract socket beyond itself; no TCP), the seccomp
// filter, and a bound on the files it keeps under its work dir. And the
// subreaper's sweep: every orphan that comes back to the init is killed.
//
// Everything here fails closed: the runtime asked for exactly what this
// host could give (it probed it, probe_confinement), so a step that fails
// now ends the call before the code runs.
#include "init.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <linux/filter.h>
#include <linux/seccomp.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/inotify.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

// Landlock's ABI, spelled out: the C library's headers may be older than
// the kernel. Syscall numbers are the same on every architecture.
#ifndef __NR_landlock_create_ruleset
#define __NR_landlock_create_ruleset 444
#define __NR_landlock_add_rule 445
#define __NR_landlock_restrict_self 446
#endif
#define LL_CREATE_RULESET_VERSION (1U << 0)
#define LL_RULE_PATH_BENEATH 1

#define FS_EXECUTE (1ULL << 0)
#define FS_WRITE_FILE (1ULL << 1)
#define FS_READ_FILE (1ULL << 2)
#define FS_READ_DIR (1ULL << 3)
#define FS_REMOVE_DIR (1ULL << 4)
#define FS_REMOVE_FILE (1ULL << 5)
#define FS_MAKE_CHAR (1ULL << 6)
#define FS_MAKE_DIR (1ULL << 7)
#define FS_MAKE_REG (1ULL << 8)
#define FS_MAKE_SOCK (1ULL << 9)
#define FS_MAKE_FIFO (1ULL << 10)
#define FS_MAKE_BLOCK (1ULL << 11)
#define FS_MAKE_SYM (1ULL << 12)
#define FS_REFER (1ULL << 13)    // ABI 2
#define FS_TRUNCATE (1ULL << 14) // ABI 3
#define FS_IOCTL_DEV (1ULL << 15) // ABI 5
#define NET_BIND_TCP (1ULL << 0)    // ABI 4
#define NET_CONNECT_TCP (1ULL << 1) // ABI 4
#define SCOPE_ABSTRACT_UNIX (1ULL << 0) // ABI 6
#define SCOPE_SIGNAL (1ULL << 1)        // ABI 6

struct ll_ruleset_attr {
	uint64_t handled_access_fs;
	uint64_t handled_access_net;
	uint64_t scoped;
};

struct ll_path_beneath {
	uint64_t allowed_access;
	int32_t parent_fd;
} __attribute__((packed));

// The rights that apply to a file rather than a directory.
#define FS_FILE_RIGHTS (FS_EXECUTE | FS_WRITE_FILE | FS_READ_FILE | FS_TRUNCATE | FS_IOCTL_DEV)

// handled is every filesystem right the ABI knows: all are denied but
// where a rule grants them.
static uint64_t handled_fs(int abi) {
	uint64_t r = (FS_MAKE_SYM << 1) - 1;
	if (abi >= 2)
		r |= FS_REFER;
	if (abi >= 3)
		r |= FS_TRUNCATE;
	if (abi >= 5)
		r |= FS_IOCTL_DEV;
	return r;
}

// add_rules grants rights on each path of l; a path that is not there is
// skipped (the runtime listed what the host had when it started).
static void add_rules(int ruleset, const struct strv *l, uint64_t rights, uint64_t handled) {
	for (int i = 0; i < l->n; i++) {
		int fd = open(l->v[i], O_PATH | O_CLOEXEC);
		if (fd < 0) {
			if (errno == ENOENT)
				continue;
			die(l->v[i]);
		}
		struct stat st;
		if (fstat(fd, &st) < 0)
			die(l->v[i]);
		struct ll_path_beneath rule = {.allowed_access = rights & handled, .parent_fd = fd};
		if (!S_ISDIR(st.st_mode))
			rule.allowed_access &= FS_FILE_RIGHTS;
		if (rule.allowed_access != 0 && syscall(__NR_landlock_add_rule, ruleset, LL_RULE_PATH_BENEATH, &rule, 0) < 0) {
			char what[PATH_MAX + 64];
			snprintf(what, sizeof what, "adding the Landlock rule of %s", l->v[i]);
			die(what);
		}
		close(fd);
	}
}

// landlock puts the calling process into a domain of its own: its own
// working dir is the only place it may write; it may read the
// interpreter, its libraries and packages, run the interpreter, use the
// few device nodes; it may not connect or bind TCP, signal or ptrace (or
// read /proc/<pid>/environ and mem of) any process outside the domain,
// nor reach an abstract unix socket made outside it.
static void landlock(const struct config *c) {
	int abi = c->landlock_abi;
	uint64_t fs = handled_fs(abi);
	struct ll_ruleset_attr attr = {.handled_access_fs = fs};
	if (abi >= 4)
		attr.handled_access_net = NET_BIND_TCP | NET_CONNECT_TCP;
	if (abi >= 6)
		attr.scoped = SCOPE_ABSTRACT_UNIX | SCOPE_SIGNAL;
	int rs = (int)syscall(__NR_landlock_create_ruleset, &attr, sizeof attr, 0);
	if (rs < 0)
		die("creating the Landlock ruleset");
	const uint64_t read = FS_READ_FILE | FS_READ_DIR;
	const uint64_t write = read | FS_WRITE_FILE | FS_REMOVE_DIR | FS_REMOVE_FILE | FS_MAKE_DIR | FS_MAKE_REG |
			       FS_MAKE_SOCK | FS_MAKE_FIFO | FS_MAKE_SYM | FS_REFER | FS_TRUNCATE;
	add_rules(rs, &c->read, read, fs);
	add_rules(rs, &c->exec, read | FS_EXECUTE, fs);
	add_rules(rs, &c->devices, FS_READ_FILE | FS_WRITE_FILE | FS_IOCTL_DEV, fs);
	add_rules(rs, &c->write, write, fs);
	if (syscall(__NR_landlock_restrict_self, rs, 0) < 0)
		die("entering the Landlock domain");
	close(rs);
}

void install_seccomp(const struct config *c) {
	struct sock_fprog prog = {.len = (unsigned short)(c->seccomp_len / 8), .filter = (struct sock_filter *)c->seccomp};
	if (syscall(SYS_seccomp, SECCOMP_SET_MODE_FILTER, 0, &prog) < 0)
		die("installing the seccomp filter");
}

// confine runs in the code's process, last before it execs the
// interpreter: no_new_privs (which Landlock and an unprivileged seccomp
// filter need), in the process runtime the domain, then the filter, which
// must allow execve. In a container the runtime has set no_new_privs and
// its own filter already; a filter given here (runsc's exact one) is
// stacked on it, and the stricter answer wins.
void confine(const struct config *c) {
	if (!c->process_mode && c->seccomp == NULL)
		return;
	if (prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) < 0)
		die("setting no_new_privs");
	if (c->process_mode && c->landlock_abi > 0)
		landlock(c);
	if (c->seccomp != NULL)
		install_seccomp(c);
}

// kill_children kills every child of this process but the export and
// input helpers, which are waited for where they are forked: in the
// process runtime the init is the code's subreaper, so every orphan the
// code made (setsid or not) comes back to it.
void kill_children(void) {
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

// The scratch bound: the process runtime has no tmpfs of the call's size,
// so the init measures what the code keeps under its work dir whenever
// anything there changes (inotify on every dir of the tree), and kills the
// code when it goes past the bound. Each file is bounded by RLIMIT_FSIZE
// too, so no single write goes far past it.
struct scratch {
	const struct config *c;
	int ino;
	uint64_t bytes, entries;
	int unreadable, too_deep;
	// A measure costs a walk of the tree: the next waits as long as the
	// last took, so that a code making thousands of files is not slowed
	// down by more than half; a change in between marks the tree dirty.
	int dirty;
	int64_t next_ms;
};

static int64_t now_ms(void) {
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

// Bounds of what the measure walks; past them the code is killed, as past
// the size: a tree it cannot measure is one it could hide files in.
#define SCRATCH_MAX_ENTRIES 100000
#define SCRATCH_MAX_DEPTH 512
#define SCRATCH_EVENTS (IN_CREATE | IN_MODIFY | IN_MOVED_TO | IN_CLOSE_WRITE | IN_ATTRIB)

static void measure(struct scratch *s, int dir, int depth) {
	DIR *d = fdopendir(dir);
	if (d == NULL) {
		close(dir);
		s->unreadable = 1;
		return;
	}
	struct dirent *e;
	while ((e = readdir(d)) != NULL && s->entries <= SCRATCH_MAX_ENTRIES) {
		if (strcmp(e->d_name, ".") == 0 || strcmp(e->d_name, "..") == 0)
			continue;
		s->entries++;
		struct stat st;
		if (fstatat(dirfd(d), e->d_name, &st, AT_SYMLINK_NOFOLLOW) < 0)
			continue;
		s->bytes += (uint64_t)st.st_blocks * 512;
		if (!S_ISDIR(st.st_mode))
			continue;
		if (depth >= SCRATCH_MAX_DEPTH) {
			s->too_deep = 1;
			continue;
		}
		int sub = openat(dirfd(d), e->d_name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
		if (sub < 0 && errno == EACCES && fchmodat(dirfd(d), e->d_name, st.st_mode | S_IRWXU, 0) == 0)
			sub = openat(dirfd(d), e->d_name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
		if (sub < 0) {
			s->unreadable = 1;
			continue;
		}
		// Watched as it is found: a dir made between two measures is
		// measured by the next one, which its first change triggers.
		char path[64];
		snprintf(path, sizeof path, "/proc/self/fd/%d", sub);
		inotify_add_watch(s->ino, path, SCRATCH_EVENTS);
		measure(s, sub, depth + 1);
	}
	closedir(d);
}

struct scratch *scratch_open(const struct config *c) {
	if (!c->process_mode || c->scratch_bytes == 0)
		return NULL;
	struct scratch *s = calloc(1, sizeof *s);
	if (s == NULL)
		die("allocating");
	s->c = c;
	s->ino = inotify_init1(IN_NONBLOCK | IN_CLOEXEC);
	if (s->ino < 0 || inotify_add_watch(s->ino, c->workdir, SCRATCH_EVENTS) < 0)
		die("watching the work dir");
	return s;
}

int scratch_fd(const struct scratch *s) { return s->ino; }

// scratch_timeout is how long the init may wait before it must measure:
// at the end of the pause after a measure when the tree changed since, or
// the periodic measure's interval.
int scratch_timeout(const struct scratch *s, int period_ms) {
	if (!s->dirty)
		return period_ms;
	int64_t wait = s->next_ms - now_ms();
	return wait < 0 ? 0 : (int)wait;
}

// scratch_over drains the watch's events and, when a measure is due,
// measures the tree and says whether it is past the bound (or could not
// be measured), and why.
int scratch_over(struct scratch *s, int periodic, char *why, size_t whycap) {
	char ev[4096];
	while (read(s->ino, ev, sizeof ev) > 0)
		s->dirty = 1;
	s->dirty |= periodic;
	int64_t start = now_ms();
	if (!s->dirty || start < s->next_ms)
		return 0;
	s->bytes = s->entries = 0;
	s->unreadable = s->too_deep = 0;
	int work = open(s->c->workdir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	if (work < 0)
		s->unreadable = 1;
	else
		measure(s, work, 0);
	int64_t took = now_ms() - start;
	s->next_ms = now_ms() + (took > 0 ? took : 1);
	s->dirty = 0;
	if (s->unreadable)
		snprintf(why, whycap, "killed: part of the call's directory could not be measured, so its size could not be bounded");
	else if (s->too_deep)
		snprintf(why, whycap, "killed: the call's directory nests dirs more than %d deep", SCRATCH_MAX_DEPTH);
	else if (s->entries > SCRATCH_MAX_ENTRIES)
		snprintf(why, whycap, "killed: the call's directory holds more than %d entries", SCRATCH_MAX_ENTRIES);
	else if (s->bytes > s->c->scratch_bytes)
		snprintf(why, whycap, "killed: the files in the call's directory (its /tmp) went past its size, %llu MiB",
			 (unsigned long long)(s->c->scratch_bytes >> 20));
	else
		return 0;
	return 1;
}
