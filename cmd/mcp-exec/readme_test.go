package main

import (
	"fmt"
	"os"
	goruntime "runtime"
	"strings"
	"testing"
)

// readmeSetting is one variable of the README's configuration table, with
// the default the table says it has.
type readmeSetting struct {
	env, def string
}

// readmeSettings parses the README's configuration table: rows of
// "| VAR[, VAR…] | DEFAULT[, DEFAULT…] | meaning |", where a default per
// variable is given when the counts match, else one default for all; "VAR
// / _SUFFIX" names VAR and VAR_SUFFIX.
func readmeSettings(t *testing.T) []readmeSetting {
	t.Helper()
	src, err := os.ReadFile("../../README.md")
	if err != nil {
		t.Fatal(err)
	}
	var out []readmeSetting
	in := false
	for _, line := range strings.Split(string(src), "\n") {
		if strings.HasPrefix(line, "| variable | default |") {
			in = true
			continue
		}
		if !in || strings.HasPrefix(line, "|---") {
			continue
		}
		if !strings.HasPrefix(line, "|") {
			if len(out) > 0 {
				break
			}
			continue
		}
		cells := strings.Split(strings.Trim(line, "|"), " | ")
		if len(cells) < 3 {
			t.Fatalf("README configuration row %q has %d cells, want 3", line, len(cells))
		}
		var vars []string
		for _, v := range strings.Split(strings.TrimSpace(cells[0]), ", ") {
			name, suffix, ok := strings.Cut(v, " / ")
			vars = append(vars, name)
			if ok {
				vars = append(vars, name+suffix)
			}
		}
		defs := strings.Split(strings.TrimSpace(cells[1]), ", ")
		for i, v := range vars {
			if !strings.HasPrefix(v, "MCP_EXEC_") {
				continue // the standard OTEL_* variables, the SDK's
			}
			def := strings.TrimSpace(cells[1])
			if len(defs) == len(vars) {
				def = defs[i]
			}
			out = append(out, readmeSetting{v, strings.Trim(def, "`")})
		}
	}
	if len(out) == 0 {
		t.Fatal("no configuration table (| variable | default | meaning |) in the README")
	}
	return out
}

// readmeDefault is what the README's table must say of a setting's
// default: the value as its flag prints it, "—" for none, or, where the
// default is worked out at start, the words that say how (each checked
// against the default it describes, so that it fails when that changes).
func readmeDefault(c config, env, printed string) string {
	described := map[string]func() (string, bool){
		"MCP_EXEC_MAX_CONCURRENCY": func() (string, bool) { return "2 × CPUs", c.MaxConcurrency == 2*goruntime.NumCPU() },
		"MCP_EXEC_MAX_QUEUED":      func() (string, bool) { return "4 × concurrency", c.MaxQueued == 4*c.MaxConcurrency },
		"MCP_EXEC_ROOTFS":          func() (string, bool) { return "cache", c.Rootfs == "" },
		"MCP_EXEC_PYTHON":          func() (string, bool) { return "/usr/bin/python3", c.Python == "" },
		"MCP_EXEC_RUNSC":           func() (string, bool) { return "/usr/local/bin/runsc or PATH", c.RunscPath == "" },
		"MCP_EXEC_RUNSC_PLATFORM":  func() (string, bool) { return "probed", c.RunscPlatform == "" },
		"MCP_EXEC_PIP_INDEX_URL":   func() (string, bool) { return "PyPI", c.Egress.PipIndexURL == "" },
		"MCP_EXEC_CACHE_DIR": func() (string, bool) {
			return "/var/cache/mcp-exec/rootfs or ~/.cache/mcp-exec/rootfs", c.CacheDir == ""
		},
		// 0: the largest timeout (server.Options).
		"MCP_EXEC_MAX_CPU_S": func() (string, bool) { return "MAX_TIMEOUT_S", c.MaxCPU == 0 },
		// 0 is the server's default, half of the maximum (server.Options).
		"MCP_EXEC_PERSISTENT_PER_CLIENT": func() (string, bool) { return "PERSISTENT_MAX / 2", c.PersistentPerClient == 0 },
	}
	if d, ok := described[env]; ok {
		if want, holds := d(); holds {
			return want
		}
		return fmt.Sprintf("(the README's words for %s no longer describe its default %q)", env, printed)
	}
	if printed == "" || printed == "[]" {
		return "—"
	}
	return printed
}

// The README's configuration table and the configuration code agree both
// ways: every setting is in the table with its default, and every
// variable of the table is a setting. It fails when a default changes in
// config.go and not in the README, or the other way round.
func TestREADMESettings(t *testing.T) {
	c := defaultConfig()
	want := map[string]string{}
	for _, s := range c.settings(true) {
		want[s.env] = readmeDefault(c, s.env, s.value.String())
	}
	seen := map[string]bool{}
	for _, r := range readmeSettings(t) {
		def, ok := want[r.env]
		switch {
		case !ok:
			t.Errorf("README's configuration table has %s, which is no setting", r.env)
		case seen[r.env]:
			t.Errorf("README's configuration table has %s twice", r.env)
		case r.def != def:
			t.Errorf("README says %s defaults to %q; the code's default is %q", r.env, r.def, def)
		}
		seen[r.env] = true
	}
	for env := range want {
		if !seen[env] {
			t.Errorf("%s is a setting the README's configuration table does not have", env)
		}
	}
}

// The README is the front page: set-up, the tool, the settings, clients,
// figures and where the rest is. Past 160 lines it goes to docs/.
func TestREADMEIsShort(t *testing.T) {
	src, err := os.ReadFile("../../README.md")
	if err != nil {
		t.Fatal(err)
	}
	if n := strings.Count(string(src), "\n"); n > 160 {
		t.Errorf("README.md has %d lines; keep it at 160 at most and move the rest into docs/", n)
	}
}
