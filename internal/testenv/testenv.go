// Package testenv decides, in one place for every package, whether a test
// that needs the real machine can run: root, real containers, a runtime, a
// host package.
//
// The rule it keeps: under -short such tests are skipped (make unit runs
// without root and starts nothing); otherwise a missing prerequisite skips
// the test saying exactly what is missing, except under CI=true, where the
// build machine is supposed to have everything and a missing prerequisite
// is a failure.
package testenv

import (
	"fmt"
	"os"
	"runtime"
	"strconv"
	"sync"
	"testing"
	"time"
)

// Real marks a test that needs the real machine (root, containers, a
// runtime, host packages): under -short it is skipped.
func Real(t testing.TB) {
	t.Helper()
	if testing.Short() {
		t.Skip("-short: skipping a test that needs the real machine (root, containers or host packages)")
	}
}

// Missing ends a test whose prerequisite is missing: a failure under
// CI=true, a skip saying what is missing elsewhere.
func Missing(t testing.TB, format string, args ...any) {
	t.Helper()
	msg := fmt.Sprintf(format, args...)
	if os.Getenv("CI") == "true" {
		t.Fatalf("prerequisite missing (CI=true makes this a failure): %s", msg)
	}
	t.Skipf("skipping: %s", msg)
}

// Root is Real for a test that also needs uid 0.
func Root(t testing.TB) {
	t.Helper()
	Real(t)
	if os.Geteuid() != 0 {
		Missing(t, "root is required (running as uid %d)", os.Geteuid())
	}
}

// Optional skips a test of something the product does not need, which a
// host may or may not have (another interpreter manager, such as pyenv):
// a skip everywhere, CI included, saying what is absent.
func Optional(t testing.TB, format string, args ...any) {
	t.Helper()
	t.Skipf("skipping: not on this host, and not required: %s", fmt.Sprintf(format, args...))
}

// Patience is how long Eventually waits: long enough for a busy machine,
// where a sandbox may take seconds to start, short enough to end a test
// that waits for what will never come.
const Patience = 2 * time.Minute

// Eventually waits, polling, until cond holds, and fails the test after
// Patience: a test waits for a condition, never for a fixed time.
func Eventually(t testing.TB, what string, cond func() bool) {
	t.Helper()
	EventuallyWithin(t, Patience, what, cond)
}

// EventuallyWithin is Eventually with its own bound, for a test that
// asserts how soon something happens (a killed server's processes gone
// within seconds).
func EventuallyWithin(t testing.TB, d time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(d)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %v waiting for %s", d, what)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// Full says whether the whole test matrix runs (MCP_EXEC_TEST_MATRIX=full):
// every sandbox property on every runtime in every mode, as gVisor's test
// platforms run on a schedule. By default a property runs once per
// runtime plus the modes it declares can change it.
func Full() bool { return os.Getenv("MCP_EXEC_TEST_MATRIX") == "full" }

var sandboxes struct {
	once sync.Once
	sem  chan struct{}
}

// Parallel marks a sandbox subtest parallel and holds one of the
// machine's sandbox places until it ends: twice the CPUs by default (a
// sandbox test spends most of its time waiting for a sandbox to start or
// end), MCP_EXEC_TEST_PARALLEL to choose. Subtests of one property run
// together; the properties themselves one after another, so that a test
// that sets a package's test seam never shares it.
func Parallel(t *testing.T) {
	t.Helper()
	sandboxes.once.Do(func() {
		n := 2 * runtime.NumCPU()
		if v, err := strconv.Atoi(os.Getenv("MCP_EXEC_TEST_PARALLEL")); err == nil && v > 0 {
			n = v
		}
		sandboxes.sem = make(chan struct{}, n)
	})
	t.Parallel()
	sandboxes.sem <- struct{}{}
	t.Cleanup(func() { <-sandboxes.sem })
}
