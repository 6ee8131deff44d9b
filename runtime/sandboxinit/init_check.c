// What a forked sandbox's init checks of its code's process before it
// lets it read any code: the zygote forked that process, and the process
// confined itself (zygote.py); the init takes nobody's word for it and
// reads what the kernel says.
#include "init.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

// status_field returns the value of a "Key:\tvalue" line of a
// /proc/<pid>/status text, or NULL.
static const char *status_field(const char *status, const char *key, char *out, size_t cap) {
	size_t kn = strlen(key);
	for (const char *l = status; l != NULL && *l != '\0';) {
		const char *end = strchr(l, '\n');
		size_t n = end ? (size_t)(end - l) : strlen(l);
		if (n > kn && strncmp(l, key, kn) == 0 && l[kn] == ':') {
			const char *v = l + kn + 1;
			while (*v == '\t' || *v == ' ')
				v++;
			size_t vn = n - (size_t)(v - l);
			if (vn >= cap)
				vn = cap - 1;
			memcpy(out, v, vn);
			out[vn] = '\0';
			return out;
		}
		l = end ? end + 1 : NULL;
	}
	return NULL;
}

static int read_text(const char *path, char *buf, size_t cap) {
	int fd = open(path, O_RDONLY | O_CLOEXEC);
	if (fd < 0)
		return -1;
	size_t got = 0;
	for (;;) {
		ssize_t r = read(fd, buf + got, cap - 1 - got);
		if (r < 0 && errno == EINTR)
			continue;
		if (r <= 0)
			break;
		got += (size_t)r;
	}
	close(fd);
	buf[got] = '\0';
	return (int)got;
}

// same_pid_ns: pid (a number of this init's /proc, the call's pid
// namespace's) is in this init's pid namespace itself, not a child of it.
static int same_pid_ns(pid_t pid) {
	char path[64], theirs[64], ours[64];
	snprintf(path, sizeof path, "/proc/%d/ns/pid", (int)pid);
	ssize_t a = readlink(path, theirs, sizeof theirs - 1), b = readlink("/proc/self/ns/pid", ours, sizeof ours - 1);
	if (a <= 0 || b <= 0)
		return 0;
	theirs[a] = ours[b] = '\0';
	return strcmp(theirs, ours) == 0;
}

// check_confined reads, from outside, what the kernel says of the code's
// process: its identity, capabilities, no_new_privs, seccomp filters,
// pid namespace, parent and cgroups must be a sandboxed process's. It
// returns why not, or NULL. The code's process set all of that itself
// (zygote.py); this init does not take its word for it.
const char *check_confined(const struct config *c, pid_t pid) {
	static char why[256];
	char path[64], st[4096], self[4096], v[128], want[128];
	snprintf(path, sizeof path, "/proc/%d/status", (int)pid);
	if (read_text(path, st, sizeof st) <= 0 || read_text("/proc/self/status", self, sizeof self) <= 0)
		return "its status cannot be read";
	snprintf(want, sizeof want, "%u\t%u\t%u\t%u", c->uid, c->uid, c->uid, c->uid);
	if (!status_field(st, "Uid", v, sizeof v) || strcmp(v, want) != 0)
		return "its uids are not the code's";
	snprintf(want, sizeof want, "%u\t%u\t%u\t%u", c->gid, c->gid, c->gid, c->gid);
	if (!status_field(st, "Gid", v, sizeof v) || strcmp(v, want) != 0)
		return "its gids are not the code's";
	if (!status_field(st, "Groups", v, sizeof v) || v[0] != '\0')
		return "it has supplementary groups";
	static const char *const caps[] = {"CapInh", "CapPrm", "CapEff", "CapBnd", "CapAmb"};
	for (size_t i = 0; i < sizeof caps / sizeof caps[0]; i++) {
		if (!status_field(st, caps[i], v, sizeof v) || strcmp(v, "0000000000000000") != 0) {
			snprintf(why, sizeof why, "its %s is %s, not empty", caps[i], v);
			return why;
		}
	}
	if (!status_field(st, "NoNewPrivs", v, sizeof v) || strcmp(v, "1") != 0)
		return "it lacks no_new_privs";
	if (!status_field(st, "Seccomp", v, sizeof v) || strcmp(v, "2") != 0)
		return "it has no seccomp filter";
	if (c->gvisor) {
		// gVisor's /proc shows neither the filters' count nor NSpid. The
		// pid namespace is told by its link instead; the filter stays
		// the process's own word (zygote.py), kept in check by the
		// template's filter, which gVisor applies to every process of
		// its sandbox (docs/sandbox.md).
		if (!same_pid_ns(pid))
			return "it is not in the sandbox's pid namespace";
	} else {
		// This init runs under the template's filter and the code's,
		// exactly as the code's process must.
		if (!status_field(st, "Seccomp_filters", v, sizeof v) || !status_field(self, "Seccomp_filters", want, sizeof want) ||
		    strcmp(v, want) != 0)
			return "it has not the code's seccomp filter";
		snprintf(want, sizeof want, "%d", (int)pid);
		if (!status_field(st, "NSpid", v, sizeof v) || strcmp(v, want) != 0)
			return "it is not in the sandbox's pid namespace";
	}
	// Its parent is the zygote, outside this pid namespace.
	if (!status_field(st, "PPid", v, sizeof v) || strcmp(v, "0") != 0)
		return "its parent is in the sandbox";
	snprintf(path, sizeof path, "/proc/%d/cgroup", (int)pid);
	if (read_text(path, st, sizeof st) <= 0 || read_text("/proc/self/cgroup", self, sizeof self) <= 0 || strcmp(st, self) != 0)
		return "it is not in the sandbox's cgroups";
	return NULL;
}
