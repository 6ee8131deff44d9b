package server

import (
	"math"
	"net/http"
	"testing"
)

func TestHasToken(t *testing.T) {
	const token = "0123456789abcdef"
	for _, tc := range []struct {
		name   string
		header http.Header
		want   bool
	}{
		{"none", http.Header{}, false},
		{"bearer", http.Header{"Authorization": {"Bearer " + token}}, true},
		{"bearer, any case", http.Header{"Authorization": {"BEARER " + token}}, true},
		{"wrong bearer", http.Header{"Authorization": {"Bearer " + token + "x"}}, false},
		{"prefix of the token", http.Header{"Authorization": {"Bearer " + token[:8]}}, false},
		{"no scheme", http.Header{"Authorization": {token}}, false},
		{"basic", http.Header{"Authorization": {"Basic " + token}}, false},
		{"X-MCP-AUTH", http.Header{"X-Mcp-Auth": {token}}, true},
		{"wrong X-MCP-AUTH", http.Header{"X-Mcp-Auth": {"nope"}}, false},
		{"empty X-MCP-AUTH", http.Header{"X-Mcp-Auth": {""}}, false},
		{"wrong bearer, right X-MCP-AUTH", http.Header{"Authorization": {"Bearer nope"}, "X-Mcp-Auth": {token}}, true},
	} {
		if got := hasToken(tc.header, []byte(token)); got != tc.want {
			t.Errorf("hasToken(%s) = %v, want %v", tc.name, got, tc.want)
		}
	}
}

func TestMaxMessageBytes(t *testing.T) {
	for _, tc := range []struct {
		code, stdin, files, want int64
	}{
		// The defaults: 12 MiB of escaped code and stdin, 20 MiB of
		// files, 1 MiB for the rest.
		{1 << 20, 1 << 20, 10 << 20, 33 << 20},
		{1, 0, 0, 6 + 1<<20},
		{1, math.MaxInt64 / 2, 0, math.MaxInt64},
		{1, 1, math.MaxInt64 / 2, math.MaxInt64},
	} {
		o := testOptions()
		o.MaxCodeBytes, o.MaxStdinBytes, o.MaxFileBytes = tc.code, tc.stdin, tc.files
		if got := maxMessageBytes(o); got != tc.want {
			t.Errorf("maxMessageBytes(code %d, stdin %d, files %d) = %d, want %d", tc.code, tc.stdin, tc.files, got, tc.want)
		}
	}
}
