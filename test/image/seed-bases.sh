#!/usr/bin/env bash
# Seeds, without a container registry, the base images that the Dockerfile's
# FROM lines name, so that `podman build --pull=never` can build the image
# on machines that reach only Debian's mirror (and the Go module proxy).
#
#   debian:bookworm-slim  debootstrap --variant=minbase, slimmed the way the
#                         official image is (no docs, apt lists cleaned,
#                         deb822 sources with -updates and -security);
#   golang:X-bookworm     that base + this machine's Go (X must match it) +
#                         what the official image adds for cgo builds
#                         (gcc, libc6-dev, make, pkg-config, git);
#                         built by golang-seed.Containerfile.
#
# Each seed is recorded in the cache dir with a hash of what it was made
# from and is remade when that changes. An image of that name that this
# script did not make is a real one (pulled on a machine with a registry)
# and is left alone.
#
# Cache: the debootstrap tree is kept as a tarball under $MCP_EXEC_IMAGE_CACHE
# (default /var/cache/mcp-exec-ci), keyed by the suite, mirror and what is
# done to it; the images themselves stay in podman's storage. A second run
# on the same machine takes seconds. Runs of this script on one machine
# take turns (flock on the cache dir).
#
# Usage: test/image/seed-bases.sh [DOCKERFILE]   (as root)
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
dockerfile="${1:-$here/../../Dockerfile}"
cache="${MCP_EXEC_IMAGE_CACHE:-/var/cache/mcp-exec-ci}"
mirror="${DEBIAN_MIRROR:-http://deb.debian.org/debian}"
security_mirror="${DEBIAN_SECURITY_MIRROR:-http://deb.debian.org/debian-security}"
goroot="${GOROOT_FOR_IMAGE:-/usr/local/go}"
host_ca=/usr/local/share/ca-certificates
# Bump when what a seeded image holds changes: it invalidates the caches.
seed_version=1

log() { printf '%s seed-bases: %s\n' "$(date +%T)" "$*" >&2; }
die() {
	log "FAIL — $*"
	exit 1
}

[[ $(id -u) -eq 0 ]] || die "needs root (debootstrap, podman's root storage)"
for c in podman debootstrap sha256sum flock tar; do
	command -v "$c" >/dev/null || die "$c is not installed (apt-get install podman debootstrap coreutils util-linux tar)"
done
[[ -f "$dockerfile" ]] || die "no Dockerfile at $dockerfile"

mkdir -p "$cache"
exec 9>"$cache/.lock"
if ! flock -n 9; then
	log "another seeding run holds $cache/.lock; waiting for it"
	flock 9
fi

# work is a scratch dir under the cache, removed at exit. debootstrap
# mounts proc and sys inside its target: never rm -rf through a mount that
# a failed run left behind.
work=""
cleanup() {
	[[ -n "$work" && -d "$work" ]] || return 0
	local m
	for m in proc sys dev/pts dev; do
		if mountpoint -q "$work/root/$m"; then umount -l "$work/root/$m" || true; fi
	done
	rm -rf --one-file-system "$work"
}
trap cleanup EXIT

# key STRING... → a short hash naming what an image or tarball was made from.
key() { printf '%s\n' "$@" | sha256sum | cut -c1-16; }

# fq NAME → the fully qualified name docker and podman give a Docker Hub
# short name, so that FROM debian:bookworm-slim finds the seeded image.
fq() {
	local n="$1" first="${1%%/*}"
	if [[ "$n" == */* && ("$first" == *.* || "$first" == *:* || "$first" == localhost) ]]; then
		echo "$n"
	elif [[ "$n" == */* ]]; then
		echo "docker.io/$n"
	else
		echo "docker.io/library/$n"
	fi
}

# Which images this script made, and from what: $cache/seed.NAME holds
# "KEY IMAGE-ID" (a record, not a label: a label would be inherited by
# every image built on the seed).
record() { echo "$cache/seed.$(tr '/:' '__' <<<"$1")"; }
remember() { echo "$2 $(podman image inspect --format '{{.Id}}' "$1")" >"$(record "$1")"; }

