package main

import (
	"bufio"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"strings"
	"time"

	"golang.org/x/sys/unix"

	"github.com/inhuman/mcp-exec/rootfs"
	"github.com/inhuman/mcp-exec/runtime"
	"github.com/inhuman/mcp-exec/server"
)

// A server that cannot start over stdio is most often a desktop user's
// first try: an MCP client started it from its configuration file, and
// shows its user what it answers to initialize (or "Connection closed"),
// not its stderr. So the reason goes there too, and the first thing it
// says is what to change in that file.

// firstStartHint puts, before err, what a user who runs the server without
// root under a runtime that needs root can do: MCP_EXEC_RUNTIME=auto, and
// what it gives. Other errors are as they are.
func firstStartHint(cfg config, err error) error {
	euid := os.Geteuid()
	if euid == 0 || !errors.Is(err, runtime.ErrUnsupported) || (cfg.Runtime != runtime.Libcontainer && cfg.Runtime != runtime.Runsc) {
		return err
	}
	return &hintError{short: fmt.Sprintf("the %s runtime makes a container for each call, which needs root, and this server runs as uid %d. "+
		"On a desktop, set MCP_EXEC_RUNTIME=auto (in the MCP client's \"env\" for this server): each call then runs as a fresh process "+
		"confined by Landlock and seccomp, with no network and its own limits, which is less than a container (mcp-exec doctor says what this host gives); "+
		"or run the server as root for the full sandbox.", cfg.Runtime, euid), err: err}
}

// hintError is an error whose first words are what to do; the rest, its
// details, follow on a line of their own.
type hintError struct {
	short string
	err   error
}

func (e *hintError) Error() string { return e.short + "\ndetails: " + e.err.Error() }
func (e *hintError) Unwrap() error { return e.err }

// shortReason is what a client shows its user of err: its hint when it
// has one.
func shortReason(err error) string {
	var h *hintError
	if errors.As(err, &h) {
		return h.short
	}
	return err.Error()
}

// speaksStdio says whether the server was to speak MCP on stdio, even when
// its configuration did not parse.
func speaksStdio(cfg config) bool {
	if v, ok := os.LookupEnv("MCP_EXEC_TRANSPORT"); ok && strings.TrimSpace(v) != string(server.Stdio) {
		return false
	}
	return cfg.Transport == server.Stdio
}

// refuseWait is how long a server that cannot start waits for its stdio
// client's first request, to answer it with the reason.
const refuseWait = 10 * time.Second

// refuseStdio answers each request a stdio client sends with a JSON-RPC
// error saying reason, until it has answered initialize (a client may ask
// something first: the Go SDK tries server/discover, and on an error falls
// back to initialize); it returns at once when stdin ends or is a terminal
// (a person reads stderr), and after refuseWait in any case.
func refuseStdio(stdin io.Reader, stdout io.Writer, reason string) {
	if f, ok := stdin.(*os.File); ok {
		if _, err := unix.IoctlGetTermios(int(f.Fd()), unix.TCGETS); err == nil {
			return
		}
	}
	answered := make(chan struct{})
	go func() {
		defer close(answered)
		r := bufio.NewReaderSize(stdin, 64<<10)
		for {
			line, err := r.ReadSlice('\n')
			var msg struct {
				ID     json.RawMessage `json:"id"`
				Method string          `json:"method"`
			}
			if json.Unmarshal(line, &msg) == nil && msg.Method != "" && len(msg.ID) > 0 && string(msg.ID) != "null" {
				b, _ := json.Marshal(map[string]any{"jsonrpc": "2.0", "id": msg.ID,
					"error": map[string]any{"code": -32603, "message": "mcp-exec cannot start: " + reason}})
				if _, err := stdout.Write(append(b, '\n')); err != nil || msg.Method == "initialize" {
					return
				}
			}
			if err != nil && !errors.Is(err, bufio.ErrBufferFull) {
				return
			}
		}
	}()
	select {
	case <-answered:
	case <-time.After(refuseWait):
	}
}

// describeEntry says what a cached rootfs holds, for a log line.
func describeEntry(e rootfs.Entry) string {
	if e.About == nil {
		return "unknown (built by an older mcp-exec)"
	}
	return e.About.String()
}
