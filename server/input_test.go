package server

import (
	"bufio"
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/modelcontextprotocol/go-sdk/mcp"
)

// An argument the schema does not name is refused, naming it and the
// closest known name, before anything runs; in a files[] item too. The
// refusal is the handler's, so the audit log has it like any other.
func TestUnknownArguments(t *testing.T) {
	auditPath := filepath.Join(t.TempDir(), "audit.log")
	audit, err := OpenAudit(auditPath, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer audit.Close()
	o := sessionOptions()
	o.Audit = audit
	eng := newFakeEngine()
	_, cs := connect(t, eng, o, nil)
	const takes = " (exec takes binary_output, code, cpu_limit_s, end_session, files, session, stdin, timeout_s)"
	for _, tc := range []struct {
		name string
		args map[string]any
		want string
	}{
		{"timeout", map[string]any{"code": "print:x", "timeout": 5}, `unknown argument "timeout"; did you mean "timeout_s"?` + takes},
		{"no code either", map[string]any{"timeout": 5}, `unknown argument "timeout"; did you mean "timeout_s"?` + takes},
		{"case", map[string]any{"Code": "print:x"}, `unknown argument "Code"; did you mean "code"?` + takes},
		{"a prefix", map[string]any{"code": "print:x", "session_id": "ps_x"}, `unknown argument "session_id"; did you mean "session"?` + takes},
		{"nothing close", map[string]any{"code": "print:x", "flavour": "x"}, `unknown argument "flavour"` + takes},
		{"two", map[string]any{"code": "print:x", "stdn": "", "zz": 1}, `unknown argument "stdn"; did you mean "stdin"?; unknown argument "zz"` + takes},
		{"a file's field", map[string]any{"code": "print:x", "files": []any{map[string]any{"path": "a", "contents": "x"}}},
			`files[0]: unknown field "contents"; did you mean "content"? (a file has path and one of content, content_base64 or uri)`},
	} {
		res, err := cs.CallTool(context.Background(), &mcp.CallToolParams{Name: "exec", Arguments: tc.args})
		if err != nil || !res.IsError || text(res) != tc.want {
			t.Errorf("exec with %s: %v, isError %v, %q; want isError %q", tc.name, err, res != nil && res.IsError, text(res), tc.want)
		}
	}
	if n := eng.calls.Load(); n != 0 {
		t.Errorf("the engine ran %d calls, want none", n)
	}
	data, _ := os.ReadFile(auditPath)
	var recs int
	for sc := bufio.NewScanner(strings.NewReader(string(data))); sc.Scan(); recs++ {
		var r map[string]any
		json.Unmarshal(sc.Bytes(), &r)
		if e, _ := r["error"].(string); !strings.Contains(e, "unknown ") || r["verdict"] != verdictInput {
			t.Errorf("audit record %v, want a refused call naming the unknown argument", r)
		}
	}
	if recs != 7 {
		t.Errorf("%d audit records, want one per refused call (7)", recs)
	}
}

// end_session needs no code; a call with neither is refused naming code.
func TestEndSessionWithoutCode(t *testing.T) {
	_, cs := connect(t, newFakeEngine(), sessionOptions(), nil)
	out, _ := call(t, cs, map[string]any{"code": "set:x=1", "session": "new"})
	if ended, _ := call(t, cs, map[string]any{"session": out.Session, "end_session": true}); ended.SessionEnded != "closed" {
		t.Errorf("end_session alone: %+v, want the session closed", ended)
	}
	for _, args := range []map[string]any{{}, {"stdin": "x"}, {"session": "new"}} {
		if msg := callErr(t, cs, args); !strings.HasPrefix(msg, "code is required") {
			t.Errorf("exec with %v: %q, want a refusal naming code", args, msg)
		}
	}
}

func TestClosest(t *testing.T) {
	known := []string{"code", "end_session", "files", "session", "stdin", "timeout_s"}
	for name, want := range map[string]string{
		"timeout": "timeout_s", "timeout_ms": "timeout_s", "TIMEOUT_S": "timeout_s", "stdn": "stdin", "file": "files",
		"end": "end_session", "endsession": "end_session", "sesion": "session", "session_id": "session",
		"cod": "code", "source": "", "script": "", "x": "", "": "", strings.Repeat("a", 1000): "",
	} {
		if got := closest(name, known); got != want {
			t.Errorf("closest(%.20q) = %q, want %q", name, got, want)
		}
	}
}
