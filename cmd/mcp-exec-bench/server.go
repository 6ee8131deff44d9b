package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os/exec"
	"strings"
	"sync"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"
)

const (
	// startTimeout covers a first start that builds the rootfs (or a
	// package layer) into the cache.
	startTimeout = 5 * time.Minute
	// callTimeout turns a hung call into a counted error instead of a
	// hung benchmark. It is far above any call's own wall-clock limit.
	callTimeout = 2 * time.Minute
)

// server is a running `mcp-exec serve` with a client session over stdio.
type server struct {
	cmd     *exec.Cmd
	cs      *mcp.ClientSession
	stderr  *tailBuffer
	version string
	started time.Duration // from exec to an initialized session
}

// startServer starts the server and completes the MCP handshake. A server
// that refuses to start (a runtime this host lacks, packages it does not
// have) exits; its last lines of stderr are the error.
func startServer(ctx context.Context, path string, env []string) (*server, error) {
	cmd := exec.Command(path, "serve")
	cmd.Env = env
	tail := &tailBuffer{max: 16 << 10}
	cmd.Stderr = tail
	client := mcp.NewClient(&mcp.Implementation{Name: "mcp-exec-bench", Version: "1"}, nil)
	cctx, cancel := context.WithTimeout(ctx, startTimeout)
	defer cancel()
	start := time.Now()
	cs, err := client.Connect(cctx, &mcp.CommandTransport{Command: cmd, TerminateDuration: 10 * time.Second}, nil)
	if err != nil {
		if cmd.Process != nil && cmd.ProcessState == nil {
			_ = cmd.Process.Kill()
			_ = cmd.Wait()
		}
		why := tail.lastLines(6)
		if why == "" {
			return nil, fmt.Errorf("starting %s serve: %w", path, err)
		}
		return nil, fmt.Errorf("starting %s serve: %w; its stderr:\n%s", path, err, why)
	}
	s := &server{cmd: cmd, cs: cs, stderr: tail, started: time.Since(start)}
	if ir := cs.InitializeResult(); ir != nil && ir.ServerInfo != nil {
		s.version = strings.TrimSpace(ir.ServerInfo.Name + " " + ir.ServerInfo.Version)
	}
	return s, nil
}

func (s *server) pid() int { return s.cmd.Process.Pid }

// close ends the session by closing the server's stdin, as the stdio
// transport prescribes, and waits for it to exit.
func (s *server) close() error {
	if err := s.cs.Close(); err != nil {
		var ee *exec.ExitError
		if errors.As(err, &ee) {
			return fmt.Errorf("stopping the server: %w; its stderr:\n%s", err, s.stderr.lastLines(6))
		}
		return fmt.Errorf("stopping the server: %w", err)
	}
	return nil
}

// execOutput is the part of the exec tool's structuredContent the
// benchmark reads. Pointers tell a missing field from a zero one.
type execOutput struct {
	Stdout     string   `json:"stdout"`
	Stderr     string   `json:"stderr"`
	ExitCode   *int     `json:"exit_code"`
	TimedOut   bool     `json:"timed_out"`
	OOMKilled  bool     `json:"oom_killed"`
	DurationMS *float64 `json:"duration_ms"`
	Runtime    string   `json:"runtime"`
	Session    string   `json:"session"`
	PeakMemory int64    `json:"peak_memory_bytes"`
	CPUMS      float64  `json:"cpu_ms"`
}

// exec calls the exec tool with code and decodes what it returned. An
// isError result is an error.
func (s *server) exec(ctx context.Context, params *mcp.CallToolParams) (execOutput, error) {
	ctx, cancel := context.WithTimeout(ctx, callTimeout)
	defer cancel()
	res, err := s.cs.CallTool(ctx, params)
	if err != nil {
		return execOutput{}, fmt.Errorf("calling exec: %w", err)
	}
	if res.IsError {
		return execOutput{}, fmt.Errorf("exec returned isError: %s", firstLine(resultText(res)))
	}
	var out execOutput
	b, err := json.Marshal(res.StructuredContent)
	if err == nil {
		err = json.Unmarshal(b, &out)
	}
	if err != nil {
		return execOutput{}, fmt.Errorf("decoding structuredContent %.200s: %w", b, err)
	}
	return out, nil
}

// caller returns a call of exec with the snippet that fails unless the run
// printed what it should and exited 0.
func (s *server) caller(sn snippet) caller {
	return s.callerWith(sn, map[string]any{"code": sn.Code})
}

// sessionCaller is caller in the persistent session handle.
func (s *server) sessionCaller(sn snippet, handle string) caller {
	return s.callerWith(sn, map[string]any{"code": sn.Code, "session": handle})
}

