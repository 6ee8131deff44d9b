package server

import (
	"bufio"
	"bytes"
	"encoding/json"
	"log/slog"
	"strings"
	"testing"
)

func TestFilterLines(t *testing.T) {
	const limit = 100 << 10
	// Longer than the reader's 64 KiB buffer, within the limit.
	long := `{"jsonrpc":"2.0","id":5,"method":"ping","params":{"x":"` + strings.Repeat("x", 80<<10) + `"}}`
	in := strings.Join([]string{
		`{"jsonrpc":"2.0","id":1,"method":"ping"}`,
		``,
		`   `,
		`{not json`,
		`{"jsonrpc":"2.0","id":"a","method":5}`,
		`"just a string"`,
		`[{"jsonrpc":"2.0","id":2,"method":"ping"}]`,
		// Over the limit, with its id before the bulk.
		`{"jsonrpc":"2.0","id":3,"method":"tools/call","params":{"x":"` + strings.Repeat("x", 200<<10) + `"}}`,
		// Over the limit, its id after the bulk: unknown.
		`{"params":{"x":"` + strings.Repeat("x", 200<<10) + `"},"jsonrpc":"2.0","id":9,"method":"tools/call"}`,
		long,
		"  \t" + `{"jsonrpc":"2.0","method":"notifications/initialized"}` + "\r",
		`{"jsonrpc":"2.0","id":4,"method":"ping"}`, // no newline: EOF ends it
	}, "\n")
	var passed, replies bytes.Buffer
	if err := filterLines(strings.NewReader(in), &passed, &replies, limit, slog.New(slog.DiscardHandler)); err != nil {
		t.Fatalf("filterLines: %v", err)
	}

	wantPassed := strings.Join([]string{
		`{"jsonrpc":"2.0","id":1,"method":"ping"}`,
		long,
		`{"jsonrpc":"2.0","method":"notifications/initialized"}`,
		`{"jsonrpc":"2.0","id":4,"method":"ping"}`,
	}, "\n") + "\n"
	if got := passed.String(); got != wantPassed {
		t.Errorf("filterLines passed on %.300q, want %.300q", got, wantPassed)
	}

	type reply struct {
		ID    any `json:"id"`
		Error struct {
			Code    int64  `json:"code"`
			Message string `json:"message"`
		} `json:"error"`
	}
	want := []struct {
		id   any
		code int64
	}{{nil, -32700}, {"a", -32600}, {nil, -32600}, {nil, -32600}, {float64(3), -32600}, {nil, -32600}}
	sc := bufio.NewScanner(&replies)
	var got []reply
	for sc.Scan() {
		var r reply
		if err := json.Unmarshal(sc.Bytes(), &r); err != nil {
			t.Fatalf("reply %q: %v", sc.Text(), err)
		}
		got = append(got, r)
	}
	if len(got) != len(want) {
		t.Fatalf("filterLines replied %d times, want %d: %s", len(got), len(want), replies.String())
	}
	for i, w := range want {
		if got[i].ID != w.id || got[i].Error.Code != w.code || got[i].Error.Message == "" {
			t.Errorf("reply %d = %+v, want id %v, code %d and a message", i, got[i], w.id, w.code)
		}
	}
}
