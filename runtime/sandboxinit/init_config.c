// The init's configuration: the CFG_ fields of the host's H_CONFIG frame
// into struct config. A field the init does not know, or one of the wrong
// size, ends it: it never runs on a configuration it half understood.
#include "init.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static void bad(const char *what, unsigned key) {
	char msg[128];
	snprintf(msg, sizeof msg, "the configuration's field %u: %s", key, what);
	die_errno(msg, EINVAL);
}

static uint64_t number(unsigned key, const unsigned char *v, uint32_t n) {
	if (n != 8)
		bad("a number is 8 bytes", key);
	return get_u64(v);
}

static char *string(unsigned key, const unsigned char *v, uint32_t n) {
	if (n == 0 || memchr(v, 0, n) != NULL)
		bad("a string is not empty and has no NUL byte", key);
	char *s = strndup((const char *)v, n);
	if (s == NULL)
		die("allocating");
	return s;
}

static void push(struct strv *l, char *s) {
	char **v = realloc(l->v, (size_t)(l->n + 2) * sizeof *v);
	if (v == NULL)
		die("allocating");
	v[l->n++] = s;
	v[l->n] = NULL;
	l->v = v;
}

static void rlimit_field(struct config *c, unsigned key, const unsigned char *v, uint32_t n) {
	if (n != 4 + 8 + 8)
		bad("an rlimit is u32 resource, u64 soft, u64 hard", key);
	struct rlim *r = realloc(c->rlimits, (size_t)(c->nrlimits + 1) * sizeof *r);
	if (r == NULL)
		die("allocating");
	r[c->nrlimits++] = (struct rlim){.resource = (int)get_u32(v), .soft = get_u64(v + 4), .hard = get_u64(v + 12)};
	c->rlimits = r;
}

// sized takes one u16-sized string of a field, advancing *v and *n.
static char *sized(unsigned key, const unsigned char **v, uint32_t *n) {
	if (*n < 2)
		bad("a sized string is cut short", key);
	uint32_t len = get_u16(*v);
	if (len > *n - 2)
		bad("a sized string is cut short", key);
	char *s = string(key, *v + 2, len);
	*v += 2 + len;
	*n -= 2 + len;
	return s;
}

static void mount_field(struct config *c, unsigned key, const unsigned char *v, uint32_t n) {
	if (n < 8)
		bad("a mount starts with its u64 flags", key);
	struct fmount m = {.flags = (unsigned long)get_u64(v)};
	v += 8;
	n -= 8;
	m.target = sized(key, &v, &n);
	m.type = sized(key, &v, &n);
	m.source = sized(key, &v, &n);
	if (memchr(v, 0, n) != NULL)
		bad("mount data has a NUL byte", key);
	m.data = strndup((const char *)v, n);
	struct fmount *ms = realloc(c->mounts, (size_t)(c->nmounts + 1) * sizeof *ms);
	if (m.data == NULL || ms == NULL)
		die("allocating");
	ms[c->nmounts++] = m;
	c->mounts = ms;
}

static void field(struct config *c, unsigned key, const unsigned char *v, uint32_t n) {
	switch (key) {
	case CFG_UID: c->uid = (uid_t)number(key, v, n); break;
	case CFG_GID: c->gid = (gid_t)number(key, v, n); break;
	case CFG_MAX_OUTPUT: c->max_output = number(key, v, n); break;
	case CFG_MAX_FILES: c->max_files = number(key, v, n); break;
	case CFG_MAX_FILE_BYTES: c->max_file_bytes = number(key, v, n); break;
	case CFG_WORKDIR: c->workdir = string(key, v, n); break;
	case CFG_SCRIPT: c->script = string(key, v, n); break;
	case CFG_ARG: push(&c->argv, string(key, v, n)); break;
	case CFG_RLIMIT: rlimit_field(c, key, v, n); break;
	case CFG_NO_PARENT_DEATH: c->no_parent_death = number(key, v, n) != 0; break;
	case CFG_PROCESS: c->process_mode = number(key, v, n) != 0; break;
	case CFG_LANDLOCK: c->landlock_abi = (int)number(key, v, n); break;
	case CFG_READ: push(&c->read, string(key, v, n)); break;
	case CFG_EXEC: push(&c->exec, string(key, v, n)); break;
	case CFG_DEVICE: push(&c->devices, string(key, v, n)); break;
	case CFG_WRITE: push(&c->write, string(key, v, n)); break;
	case CFG_SECCOMP:
		if (n == 0 || n % 8 != 0)
			bad("a BPF program is a whole number of 8-byte instructions", key);
		c->seccomp = malloc(n);
		if (c->seccomp == NULL)
			die("allocating");
		memcpy(c->seccomp, v, n);
		c->seccomp_len = n;
		break;
	case CFG_SCRATCH: c->scratch_bytes = number(key, v, n); break;
	case CFG_TEMPLATE: c->template_mode = number(key, v, n) != 0; break;
	case CFG_MOUNT: mount_field(c, key, v, n); break;
	case CFG_MASK: push(&c->mask, string(key, v, n)); break;
	case CFG_READONLY: push(&c->readonly, string(key, v, n)); break;
	case CFG_HOSTNAME: c->hostname = string(key, v, n); break;
	case CFG_LOOPBACK_MTU: c->loopback_mtu = (int)number(key, v, n); break;
	case CFG_KEEP_CAPS: c->keep_caps = number(key, v, n); break;
	case CFG_GVISOR: c->gvisor = number(key, v, n) != 0; break;
	case CFG_NAMESPACES: c->namespaces = number(key, v, n) != 0; break;
	case CFG_PROC_SELF: c->proc_self = number(key, v, n) != 0; break;
	case CFG_RELAY_PORT:
		c->relay_port = (int)number(key, v, n);
		if (c->relay_port <= 0 || c->relay_port > 65535)
			bad("a port is 1-65535", key);
		break;
	case CFG_CA_BUNDLE:
		c->ca_bundle = malloc(n ? n : 1);
		if (c->ca_bundle == NULL)
			die("allocating");
		memcpy(c->ca_bundle, v, n);
		c->ca_bundle_len = n;
		break;
	case CFG_CA_PATH: c->ca_path = string(key, v, n); break;
	case CFG_ROOT: push(&c->root, string(key, v, n)); break;
	case CFG_PIDS_SHARE: c->pids_share = number(key, v, n); break;
	default: bad("unknown key", key);
	}
}

void config_decode(struct config *c, const unsigned char *p, uint32_t len) {
	*c = (struct config){.uid = (uid_t)-1, .gid = (gid_t)-1};
	uint32_t off = 0;
	while (off < len) {
		if (len - off < 6)
			bad("a field's head is cut short", 0);
		unsigned key = get_u16(p + off);
		uint32_t n = get_u32(p + off + 2);
		off += 6;
		if (n > len - off)
			bad("a field's value is cut short", key);
		field(c, key, p + off, n);
		off += n;
	}
	if (c->uid == (uid_t)-1 || c->gid == (gid_t)-1 || c->workdir == NULL || c->script == NULL || c->argv.n < 2)
		die_errno("the configuration lacks the uid, gid, work dir, script or interpreter", EINVAL);
}
