// The holder of a call slot's user namespace, the third life the
// executable has besides the server and the init (runtime/slots.go says
// why each slot has one).
#include "init.h"

#include <errno.h>
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
