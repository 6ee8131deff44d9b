package main

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
		stdin, want int64
	}{
		{1 << 20, 10 << 20}, // the default: 6 MiB of escaped stdin and 4 MiB for the rest
		{1, 6 + 4<<20},
		{math.MaxInt64, math.MaxInt64},
	} {
		cfg := defaultConfig()
		cfg.MaxStdinBytes = tc.stdin
		if got := maxMessageBytes(cfg); got != tc.want {
			t.Errorf("maxMessageBytes(MaxStdinBytes=%d) = %d, want %d", tc.stdin, got, tc.want)
		}
	}
}
