package main

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/inhuman/mcp-exec/internal/testenv"
)

// A file of the served rootfs changed on the host while the server runs
// (an operator's MCP_EXEC_ROOTFS; the cache is watched the same way) is
// never used: the next call, fresh or in a persistent session, is
// isError naming the file as the sandbox sees it, and the log says which
// file on the host and how to serve again. Without the check the code
// would import the appended module and print what the host wrote.
func TestBinaryRootfsChangedIsRefused(t *testing.T) {
	testenv.Real(t)
	requireSandbox(t)
	tmp := t.TempDir()
	for _, d := range []string{tmp, filepath.Dir(tmp)} {
		if err := os.Chmod(d, 0o711); err != nil {
			t.Fatal(err)
		}
	}
	root := filepath.Join(tmp, "rootfs")
	if stdout, stderr, status := cli(t, nil, "rootfs", "build", "--out", root); status != 0 {
		t.Fatalf("rootfs build: status %d\n%s\n%s", status, stdout, stderr)
	}
	mods, _ := filepath.Glob(filepath.Join(root, "usr/lib/python3*/json/__init__.py"))
	if len(mods) != 1 {
		t.Fatalf("json/__init__.py in the built rootfs: %v", mods)
	}
	inside := strings.TrimPrefix(mods[0], root)

	var stderr testenv.SyncBuffer
	cmd := exec.Command(binaryPath(t), "serve")
	cmd.Env = serverEnv(filepath.Join(tmp, "state"), "MCP_EXEC_ROOTFS="+root)
	cmd.Stderr = &stderr
	ctx := context.Background()
	cs, err := mcp.NewClient(&mcp.Implementation{Name: "test", Version: "1"}, nil).Connect(ctx, &mcp.CommandTransport{Command: cmd}, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer cs.Close()
	call := func(args map[string]any) *mcp.CallToolResult {
		t.Helper()
		res, err := cs.CallTool(ctx, &mcp.CallToolParams{Name: "exec", Arguments: args})
		if err != nil {
			t.Fatal(err)
		}
		return res
	}
	res := call(map[string]any{"code": "import json; print(json.dumps(1))"})
	if res.IsError || decodeOutput(t, res).Stdout != "1\n" {
		t.Fatalf("a call before the change: %s", text(res))
	}
	sess := call(map[string]any{"code": "x = 1", "session": "new"})
	handle := decodeOutput(t, sess).Session
	if sess.IsError || handle == "" {
		t.Fatalf("a session before the change: %s", text(sess))
	}

	f, err := os.OpenFile(mods[0], os.O_WRONLY|os.O_APPEND, 0)
	if err != nil {
		t.Fatal(err)
	}
	f.WriteString("\nprint('appended on the host')\n")
	f.Close()

	for _, args := range []map[string]any{
		{"code": "import json; print(json.dumps(2))"},
		{"code": "import json; print(x)", "session": handle},
		{"code": "print(3)", "session": "new"},
	} {
		res := call(args)
		if !res.IsError || !strings.Contains(text(res), inside) || strings.Contains(text(res), root) {
			t.Errorf("call %v after the change: isError %v, %q; want isError naming %s, not the host path", args, res.IsError, text(res), inside)
		}
	}
	log := stderr.String()
	if !strings.Contains(log, mods[0]) || !strings.Contains(log, "restart the server") {
		t.Errorf("server log does not name the changed file on the host and the fix:\n%s", log)
	}
}
