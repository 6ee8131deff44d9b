// The process runtime's confinement of the code, in place of a container:
// where the host lets it, namespaces of its own (setup_namespaces); a
// Landlock domain of its own (what it may read, execute and write; no
// signal, ptrace or abstract socket beyond itself; no TCP), the seccomp
// filter, and, without namespaces, a bound on the files it keeps under its
// work dir, named or not. And the subreaper's sweep: every orphan that
// comes back to the init is killed.
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
#include <sys/mount.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/sysmacros.h>
#include <time.h>
#include <unistd.h>

// mount_setattr(2) (Linux 5.12), spelled out for older headers.
#ifndef __NR_mount_setattr
#define __NR_mount_setattr 442
#endif
#ifndef AT_RECURSIVE
#define AT_RECURSIVE 0x8000
#endif
#define ATTR_RDONLY 0x00000001ULL // MOUNT_ATTR_RDONLY
#define ATTR_NOSUID 0x00000002ULL // MOUNT_ATTR_NOSUID
#define ATTR_NODEV 0x00000004ULL  // MOUNT_ATTR_NODEV
#define ATTR_NOEXEC 0x00000008ULL // MOUNT_ATTR_NOEXEC

struct setattr {
	uint64_t attr_set, attr_clr, propagation, userns_fd;
};

static void set_attr(const char *path, unsigned flags, uint64_t attr) {
	struct setattr a = {.attr_set = attr};
	if (syscall(__NR_mount_setattr, AT_FDCWD, path, flags, &a, sizeof a) < 0) {
		char what[PATH_MAX + 80];
		snprintf(what, sizeof what, "making %s read-only in the call's root (mount_setattr, Linux 5.12)", path);
		die(what);
	}
}

// in_root is path as it lies under the new root, not yet pivoted into.
static void in_root(char *buf, size_t cap, const char *root, const char *path) {
	if ((size_t)snprintf(buf, cap, "%s%s", root, path) >= cap)
		die_errno(path, ENAMETOOLONG);
}

// make_dirs makes every dir of path below the new root (root, itself made)
// that is not there yet, 0755. It never goes through a symlink: the
// runtime binds nothing below a path it binds, so a symlink on the way is
// one it did not mean.
static void make_dirs(const char *root, const char *path) {
	char p[PATH_MAX];
	in_root(p, sizeof p, root, path);
	for (char *s = p + strlen(root) + 1;; s++) {
		if (*s != '/' && *s != '\0')
			continue;
		char c = *s;
		*s = '\0';
		struct stat st;
		if (mkdir(p, 0755) < 0 && (errno != EEXIST || lstat(p, &st) < 0 || !S_ISDIR(st.st_mode)))
			die_errno(p, errno == EEXIST ? ENOTDIR : errno);
		*s = c;
		if (c == '\0')
			return;
	}
}

static char *parent_of_path(char *buf, size_t cap, const char *path) {
	snprintf(buf, cap, "%s", path);
	char *slash = strrchr(buf, '/');
	if (slash == buf)
		slash[1] = '\0';
	else if (slash != NULL)
		*slash = '\0';
	return buf;
}

// bind_into binds a path of the host read-only at the same place below
// the new root: a dir or file by a bind mount of it and everything below
// it, nosuid and (but for a device node) nodev as well; a symlink made
// again, with the same target, which then resolves in the new root. A
// path the host does not have is left out, as Landlock's rules leave it.
static void bind_into(const char *root, const char *path) {
	struct stat st;
	if (lstat(path, &st) < 0) {
		if (errno == ENOENT)
			return;
		die(path);
	}
	char dst[PATH_MAX], parent[PATH_MAX];
	in_root(dst, sizeof dst, root, path);
	if (strcmp(path, "/") != 0)
		make_dirs(root, parent_of_path(parent, sizeof parent, path));
	if (S_ISLNK(st.st_mode)) {
		char target[PATH_MAX];
		ssize_t n = readlink(path, target, sizeof target - 1);
		if (n < 0)
			die(path);
		target[n] = '\0';
		if (symlink(target, dst) < 0)
			die(dst);
		return;
	}
	if (S_ISDIR(st.st_mode)) {
		if (mkdir(dst, 0755) < 0 && errno != EEXIST)
			die(dst);
	} else {
		int fd = open(dst, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0644);
		if (fd < 0)
			die(dst);
		close(fd);
	}
	if (mount(path, dst, NULL, MS_BIND | MS_REC, NULL) < 0) {
		char what[PATH_MAX + 64];
		snprintf(what, sizeof what, "binding %s into the call's root", path);
		die(what);
	}
	int dev = S_ISCHR(st.st_mode) || S_ISBLK(st.st_mode);
	set_attr(dst, AT_RECURSIVE, ATTR_RDONLY | ATTR_NOSUID | (dev ? 0 : ATTR_NODEV));
}

