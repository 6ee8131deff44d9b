package main

// The server is not dumpable from before its first instruction of Go: the
// token in its environment (MCP_EXEC_AUTH_TOKEN) and in its memory is out
// of reach of every process of its uid — under the process runtime, the
// code's own uid — as a dumpable process's /proc/<pid>/environ and mem
// would not be. The sandbox's init, the slot holders and libcontainer's
// init (argv[1] "init", whose nsexec manages dumpability itself) are left
// to their own code.

/*
#include <string.h>
#include <sys/prctl.h>

__attribute__((constructor)) static void mcp_exec_nodump(int argc, char **argv) {
	if (argc > 1 && argv != NULL && argv[1] != NULL && (strcmp(argv[1], "init") == 0 || strncmp(argv[1], "__mcp_exec_", 11) == 0))
		return;
	prctl(PR_SET_DUMPABLE, 0, 0, 0, 0);
}
*/
import "C"
