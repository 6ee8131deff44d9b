#!/usr/bin/env bash
# make image-test: builds the mcp-exec image from the repository's
# Dockerfile with podman, offline (bases seeded by seed-bases.sh, then
# --pull=never), and runs image_test.go against it: one sandboxed call per
# runtime over stdio and over HTTP with the privileged recipe, and the
# mcp-exec 0.5.4 mcpServers entry's flags over stdio.
#
# Prerequisites: root, podman, debootstrap, Go (.ci/install-deps installs
# the packages). Under CI=true a missing one fails; otherwise it skips.
#
# Environment:
#   MCP_EXEC_IMAGE_CACHE   where the debootstrap base is cached
#                          (default /var/cache/mcp-exec-ci)
#   IMAGE_TEST_IMAGE       the tag built and tested (default
#                          localhost/mcp-exec:image-test)
#   IMAGE_TEST_RUN         a go test -run pattern (default: all)
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
repo="$(cd "$here/../.." && pwd)"
cd "$repo"
export PATH="/usr/local/go/bin:$PATH"
start=$SECONDS
image="${IMAGE_TEST_IMAGE:-localhost/mcp-exec:image-test}"

log() { printf '%s image-test: %s\n' "$(date +%T)" "$*" >&2; }
skip_or_fail() {
	if [[ "${CI:-}" == "true" ]]; then
		log "FAIL — $1"
		exit 1
	fi
	log "SKIP — $1"
	exit 0
}

[[ $(id -u) -eq 0 ]] || skip_or_fail "needs root (podman's root storage, debootstrap, privileged containers)"
for c in podman debootstrap; do
	command -v "$c" >/dev/null || skip_or_fail "$c is not installed (apt-get install podman buildah debootstrap runc; or bash .ci/install-deps)"
done
command -v go >/dev/null || skip_or_fail "go is not on PATH (expected in /usr/local/go/bin)"

# What podman needs to run containers on these hosts: Debian's runc (crun
# refuses containers on cgroup v1 hybrid hosts), ulimits at most the host's
# hard limits (podman's default asks for more than a container host may
# give), and RUN steps in chroot isolation (no nested OCI runtime needed).
# --health-interval disable: no systemd timer for the HEALTHCHECK (there
# may be no systemd); the test runs it itself with podman healthcheck run.
runtime=/usr/sbin/runc
[[ -x "$runtime" ]] || runtime="$(command -v runc || true)"
[[ -n "$runtime" ]] || skip_or_fail "runc is not installed (apt-get install runc)"
nofile=$(ulimit -Hn)
nproc=$(ulimit -Hu)
[[ "$nofile" == unlimited || "$nofile" -gt 4096 ]] && nofile=4096
[[ "$nproc" == unlimited || "$nproc" -gt 4096 ]] && nproc=4096
# Containers of this run are named $prefix…, so that only they are
# cleaned up, not those of another run on the same machine.
prefix="mcp-exec-image-test-$$-"
engine_flags="--runtime $runtime --ulimit nofile=$nofile:$nofile --ulimit nproc=$nproc:$nproc --health-interval disable"

log "1/3 seeding the base images offline"
"$here/seed-bases.sh" "$repo/Dockerfile"

version="$(git describe --tags --always --dirty 2>/dev/null || echo dev)"
log "2/3 podman build --pull=never → $image (version $version)"
t0=$SECONDS
# The builder stage is tagged too ($image-build, from the layer cache in a
# second), so that what each tag named before can be removed once
# replaced: a build leaves the old images behind untagged otherwise, some
# 700 MB per changed run.
builder="$image-build"
previous=()
for tag in "$image" "$builder"; do
	previous+=("$(podman image inspect --format '{{.Id}}' "$tag" 2>/dev/null || true)")
done
build() {
	# --format docker keeps the HEALTHCHECK (the OCI format has no field
	# for it); --jobs 2 builds the two stages side by side.
	podman build --pull=never --isolation=chroot --format docker --jobs 2 \
		--build-arg "VERSION=$version" "$@" -f Dockerfile . 2>&1 |
		while IFS= read -r line; do printf '%s   %s\n' "$(date +%T)" "$line"; done >&2
}
build -t "$image"
build --quiet --target build -t "$builder" >/dev/null
log "built in $((SECONDS - t0))s"
for old in "${previous[@]}"; do
	[[ -z "$old" ]] && continue
	if [[ "$old" != "$(podman image inspect --format '{{.Id}}' "$image")" && "$old" != "$(podman image inspect --format '{{.Id}}' "$builder")" ]]; then
		podman rmi "$old" >/dev/null 2>&1 || true
	fi
done
podman images --filter "reference=$image" --format '{{.Repository}}:{{.Tag}} {{.ID}} {{.Size}}' >&2

log "3/3 go test -tags imagetest ./test/image/ (engine flags: $engine_flags)"
t0=$SECONDS
status=0
MCP_EXEC_TEST_IMAGE="$image" MCP_EXEC_TEST_ENGINE_FLAGS="$engine_flags" MCP_EXEC_TEST_NAME_PREFIX="$prefix" \
	go test -tags 'imagetest' -count=1 -v -timeout 15m ${IMAGE_TEST_RUN:+-run "$IMAGE_TEST_RUN"} ./test/image/ || status=$?
log "tests done in $((SECONDS - t0))s"

# Leave no container of this run behind (a killed test could).
leftover="$(podman ps -a --filter "name=^$prefix" --format '{{.Names}}')"
if [[ -n "$leftover" ]]; then
	log "removing leftover containers: $leftover"
	podman rm -f $leftover >/dev/null || true
fi
if [[ $status -ne 0 ]]; then
	log "FAIL (status $status) after $((SECONDS - start))s"
	exit "$status"
fi
log "PASS in $((SECONDS - start))s"