// bind_mount binds a host dir (the data dir) at dst in the call's root
// with m's flags all the way down: a bind takes them only by a change of
// its attributes, recursive since mount_setattr.
static void bind_mount(const struct fmount *m, const char *dst) {
	char what[PATH_MAX + 64];
	snprintf(what, sizeof what, "binding %s on %s", m->source, m->target);
	if (mount(m->source, dst, NULL, MS_BIND | MS_REC, NULL) < 0)
		die(what);
	struct setattr a = {0};
	a.attr_set |= m->flags & MS_RDONLY ? ATTR_RDONLY : 0;
	a.attr_set |= m->flags & MS_NOSUID ? ATTR_NOSUID : 0;
	a.attr_set |= m->flags & MS_NODEV ? ATTR_NODEV : 0;
	a.attr_set |= m->flags & MS_NOEXEC ? ATTR_NOEXEC : 0;
	if (syscall(__NR_mount_setattr, AT_FDCWD, dst, AT_RECURSIVE, &a, sizeof a) < 0)
		die(what);
}

// new_root makes the call's own root on a tmpfs mounted on the work dir
// (the init's, and no other process's, in this mount namespace): the
// host's paths the runtime named, bound read-only; the fresh mounts
// (/proc, /sys, the work dir's and the script dir's tmpfs) at their
// places in it; /dev's links to /proc/self/fd, as a container's. Then it
// pivots into it and lets the host's root go: no other file of the host,
// no socket of /run, /tmp, /home or /var, and no line of the host's mount
// table is there for the code. /proc is mounted before the pivot: a
// user namespace may mount a fresh one only while a whole one is in
// sight.
static void new_root(const struct config *c) {
	const char *root = c->workdir;
	if (mount("tmpfs", root, "tmpfs", MS_NOSUID | MS_NODEV, "mode=0755,size=1m") < 0)
		die("mounting a tmpfs as the call's root");
	for (int i = 0; i < c->root.n; i++)
		bind_into(root, c->root.v[i]);
	char dst[PATH_MAX];
	for (int i = 0; i < c->nmounts; i++) {
		const struct fmount *m = &c->mounts[i];
		make_dirs(root, m->target);
		in_root(dst, sizeof dst, root, m->target);
		if (m->flags & MS_BIND) {
			bind_mount(m, dst);
			continue;
		}
		if (mount(m->source, dst, m->type, m->flags, m->data) < 0) {
			char what[PATH_MAX + 64];
			snprintf(what, sizeof what, "mounting a fresh %s on %s", m->type, m->target);
			die(what);
		}
	}
	static const char *const links[][2] = {
		{"/dev/fd", "/proc/self/fd"}, {"/dev/stdin", "/proc/self/fd/0"},
		{"/dev/stdout", "/proc/self/fd/1"}, {"/dev/stderr", "/proc/self/fd/2"},
	};
	in_root(dst, sizeof dst, root, "/dev");
	struct stat st;
	for (size_t i = 0; lstat(dst, &st) == 0 && i < sizeof links / sizeof links[0]; i++) {
		char l[PATH_MAX];
		in_root(l, sizeof l, root, links[i][0]);
		if (symlink(links[i][1], l) < 0 && errno != EEXIST)
			die(l);
	}
	if (chdir(root) < 0)
		die("entering the call's root");
	// The old root ends up stacked on the new one, at ".": detached, it is
	// gone from this mount namespace.
	if (syscall(SYS_pivot_root, ".", ".") < 0)
		die("pivoting into the call's root");
	if (umount2(".", MNT_DETACH) < 0)
		die("letting the host's root go");
	if (chdir("/") < 0)
		die("entering the call's root");
}

