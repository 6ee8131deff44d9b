package main

import (
	"context"
	"crypto/sha256"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/inhuman/mcp-exec/internal/testenv"
)

// resultOutput is what these tests read of a result, beyond execOutput.
type resultOutput struct {
	ExitCode     int    `json:"exit_code"`
	Signal       string `json:"signal"`
	TimedOut     bool   `json:"timed_out"`
	CPULimited   bool   `json:"cpu_limited"`
	CPUMS        int64  `json:"cpu_ms"`
	Stdout       string `json:"stdout"`
	Stderr       string `json:"stderr"`
	StdoutBase64 string `json:"stdout_base64"`
	StdoutBytes  int64  `json:"stdout_bytes"`
	StdoutCut    bool   `json:"stdout_truncated"`
	Result       string `json:"result"`
	Session      string `json:"session"`
	SessionEnded string `json:"session_ended"`
	Files        []struct {
		Path string `json:"path"`
		Size int64  `json:"size"`
		URI  string `json:"uri"`
	} `json:"files"`
	FilesLeftOut []struct {
		Path string `json:"path"`
		Size int64  `json:"size"`
		Why  string `json:"why"`
	} `json:"files_left_out"`
}

func callResult(t *testing.T, cs *mcp.ClientSession, args map[string]any) (resultOutput, *mcp.CallToolResult) {
	t.Helper()
	res, err := cs.CallTool(context.Background(), &mcp.CallToolParams{Name: "exec", Arguments: args})
	if err != nil {
		t.Fatalf("CallTool(%v): %v", args, err)
	}
	if res.IsError {
		t.Fatalf("CallTool(%.200v): isError: %s", args, text(res))
	}
	var out resultOutput
	remarshal(t, res.StructuredContent, &out)
	return out, res
}

// toolError runs exec and returns its isError text.
func toolError(t *testing.T, cs *mcp.ClientSession, args map[string]any) string {
	t.Helper()
	res, err := cs.CallTool(context.Background(), &mcp.CallToolParams{Name: "exec", Arguments: args})
	if err != nil {
		t.Fatalf("CallTool(%v): %v", args, err)
	}
	if !res.IsError {
		t.Fatalf("CallTool(%.200v): %s, want isError", args, text(res))
	}
	return text(res)
}

