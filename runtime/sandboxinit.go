package runtime

// The sandbox's init, the holder of a call slot's user namespace, the probe
// of the process runtime's confinement and the killer of a call's uid are
// C, in sandboxinit.c and the init_*.c files: an ELF constructor runs them,
// before the Go runtime starts, when this executable is started with their
// marker argument (initproto.go). Every binary that imports this package
// (the server, and the tests that start sandboxes) can thus be each of
// them; it must be linked statically, so that the init runs in any root
// filesystem (see checkInitBinary).

// #cgo CFLAGS: -O2 -Wall -Wno-unused-result
import "C"