// setup_namespaces makes the namespaces the process runtime's init starts
// in — new pid, mount, network, IPC and UTS ones, and, under a server
// that is not root, a user namespace that maps its uid to itself, made as
// the server started it as their pid 1 — the call's, as bubblewrap does:
// a root of its own (new_root) holding, read-only, only what the
// interpreter and its libraries need, a fresh /proc that shows only the
// call's processes, with the container's masks, a fresh /sys that shows
// only lo, a tmpfs of the /tmp size as the work dir (a hard bound, files
// without a name included) and another holding the script; no mount
// event goes either way. The hostname is the sandbox's (where the outer
// seccomp profile allows it) and lo is up. Then the init gives up its
// capabilities: all those it had in the namespaces (what it does from
// here, any process of the call's uid could), or, made by a root server
// without a user namespace, all but a container's init's.
void setup_namespaces(const struct config *c) {
	// It ends the call with kill(-1), which only pid 1 of the call's own
	// pid namespace may do.
	if (getpid() != 1)
		die_errno("the init is not pid 1 of a pid namespace of its own", EINVAL);
	if (c->root.n == 0)
		die_errno("the configuration names nothing to bind into the call's root", EINVAL);
	if (mount(NULL, "/", NULL, MS_REC | MS_PRIVATE, NULL) < 0)
		die("making the call's mounts private");
	new_root(c);
	fresh_proc_paths(c);
	// Nothing is made in the root from here: it is read-only too.
	set_attr("/", 0, ATTR_RDONLY | ATTR_NOSUID | ATTR_NODEV);
	// A container engine's seccomp profile may refuse sethostname to a
	// container without CAP_SYS_ADMIN (docker's and podman's do): the
	// call's UTS namespace then keeps the name the server's container has,
	// which is no secret, and which the code cannot change either.
	if (c->hostname != NULL && sethostname(c->hostname, strlen(c->hostname)) < 0 && errno != EPERM)
		die("setting the hostname");
	loopback(c->loopback_mtu);
	// The init's work dir is the tmpfs now (the call's own: a root init
	// may enter it only while it may override modes).
	if (chdir(c->workdir) < 0)
		die("entering the work dir");
	keep_caps(c->keep_caps);
}

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

#define LL_RULE_NET_PORT 2 // ABI 4

struct ll_net_port {
	uint64_t allowed_access;
	uint64_t port;
};

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

// add_rule grants rights on path; a path that is not there is skipped
// (the runtime listed what the host had when it started).
static void add_rule(int ruleset, const char *path, uint64_t rights, uint64_t handled) {
	int fd = open(path, O_PATH | O_CLOEXEC);
	if (fd < 0) {
		if (errno == ENOENT)
			return;
		die(path);
	}
	struct stat st;
	if (fstat(fd, &st) < 0)
		die(path);
	struct ll_path_beneath rule = {.allowed_access = rights & handled, .parent_fd = fd};
	if (!S_ISDIR(st.st_mode))
		rule.allowed_access &= FS_FILE_RIGHTS;
	if (rule.allowed_access != 0 && syscall(__NR_landlock_add_rule, ruleset, LL_RULE_PATH_BENEATH, &rule, 0) < 0) {
		char what[PATH_MAX + 64];
		snprintf(what, sizeof what, "adding the Landlock rule of %s", path);
		die(what);
	}
	close(fd);
}

static void add_rules(int ruleset, const struct strv *l, uint64_t rights, uint64_t handled) {
	for (int i = 0; i < l->n; i++)
		add_rule(ruleset, l->v[i], rights, handled);
}

