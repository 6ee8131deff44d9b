package runtime

import (
	_ "embed"

	"github.com/inhuman/mcp-exec/runtime/initproto"
)

// driverSource is the interpreter's program, its @NAME@s the protocol's.
//
//go:embed driver.py
var driverSource string

func init() { initproto.Link(driverSource, "") }
