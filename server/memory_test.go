package server

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"runtime/debug"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/inhuman/mcp-exec/internal/testenv"
)

const testToken = "0123456789abcdef-token"

// TestMain lets the test binary be a server of its own (the fake engine
// over HTTP), so that its memory is measured apart from the clients'.
func TestMain(m *testing.M) {
	if addrFile := os.Getenv("MCP_EXEC_TEST_HTTP_SERVER"); addrFile != "" {
		os.Exit(childServer(addrFile))
	}
	os.Exit(m.Run())
}

func childServer(addrFile string) int {
	debug.SetMemoryLimit(MemoryTarget) // as the binary does
	TuneGC()
	o := testOptions()
	o.Transport, o.AuthToken = HTTP, testToken
	if v := os.Getenv("MCP_EXEC_TEST_SESSION_IDLE"); v != "" {
		d, _ := time.ParseDuration(v)
		o.SessionIdle = d
	}
	s, err := New(newFakeEngine(), o)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	if err := os.WriteFile(addrFile, []byte(ln.Addr().String()), 0o600); err != nil {
		return 1
	}
	if err := s.ServeHTTP(context.Background(), ln); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	return 0
}

// startChild starts the test binary as an HTTP server and returns its
// base URL and process.
func startChild(t *testing.T, env ...string) (string, *os.Process) {
	t.Helper()
	addrFile := t.TempDir() + "/addr"
	cmd := exec.Command(os.Args[0])
	cmd.Env = append(os.Environ(), append(env, "MCP_EXEC_TEST_HTTP_SERVER="+addrFile)...)
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
	waitFor(t, "the child server to listen", func() bool {
		b, err := os.ReadFile(addrFile)
		return err == nil && len(b) > 0
	})
	addr, _ := os.ReadFile(addrFile)
	return "http://" + string(addr) + "/mcp", cmd.Process
}