# stale is the id of a seed that seeded() found outdated; it is removed
# once its replacement is tagged (unless something still uses it).
stale=""
drop_stale() {
	[[ -n "$stale" ]] || return 0
	podman rmi "$stale" >/dev/null 2>&1 && log "removed the stale seed ${stale:0:12}" || true
	stale=""
}

# seeded NAME KEY → 0 when NAME is there and should not be (re)made: it is
# our seed of this KEY, or an image this script did not make (pulled on a
# machine with a registry), which is not ours to replace.
seeded() {
	local name="$1" want="$2" id rkey="" rid=""
	podman image exists "$name" || return 1
	id="$(podman image inspect --format '{{.Id}}' "$name")"
	[[ -f "$(record "$name")" ]] && read -r rkey rid <"$(record "$name")"
	if [[ "$id" != "$rid" ]]; then
		log "$name: present and not seeded here (pulled?); using it"
		return 0
	fi
	if [[ "$rkey" == "$want" ]]; then
		log "$name: seeded already (seed $want)"
		return 0
	fi
	log "$name: seed $rkey is stale (want $want); re-seeding"
	stale="$id"
	return 1
}

suite=bookworm
debian_key="$(key "$seed_version" "$suite" minbase "$mirror" "$security_mirror")"
debian_tar="$cache/debian-$suite-minbase-$debian_key.tar"