// What a model gets back from the real server, over streamable HTTP with
// two clients: unknown arguments refused by name, a text block within its
// budget that keeps the end of long output, signals named, a session's
// interrupted timeout told apart from a kill, files left out named, and
// large files as resource links that the same client reads back and hands
// to its next call, and another client cannot reach.
func TestBinaryResults(t *testing.T) {
	p := startServer(t, []string{"MCP_EXEC_AUTH_TOKEN=" + testToken, "MCP_EXEC_TEXT_BYTES=4096", "MCP_EXEC_MAX_FILE_BYTES=1048576"},
		"--transport", "http", "--addr", "127.0.0.1:0")
	endpoint := p.url(t) + "/mcp"
	client := func() *mcp.ClientSession {
		return connectHTTP(t, &mcp.StreamableClientTransport{Endpoint: endpoint,
			HTTPClient: httpClient("Authorization", "Bearer "+testToken, nil)}, nil)
	}
	a, b := client(), client()

	t.Run("unknown argument", func(t *testing.T) {
		msg := toolError(t, a, map[string]any{"code": "print(1)", "timeout": 5})
		if !strings.HasPrefix(msg, `unknown argument "timeout"; did you mean "timeout_s"?`) {
			t.Errorf("exec with timeout: %q", msg)
		}
		if msg := toolError(t, a, map[string]any{"stdin": "x"}); !strings.HasPrefix(msg, "code is required") {
			t.Errorf("exec without code: %q", msg)
		}
	})
	t.Run("text budget", func(t *testing.T) {
		out, res := callResult(t, a, map[string]any{"code": "import sys\nfor i in range(50000):\n    sys.stdout.write(f'{i:08d} ' + 'y' * 90 + '\\n')\nprint('the end')\n'z' * 3_000_000"})
		txt := text(res)
		if len(txt) > 4096 || !utf8.ValidString(txt) {
			t.Errorf("text block of %d bytes, want at most 4096", len(txt))
		}
		for _, want := range []string{"stdout truncated at 1048576 bytes (5000008 written)", "--- stdout ---\n00000000 yyy", "bytes of stdout left out of this text …]\n", "--- result ---\n'zzz", "bytes of result left out of this text …]\n"} {
			if !strings.Contains(txt, want) {
				t.Errorf("text block lacks %q:\n%s", want, txt)
			}
		}
		if len(out.Stdout) != 1048576 || out.StdoutBytes != 5000008 || len(out.Result) != 1048576 || !out.StdoutCut {
			t.Errorf("structuredContent: stdout %d bytes (of %d), result %d; want the caps' worth", len(out.Stdout), out.StdoutBytes, len(out.Result))
		}
		// Head and tail: the first line, the last, and how much was left
		// out between them.
		if !strings.HasPrefix(out.Stdout, "00000000 yyy") || !strings.HasSuffix(out.Stdout, "y\nthe end\n") ||
			!regexp.MustCompile(`\n\[… 39\d{5} bytes left out …\]\n`).MatchString(out.Stdout) {
			t.Errorf("structuredContent.stdout begins %q, ends %q: want the first and last lines around a count of what was left out",
				out.Stdout[:min(len(out.Stdout), 30)], out.Stdout[max(0, len(out.Stdout)-30):])
		}
		if !strings.Contains(txt, "the end\n") {
			t.Errorf("the text block lacks the last line:\n%s", txt)
		}
	})
	t.Run("signals", func(t *testing.T) {
		if out, res := callResult(t, a, map[string]any{"code": "import os, signal\nos.kill(os.getpid(), signal.SIGSEGV)"}); out.Signal != "SIGSEGV" ||
			!strings.HasPrefix(text(res), "exit code 139, killed by SIGSEGV (signal 11)") {
			t.Errorf("SIGSEGV: %+v\n%s", out, text(res))
		}
		if out, res := callResult(t, a, map[string]any{"code": "import sys; sys.exit(139)"}); out.Signal != "" || strings.Contains(text(res), "killed") {
			t.Errorf("sys.exit(139): %+v\n%s", out, text(res))
		}
		if out, res := callResult(t, a, map[string]any{"code": "while True: pass", "timeout_s": 1}); !out.TimedOut ||
			!strings.Contains(text(res), "timed out after 1 s: the sandbox was killed") {
			t.Errorf("a fresh call's timeout: %+v\n%s", out, text(res))
		}
	})
	t.Run("cpu limit", func(t *testing.T) {
		if out, res := callResult(t, a, map[string]any{"code": "while True: pass", "cpu_limit_s": 1, "timeout_s": 30}); !out.CPULimited || out.TimedOut ||
			out.CPUMS < 1000 || !strings.Contains(text(res), "; CPU time limit of 1 s reached: the sandbox was killed") {
			t.Errorf("spinning under cpu_limit_s 1: %+v\n%s", out, text(res))
		}
		if out, res := callResult(t, a, map[string]any{"code": "import time\ntime.sleep(60)", "cpu_limit_s": 1, "timeout_s": 2}); out.CPULimited || !out.TimedOut {
			t.Errorf("sleeping under cpu_limit_s 1, timeout_s 2: %+v\n%s", out, text(res))
		}
		if msg := toolError(t, a, map[string]any{"code": "1", "cpu_limit_s": 301}); !strings.HasPrefix(msg, "cpu_limit_s must be > 0 and ≤ 300 (MCP_EXEC_MAX_CPU_S)") {
			t.Errorf("cpu_limit_s 301: %q", msg)
		}
	})
	t.Run("bytes", func(t *testing.T) {
		code := "import sys\nsys.stdout.buffer.write(b'a\\xff\\xfe\\xfdb \\xe2\\x82\\xac')"
		if out, _ := callResult(t, a, map[string]any{"code": code}); out.Stdout != "a\uFFFD\uFFFD\uFFFDb €" || out.StdoutBase64 != "" {
			t.Errorf("three bad bytes: stdout %q, stdout_base64 %q; want three U+FFFD, no base64", out.Stdout, out.StdoutBase64)
		}
		if out, _ := callResult(t, a, map[string]any{"code": code, "binary_output": true}); out.StdoutBase64 != "Yf/+/WIg4oKs" {
			t.Errorf("binary_output: stdout_base64 %q", out.StdoutBase64)
		}
	})
	t.Run("session", func(t *testing.T) {
		out, _ := callResult(t, a, map[string]any{"code": "x = 41", "session": "new"})
		h := out.Session
		out, res := callResult(t, a, map[string]any{"code": "import time\ntime.sleep(60)", "session": h, "timeout_s": 1})
		if !out.TimedOut || out.SessionEnded != "" || !strings.Contains(text(res), "timed out after 1 s: the code was interrupted (KeyboardInterrupt) and stopped; the session and its variables live on") ||
			strings.Contains(text(res), "killed") {
			t.Errorf("a session's timeout the code stopped for: %+v\n%s", out, text(res))
		}
		if out, _ := callResult(t, a, map[string]any{"code": "x + 1", "session": h}); out.Result != "42" {
			t.Errorf("the session after its timeout: %+v", out)
		}
		if out, _ := callResult(t, a, map[string]any{"session": h, "end_session": true}); out.SessionEnded != "closed" {
			t.Errorf("end_session without code: %+v", out)
		}
	})
	t.Run("files left out", func(t *testing.T) {
		out, res := callResult(t, a, map[string]any{"code": "open('outputs/a.txt', 'w').write('a')\nopen('outputs/huge.bin', 'wb').write(b'x' * 2_000_000)"})
		if len(out.FilesLeftOut) != 1 || out.FilesLeftOut[0].Path != "huge.bin" || out.FilesLeftOut[0].Size != 2000000 || out.FilesLeftOut[0].Why != "bytes" {
			t.Errorf("files_left_out = %+v", out.FilesLeftOut)
		}
		if !strings.Contains(text(res), "  huge.bin (2000000 bytes): it would take the call's files past 1048576 bytes (MCP_EXEC_MAX_FILE_BYTES)\n") {
			t.Errorf("text:\n%s", text(res))
		}
	})
	t.Run("resource links", func(t *testing.T) {
		out, res := callResult(t, a, map[string]any{"code": "import os\ndata = os.urandom(300_000).hex()\nopen('outputs/big.csv', 'w').write(data)\nimport hashlib\nhashlib.sha256(data.encode()).hexdigest()"})
		var link *mcp.ResourceLink
		for _, c := range res.Content {
			if l, ok := c.(*mcp.ResourceLink); ok {
				link = l
			}
		}
		if link == nil || len(out.Files) != 1 || link.URI != out.Files[0].URI || *link.Size != 600000 {
			t.Fatalf("a 600 kB file: content %v, files %+v; want a resource_link", res.Content, out.Files)
		}
		read, err := a.ReadResource(context.Background(), &mcp.ReadResourceParams{URI: link.URI})
		if err != nil || fmt.Sprintf("'%x'", sha256.Sum256([]byte(read.Contents[0].Text))) != out.Result {
			t.Errorf("resources/read: %v; want the file (sha256 %s)", err, out.Result)
		}
		again, _ := callResult(t, a, map[string]any{"code": "import hashlib\nhashlib.sha256(open('in.csv', 'rb').read()).hexdigest()",
			"files": []any{map[string]any{"path": "in.csv", "uri": link.URI}}})
		if again.Result != out.Result {
			t.Errorf("the file in by uri hashes to %s, want %s", again.Result, out.Result)
		}
		if _, err := b.ReadResource(context.Background(), &mcp.ReadResourceParams{URI: link.URI}); err == nil {
			t.Errorf("another client read the resource")
		}
		if msg := toolError(t, b, map[string]any{"code": "1", "files": []any{map[string]any{"path": "in.csv", "uri": link.URI}}}); !strings.HasPrefix(msg, "files[0].uri: ") {
			t.Errorf("another client's files[].uri: %q", msg)
		}
		if list, err := b.ListResources(context.Background(), nil); err != nil || len(list.Resources) != 0 {
			t.Errorf("another client's resources/list: %v, %v", list, err)
		}
	})
	p.stop(t)
}

