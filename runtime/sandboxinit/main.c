// The constructor that makes this executable something else than the
// server: it runs before the Go runtime starts (as runc's nsenter does),
// whenever a binary links this package, and returns at once unless the
// first argument is one of initproto.h's markers. Then it dispatches by
// that marker and never returns to Go: the sandbox's init (a container's,
// the process runtime's, or a template's), the holder of a call slot's
// user namespace, the probe of the process runtime's confinement, the
// killer of a call's uid.
#include "init.h"

#include <string.h>
#include <unistd.h>

// sandbox_init is the init of a container or of the process runtime
// (init_loop.c), or of a template, which only forks (init_template.c):
// its configuration says which.
static int sandbox_init(void) {
	struct init *in = init_begin(0, 0);
	const struct config *c = init_config(in);
	if (c->template_mode)
		template_serve(c, init_signals(in));
	if (c->namespaces)
		setup_namespaces(c);
	init_start_code(in);
	init_serve(in);
	return 0;
}

__attribute__((constructor)) static void mcp_exec_reexec(int argc, char **argv, char **envp) {
	(void)envp;
	if (argc < 2 || argv == NULL || argv[1] == NULL)
		return;
	if (strcmp(argv[1], INIT_ARG) == 0)
		_exit(sandbox_init());
	if (strcmp(argv[1], HOLD_ARG) == 0)
		_exit(userns_hold());
	if (strcmp(argv[1], PROBE_ARG) == 0)
		_exit(argc > 2 && argv[2] != NULL && strcmp(argv[2], PROBE_NAMESPACES) == 0 ? probe_namespaces() : probe_confinement());
	if (strcmp(argv[1], KILL_ARG) == 0)
		_exit(kill_own_uid());
}
