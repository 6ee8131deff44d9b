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
	"testing"
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
