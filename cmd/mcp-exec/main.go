// Command mcp-exec is an MCP server with one tool, exec, that runs Python in
// a fresh, network-isolated, locked-down container per call.
package main

import (
	"context"
	"fmt"
	"io"
	"os"
	"os/signal"
	"syscall"

	"github.com/sirupsen/logrus"
)

func main() {
	// A client that dies takes the read end of our stderr (and, on stdio,
	// stdout) with it. Unhandled, the next log line would kill us with
	// SIGPIPE before the in-flight containers are torn down; handled, the
	// write fails with EPIPE and teardown goes on. Notify rather than
	// Ignore: an ignored SIGPIPE would be inherited by the sandbox.
	signal.Notify(make(chan os.Signal, 1), syscall.SIGPIPE)
	// libcontainer logs through logrus to stderr. Its warnings are about
	// the spec (it ignores KernelTCP, which the runtime applies itself)
	// and its debug lines about its internals: only errors are the
	// operator's.
	logrus.SetLevel(logrus.ErrorLevel)
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	code := run(ctx, os.Args[1:], os.Stdin, os.Stdout, os.Stderr)
	stop()
	os.Exit(code)
}

const usage = `mcp-exec: an MCP server with one tool, exec, that runs Python in a fresh,
locked-down sandbox per call.

usage:
  mcp-exec [serve] [flags]                 run the MCP server (stdio by default)
  mcp-exec run [-c CODE | FILE] [flags]     run Python once in the sandbox
  mcp-exec doctor [--json]                  report what isolation this host supports
  mcp-exec rootfs build --out DIR           build the default Python rootfs
  mcp-exec rootfs ls [--json]               list the cached rootfs: what each holds, its size, when last used
  mcp-exec rootfs prune [--keep N] [--older-than D]
                                            remove cached rootfs no running server uses
  mcp-exec version, mcp-exec --version      print the version
  mcp-exec help, mcp-exec -h                this help

Run "mcp-exec COMMAND -h" for a command's flags; "mcp-exec serve -h" lists
every setting with its MCP_EXEC_* variable.
`

// version is set at build time.
var version = "dev"

// run dispatches a subcommand and returns the process exit status.
func run(ctx context.Context, args []string, stdin io.Reader, stdout, stderr io.Writer) int {
	cmd := "serve"
	if len(args) > 0 {
		switch args[0] {
		case "-h", "-help", "--help":
			// The top level's help lists the subcommands; serve's flags
			// are "mcp-exec serve -h".
			cmd, args = "help", args[1:]
		case "-version", "--version":
			cmd, args = "version", args[1:]
		default:
			if len(args[0]) == 0 || args[0][0] != '-' {
				cmd, args = args[0], args[1:]
			}
		}
	}
	switch cmd {
	case "serve":
		return serveCmd(ctx, args, stdin, stdout, stderr)
	case "run":
		return runCmd(ctx, args, stdout, stderr)
	case "rootfs":
		return rootfsCmd(ctx, args, stdout, stderr)
	case "doctor":
		return doctorCmd(ctx, args, stdout, stderr)
	case "version":
		fmt.Fprintln(stdout, "mcp-exec", version)
		return 0
	case "help":
		fmt.Fprint(stdout, usage)
		return 0
	default:
		fmt.Fprintf(stderr, "mcp-exec: unknown command %q\n\n%s", cmd, usage)
		return 2
	}
}
