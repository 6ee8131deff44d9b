package main

import (
	"flag"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestAuthTokenFile(t *testing.T) {
	dir := t.TempDir()
	write := func(name, content string) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(content), 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	good := write("good", "0123456789abcdef0123\n")
	public := write("public", "0123456789abcdef0123\n")
	if err := os.Chmod(public, 0o644); err != nil {
		t.Fatal(err)
	}
	empty := write("empty", "\n")
	tests := []struct {
		name      string
		env       map[string]string
		wantToken string
		wantErr   string
		wantWarn  string
	}{
		{"file readable by all: a warning", map[string]string{"MCP_EXEC_AUTH_TOKEN_FILE": public}, "0123456789abcdef0123", "", "readable by every user (mode -rw-r--r--)"},
		{"file, newline trimmed", map[string]string{"MCP_EXEC_AUTH_TOKEN_FILE": good}, "0123456789abcdef0123", "", ""},
		{"both set", map[string]string{"MCP_EXEC_AUTH_TOKEN_FILE": good, "MCP_EXEC_AUTH_TOKEN": "0123456789abcdef0123"}, "", "both set", ""},
		{"missing file", map[string]string{"MCP_EXEC_AUTH_TOKEN_FILE": filepath.Join(dir, "nope")}, "", "MCP_EXEC_AUTH_TOKEN_FILE: reading the token", ""},
		{"empty file", map[string]string{"MCP_EXEC_AUTH_TOKEN_FILE": empty}, "", "is empty", ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			env := map[string]string{"MCP_EXEC_TRANSPORT": "http"}
			for k, v := range tt.env {
				env[k] = v
			}
			getenv := func(k string) (string, bool) { v, ok := env[k]; return v, ok }
			fs := flag.NewFlagSet("serve", flag.ContinueOnError)
			fs.SetOutput(io.Discard)
			cfg, err := loadConfig(fs, nil, getenv, true)
			if tt.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
					t.Errorf("loadConfig(%v): err = %v, want one containing %q", tt.env, err, tt.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatalf("loadConfig(%v): %v", tt.env, err)
			}
			if cfg.AuthToken != tt.wantToken {
				t.Errorf("loadConfig(%v): AuthToken = %q, want %q", tt.env, cfg.AuthToken, tt.wantToken)
			}
			if warned := strings.Join(cfg.Warnings, "; "); tt.wantWarn == "" && warned != "" || !strings.Contains(warned, tt.wantWarn) {
				t.Errorf("loadConfig(%v): warnings %q, want %q", tt.env, warned, tt.wantWarn)
			}
		})
	}
}
