package main

import (
	"context"
	"fmt"
	"io"
)

func serveCmd(ctx context.Context, args []string, stdin io.Reader, stdout, stderr io.Writer) int {
	fmt.Fprintln(stderr, "mcp-exec serve: not built yet")
	return 1
}