// post sends one JSON-RPC message and returns the status, the session id
// it was given and the body.
func post(c *http.Client, url, session string, body []byte) (int, string, []byte, error) {
	req, _ := http.NewRequest(http.MethodPost, url, bytes.NewReader(body))
	req.Header.Set("Authorization", "Bearer "+testToken)
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Accept", "application/json, text/event-stream")
	if session != "" {
		req.Header.Set("Mcp-Session-Id", session)
		req.Header.Set("Mcp-Protocol-Version", "2025-06-18")
	}
	resp, err := c.Do(req)
	if err != nil {
		return 0, "", nil, err
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, resp.Header.Get("Mcp-Session-Id"), b, nil
}

const initBody = `{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-06-18","capabilities":{},"clientInfo":{"name":"t","version":"1"}}}`

// session opens an MCP session: initialize, then the initialized
// notification.
func session(t *testing.T, c *http.Client, url string) string {
	t.Helper()
	st, id, body, err := post(c, url, "", []byte(initBody))
	if err != nil || st != http.StatusOK || id == "" {
		t.Fatalf("initialize: %d %q %v %s", st, id, err, body)
	}
	if st, _, body, err := post(c, url, id, []byte(`{"jsonrpc":"2.0","method":"notifications/initialized"}`)); err != nil || st/100 != 2 {
		t.Fatalf("initialized: %d %v %s", st, err, body)
	}
	return id
}

// vmHWM is a process's peak resident memory, in bytes.
func vmHWM(t *testing.T, pid int) int64 {
	t.Helper()
	data, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/status")
	if err != nil {
		t.Fatal(err)
	}
	for _, l := range strings.Split(string(data), "\n") {
		if rest, ok := strings.CutPrefix(l, "VmHWM:"); ok {
			kb, _ := strconv.ParseInt(strings.TrimSuffix(strings.TrimSpace(rest), " kB"), 10, 64)
			return kb << 10
		}
	}
	t.Fatal("no VmHWM")
	return 0
}

// Whatever an authenticated client sends, the server's memory stays
// bounded: thousands of sessions, oversized calls, and more calls with the
// largest valid input than run and wait at once.
func TestHTTPMemoryIsBounded(t *testing.T) {
	testenv.Real(t) // a few hundred MB of traffic
	url, proc := startChild(t)
	c := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 64}}
	base := vmHWM(t, proc.Pid)

	// 6000 sessions.
	var wg sync.WaitGroup
	sem := make(chan struct{}, 16)
	for i := 0; i < 6000; i++ {
		sem <- struct{}{}
		wg.Go(func() {
			defer func() { <-sem }()
			post(c, url, "", []byte(initBody))
		})
	}
	wg.Wait()
	afterSessions := vmHWM(t, proc.Pid)

	id := session(t, c, url)
	call := func(args map[string]any) []byte {
		b, _ := json.Marshal(map[string]any{"jsonrpc": "2.0", "id": 2, "method": "tools/call",
			"params": map[string]any{"name": "exec", "arguments": args}})
		return b
	}
	// 16 parallel calls of 9 MiB code: refused by the code limit.
	big := call(map[string]any{"code": strings.Repeat("x", 9<<20)})
	for range 16 {
		wg.Go(func() {
			if st, _, body, err := post(c, url, id, big); err == nil && st == http.StatusOK && !bytes.Contains(body, []byte("MCP_EXEC_MAX_CODE_BYTES")) {
				t.Errorf("a 9 MiB call was not refused for its size: %.200s", body)
			}
		})
	}
	wg.Wait()
	// 40 parallel calls with the largest valid input (1 MiB of code, 1 MiB
	// of stdin, 10 MiB of files) that hold a slot for a while: 4 run, 16
	// wait, the rest are refused or wait for the body budget.
	var files []map[string]any
	for i := range 10 {
		files = append(files, map[string]any{"path": fmt.Sprintf("f%d", i), "content": strings.Repeat("y", 1<<20)})
	}
	full := call(map[string]any{"code": "sleep:1s#" + strings.Repeat("p", 1<<20-9), "stdin": strings.Repeat("s", 1<<20), "files": files})
	for range 40 {
		wg.Go(func() { post(c, url, id, full) })
	}
	wg.Wait()
	peak := vmHWM(t, proc.Pid)
	t.Logf("server RSS peak: %d MiB at start, %d MiB after 6000 sessions, %d MiB after the calls", base>>20, afterSessions>>20, peak>>20)
	if peak > 300<<20 {
		t.Errorf("the server's RSS peaked at %d MiB, over 300 MiB", peak>>20)
	}
	// It still serves.
	if st, _, body, err := post(c, url, id, call(map[string]any{"code": "print:ok"})); err != nil || st != http.StatusOK || !bytes.Contains(body, []byte(`ok`)) {
		t.Errorf("a call after the flood: %d %v %.200s", st, err, body)
	}
}

// An idle session is closed after MCP_EXEC_SESSION_IDLE_S: its id then gets
// 404, and a new session works.
func TestHTTPIdleSessionCloses(t *testing.T) {
	testenv.Real(t)
	url, _ := startChild(t, "MCP_EXEC_TEST_SESSION_IDLE=500ms")
	c := &http.Client{}
	id := session(t, c, url)
	ping := []byte(`{"jsonrpc":"2.0","id":5,"method":"ping"}`)
	if st, _, body, err := post(c, url, id, ping); err != nil || st != http.StatusOK {
		t.Fatalf("ping in a fresh session: %d %v %s", st, err, body)
	}
	// Every look at the session is a use of it that restarts its idle
	// time: look after three idle times of quiet, a few times over, for a
	// loaded machine's late timers.
	closed := false
	for i := 0; i < 5 && !closed; i++ {
		time.Sleep(1500 * time.Millisecond)
		st, _, _, err := post(c, url, id, ping)
		closed = err == nil && st == http.StatusNotFound
	}
	if !closed {
		t.Fatalf("a session idle for 1.5 s (MCP_EXEC_SESSION_IDLE_S 0.5 s) still answers")
	}
	session(t, c, url)
}
