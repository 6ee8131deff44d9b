package runtime_test

import (
	"testing"

	"github.com/inhuman/mcp-exec/runtime"
)

// runscAvailable reports whether the runsc runtime can be tested here; when
// it cannot, need skips (or fails under CI) with the reason.
func runscAvailable(t *testing.T) bool {
	t.Helper()
	if err := runtime.RunscUsable(runtime.Config{}); err != nil {
		need(t, "%v", err)
		return false
	}
	return true
}

func runscAvailableB() bool { return runtime.RunscUsable(runtime.Config{}) == nil }
