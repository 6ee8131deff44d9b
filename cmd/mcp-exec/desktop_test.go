package main

import (
	"context"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/inhuman/mcp-exec/internal/testenv"
	"github.com/inhuman/mcp-exec/rootfs"
)

// A desktop user's first start, as the README tells it: its client
// entries, started as written with the MCP Go SDK's stdio client — the
// normal user's as uid 65532, the root one's as root — run Python with the
// packages they name; and the default entry without MCP_EXEC_RUNTIME,
// started by a normal user, fails with a reason the client shows that
// names MCP_EXEC_RUNTIME=auto.

// clientEntry is one server of an mcpServers entry.
type clientEntry struct {
	Command string            `json:"command"`
	Args    []string          `json:"args"`
	Env     map[string]string `json:"env"`
}

// readmeEntries are the mcpServers entries of the README's JSON blocks,
// in order.
func readmeEntries(t *testing.T) []clientEntry {
	t.Helper()
	data, err := os.ReadFile("../../README.md")
	if err != nil {
		t.Fatal(err)
	}
	var entries []clientEntry
	for _, m := range regexp.MustCompile("(?s)```json\n(.*?)```").FindAllSubmatch(data, -1) {
		if !strings.Contains(string(m[1]), `"mcpServers"`) {
			continue // a tool call, not a client's entry
		}
		var doc struct {
			MCPServers map[string]clientEntry `json:"mcpServers"`
		}
		if err := json.Unmarshal(m[1], &doc); err != nil {
			t.Fatalf("a JSON block of the README does not parse: %v\n%s", err, m[1])
		}
		for _, e := range doc.MCPServers {
			entries = append(entries, e)
		}
	}
	return entries
}

// start starts entry as a client would, its command replaced by bin,
// under wrapper (argv before it), with a desktop's environment.
func start(t *testing.T, entry clientEntry, bin string, wrapper []string, home string) (*mcp.ClientSession, *testenv.SyncBuffer, error) {
	t.Helper()
	argv := append(append(append([]string{}, wrapper...), bin), entry.Args...)
	cmd := exec.Command(argv[0], argv[1:]...)
	// What the Go and TypeScript SDKs' stdio clients pass: a few of the
	// client's variables, then the entry's env.
	cmd.Env = []string{"PATH=/usr/local/bin:/usr/bin:/bin", "HOME=" + home, "LANG=C.UTF-8"}
	for k, v := range entry.Env {
		cmd.Env = append(cmd.Env, k+"="+v)
	}
	var stderr testenv.SyncBuffer
	cmd.Stderr = &stderr
	cs, err := mcp.NewClient(&mcp.Implementation{Name: "desktop", Version: "1"}, nil).Connect(context.Background(), &mcp.CommandTransport{Command: cmd}, nil)
	if err == nil {
		t.Cleanup(func() { cs.Close() })
	}
	return cs, &stderr, err
}

func TestREADMEDesktopEntries(t *testing.T) {
	testenv.Root(t)
	if _, err := exec.LookPath("setpriv"); err != nil {
		testenv.Missing(t, "setpriv is not installed (util-linux)")
	}
	entries := readmeEntries(t)
	if len(entries) != 2 || entries[0].Env["MCP_EXEC_RUNTIME"] != "auto" || entries[1].Env["MCP_EXEC_RUNTIME"] != "" {
		t.Fatalf("README entries %+v, want a normal user's with MCP_EXEC_RUNTIME=auto, then a root one's", entries)
	}
	packages := entries[0].Env["MCP_EXEC_PACKAGES"]
	if packages == "" || packages != entries[1].Env["MCP_EXEC_PACKAGES"] {
		t.Fatalf("README entries name packages %q and %q, want the same, set", packages, entries[1].Env["MCP_EXEC_PACKAGES"])
	}
	py, err := rootfs.FindPython(context.Background(), "")
	if err == nil {
		_, err = rootfs.Describe(py, rootfs.Options{Packages: strings.Split(packages, ",")})
	}
	if err != nil {
		testenv.Missing(t, "the README's packages on this host: %v", err)
	}
	bin, dir := publicBinary(t)
	home := filepath.Join(dir, "home")
	asUser := []string{"setpriv", "--reuid=65532", "--regid=65532", "--clear-groups"}
	probe := "import numpy, pandas, matplotlib, os\nprint(os.getuid(), numpy.__name__, pandas.__name__)"

	for _, tc := range []struct {
		name    string
		entry   clientEntry
		wrapper []string
		runtime string
		uid     string
	}{
		{"normal user", entries[0], asUser, "process", "65532"},
		{"root", entries[1], nil, "libcontainer", "65532"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cs, stderr, err := start(t, tc.entry, bin, tc.wrapper, home)
			if err != nil {
				t.Fatalf("starting the README's entry: %v\n%s", err, stderr)
			}
			res, err := cs.CallTool(context.Background(), &mcp.CallToolParams{Name: "exec", Arguments: map[string]any{"code": probe}})
			if err != nil || res.IsError {
				t.Fatalf("exec: %v %v\n%s", err, text(res), stderr)
			}
			out := decodeOutput(t, res)
			if out.Stdout != tc.uid+" numpy pandas\n" || out.Runtime != tc.runtime {
				t.Errorf("exec: stdout %q runtime %q, want %q from %s", out.Stdout, out.Runtime, tc.uid+" numpy pandas\n", tc.runtime)
			}
		})
	}

	// The default entry, as a normal user first writes it: the client
	// shows the reason, and it names what to set.
	t.Run("normal user without MCP_EXEC_RUNTIME", func(t *testing.T) {
		plain := clientEntry{Args: entries[0].Args, Env: map[string]string{"MCP_EXEC_PACKAGES": packages}}
		_, stderr, err := start(t, plain, bin, asUser, home)
		if err == nil {
			t.Fatalf("the default runtime started as uid 65532:\n%s", stderr)
		}
		for _, want := range []string{"MCP_EXEC_RUNTIME=auto", "needs root", "Landlock"} {
			if !strings.Contains(err.Error(), want) {
				t.Errorf("the error the client shows, %q, does not say %q\n%s", err, want, stderr)
			}
		}
		if first, _, _ := strings.Cut(stderr.String(), "\n"); !strings.Contains(first, "MCP_EXEC_RUNTIME=auto") {
			t.Errorf("the first line of stderr, %q, does not name MCP_EXEC_RUNTIME=auto", first)
		}
	})
}