// The operator's data dir, through the built binary and a client: the
// tool description says it is at /data and how much it holds, a call
// reads it there, and cannot write it. The process runtime without
// namespaces of its own, which cannot give it, refuses to start, naming
// the variable; so does a data dir the sandbox cannot list.
func TestBinaryDataDir(t *testing.T) {
	requireSandbox(t)
	dir := filepath.Join(t.TempDir(), "data")
	if err := os.MkdirAll(filepath.Join(dir, "sub"), 0o755); err != nil {
		t.Fatal(err)
	}
	os.Chmod(filepath.Dir(dir), 0o755)
	os.WriteFile(filepath.Join(dir, "sales.csv"), []byte("day,amount\n1,3\n2,4\n"), 0o644)
	os.WriteFile(filepath.Join(dir, "sub", "notes.txt"), []byte("hello"), 0o644)
	// Writable by all: only the read-only mount refuses the write, with
	// EROFS on every runtime (gVisor checks permissions first).
	os.Chmod(dir, 0o777)

	ctx := context.Background()
	// The default (forks of a template), a fresh libcontainer sandbox per
	// call, and gVisor.
	for _, kind := range []string{"", "libcontainer", "runsc"} {
		t.Run("runtime="+kind, func(t *testing.T) {
			cmd := exec.Command(binaryPath(t), "serve")
			cmd.Env = serverEnv(filepath.Join(t.TempDir(), "state"), "MCP_EXEC_DATA_DIR="+dir)
			if kind != "" {
				cmd.Env = append(cmd.Env, "MCP_EXEC_RUNTIME="+kind)
			}
			var stderr testenv.SyncBuffer
			cmd.Stderr = &stderr
			cs, err := mcp.NewClient(&mcp.Implementation{Name: "test", Version: "1"}, nil).Connect(ctx, &mcp.CommandTransport{Command: cmd}, nil)
			if err != nil {
				t.Fatalf("connecting: %v\n%s", err, &stderr)
			}
			defer cs.Close()
			tools, err := cs.ListTools(ctx, nil)
			if err != nil || len(tools.Tools) != 1 || !strings.Contains(tools.Tools[0].Description, "Data is in /data, read-only: 2 files, 24 bytes in all") {
				t.Errorf("tools/list: %v; want the description to say where the data is and how much (2 files, 24 bytes)", err)
			}
			out, _ := callResult(t, cs, map[string]any{"code": "import os\nprint(open('/data/sales.csv').read().splitlines()[-1])\ntry:\n    open('/data/x', 'w')\nexcept OSError as e:\n    print(e.errno)"})
			if out.Stdout != "2,4\n30\n" {
				t.Errorf("reading and writing /data: %q (stderr %s), want its last line, then EROFS (30)", out.Stdout, out.Stderr)
			}
		})
	}

	// A dir the sandbox's user cannot list: the operator's own only.
	private := t.TempDir()
	if err := os.Chmod(private, 0o700); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		env  []string
		want []string
	}{
		{[]string{"MCP_EXEC_DATA_DIR=" + dir, "MCP_EXEC_RUNTIME=process", "MCP_EXEC_PROCESS_NAMESPACES=false"}, []string{"MCP_EXEC_DATA_DIR", "the process runtime", "MCP_EXEC_PROCESS_NAMESPACES", "MCP_EXEC_RUNTIME"}},
		{[]string{"MCP_EXEC_DATA_DIR=" + private}, []string{"MCP_EXEC_DATA_DIR", "/data cannot be listed in the sandbox", "chmod a+rX"}},
	} {
		// As a client meets it: initialize answered with the reason, and
		// the server gone.
		cmd := exec.Command(binaryPath(t), "serve")
		cmd.Env = serverEnv(filepath.Join(t.TempDir(), "state"), tc.env...)
		var stderr testenv.SyncBuffer
		cmd.Stderr = &stderr
		cs, err := mcp.NewClient(&mcp.Implementation{Name: "test", Version: "1"}, nil).Connect(ctx, &mcp.CommandTransport{Command: cmd}, nil)
		if err == nil {
			cs.Close()
			t.Errorf("serve with %v: started, want a refusal", tc.env)
			continue
		}
		if !strings.Contains(err.Error(), tc.want[0]) {
			t.Errorf("serve with %v: initialize answered %v, want the reason, naming %s", tc.env, err, tc.want[0])
		}
		cmd.Wait()
		for _, w := range tc.want {
			if !strings.Contains(stderr.String(), w) {
				t.Errorf("serve with %v: stderr lacks %q:\n%s", tc.env, w, &stderr)
			}
		}
	}
}
