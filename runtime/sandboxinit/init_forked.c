// A forked sandbox's init, before it serves its call: it starts as pid 1
// of namespaces it has just made (mount, pid, network, ipc, uts, cgroup),
// in the call's own cgroups, with what the template had in them. Here it
// makes them what a fresh container's are: its own
// /proc (masked and read-only where a container's is), fresh tmpfs mounts
// in place of the template's, the hostname, lo up; then it keeps of its
// privileges only what any init keeps, and puts itself under the code's
// seccomp filter. (That the code's process dropped everything before it
// gets any code, it checks from outside: init_check.c.)
//
// Everything fails closed: a step that fails ends the init, and the call
// gets no sandbox of this template (but a fresh container) rather than a
// lesser one.
#include "init.h"

#include <errno.h>
#include <fcntl.h>
#include <linux/capability.h>
#include <linux/if.h>
#include <linux/netlink.h>
#include <linux/rtnetlink.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mount.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <sys/syscall.h>
#include <unistd.h>

// fresh_proc mounts a proc of the new pid namespace in place of the
// template's. The kernel lets a user namespace mount a proc only while one
// it already shows whole is in this mount namespace, so the new one is
// staged on the work dir (replaced next) before the old one goes.
static void fresh_proc(const struct config *c, const struct fmount *m) {
	if (mount(m->source, c->workdir, m->type, m->flags, m->data) < 0)
		die("mounting the sandbox's /proc");
	if (umount2(m->target, MNT_DETACH) < 0)
		die("unmounting the template's /proc");
	if (mount(c->workdir, m->target, NULL, MS_MOVE, NULL) < 0)
		die("moving the sandbox's /proc in place");
}

// fresh_mount replaces the template's filesystem at m's target, if it had
// one there, with a new one: nothing of the template's stays below it.
static void fresh_mount(const struct fmount *m) {
	if (umount2(m->target, MNT_DETACH) < 0 && errno != EINVAL)
		die(m->target);
	if (mount(m->source, m->target, m->type, m->flags, m->data) < 0)
		die(m->target);
}

// setup_forked makes the namespaces the init starts in a fresh sandbox's,
// then lowers the init to what a container's init is.
static void setup_forked(const struct config *c) {
	if (mount(NULL, "/", NULL, MS_REC | MS_PRIVATE, NULL) < 0)
		die("making the sandbox's mounts private");
	int staged = 0;
	for (int i = 0; i < c->nmounts; i++) {
		const struct fmount *m = &c->mounts[i];
		if (strcmp(m->type, "proc") == 0) {
			fresh_proc(c, m);
			staged = 1;
		} else {
			if (strcmp(m->target, c->workdir) == 0)
				staged = 0;
			fresh_mount(m);
		}
	}
	if (staged)
		die_errno("the work dir, where /proc is staged, is not a fresh mount after it", EINVAL);
	fresh_proc_paths(c);
	if (c->hostname != NULL && sethostname(c->hostname, strlen(c->hostname)) < 0)
		die("setting the hostname");
	loopback(c->loopback_mtu);
	keep_caps(c->keep_caps);
	if (c->seccomp == NULL)
		die_errno("a forked sandbox's configuration has no seccomp filter", EINVAL);
	install_seccomp(c);
}


// forked_init is a forked sandbox's init: forked by its template's
// (init_template.c), pid 1 of the call's new namespaces, its descriptors
// in place. It makes them a fresh container's first; its code's process
// is the zygote's. It serves its call as any init (init_loop.c).
void forked_init(int nprocs) {
	struct init *in = init_begin(1, nprocs);
	setup_forked(init_config(in));
	init_adopt_code(in);
	init_serve(in);
	_exit(0);
}
