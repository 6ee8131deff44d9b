package names

import (
	"strings"
	"testing"
)

func TestDistance(t *testing.T) {
	for _, c := range []struct {
		a, b string
		want int
	}{
		{"", "", 0},
		{"timeout", "timeout_s", 2},
		{"MCP_EXEC_MEMROY_MB", "MCP_EXEC_MEMORY_MB", 2},
		{"kitten", "sitting", 3},
		{strings.Repeat("x", 65), "code", 65},
	} {
		if got := Distance(c.a, c.b); got != c.want {
			t.Errorf("Distance(%.20q, %q) = %d, want %d", c.a, c.b, got, c.want)
		}
	}
}
