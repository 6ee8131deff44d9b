package runtime

// The sandbox's init and the holder of a call slot's user namespace are C,
// in sandboxinit.c: an ELF constructor runs them, before the Go runtime
// starts, when this executable is started with their marker argument. Every
// binary that imports this package (the server, and the tests that start
// sandboxes) can thus be both; it must be linked statically, so that it runs
// in any root filesystem (see checkInitBinary).

// #cgo CFLAGS: -O2 -Wall -Wno-unused-result
import "C"

// holdMarker is the argument that makes this executable a user namespace
// holder; it must match HOLD_ARG in sandboxinit.c (TestInitMarkers).
const holdMarker = "__mcp_exec_userns__"
