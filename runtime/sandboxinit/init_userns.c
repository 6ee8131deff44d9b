// User namespaces: the holder of a call slot's, the third life the
// executable has besides the server and the init (runtime/slots.go says
// why each slot has one); and the mapping of the one a process runtime's
// init starts in when the server, not root, could not map it.
#include "init.h"

#include <errno.h>
#include <fcntl.h>
#include <sched.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <sys/prctl.h>
#include <unistd.h>

// userns_hold runs as the unprivileged owner of a call slot: it creates a
// user namespace that the slot's sandboxes join, so that every per-user
// kernel count of their code is charged to the slot's own uid, and holds
// it until its stdin closes.
int userns_hold(void) {
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

// ids_unmapped says whether this process is in a user namespace whose
// uid_map is still empty: one made for it by a server that is not root,
// and may not write that map (it is not dumpable, so this process's /proc
// files were root's until its exec).
int ids_unmapped(void) {
	char b[8];
	int fd = open("/proc/self/uid_map", O_RDONLY | O_CLOEXEC);
	if (fd < 0)
		return 0;
	ssize_t n = read(fd, b, sizeof b);
	close(fd);
	return n == 0;
}

static void write_file(const char *path, const char *text) {
	int fd = open(path, O_WRONLY | O_CLOEXEC);
	if (fd < 0 || write_all(fd, text, strlen(text)) < 0 || close(fd) < 0)
		die(path);
}

// map_own_ids maps, as bubblewrap does unprivileged, this process's own
// uid and gid (those of the server that started it, given by the
// runtime) to themselves in its new user namespace, and nothing else;
// setgroups is denied, which an unprivileged gid_map needs and which
// keeps the groups it has from being dropped to reach a file a group
// denies. It must run while the process is dumpable.
void map_own_ids(uid_t uid, gid_t gid) {
	char m[64];
	write_file("/proc/self/setgroups", "deny");
	snprintf(m, sizeof m, "%u %u 1\n", (unsigned)uid, (unsigned)uid);
	write_file("/proc/self/uid_map", m);
	snprintf(m, sizeof m, "%u %u 1\n", (unsigned)gid, (unsigned)gid);
	write_file("/proc/self/gid_map", m);
	if (getuid() != uid || getgid() != gid)
		die_errno("mapping the call's ids in its user namespace: they are not the server's", EINVAL);
}
