// Package sandboxinit is the sandbox's init program, which a binary that
// starts sandboxes links by importing it for its side effect, as runc's
// binary imports libcontainer/nsenter:
//
//	import _ "github.com/inhuman/mcp-exec/runtime/sandboxinit"
//
// Its C constructor (main.c) runs before the Go runtime starts, and
// makes this executable the sandbox's init, the holder of a call slot's
// user namespace, the probe of the process runtime's confinement or the
// killer of a call's uid when it is started with their marker argument
// (runtime/initproto); it returns at once otherwise. The interpreter's
// side of the program, driver.py and zygote.py, is handed to the runtime
// here (initproto.Link): a runtime refuses to start in a binary that
// lacks it, which could not be its sandboxes' init. The binary must be
// linked statically, so that the init runs in any root filesystem (the
// runtime checks that too).
package sandboxinit

// #cgo CFLAGS: -O2 -Wall -Wno-unused-result
import "C"

import (
	_ "embed"

	"github.com/inhuman/mcp-exec/runtime/initproto"
)

var (
	//go:embed driver.py
	driver string
	//go:embed zygote.py
	zygote string
)

func init() { initproto.Link(driver, zygote) }
