package runtime_test

import (
	"os"
	"testing"

	"github.com/inhuman/mcp-exec/host"
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

// debianRunsc is Debian's runsc, when the default is another (the pinned
// current gVisor): the fallback, tested as well. CI installs both.
func debianRunsc(t *testing.T) string {
	t.Helper()
	const path = "/usr/bin/runsc"
	if _, err := os.Stat(path); err != nil {
		need(t, "Debian's runsc, the fallback runtime, is not installed (apt-get install runsc)")
	}
	if _, err := os.Stat(host.PinnedRunsc); err != nil {
		// Then the default runsc is Debian's, already tested as runsc;
		// under CI the pinned gVisor must be there (.ci/install-runsc).
		need(t, "the pinned current gVisor %s is not installed (.ci/install-runsc); Debian's runsc is tested as runsc", host.PinnedRunsc)
	}
	if err := runtime.RunscUsable(runtime.Config{RunscPath: path}); err != nil {
		need(t, "Debian's runsc: %v", err)
	}
	return path
}
