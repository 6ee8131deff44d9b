package main

import (
	"os"
	goruntime "runtime"

	"github.com/opencontainers/runc/libcontainer"
	// nsenter's C constructor joins the container's namespaces before the
	// Go runtime starts; it does nothing unless libcontainer started us.
	_ "github.com/opencontainers/runc/libcontainer/nsenter"

	"github.com/inhuman/mcp-exec/runtime"
	// The sandbox's init, the slot holders, the probe and the killer: a C
	// constructor that runs before the Go runtime starts, and does nothing
	// unless this binary was started as one of them.
	_ "github.com/inhuman/mcp-exec/runtime/sandboxinit"
)

// libcontainer re-executes this binary as "mcp-exec init" to become the
// container's init. Nothing else may run first: Init never returns.
func init() {
	if len(os.Args) > 1 && os.Args[1] == "init" {
		libcontainer.Init()
	}
	// The instance's watchdog is this binary too (the sandbox's init and
	// the user namespace holders run before Go does: runtime/sandboxinit).
	runtime.RunWatchdogIfAsked()
	// libcontainer joins each new container's mount namespace from a
	// goroutine locked to its thread, and lets the thread die with it. Go
	// never ends the main thread, though: it would park it, still inside
	// that container's namespace, pinning its mounts (/tmp and all) for the
	// life of the server. Keeping the main goroutine on the main thread
	// means no such goroutine can ever land there.
	goruntime.LockOSThread()
}