// add_proc_rules grants rights on what of /proc is the machine's, not a
// process's (every entry that is not a pid's dir or a link into one), and
// on the calling process's own dir: the code's main process sees itself,
// and no other process — not the server, not another call, not its own
// children. Without a pid namespace of its own, that is what keeps a call
// from reading the command lines, and every other file, of the machine's
// processes. Of its own dir it reads every entry but net, which is the
// machine's network namespace's (its TCP table lists the server's
// listener and its clients' addresses), task, whose threads' dirs each
// hold a net too, and the links (a rule on root would be one on /).
static void add_proc_rules(int ruleset, uint64_t rights, uint64_t handled) {
	char path[300];
	snprintf(path, sizeof path, "/proc/%d", (int)getpid());
	DIR *self = opendir(path);
	if (self == NULL)
		die("listing the code's own /proc dir");
	struct dirent *e;
	while ((e = readdir(self)) != NULL) {
		// A link (root, cwd, exe) would grant what it points to.
		if (e->d_name[0] == '.' || e->d_type == DT_LNK || strcmp(e->d_name, "net") == 0 || strcmp(e->d_name, "task") == 0)
			continue;
		snprintf(path, sizeof path, "/proc/%d/%s", (int)getpid(), e->d_name);
		add_rule(ruleset, path, rights, handled);
	}
	closedir(self);
	DIR *d = opendir("/proc");
	if (d == NULL)
		die("listing /proc");
	while ((e = readdir(d)) != NULL) {
		if (e->d_name[0] == '.' || (e->d_name[0] >= '0' && e->d_name[0] <= '9') || e->d_type == DT_LNK)
			continue;
		snprintf(path, sizeof path, "/proc/%s", e->d_name);
		add_rule(ruleset, path, rights, handled);
	}
	closedir(d);
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
	if (c->proc_self)
		add_proc_rules(rs, read, fs);
	add_rules(rs, &c->exec, read | FS_EXECUTE, fs);
	add_rules(rs, &c->devices, FS_READ_FILE | FS_WRITE_FILE | FS_IOCTL_DEV, fs);
	add_rules(rs, &c->write, write, fs);
	// With the network allowlist on, the code connects to the egress
	// relay on its own lo, and nowhere else; it binds nothing.
	struct ll_net_port relay = {.allowed_access = NET_CONNECT_TCP, .port = (uint64_t)c->relay_port};
	if (abi >= 4 && c->relay_port > 0 && syscall(__NR_landlock_add_rule, rs, LL_RULE_NET_PORT, &relay, 0) < 0)
		die("adding the Landlock rule of the egress relay's port");
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

// parent_of returns the parent of the process named pid in /proc, or -1.
static pid_t parent_of(const char *pid) {
	char path[64], buf[512];
	snprintf(path, sizeof path, "/proc/%s/stat", pid);
	int fd = open(path, O_RDONLY | O_CLOEXEC);
	if (fd < 0)
		return -1;
	ssize_t n = read(fd, buf, sizeof buf - 1);
	close(fd);
	if (n <= 0)
		return -1;
	buf[n] = '\0';
	char *rp = strrchr(buf, ')');
	int ppid;
	if (rp == NULL || sscanf(rp + 1, " %*c %d", &ppid) != 1)
		return -1;
	return ppid;
}

static int is_pid(const char *name) { return name[0] >= '0' && name[0] <= '9'; }

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
		if (is_pid(e->d_name) && parent_of(e->d_name) == self)
			kill(atoi(e->d_name), SIGKILL);
	}
	closedir(d);
}

