// What an init makes of the new namespaces it starts in, as a container
// runtime would: /proc's read-only paths and masks, lo up, and the
// capabilities it keeps once that is done. Both inits that start in new
// namespaces do: a forked sandbox's (init_forked.c) and the process
// runtime's in namespaces of its own (init_confine.c).
#include "init.h"

#include <errno.h>
#include <linux/capability.h>
#include <linux/if.h>
#include <linux/netlink.h>
#include <linux/rtnetlink.h>
#include <string.h>
#include <sys/mount.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <sys/syscall.h>
#include <unistd.h>

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