# debootstrap_base → $debian_tar, made once per key.
debootstrap_base() {
	if [[ -s "$debian_tar" ]]; then
		log "debootstrap base cached: $debian_tar"
		return
	fi
	work="$(mktemp -d "$cache/debootstrap.XXXXXX")"
	log "debootstrap --variant=minbase $suite from $mirror (cold cache: about 5 minutes)"
	local t0=$SECONDS
	if ! debootstrap --variant=minbase "$suite" "$work/root" "$mirror" >"$work/debootstrap.log" 2>&1; then
		tail -n 30 "$work/debootstrap.log" >&2
		[[ -f "$work/root/debootstrap/debootstrap.log" ]] && tail -n 30 "$work/root/debootstrap/debootstrap.log" >&2
		die "debootstrap failed"
	fi
	log "debootstrap done in $((SECONDS - t0))s; slimming it like the official bookworm-slim"
	local r="$work/root"
	rm -f "$r/etc/apt/sources.list"
	cat >"$r/etc/apt/sources.list.d/debian.sources" <<-EOF
		Types: deb
		URIs: $mirror
		Suites: $suite $suite-updates
		Components: main
		Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg

		Types: deb
		URIs: $security_mirror
		Suites: $suite-security
		Components: main
		Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg
	EOF
	# What the official image's /etc/dpkg/dpkg.cfg.d/docker and
	# /etc/apt/apt.conf.d/docker-* say: no docs or man pages, no
	# recommends by habit of the Dockerfiles, apt caches cleaned.
	cat >"$r/etc/dpkg/dpkg.cfg.d/docker" <<-'EOF'
		path-exclude /usr/share/doc/*
		path-include /usr/share/doc/*/copyright
		path-exclude /usr/share/man/*
		path-exclude /usr/share/groff/*
		path-exclude /usr/share/info/*
		path-exclude /usr/share/lintian/*
		path-exclude /usr/share/linda/*
	EOF
	cat >"$r/etc/apt/apt.conf.d/docker-clean" <<-'EOF'
		DPkg::Post-Invoke { "rm -f /var/cache/apt/archives/*.deb /var/cache/apt/archives/partial/*.deb /var/cache/apt/*.bin || true"; };
		APT::Update::Post-Invoke { "rm -f /var/cache/apt/archives/*.deb /var/cache/apt/archives/partial/*.deb /var/cache/apt/*.bin || true"; };
		Dir::Cache::pkgcache "";
		Dir::Cache::srcpkgcache "";
	EOF
	echo 'Acquire::GzipIndexes "true";' >"$r/etc/apt/apt.conf.d/docker-gzip-indexes"
	find "$r/usr/share/doc" -mindepth 1 -not -name copyright -not -type d -delete 2>/dev/null || true
	rm -rf "$r/usr/share/man"/* "$r/usr/share/info"/* "$r/var/lib/apt/lists"/* "$r/var/cache/apt"/*.bin \
		"$r/var/cache/apt/archives"/*.deb "$r/var/log"/*.log "$r/var/log/apt"/* "$r/debootstrap"
	# The engine provides these per container.
	: >"$r/etc/resolv.conf"
	rm -f "$r/etc/hostname"
	tar --numeric-owner --xattrs -C "$r" -cf "$work/base.tar" .
	mv "$work/base.tar" "$debian_tar"
	log "cached $debian_tar ($(du -m "$debian_tar" | cut -f1) MiB)"
}

debian_ready=""
seed_debian() {
	local name="$1"
	[[ "$debian_ready" == "$name" ]] && return
	debian_ready="$name"
	seeded "$name" "$debian_key" && return
	debootstrap_base
	log "podman import $debian_tar → $name"
	podman import \
		--change 'ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' \
		--change 'CMD ["bash"]' \
		--quiet "$debian_tar" "$name" >/dev/null
	remember "$name" "$debian_key"
	drop_stale
}

seed_golang() {
	local name="$1" want="$2" have
	[[ -x "$goroot/bin/go" ]] || die "no Go at $goroot (GOROOT_FOR_IMAGE) to seed $name from"
	have="$(head -n1 "$goroot/VERSION")"
	# golang:1.26-bookworm holds some go1.26.x: this machine's must be one.
	[[ "$have" == "go$want" || "$have" == "go$want".* ]] ||
		die "$name needs Go $want but $goroot has $have; install Go $want there or set GOROOT_FOR_IMAGE"
	local debian_name containerfile="$here/golang-seed.Containerfile"
	debian_name="$(fq debian:$suite-slim)"
	seed_debian "$debian_name"
	local k
	local cas="" mounts=()
	if compgen -G "$host_ca/*.crt" >/dev/null; then
		cas="$(cat "$host_ca"/*.crt | sha256sum)"
		mounts=(-v "$host_ca:/run/host-ca:ro")
		log "the host trusts local CAs ($host_ca): the golang seed trusts them too"
	fi
	k="$(key "$seed_version" "$debian_key" "$have" "$(sha256sum <"$containerfile")" "$cas")"
	seeded "$name" "$k" && return
	log "building $name from $debian_name + $goroot ($have)"
	# The context is GOROOT itself; RUN steps need chroot isolation on
	# hosts whose OCI runtime refuses nested containers.
	podman build --pull=never --isolation=chroot --quiet \
		--build-arg "BASE=$debian_name" --build-arg "GOLANG_VERSION=${have#go}" \
		"${mounts[@]}" \
		-f "$containerfile" -t "$name" "$goroot" >/dev/null
	remember "$name" "$k"
	drop_stale
}

mapfile -t bases < <(awk 'toupper($1) == "FROM" { for (i = 2; i <= NF; i++) if ($i !~ /^--/) { print $i; break } }' "$dockerfile" | sort -u)
[[ ${#bases[@]} -gt 0 ]] || die "no FROM line in $dockerfile"
for b in "${bases[@]}"; do
	name="$(fq "$b")"
	case "$name" in
	docker.io/library/debian:"$suite"-slim) seed_debian "$name" ;;
	docker.io/library/golang:*-"$suite") v="${name#docker.io/library/golang:}" && seed_golang "$name" "${v%-"$suite"}" ;;
	*) die "cannot seed $b (FROM in $dockerfile): only debian:$suite-slim and golang:X-$suite are known here" ;;
	esac
done
log "bases ready: ${bases[*]}"
