package main

import (
	"bytes"
	"context"
	"encoding/json"
	"flag"
	"io"
	"log/slog"
	"strings"
	"testing"
	"time"
)

// loadWith loads the server's configuration from env alone, as serve does.
func loadWith(t *testing.T, env ...string) (config, error) {
	t.Helper()
	saved := environ
	environ = func() []string { return env }
	t.Cleanup(func() { environ = saved })
	getenv := func(k string) (string, bool) {
		for _, kv := range env {
			if name, v, ok := strings.Cut(kv, "="); ok && name == k {
				return v, true
			}
		}
		return "", false
	}
	fs := flag.NewFlagSet("test", flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	return loadConfig(fs, nil, getenv, true)
}

// A variable no setting reads is a warning naming the closest known one,
// or, with MCP_EXEC_STRICT_CONFIG=true, an error.
func TestUnknownVariables(t *testing.T) {
	cfg, err := loadWith(t, "MCP_EXEC_MEMRY_MB=512", "MCP_EXEC_TRANSPORT=stdio", "PATH=/bin", "MCP_EXECUTOR=1")
	if err != nil {
		t.Fatal(err)
	}
	if len(cfg.Warnings) != 1 || !strings.Contains(cfg.Warnings[0], "MCP_EXEC_MEMRY_MB is not a variable mcp-exec knows") ||
		!strings.Contains(cfg.Warnings[0], "the closest known is MCP_EXEC_MEMORY_MB") {
		t.Errorf("warnings = %q, want one naming MCP_EXEC_MEMRY_MB and MCP_EXEC_MEMORY_MB", cfg.Warnings)
	}
	_, err = loadWith(t, "MCP_EXEC_MEMRY_MB=512", "MCP_EXEC_STRICT_CONFIG=true")
	if err == nil || !strings.Contains(err.Error(), "MCP_EXEC_MEMRY_MB") || !strings.Contains(err.Error(), "MCP_EXEC_MEMORY_MB") ||
		!strings.Contains(err.Error(), "MCP_EXEC_STRICT_CONFIG") {
		t.Errorf("strict: %v, want an error naming the variable, the closest and MCP_EXEC_STRICT_CONFIG", err)
	}
	for _, c := range []struct{ typo, want string }{
		{"MCP_EXEC_PACKAGE", "MCP_EXEC_PACKAGES"}, {"MCP_EXEC_TIMEOUT_S", "MCP_EXEC_MAX_TIMEOUT_S"}, {"MCP_EXEC_LOGLEVEL", "MCP_EXEC_LOG_LEVEL"},
	} {
		if got := closest(c.typo, knownVars()); got != c.want {
			t.Errorf("closest(%s) = %s, want %s", c.typo, got, c.want)
		}
	}
}

// Limits that cannot hold together are refused, naming both settings.
func TestLimitsTogether(t *testing.T) {
	saved := hostCPUs
	hostCPUs = func() int { return 2 }
	t.Cleanup(func() { hostCPUs = saved })
	for _, c := range []struct {
		env  []string
		want []string // what the error names; nil: no error
	}{
		{[]string{"MCP_EXEC_CPUS=99"}, []string{"MCP_EXEC_CPUS", "the 2 CPUs this host has"}},
		{[]string{"MCP_EXEC_CPUS=2"}, nil},
		{[]string{"MCP_EXEC_TMPFS_MB=2000"}, []string{"MCP_EXEC_TMPFS_MB (2000 MiB)", "MCP_EXEC_MEMORY_MB (256 MiB)"}},
		{[]string{"MCP_EXEC_TMPFS_MB=256", "MCP_EXEC_MAX_FILE_BYTES=1000"}, nil},
		{[]string{"MCP_EXEC_PACKAGES=numpy,,pandas"}, []string{"MCP_EXEC_PACKAGES", "item 2", "empty"}},
		{[]string{"MCP_EXEC_PACKAGES=numpy,"}, []string{"MCP_EXEC_PACKAGES", "item 2"}},
		{[]string{"MCP_EXEC_PRELOAD= ,numpy"}, []string{"MCP_EXEC_PRELOAD", "item 1"}},
		{[]string{"MCP_EXEC_PACKAGES="}, nil},
		{[]string{"MCP_EXEC_PACKAGES= numpy , pandas "}, nil},
	} {
		_, err := loadWith(t, c.env...)
		if c.want == nil {
			if err != nil {
				t.Errorf("%v: %v, want accepted", c.env, err)
			}
			continue
		}
		for _, w := range c.want {
			if err == nil || !strings.Contains(err.Error(), w) {
				t.Errorf("%v: %v, want an error naming %q", c.env, err, w)
			}
		}
	}
}

func TestLogSettings(t *testing.T) {
	cfg, err := loadWith(t, "MCP_EXEC_LOG_FORMAT=json", "MCP_EXEC_LOG_LEVEL=warn")
	if err != nil {
		t.Fatal(err)
	}
	var buf bytes.Buffer
	log := newLogger(&buf, cfg.LogFormat, cfg.LogLevel)
	log.Info("not shown")
	log.Warn("shown", "n", 1)
	var m map[string]any
	if err := json.Unmarshal(buf.Bytes(), &m); err != nil || m["msg"] != "shown" || strings.Contains(buf.String(), "not shown") {
		t.Errorf("json at warn wrote %q (%v)", buf.String(), err)
	}
	for _, env := range []string{"MCP_EXEC_LOG_FORMAT=xml", "MCP_EXEC_LOG_LEVEL=loud"} {
		if _, err := loadWith(t, env); err == nil || !strings.Contains(err.Error(), strings.Split(env, "=")[0]) {
			t.Errorf("%s: %v, want refused naming the variable", env, err)
		}
	}
}

func TestTopLevelHelpAndVersion(t *testing.T) {
	for _, args := range [][]string{{"--version"}, {"-version"}, {"version"}} {
		var out bytes.Buffer
		if code := run(context.Background(), args, nil, &out, io.Discard); code != 0 || out.String() != "mcp-exec "+version+"\n" {
			t.Errorf("mcp-exec %v: %d %q", args, code, out.String())
		}
	}
	for _, args := range [][]string{{"-h"}, {"--help"}, {"help"}} {
		var out bytes.Buffer
		code := run(context.Background(), args, nil, &out, io.Discard)
		for _, sub := range []string{"serve", "run", "doctor", "rootfs build", "rootfs ls", "rootfs prune", "--version"} {
			if code != 0 || !strings.Contains(out.String(), "mcp-exec "+sub) && !strings.Contains(out.String(), sub) {
				t.Errorf("mcp-exec %v: %d, help lacks %q:\n%s", args, code, sub, out.String())
			}
		}
	}
}

// Traces are on only when OpenTelemetry's variables ask, over the
// protocols the exporters speak.
func TestTracingFromTheEnvironment(t *testing.T) {
	log := slog.New(slog.DiscardHandler)
	env := func(kv ...string) func(string) (string, bool) {
		return func(k string) (string, bool) {
			for i := 0; i < len(kv); i += 2 {
				if kv[i] == k {
					return kv[i+1], true
				}
			}
			return "", false
		}
	}
	ctx := context.Background()
	if tr, _, err := startTracing(ctx, env(), log); tr != nil || err != nil {
		t.Errorf("no OTEL variable: tracer %v, %v; want none", tr, err)
	}
	if tr, _, err := startTracing(ctx, env("OTEL_EXPORTER_OTLP_ENDPOINT", "http://127.0.0.1:1", "OTEL_SDK_DISABLED", "true"), log); tr != nil || err != nil {
		t.Errorf("OTEL_SDK_DISABLED=true: tracer %v, %v; want none", tr, err)
	}
	for _, proto := range []string{"", "http/protobuf", "grpc"} {
		tr, stop, err := startTracing(ctx, env("OTEL_EXPORTER_OTLP_ENDPOINT", "http://127.0.0.1:1", "OTEL_EXPORTER_OTLP_PROTOCOL", proto), log)
		if tr == nil || err != nil {
			t.Errorf("protocol %q: tracer %v, %v; want one", proto, tr, err)
			continue
		}
		sctx, cancel := context.WithTimeout(ctx, time.Second)
		stop(sctx)
		cancel()
	}
	if _, _, err := startTracing(ctx, env("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "http://x", "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL", "http/json"), log); err == nil ||
		!strings.Contains(err.Error(), "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL") {
		t.Errorf("http/json: %v, want refused naming the variable", err)
	}
}

// A server that cannot start answers its stdio client's initialize with
// the reason, so that the client shows it.
func TestRefuseStdio(t *testing.T) {
	in := strings.NewReader(`{"jsonrpc":"2.0","method":"notifications/x"}` + "\n" +
		`{"jsonrpc":"2.0","id":7,"method":"server/discover","params":{}}` + "\n" +
		`{"jsonrpc":"2.0","id":"i-1","method":"initialize","params":{}}` + "\n" +
		`{"jsonrpc":"2.0","id":8,"method":"tools/list"}` + "\n")
	var out bytes.Buffer
	refuseStdio(in, &out, "MCP_EXEC_RUNTIME=auto would do")
	// server/discover gets the error too; nothing after initialize.
	discover, rest, _ := strings.Cut(out.String(), "\n")
	if !strings.Contains(discover, `"id":7`) || !strings.Contains(discover, "MCP_EXEC_RUNTIME=auto would do") || strings.Count(rest, "\n") != 1 {
		t.Errorf("refuseStdio wrote %q, want an error for server/discover, then one for initialize, then nothing", out.String())
	}
	out = *bytes.NewBufferString(rest)
	var m struct {
		ID    string `json:"id"`
		Error struct {
			Code    int    `json:"code"`
			Message string `json:"message"`
		} `json:"error"`
	}
	if err := json.Unmarshal(out.Bytes(), &m); err != nil || m.ID != "i-1" || m.Error.Code != -32603 ||
		m.Error.Message != "mcp-exec cannot start: MCP_EXEC_RUNTIME=auto would do" {
		t.Errorf("refuseStdio wrote %q (%v)", out.String(), err)
	}
	out.Reset()
	start := time.Now()
	refuseStdio(strings.NewReader(""), &out, "x")
	if out.Len() != 0 || time.Since(start) > time.Second {
		t.Errorf("refuseStdio on an empty stdin wrote %q and took %v; want nothing, at once", out.String(), time.Since(start))
	}
}
