package runtime_test

import (
	"strings"
	"testing"

	"github.com/inhuman/mcp-exec/policy"
	"github.com/inhuman/mcp-exec/runtime"
)

// newForkHarness is a libcontainer runtime whose sandboxes are forked
// from templates.
func newForkHarness(t *testing.T, limits policy.Limits) *harness {
	t.Helper()
	return newHarnessConfig(t, runtime.Libcontainer, limits, runtime.Config{Fork: runtime.ForkConfig{Enabled: true}})
}

func TestForkSmoke(t *testing.T) {
	h := newForkHarness(t, policy.DefaultLimits())
	for i := 0; i < 3; i++ {
		res := h.mustRun("import os; print(os.getpid(), os.getppid(), os.getuid(), open('/proc/self/status').read().count('\\n'))")
		t.Logf("stdout %q stderr %q exit %d", res.Stdout, res.Stderr, res.ExitCode)
		if res.ExitCode != 0 || !strings.HasPrefix(string(res.Stdout), "2 1 65532") {
			t.Fatalf("exit %d stdout %q stderr %q", res.ExitCode, res.Stdout, res.Stderr)
		}
	}
}
