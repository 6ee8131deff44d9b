package main

import (
	"os"

	"github.com/opencontainers/runc/libcontainer"
	// nsenter's C constructor joins the container's namespaces before the
	// Go runtime starts; it does nothing unless libcontainer started us.
	_ "github.com/opencontainers/runc/libcontainer/nsenter"
)

// libcontainer re-executes this binary as "mcp-exec init" to become the
// container's init. Nothing else may run first: Init never returns.
func init() {
	if len(os.Args) > 1 && os.Args[1] == "init" {
		libcontainer.Init()
	}
}
