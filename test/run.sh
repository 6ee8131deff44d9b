#!/usr/bin/env bash
# make test: every test of the project, phase by phase — the build and
# vet, the Go tests (unit tests, real sandboxes as root, the built binary),
# the MCP end-to-end suites — with each phase's seconds, the Go tests'
# failures in full and their 20 slowest tests (test/report).
#
# Under CI=true a missing prerequisite fails a test instead of skipping it.
# MCP_EXEC_TEST_MATRIX=full runs every sandbox property in every mode on
# every runtime (the scheduled run, docs/development.md); the default runs
# each once per runtime plus the modes it declares.
set -uo pipefail
cd "$(dirname "$0")/.."
export PATH="/usr/local/go/bin:$PATH"
GO="${GO:-go}"
TAGS='seccomp netgo osusergo'

declare -a phases
status=0
phase() {
	local name="$1" start=$SECONDS rc
	shift
	echo "=== phase $name"
	"$@"
	rc=$?
	phases+=("$(printf '%-8s %5ds  %s' "$name" $((SECONDS - start)) "$([[ $rc -eq 0 ]] && echo ok || echo "FAILED ($rc)")")")
	[[ $rc -eq 0 ]] || status=1
	return $rc
}

gotest() {
	"$GO" test -tags "$TAGS" -ldflags '-extldflags=-static' -count=1 -timeout 20m -json ./... | "$GO" run ./test/report
}

phase build make -s build && phase vet make -s vet && {
	phase go gotest
	phase e2e test/e2e/run.sh
}
echo
echo "phases:"
printf '  %s\n' "${phases[@]}"
exit $status
