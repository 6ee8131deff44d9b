package runtime

import (
	"go/ast"
	"go/parser"
	"go/token"
	"path/filepath"
	"strings"
	"testing"
)

// maxFuncLines bounds a function of the runtime's packages, from its func
// line to its closing brace: a longer one is doing the work of several,
// and each of them wants a name (as supervise's call has a handler per
// event).
const maxFuncLines = 80

func TestFunctionsShort(t *testing.T) {
	for _, dir := range []string{".", "initproto", "sandboxinit"} {
		files, err := filepath.Glob(filepath.Join(dir, "*.go"))
		if err != nil || len(files) == 0 {
			t.Fatalf("no Go files in %s: %v", dir, err)
		}
		for _, f := range files {
			if strings.HasSuffix(f, "_test.go") {
				continue
			}
			fs := token.NewFileSet()
			af, err := parser.ParseFile(fs, f, nil, 0)
			if err != nil {
				t.Fatal(err)
			}
			for _, d := range af.Decls {
				fd, ok := d.(*ast.FuncDecl)
				if !ok || fd.Body == nil {
					continue
				}
				if n := fs.Position(fd.End()).Line - fs.Position(fd.Pos()).Line + 1; n > maxFuncLines {
					t.Errorf("%s: %s is %d lines, over %d: split it into named steps", f, fd.Name.Name, n, maxFuncLines)
				}
			}
		}
	}
}
