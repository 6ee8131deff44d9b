package runtime_test

import (
	"strings"
	"testing"

	"github.com/inhuman/mcp-exec/policy"
	"github.com/inhuman/mcp-exec/runtime"
)

// newForkHarness is a libcontainer runtime whose sandboxes are forked
// from templates.
// Its cleanup fails the test when a sandbox was not a fork after all: a
// template that fails makes a fresh container instead, which would pass
// every property test without testing forks.
func newForkHarness(t *testing.T, limits policy.Limits) *harness {
	t.Helper()
	h := newHarnessConfig(t, runtime.Libcontainer, limits, runtime.Config{Fork: runtime.ForkConfig{Enabled: true}})
	t.Cleanup(func() {
		if st := h.rt.(*runtime.LibcontainerRuntime).Forking(); st.LastError != "" {
			t.Errorf("a sandbox was a fresh container, not a fork: %s", st.LastError)
		}
	})
	return h
}

func TestForkSmoke(t *testing.T) {
	h := newForkHarness(t, policy.DefaultLimits())
	for i := 0; i < 3; i++ {
		res := h.mustRun("import os; print(os.getpid(), os.getppid(), os.getuid(), open('/proc/self/status').read().count('\\n'))")
		t.Logf("stdout %q stderr %q exit %d", res.Stdout, res.Stderr, res.ExitCode)
		if res.ExitCode != 0 || !strings.HasPrefix(string(res.Stdout), "2 0 65532") {
			t.Fatalf("exit %d stdout %q stderr %q; forking: %+v", res.ExitCode, res.Stdout, res.Stderr, h.rt.(*runtime.LibcontainerRuntime).Forking())
		}
	}
}
