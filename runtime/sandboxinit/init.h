// What the files of the sandbox's init share. The init program is C, run
// by a constructor before Go starts; each file is one concern of it:
//
//   main.c           the constructor, and the dispatch by marker
//   init_loop.c      an init's steps, its one loop and the handlers of
//                    its events: a container's init and a forked one's
//   init_template.c  a template's init: starts the zygote, forks calls
//   init_forked.c    a forked sandbox's init: its namespaces made fresh
//   init_fresh.c     /proc's masks, lo and capabilities in new namespaces
//   init_check.c     a forked code process checked from outside
//   init_confine.c   the process runtime's confinement and scratch bound
//   init_relay.c     the egress relay, with the network allowlist on
//   init_config.c    the configuration, decoded from H_CONFIG
//   init_files.c     files in and out, as the code's user
//   init_io.c        frames and buffers
//   init_userns.c    a call slot's user namespace, and ids mapped
//   init_helpers.c   the probe and the killer, which are not the init
//   initproto.h      the protocol, generated from runtime/initproto
//
// The interpreter's side is Python: driver.py runs a call's code as a
// notebook cell, zygote.py makes a template's interpreter fork calls.
// Calls between the files go one way: main.c at the top, init_template.c
// to init_forked.c to init_loop.c, never back.
#pragma once
#define _GNU_SOURCE
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include "initproto.h"

// rlim is one rlimit the init sets on itself before it starts the code.
struct rlim {
	int resource;
	uint64_t soft, hard;
};

// fmount is one fresh mount of a forked sandbox, as mount(2) takes it.
struct fmount {
	unsigned long flags;
	char *target, *type, *source, *data;
};

// strv is a list of strings the configuration repeats.
struct strv {
	char **v;
	int n;
};

// config is the init's configuration, decoded from the host's H_CONFIG
// frame: runtime/initproto's Config is its other side, field for field.
struct config {
	uid_t uid;
	gid_t gid;
	uint64_t max_output;     // per stream
	uint64_t max_files;      // output files
	uint64_t max_file_bytes; // their bytes
	char *workdir;           // the code's cwd: files in go here, outputs/ in it comes back
	char *script;            // the FIFO, then the file, the interpreter runs
	struct strv argv;        // the interpreter's command line, NULL-terminated
	struct rlim *rlimits;
	int nrlimits;
	int no_parent_death; // tests: play an init the code subverted
	// The process runtime: not pid 1 of a namespace but a process of the
	// server's machine, its code confined by what follows.
	int process_mode;
	int landlock_abi; // 0: no Landlock domain
	struct strv read, exec, devices, write;
	unsigned char *seccomp; // BPF program; NULL: none
	size_t seccomp_len;
	uint64_t scratch_bytes; // bound on the bytes under workdir; 0: none
	int proc_self;          // of /proc the domain reads the machine's entries and the code's own process only
	int template_mode;      // a template's init: the interpreter is a zygote
	// The process runtime's init starts in namespaces of its own, which it
	// makes the call's (setup_namespaces) with what follows.
	int namespaces;
	// A forked sandbox's init, and a process runtime's in namespaces of
	// its own, set these up in their new namespaces.
	struct fmount *mounts;
	int nmounts;
	struct strv mask, readonly;
	char *hostname;
	int loopback_mtu;
	uint64_t keep_caps;
	int gvisor; // a fork inside gVisor: its /proc shows no Seccomp_filters nor NSpid
	// The network allowlist: the egress relay's port on 127.0.0.1 (0:
	// none), and the CA bundle the code trusts, written at ca_path.
	int relay_port;
	unsigned char *ca_bundle;
	size_t ca_bundle_len;
	char *ca_path;
	// The process runtime's init in namespaces: the host paths it binds
	// read-only into the call's own root (setup_namespaces).
	struct strv root;
	// The process runtime's share of processes for a call whose process
	// limit counts a uid shared with others; 0: the count is the call's.
	uint64_t pids_share;
};

// buffer is a growable byte queue.
struct buffer {
	unsigned char *p;
	size_t len, off;
};

// ring keeps the last cap bytes put into it: a stream's tail. Its memory
// is taken when the first byte comes, so that a call that writes little
// costs nothing.
struct ring {
	unsigned char *p;
	size_t cap, start, len;
};

// init_io.c
extern int out_fd;
void die(const char *what) __attribute__((noreturn));
void die_errno(const char *what, int err) __attribute__((noreturn));
int write_all(int fd, const void *p, size_t n);
void put_u16(unsigned char *p, uint16_t v);
void put_u32(unsigned char *p, uint32_t v);
void put_u64(unsigned char *p, uint64_t v);
uint16_t get_u16(const unsigned char *p);
uint32_t get_u32(const unsigned char *p);
uint64_t get_u64(const unsigned char *p);
void frame_head(char type, uint32_t len);
void frame(char type, const void *p, uint32_t len);
void report(char type, const char *what, int err);
void buf_append(struct buffer *b, const void *p, size_t n);
void ring_put(struct ring *r, size_t cap, const unsigned char *p, size_t n);
size_t ring_read(const struct ring *r, size_t off, unsigned char *p, size_t n);
void ring_reset(struct ring *r);
size_t buf_pending(const struct buffer *b);
void buf_reset(struct buffer *b);
int buf_flush(struct buffer *b, int fd);
int read_frame_blocking(int fd, char *type, unsigned char **payload, uint32_t *len);
void close_from(int lowfd);

// init_config.c
void config_decode(struct config *c, const unsigned char *p, uint32_t len);

// init_files.c
int as_user(const struct config *c, int (*fn)(const struct config *, void *), void *arg);
int make_outputs(const struct config *c, void *arg);
int write_input_file(const struct config *c, const unsigned char *payload, uint32_t len, char *path, size_t pathcap);
int outputs_empty(const struct config *c);
int export_outputs(const struct config *c, void *arg);
int empty_outputs(const struct config *c, void *arg);

// init_confine.c
void setup_namespaces(const struct config *c);
void confine(const struct config *c);
void install_seccomp(const struct config *c);
void kill_children(void);
struct scratch;
struct scratch *scratch_open(const struct config *c);
int scratch_fd(const struct scratch *s);
int scratch_timeout(const struct scratch *s, int period_ms);
int scratch_over(struct scratch *s, int periodic, char *why, size_t whycap);
int nproc_at_limit(const struct config *c);
void usage_mark(const struct config *c, int later);
void usage_sample(void);
void usage_send(void);

// init_relay.c
struct relay;
struct relay *relay_open(const struct config *c);
int relay_fd(const struct relay *r);
void relay_events(struct relay *r);
void relay_host(struct relay *r, const unsigned char *p, uint32_t len);
void write_trust(const struct config *c);

// init_fresh.c
void fresh_proc_paths(const struct config *c);
void loopback(int mtu);
void keep_caps(uint64_t keep);

// init_check.c
const char *check_confined(const struct config *c, pid_t pid);

// init_loop.c: one init a process.
struct init;
struct init *init_begin(int forked, int nprocs);
const struct config *init_config(const struct init *in);
int init_signals(const struct init *in);
void init_start_code(struct init *in);
void init_adopt_code(struct init *in);
void init_serve(struct init *in);

// init_forked.c
void forked_init(int nprocs) __attribute__((noreturn));

// init_template.c
void template_serve(const struct config *c, int sfd) __attribute__((noreturn));

// init_userns.c
int userns_hold(void);
int ids_unmapped(void);
void map_own_ids(uid_t uid, gid_t gid);

// init_helpers.c
int probe_confinement(void);
int probe_namespaces(void);
int kill_own_uid(void);