func (s *server) callerWith(sn snippet, args map[string]any) caller {
	params := &mcp.CallToolParams{Name: "exec", Arguments: args}
	return func(ctx context.Context) (outcome, error) {
		out, err := s.exec(ctx, params)
		if err != nil {
			return outcome{}, err
		}
		if err := check(out, sn.Stdout); err != nil {
			return outcome{}, err
		}
		o := outcome{runtime: out.Runtime, cpuMS: out.CPUMS}
		if out.DurationMS != nil {
			o.durationMS, o.hasDur = *out.DurationMS, true
		}
		return o, nil
	}
}

// pythonVersion is the sandbox's interpreter's version, or why it is not
// known.
func (s *server) pythonVersion(ctx context.Context) string {
	out, err := s.exec(ctx, &mcp.CallToolParams{Name: "exec", Arguments: map[string]any{"code": "import platform; print(platform.python_version())"}})
	if err == nil {
		switch {
		case out.ExitCode == nil:
			err = errors.New("structuredContent has no exit_code")
		case *out.ExitCode != 0:
			err = fmt.Errorf("exit_code %d: %s", *out.ExitCode, lastLine(out.Stderr))
		}
	}
	if err != nil {
		return "unknown (" + err.Error() + ")"
	}
	return strings.TrimSpace(out.Stdout)
}

func check(out execOutput, wantStdout string) error {
	switch {
	case out.ExitCode == nil:
		return errors.New("structuredContent has no exit_code")
	case out.TimedOut:
		return errors.New("timed out")
	case out.OOMKilled:
		return errors.New("killed at the memory limit")
	case *out.ExitCode != 0:
		return fmt.Errorf("exit_code %d: %s", *out.ExitCode, lastLine(out.Stderr))
	case out.Stdout != wantStdout:
		return fmt.Errorf("stdout %.100q, want %q (stderr: %s)", out.Stdout, wantStdout, lastLine(out.Stderr))
	}
	return nil
}

func resultText(res *mcp.CallToolResult) string {
	var parts []string
	for _, c := range res.Content {
		if tc, ok := c.(*mcp.TextContent); ok {
			parts = append(parts, tc.Text)
		}
	}
	return strings.Join(parts, "\n")
}

func firstLine(s string) string {
	s = strings.TrimSpace(s)
	if i := strings.IndexByte(s, '\n'); i >= 0 {
		return s[:i]
	}
	return s
}

// lastLine is where Python puts the exception of a traceback.
func lastLine(s string) string {
	s = strings.TrimSpace(s)
	return s[strings.LastIndexByte(s, '\n')+1:]
}

// tailBuffer keeps the last max bytes written to it: the server's stderr,
// which says why it refused to start, without growing for a long run.
type tailBuffer struct {
	mu  sync.Mutex
	max int
	b   []byte
}

func (t *tailBuffer) Write(p []byte) (int, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.b = append(t.b, p...)
	if over := len(t.b) - t.max; over > 0 {
		t.b = append(t.b[:0], t.b[over:]...)
	}
	return len(p), nil
}

func (t *tailBuffer) lastLines(n int) string {
	t.mu.Lock()
	defer t.mu.Unlock()
	lines := strings.Split(strings.TrimSpace(string(t.b)), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}

// doctorReport is the part of `mcp-exec doctor --json` that describes a
// runtime. Unknown fields are ignored, a missing one stays empty: the
// description is for the header, not a check.
type doctorReport struct {
	Runtime struct {
		Selected string `json:"selected"`
		Mode     string `json:"mode"`
	} `json:"runtime"`
	Runtimes []struct {
		Kind      string `json:"kind"`
		Available bool   `json:"available"`
		Detail    string `json:"detail"`
	} `json:"runtimes"`
}

// describeRuntime asks the server's doctor, in the server's environment,
// how it would run kind (for runsc: its version and platform). The doctor's
// exit status is ignored: it says whether the full sandbox is possible,
// and the server itself is the judge of whether it starts.
func describeRuntime(ctx context.Context, path string, env []string, kind string) string {
	ctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, path, "doctor", "--json")
	cmd.Env = env
	var out bytes.Buffer
	cmd.Stdout = &out
	_ = cmd.Run()
	var d doctorReport
	if err := json.Unmarshal(out.Bytes(), &d); err != nil {
		return fmt.Sprintf("unknown (doctor --json: %v)", err)
	}
	for _, r := range d.Runtimes {
		if r.Kind == kind {
			if !r.Available {
				return "unavailable: " + r.Detail
			}
			return r.Detail
		}
	}
	if d.Runtime.Selected != "" {
		return strings.TrimSpace(d.Runtime.Selected + ", " + d.Runtime.Mode)
	}
	return "unknown (doctor does not list it)"
}

// serverVersion is what `mcp-exec version` prints, for the header even when
// no server starts.
func serverVersion(ctx context.Context, path string) (string, error) {
	ctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	out, err := exec.CommandContext(ctx, path, "version").Output()
	if err != nil {
		return "", fmt.Errorf("running %s version: %w", path, err)
	}
	return strings.TrimSpace(string(out)), nil
}