// The scratch bound: without namespaces the process runtime has no tmpfs
// of the call's size, so the init measures what the code keeps under its
// work dir whenever anything there changes (inotify on every dir of the
// tree), and every 250 ms, and kills the code when it goes past the
// bound. Each file is bounded by RLIMIT_FSIZE too, so no single write goes
// far past it. The measure counts the files the code holds without a
// name as well (nameless_bytes).
struct scratch {
	const struct config *c;
	int ino;
	dev_t dev; // the work dir's filesystem
	uint64_t bytes, entries;
	int unreadable, too_deep, hidden;
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

// Files without a name: the walk of the tree cannot see a file the code
// unlinked while it holds it, or made with O_TMPFILE, yet its blocks are
// on the work dir's filesystem as much as a named file's. The measure
// adds each such file a process of the call holds: through a descriptor,
// at its blocks; through a memory mapping alone, at the end of its
// furthest mapping (all that can be told of it without a descriptor: the
// file may be longer).
struct held_file {
	ino_t ino;
	uint64_t bytes;
	int exact; // seen through a descriptor: its blocks
};

struct held {
	dev_t dev;
	struct held_file *v;
	int n, cap;
	int hidden; // a process of the call would not show its files
};

static void hold(struct held *h, ino_t ino, uint64_t bytes, int exact) {
	for (int i = 0; i < h->n; i++) {
		struct held_file *f = &h->v[i];
		if (f->ino != ino)
			continue;
		if (exact > f->exact || (exact == f->exact && bytes > f->bytes))
			*f = (struct held_file){ino, bytes, exact};
		return;
	}
	if (h->n == h->cap) {
		h->cap = h->cap ? h->cap * 2 : 16;
		h->v = realloc(h->v, (size_t)h->cap * sizeof *h->v);
		if (h->v == NULL)
			die("allocating");
	}
	h->v[h->n++] = (struct held_file){ino, bytes, exact};
}

// gone says whether the process named pid has given up its memory, and
// with it its files: it has exited, or is exiting (its /proc files are
// root's from then on, as a process's that is not dumpable are).
static int gone(const char *pid) {
	char path[64], buf[1024];
	snprintf(path, sizeof path, "/proc/%s/stat", pid);
	int fd = open(path, O_RDONLY | O_CLOEXEC);
	if (fd < 0)
		return 1;
	ssize_t n = read(fd, buf, sizeof buf - 1);
	close(fd);
	if (n <= 0)
		return 1;
	buf[n] = '\0';
	char *rp = strrchr(buf, ')');
	char state;
	unsigned long long vsize;
	// After the name: state (3), then fields 4 to 22, then vsize (23).
	if (rp == NULL || sscanf(rp + 2, "%c %*s %*s %*s %*s %*s %*s %*s %*s %*s %*s %*s %*s %*s %*s %*s %*s %*s %*s %*s %llu",
				 &state, &vsize) != 2)
		return 1;
	return state == 'Z' || state == 'X' || vsize == 0;
}

// A /proc file of a process of the call that cannot be read while the
// process still has its memory hides what it holds: the call cannot be
// bounded.
static void unreadable_proc(struct held *h, const char *pid) {
	if (errno != ENOENT && errno != ESRCH && !gone(pid))
		h->hidden = 1;
}

static void held_by_fds(struct held *h, const char *pid) {
	char path[64];
	snprintf(path, sizeof path, "/proc/%s/fd", pid);
	DIR *d = opendir(path);
	if (d == NULL) {
		unreadable_proc(h, pid);
		return;
	}
	struct dirent *e;
	while ((e = readdir(d)) != NULL) {
		struct stat st;
		if (e->d_name[0] == '.')
			continue;
		if (fstatat(dirfd(d), e->d_name, &st, 0) < 0) {
			if (errno == EACCES || errno == EPERM)
				unreadable_proc(h, pid);
			continue; // closed since
		}
		if (S_ISREG(st.st_mode) && st.st_nlink == 0 && st.st_dev == h->dev)
			hold(h, st.st_ino, (uint64_t)st.st_blocks * 512, 1);
	}
	closedir(d);
}

static void held_by_maps(struct held *h, const char *pid) {
	char path[64], line[PATH_MAX + 256];
	snprintf(path, sizeof path, "/proc/%s/maps", pid);
	FILE *f = fopen(path, "re");
	if (f == NULL) {
		unreadable_proc(h, pid);
		return;
	}
	static const char deleted[] = " (deleted)\n";
	while (fgets(line, sizeof line, f) != NULL) {
		unsigned long long start, end, off, ino;
		unsigned maj, min;
		size_t n = strlen(line);
		if (n < sizeof deleted || strcmp(line + n - (sizeof deleted - 1), deleted) != 0)
			continue;
		if (sscanf(line, "%llx-%llx %*s %llx %x:%x %llu", &start, &end, &off, &maj, &min, &ino) != 6)
			continue;
		if (ino != 0 && makedev(maj, min) == h->dev)
			hold(h, (ino_t)ino, off + (end - start), 0);
	}
	fclose(f);
}

static int by_pid(const void *a, const void *b) {
	pid_t x = *(const pid_t *)a, y = *(const pid_t *)b;
	return (x > y) - (x < y);
}

// call_procs lists the init's descendants, every process of the call (an
// orphan comes back to the init, its subreaper), as pairs of pid and
// parent, sorted; it returns how many are the call's (the first *n), or
// -1.
static int call_procs(pid_t (**out)[2]) {
	DIR *d = opendir("/proc");
	if (d == NULL)
		return -1;
	pid_t(*p)[2] = NULL;
	int n = 0, cap = 0;
	struct dirent *e;
	while ((e = readdir(d)) != NULL) {
		pid_t ppid = is_pid(e->d_name) ? parent_of(e->d_name) : -1;
		if (ppid < 0)
			continue;
		if (n == cap && (p = realloc(p, (size_t)(cap = cap ? cap * 2 : 256) * sizeof *p)) == NULL)
			die("allocating");
		p[n][0] = atoi(e->d_name);
		p[n++][1] = ppid;
	}
	closedir(d);
	// The call's first, grown a generation at a pass.
	pid_t self = getpid();
	int mine = 0;
	for (int grew = 1; grew;) {
		grew = 0;
		size_t known = (size_t)mine;
		qsort(p, known, sizeof *p, by_pid);
		for (int i = mine; i < n; i++) {
			if (p[i][1] != self && bsearch(&p[i][1], p, known, sizeof *p, by_pid) == NULL)
				continue;
			pid_t t[2] = {p[i][0], p[i][1]};
			memcpy(p[i], p[mine], sizeof t);
			memcpy(p[mine++], t, sizeof t);
			grew = 1;
		}
	}
	*out = p;
	return mine;
}

// nameless_bytes is what the call's processes hold of the work dir's
// filesystem without a name.
static uint64_t nameless_bytes(struct scratch *s) {
	pid_t(*p)[2];
	int n = call_procs(&p);
	if (n < 0) {
		s->unreadable = 1;
		return 0;
	}
	struct held h = {.dev = s->dev};
	for (int i = 0; i < n; i++) {
		char pid[16];
		snprintf(pid, sizeof pid, "%d", (int)p[i][0]);
		held_by_fds(&h, pid);
		held_by_maps(&h, pid);
	}
	free(p);
	uint64_t bytes = 0;
	for (int i = 0; i < h.n; i++)
		bytes += h.v[i].bytes;
	free(h.v);
	s->hidden = h.hidden;
	return bytes;
}

struct scratch *scratch_open(const struct config *c) {
	if (!c->process_mode || c->scratch_bytes == 0)
		return NULL;
	struct scratch *s = calloc(1, sizeof *s);
	if (s == NULL)
		die("allocating");
	s->c = c;
	struct stat st;
	if (stat(c->workdir, &st) < 0)
		die("measuring the work dir");
	s->dev = st.st_dev;
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
	s->bytes += nameless_bytes(s);
	int64_t took = now_ms() - start;
	s->next_ms = now_ms() + (took > 0 ? took : 1);
	s->dirty = 0;
	if (s->unreadable)
		snprintf(why, whycap, "killed: part of the call's directory could not be measured, so its size could not be bounded");
	else if (s->hidden)
		snprintf(why, whycap, "killed: a process of the call hides the files it holds (it made itself not dumpable), so their size could not be bounded");
	else if (s->too_deep)
		snprintf(why, whycap, "killed: the call's directory nests dirs more than %d deep", SCRATCH_MAX_DEPTH);
	else if (s->entries > SCRATCH_MAX_ENTRIES)
		snprintf(why, whycap, "killed: the call's directory holds more than %d entries", SCRATCH_MAX_ENTRIES);
	else if (s->bytes > s->c->scratch_bytes)
		snprintf(why, whycap, "killed: the files in the call's directory (its /tmp), with those it holds without a name, went past its size, %llu MiB",
			 (unsigned long long)(s->c->scratch_bytes >> 20));
	else
		return 0;
	return 1;
}

// The process runtime's measures, which a container's cgroups make for
// it: whether the code's process limit was reached, and what the call's
// processes used.

// nproc_limit is the code's RLIMIT_NPROC, as the configuration set it on
// the init (and so on the code), or as the runtime lowered it since, as
// the call was claimed; 0 when the configuration sets none.
static uint64_t nproc_limit(const struct config *c) {
	struct rlimit rl;
	for (int i = 0; i < c->nrlimits; i++)
		if (c->rlimits[i].resource == RLIMIT_NPROC)
			return getrlimit(RLIMIT_NPROC, &rl) == 0 ? rl.rlim_cur : c->rlimits[i].soft;
	return 0;
}

// status_field reads the first number after name in a /proc status file.
static int status_field(const char *status, const char *name, unsigned long long *v) {
	const char *p = strstr(status, name);
	return p != NULL && sscanf(p + strlen(name), "%llu", v) == 1;
}

static ssize_t read_small(const char *path, char *buf, size_t cap) {
	int fd = open(path, O_RDONLY | O_CLOEXEC);
	if (fd < 0)
		return -1;
	ssize_t n = read(fd, buf, cap - 1);
	close(fd);
	if (n >= 0)
		buf[n] = '\0';
	return n;
}

static void walk_tree(pid_t root, void (*visit)(pid_t pid, void *arg), void *arg);

// add_threads counts a process's tasks (threads).
static void add_threads(pid_t pid, void *arg) {
	char path[64], buf[4096];
	unsigned long long threads;
	snprintf(path, sizeof path, "/proc/%d/status", (int)pid);
	if (read_small(path, buf, sizeof buf) > 0)
		*(uint64_t *)arg += status_field(buf, "\nThreads:", &threads) ? threads : 1;
}

// nproc_at_limit says whether the count RLIMIT_NPROC keeps for the code's
// uid — its tasks (threads), zombies included — has reached the limit, so
// that a fork or a new thread fails there. The kernel counts per user in
// each user namespace: in the call's own, its tasks (the init's with
// them); under root, a uid of the call's own. Without either the uid is
// the server's, and the count every task of it, other calls' included
// (the runtime set the limit at their count as the call was claimed, and
// the call's share above it): the call's own tasks, this init's among
// them, reaching its share say it then, as the others' coming and going
// moves the uid's count under it; and so does the uid's count reaching
// the limit, which it may sooner where the uid's own limit left the call
// less than its share.
int nproc_at_limit(const struct config *c) {
	if (c->pids_share > 0) {
		uint64_t own = 1;
		walk_tree(getpid(), add_threads, &own);
		if (own >= c->pids_share)
			return 1;
	}
	uint64_t lim = nproc_limit(c);
	if (lim == 0)
		return 0;
	DIR *d = opendir("/proc");
	if (d == NULL)
		return 0;
	uint64_t n = 0;
	struct dirent *e;
	char path[300], buf[4096];
	while ((e = readdir(d)) != NULL && n < lim) {
		if (!is_pid(e->d_name))
			continue;
		snprintf(path, sizeof path, "/proc/%s/status", e->d_name);
		unsigned long long uid, threads;
		if (read_small(path, buf, sizeof buf) <= 0 || !status_field(buf, "\nUid:", &uid) || uid != c->uid)
			continue;
		n += status_field(buf, "\nThreads:", &threads) ? threads : 1;
	}
	closedir(d);
	return n >= lim;
}

// usage is what the call's processes used: CPU time and the peak resident
// memory of the largest of them.
struct usage {
	uint64_t cpu_ns, peak, reaped_peak;
};

// The call's measures so far: what its processes had used as its code
// started, and the largest peak seen since (usage_sample).
static struct usage usage_base;
static uint64_t usage_peak;

// walk_tree calls visit for every process below root (zombies too), as
// this init's /proc shows them.
static void walk_tree(pid_t root, void (*visit)(pid_t pid, void *arg), void *arg) {
	DIR *d = opendir("/proc");
	if (d == NULL)
		return;
	// Parents of every process, to walk the tree below root.
	int cap = 256, n = 0;
	struct proc_parent {
		pid_t pid, parent;
		int below;
	} *pp = malloc((size_t)cap * sizeof *pp);
	struct dirent *e;
	while (pp != NULL && (e = readdir(d)) != NULL) {
		if (!is_pid(e->d_name))
			continue;
		pid_t parent = parent_of(e->d_name);
		if (parent < 0)
			continue;
		if (n == cap) {
			cap *= 2;
			void *np = realloc(pp, (size_t)cap * sizeof *pp);
			if (np == NULL)
				break;
			pp = np;
		}
		pp[n++] = (struct proc_parent){(pid_t)atoi(e->d_name), parent, 0};
	}
	closedir(d);
	// A process is below root when its parent is root or below it:
	// walked until no more are found.
	for (int changed = 1; changed && pp != NULL;) {
		changed = 0;
		for (int i = 0; i < n; i++) {
			if (pp[i].below)
				continue;
			int below = pp[i].parent == root;
			for (int j = 0; !below && j < n; j++)
				below = pp[j].below && pp[j].pid == pp[i].parent;
			if (below) {
				pp[i].below = changed = 1;
				visit(pp[i].pid, arg);
			}
		}
	}
	free(pp);
}

static void clear_peak(pid_t pid, void *arg) {
	(void)arg;
	char path[64];
	snprintf(path, sizeof path, "/proc/%d/clear_refs", (int)pid);
	int fd = open(path, O_WRONLY | O_CLOEXEC);
	if (fd >= 0) {
		(void)!write(fd, "5", 1);
		close(fd);
	}
}

// add_usage adds a process's CPU time and that of the children it reaped,
// and takes its peak resident set (VmHWM) if it is the largest.
static void add_usage(pid_t pid, void *arg) {
	struct usage *u = arg;
	char path[64], buf[4096], *rp;
	long hz = sysconf(_SC_CLK_TCK);
	snprintf(path, sizeof path, "/proc/%d/stat", (int)pid);
	unsigned long long ut, st, cut, cst, hwm;
	if (read_small(path, buf, sizeof buf) > 0 && (rp = strrchr(buf, ')')) != NULL &&
	    sscanf(rp + 2, "%*c %*s %*s %*s %*s %*s %*s %*s %*s %*s %*s %llu %llu %llu %llu", &ut, &st, &cut, &cst) == 4 && hz > 0)
		u->cpu_ns += (ut + st + cut + cst) * (1000000000ULL / (unsigned long long)hz);
	snprintf(path, sizeof path, "/proc/%d/status", (int)pid);
	if (read_small(path, buf, sizeof buf) > 0 && status_field(buf, "\nVmHWM:", &hwm) && hwm * 1024 > u->peak)
		u->peak = hwm * 1024;
}

// tree_usage is what the processes below root used (add_usage), and what
// this init's reaped children did (RUSAGE_CHILDREN).
static struct usage tree_usage(pid_t root) {
	struct usage u = {0};
	walk_tree(root, add_usage, &u);
	struct rusage ru;
	if (getrusage(RUSAGE_CHILDREN, &ru) == 0) {
		u.cpu_ns += ((uint64_t)ru.ru_utime.tv_sec + (uint64_t)ru.ru_stime.tv_sec) * 1000000000ULL +
			    ((uint64_t)ru.ru_utime.tv_usec + (uint64_t)ru.ru_stime.tv_usec) * 1000ULL;
		u.reaped_peak = (uint64_t)ru.ru_maxrss * 1024;
	}
	return u;
}

// reset_peaks clears the peaks of the processes below the init, as the
// code's user: only the owner of a process may.
static int reset_peaks(const struct config *c, void *init) {
	(void)c;
	walk_tree(*(pid_t *)init, clear_peak, NULL);
	return 0;
}

// usage_mark notes, before a call's code is given, what the call's processes
// had used: a call is told only its own. A session's later call starts
// from its live processes' peaks cleared, as the code's user (a root
// init in namespaces keeps no capability that would let it).
void usage_mark(const struct config *c, int later) {
	pid_t self = getpid();
	if (later)
		as_user(c, reset_peaks, &self);
	usage_base = tree_usage(self);
	usage_peak = 0;
}

// usage_sample takes the largest peak of the call's live processes: one
// that a process of the code reaps itself is seen no other way.
void usage_sample(void) {
	struct usage u = tree_usage(getpid());
	if (u.peak > usage_peak)
		usage_peak = u.peak;
}

// usage_send reports what the call used since usage_mark (I_USAGE), just
// before its verdict: CPU time, to a clock tick; the peak is the largest
// single process's resident set, as last seen or sampled, or, of those
// this init reaped, as far as one passed the earlier calls' largest.
void usage_send(void) {
	struct usage u = tree_usage(getpid());
	uint64_t peak = u.peak > usage_peak ? u.peak : usage_peak;
	if (u.reaped_peak > usage_base.reaped_peak && u.reaped_peak > peak)
		peak = u.reaped_peak;
	unsigned char p[16];
	put_u64(p, u.cpu_ns > usage_base.cpu_ns ? u.cpu_ns - usage_base.cpu_ns : 0);
	put_u64(p + 8, peak);
	frame(I_USAGE, p, sizeof p);
}
