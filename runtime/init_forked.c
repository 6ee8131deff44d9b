// A forked sandbox's init, before it serves its call: it starts as pid 1
// of namespaces it has just made (mount, pid, network, ipc, uts, cgroup),
// in the call's own cgroups, with what the template had in them. Here it makes them what a fresh container's are: its own
// /proc (masked and read-only where a container's is), fresh tmpfs mounts
// in place of the template's, the hostname, lo up; then it keeps of its
// privileges only what any init keeps, and puts itself under the code's
// seccomp filter. And it checks, from outside, that the code's process
// dropped everything before it gets any code.
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

// mask hides a path of /proc as runc does: a file under /dev/null, a dir
// under an empty read-only tmpfs. One this kernel does not show is not
// there to hide.
static void mask(const char *path) {
	struct stat st;
	if (stat(path, &st) < 0) {
		if (errno == ENOENT)
			return;
		die(path);
	}
	int r = S_ISDIR(st.st_mode) ? mount("tmpfs", path, "tmpfs", MS_RDONLY, NULL) : mount("/dev/null", path, NULL, MS_BIND, NULL);
	if (r < 0)
		die(path);
}

// readonly binds a path of /proc onto itself read-only, keeping the flags
// it has (a user namespace may not drop nosuid, nodev or noexec).
static void readonly(const char *path) {
	if (mount(path, path, NULL, MS_BIND | MS_REC, NULL) < 0) {
		if (errno == ENOENT)
			return;
		die(path);
	}
	struct statvfs sv;
	if (statvfs(path, &sv) < 0)
		die(path);
	unsigned long keep = (sv.f_flag & ST_NOSUID ? MS_NOSUID : 0) | (sv.f_flag & ST_NODEV ? MS_NODEV : 0) |
			     (sv.f_flag & ST_NOEXEC ? MS_NOEXEC : 0);
	if (mount(path, path, NULL, MS_BIND | MS_REMOUNT | MS_RDONLY | MS_REC | keep, NULL) < 0)
		die(path);
}

static void add_attr(struct nlmsghdr *h, unsigned short type, uint32_t v) {
	struct rtattr *a = (struct rtattr *)((char *)h + NLMSG_ALIGN(h->nlmsg_len));
	a->rta_type = type;
	a->rta_len = RTA_LENGTH(sizeof v);
	memcpy(RTA_DATA(a), &v, sizeof v);
	h->nlmsg_len = NLMSG_ALIGN(h->nlmsg_len) + RTA_ALIGN(a->rta_len);
}

// loopback brings lo up, as a container runtime does, and shrinks its MTU
// and largest segment when asked (see the runtime's loopbackMTU).
void loopback(int mtu) {
	int s = socket(AF_NETLINK, SOCK_RAW | SOCK_CLOEXEC, NETLINK_ROUTE);
	if (s < 0)
		die("opening a netlink socket");
	struct {
		struct nlmsghdr h;
		struct ifinfomsg i;
		char attrs[64];
	} req = {0};
	req.h.nlmsg_len = NLMSG_LENGTH(sizeof req.i);
	req.h.nlmsg_type = RTM_NEWLINK;
	req.h.nlmsg_flags = NLM_F_REQUEST | NLM_F_ACK;
	req.i.ifi_family = AF_UNSPEC;
	req.i.ifi_index = 1; // lo, the only link of a new network namespace
	req.i.ifi_flags = IFF_UP;
	req.i.ifi_change = IFF_UP;
	if (mtu > 0) {
		add_attr(&req.h, IFLA_MTU, (uint32_t)mtu);
		add_attr(&req.h, IFLA_GSO_MAX_SIZE, (uint32_t)mtu);
	}
	if (send(s, &req, req.h.nlmsg_len, 0) < 0)
		die("configuring lo");
	struct {
		struct nlmsghdr h;
		struct nlmsgerr e;
		char rest[256];
	} ack;
	ssize_t n = recv(s, &ack, sizeof ack, 0);
	if (n < (ssize_t)(sizeof ack.h + sizeof ack.e) || ack.h.nlmsg_type != NLMSG_ERROR)
		die_errno("configuring lo: no answer from the kernel", EPROTO);
	if (ack.e.error != 0)
		die_errno("configuring lo", -ack.e.error);
	close(s);
}

// keep_caps drops every capability but keep from all five sets: what an
// init needs once its sandbox is made.
void keep_caps(uint64_t keep) {
	for (int cap = 0; cap <= 63; cap++) {
		if (keep & (1ULL << cap))
			continue;
		if (prctl(PR_CAPBSET_DROP, cap, 0, 0, 0) < 0) {
			if (errno == EINVAL)
				break;
			die("dropping a capability from the bounding set");
		}
	}
	if (prctl(PR_CAP_AMBIENT, PR_CAP_AMBIENT_CLEAR_ALL, 0, 0, 0) < 0 && errno != EINVAL)
		die("clearing ambient capabilities");
	struct __user_cap_header_struct h = {.version = _LINUX_CAPABILITY_VERSION_3};
	struct __user_cap_data_struct d[2];
	if (syscall(SYS_capget, &h, d) < 0)
		die("reading capabilities");
	for (int i = 0; i < 2; i++) {
		uint32_t k = (uint32_t)(keep >> (32 * i));
		d[i].effective &= k;
		d[i].permitted &= k;
		d[i].inheritable = 0;
	}
	if (syscall(SYS_capset, &h, d) < 0)
		die("dropping capabilities");
}

// fresh_proc_paths makes the configuration's paths of a fresh /proc
// read-only, then hides the masked ones, in runc's order: a mask below a
// read-only path is one mount, not two (its bind would copy the mask).
void fresh_proc_paths(const struct config *c) {
	for (int i = 0; i < c->readonly.n; i++)
		readonly(c->readonly.v[i]);
	for (int i = 0; i < c->mask.n; i++)
		mask(c->mask.v[i]);
}

// setup_forked makes the namespaces the init starts in a fresh sandbox's,
// then lowers the init to what a container's init is.
void setup_forked(const struct config *c) {
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

// check_confined reads, from outside, what the kernel says of the code's
// process: its identity, capabilities, no_new_privs, seccomp filters,
// pid namespace, parent and cgroups must be a sandboxed process's. It
// returns why not, or NULL. The code's process set all of that itself
// (driver.py); this init does not take its word for it.
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
	// This init runs under the template's filter and the code's, exactly
	// as the code's process must.
	if (!status_field(st, "Seccomp_filters", v, sizeof v) || !status_field(self, "Seccomp_filters", want, sizeof want) ||
	    strcmp(v, want) != 0)
		return "it has not the code's seccomp filter";
	snprintf(want, sizeof want, "%d", (int)pid);
	if (!status_field(st, "NSpid", v, sizeof v) || strcmp(v, want) != 0)
		return "it is not in the sandbox's pid namespace";
	// Its parent is the zygote, outside this pid namespace.
	if (!status_field(st, "PPid", v, sizeof v) || strcmp(v, "0") != 0)
		return "its parent is in the sandbox";
	snprintf(path, sizeof path, "/proc/%d/cgroup", (int)pid);
	if (read_text(path, st, sizeof st) <= 0 || read_text("/proc/self/cgroup", self, sizeof self) <= 0 || strcmp(st, self) != 0)
		return "it is not in the sandbox's cgroups";
	return NULL;
}
