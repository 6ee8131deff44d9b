// Small programs the executable also is, besides the init: the probes of
// what the process runtime can apply on this host, and the killer of a
// call's uid. The holder of a call slot's user namespace is in
// init_userns.c.
#include "init.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <linux/filter.h>
#include <linux/seccomp.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

static int verdict(long rc) { return rc < 0 ? errno : 0; }

// probe_confinement tries, in this throwaway process, each step the
// process runtime's init takes to confine the code, and prints one line
// the runtime parses: "landlock=ABI subreaper=E nnp=E restrict=E
// seccomp=E", each E 0 or the errno the step failed with.
// A container engine's own seccomp profile, or an old kernel, may refuse
// any of them; the runtime then says what is missing and what remains.
int probe_confinement(void) {
	char line[512];
	long abi = syscall(444 /* landlock_create_ruleset */, NULL, 0, 1U /* VERSION */);
	int n = snprintf(line, sizeof line, "landlock=%ld", abi < 0 ? 0 : abi);
	long sub = prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0);
	n += snprintf(line + n, sizeof line - n, " subreaper=%d", verdict(sub));
	long nnp = prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0);
	n += snprintf(line + n, sizeof line - n, " nnp=%d", verdict(nnp));
	if (abi > 0) {
		uint64_t attr[3] = {1ULL << 3 /* READ_DIR */, 0, 0};
		long rs = syscall(444, attr, sizeof attr, 0);
		long r = rs < 0 ? rs : syscall(446 /* landlock_restrict_self */, (int)rs, 0);
		n += snprintf(line + n, sizeof line - n, " restrict=%d", verdict(r));
	}
	struct sock_filter allow = BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ALLOW);
	struct sock_fprog prog = {.len = 1, .filter = &allow};
	long sc = syscall(SYS_seccomp, SECCOMP_SET_MODE_FILTER, 0, &prog);
	n += snprintf(line + n, sizeof line - n, " seccomp=%d\n", verdict(sc));
	return write_all(1, line, (size_t)n) < 0;
}

// probe_namespaces is the init's making of its namespaces, alone: started
// as the process runtime starts a call's init (as pid 1 of new
// namespaces), with a configuration of the same shape on its stdin, it takes every step the init would take
// (setup_namespaces) and prints "namespaces=0" when its /proc shows it
// alone. A step that fails ends it as it would end the init, its reason
// on stderr, which the runtime reports.
int probe_namespaces(void) {
	int unmapped = ids_unmapped();
	char type;
	unsigned char *p;
	uint32_t len;
	if (read_frame_blocking(0, &type, &p, &len) < 0 || type != H_CONFIG)
		die_errno("reading the probe's configuration", EPROTO);
	struct config c;
	config_decode(&c, p, len);
	if (unmapped)
		map_own_ids(c.uid, c.gid);
	setup_namespaces(&c);
	DIR *d = opendir("/proc");
	if (d == NULL)
		die("listing the fresh /proc");
	int others = 0;
	struct dirent *e;
	while ((e = readdir(d)) != NULL)
		others += e->d_name[0] >= '0' && e->d_name[0] <= '9' && strcmp(e->d_name, "1") != 0;
	closedir(d);
	if (others > 0)
		die_errno("the fresh /proc shows processes other than the probe", EEXIST);
	static const char ok[] = "namespaces=0\n";
	return write_all(1, ok, sizeof ok - 1) < 0;
}

// alive_of counts the live processes (not zombies) other than this one
// whose real or saved uid is uid: those kill(-1) reaches.
static int alive_of(uid_t uid) {
	DIR *d = opendir("/proc");
	if (d == NULL)
		return -1;
	int n = 0;
	struct dirent *e;
	while ((e = readdir(d)) != NULL) {
		if (e->d_name[0] < '0' || e->d_name[0] > '9' || atoi(e->d_name) == getpid())
			continue;
		char path[300], buf[4096];
		snprintf(path, sizeof path, "/proc/%s/status", e->d_name);
		int fd = open(path, O_RDONLY | O_CLOEXEC);
		if (fd < 0)
			continue;
		ssize_t r = read(fd, buf, sizeof buf - 1);
		close(fd);
		if (r <= 0)
			continue;
		buf[r] = '\0';
		char *st = strstr(buf, "\nState:\t"), *u = strstr(buf, "\nUid:\t");
		unsigned ruid, euid, suid;
		if (st == NULL || u == NULL || sscanf(u, "\nUid:\t%u\t%u\t%u", &ruid, &euid, &suid) != 3)
			continue;
		if ((st[8] != 'Z' && st[8] != 'X') && (ruid == uid || suid == uid))
			n++;
	}
	closedir(d);
	return n;
}

// kill_own_uid kills every process of its own uid, the uid of a call of
// the process runtime running as root, until none is left alive: the
// backstop for a call whose init died before it could kill them itself.
// (kill(-1) succeeds whenever there is any other process, reached or not:
// only a look at what is left says it is done.)
int kill_own_uid(void) {
	for (int i = 0; i < 1000; i++) {
		kill(-1, SIGKILL);
		int n = alive_of(getuid());
		if (n == 0)
			return 0;
		if (n < 0)
			return 2;
		struct timespec ts = {0, 1000000};
		nanosleep(&ts, NULL);
	}
	return 1;
}
