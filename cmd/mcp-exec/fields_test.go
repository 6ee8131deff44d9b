package main

import (
	"errors"
	"go/ast"
	"go/parser"
	"go/token"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/inhuman/mcp-exec/policy"
)

// Every setting writes through a field of config, and the table finds it.
func TestEverySettingHasItsField(t *testing.T) {
	var c config
	vars := fieldVars()
	for _, s := range c.settings(true) {
		found := false
		for _, v := range vars {
			found = found || v == s.env
		}
		if !found {
			t.Errorf("%s: no field of config is written by its setting", s.env)
		}
	}
	for field, env := range map[string]string{"MemoryBytes": "MCP_EXEC_MEMORY_MB", "MaxCodeBytes": "MCP_EXEC_MAX_CODE_BYTES",
		"RootfsImage": "MCP_EXEC_ROOTFS_IMAGE", "Transport": "MCP_EXEC_TRANSPORT"} {
		if vars[field] != env {
			t.Errorf("field %s is set by %q, want %s", field, vars[field], env)
		}
	}
}

// Every {Field} a library writes in a message is one the edge can name:
// a typo would reach the operator as {Field}, naming nothing they can set.
func TestLibrariesNameOnlySettings(t *testing.T) {
	vars := fieldVars()
	fset := token.NewFileSet()
	n := 0
	for _, pkg := range []string{"host", "rootfs", "rootfs/image", "runtime", "server", "policy", "bundle", "egress"} {
		files, err := filepath.Glob(filepath.Join("..", "..", pkg, "*.go"))
		if err != nil || len(files) == 0 {
			t.Fatalf("no Go files in %s (%v)", pkg, err)
		}
		for _, f := range files {
			if strings.HasSuffix(f, "_test.go") {
				continue
			}
			src, err := os.ReadFile(f)
			if err != nil {
				t.Fatal(err)
			}
			file, err := parser.ParseFile(fset, f, src, 0)
			if err != nil {
				t.Fatal(err)
			}
			ast.Inspect(file, func(node ast.Node) bool {
				lit, ok := node.(*ast.BasicLit)
				if !ok || lit.Kind != token.STRING {
					return true
				}
				s, err := strconv.Unquote(lit.Value)
				if err != nil {
					return true
				}
				for _, m := range fieldRef.FindAllStringSubmatch(s, -1) {
					n++
					if _, ok := vars[m[1]]; !ok {
						t.Errorf("%s: %q names {%s}, which no setting sets", fset.Position(lit.Pos()), s, m[1])
					}
				}
				// The server's messages to a caller, and the egress proxy's
				// to the code (all in refuse.go), leave the process as they are.
				toCaller := pkg == "server" || pkg == "egress" && filepath.Base(f) == "refuse.go"
				if strings.Contains(s, "MCP_EXEC_") && !toCaller {
					t.Errorf("%s: %q names a variable: libraries name the field, {Field}", fset.Position(lit.Pos()), s)
				}
				return true
			})
		}
	}
	if n < 30 {
		t.Errorf("found %d field references in the libraries, want the 30 and more they write", n)
	}
}

// An error from a library reads with the variable, and still matches what
// it wrapped.
func TestNamedErrors(t *testing.T) {
	caps := policy.DefaultCallCaps()
	caps.MaxCodeBytes = 0
	err := named(caps.Validate())
	if !strings.Contains(err.Error(), "MCP_EXEC_MAX_CODE_BYTES must be ≥ 1, got 0") {
		t.Errorf("got %q, want it to name MCP_EXEC_MAX_CODE_BYTES", err)
	}
	sentinel := errors.New("{Nothing} {Rootfs}")
	if err := named(sentinel); !errors.Is(err, sentinel) || err.Error() != "{Nothing} MCP_EXEC_ROOTFS" {
		t.Errorf("named(%q) = %q (Is %v), want {Nothing} kept and {Rootfs} named", sentinel, err, errors.Is(err, sentinel))
	}
	if named(nil) != nil {
		t.Error("named(nil) is not nil")
	}
}
