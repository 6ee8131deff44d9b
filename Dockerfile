# mcp-exec in a container.
#
#   docker build -t mcp-exec .          (or: make image)
#
# Drop-in for an mcp-exec 0.5.4 `mcpServers` entry (stdio; no privileges,
# so no per-call container can be made and the `auto` runtime runs each
# call as a fresh process, the outer container being the boundary):
#
#   docker run -i --rm --network none --read-only --cap-drop ALL \
#     --security-opt no-new-privileges --user 65532:65532 \
#     --tmpfs /tmp:rw,noexec,nosuid,size=64m --memory 256m --pids-limit 128 --cpus 1 mcp-exec
#
# The full sandbox, a fresh container per call (what `mcp-exec doctor`
# prints as the fix; NET_ADMIN and SYS_PTRACE are not needed for runsc):
#
#   docker run --user 0:0 --cap-add SYS_ADMIN --cap-add NET_ADMIN --cap-add SYS_PTRACE \
#     --security-opt seccomp=unconfined --security-opt apparmor=unconfined \
#     --security-opt systempaths=unconfined \
#     --cgroupns=host -v /sys/fs/cgroup:/sys/fs/cgroup:rw \
#     -e MCP_EXEC_TRANSPORT=http -e MCP_EXEC_AUTH_TOKEN=... -p 127.0.0.1:8080:8080 mcp-exec
#
# test/image/run.sh (make image-test) builds this file offline and runs
# both of these.

FROM golang:1.26-bookworm AS build
# libseccomp-dev brings libseccomp.a for the static link; gcc and
# libc6-dev come with the golang image.
RUN apt-get update \
    && apt-get install -y --no-install-recommends libseccomp-dev pkg-config \
    && rm -rf /var/lib/apt/lists/*
WORKDIR /src
COPY go.mod go.sum ./
RUN --mount=type=cache,target=/go/pkg/mod go mod download
COPY . .
ARG VERSION=dev
# cgo for libcontainer's nsenter and libseccomp; -tags seccomp or a seccomp
# profile is refused (never drop it). Static, so the runtime stage needs no
# libseccomp2 and the binary runs on any distribution: netgo and osusergo
# keep glibc's NSS (which cannot be linked statically) out. The build
# fails if the result still has a dynamic section.
RUN --mount=type=cache,target=/go/pkg/mod --mount=type=cache,target=/root/.cache/go-build \
    CGO_ENABLED=1 go build -tags 'seccomp netgo osusergo' -trimpath \
        -ldflags "-s -w -X main.version=${VERSION} -extldflags=-static" \
        -o /out/mcp-exec ./cmd/mcp-exec \
    && if readelf -d /out/mcp-exec | grep -q NEEDED; then echo "mcp-exec is not static" >&2; exit 1; fi

FROM debian:bookworm-slim
# python3: the interpreter the sandbox's read-only rootfs is built from
# (and, under the process runtime, the one that runs the code).
# The python3-* packages, fonts-dejavu-core and busybox-static: what
# MCP_EXEC_PACKAGES and MCP_EXEC_SHELL below make importable and callable
# in the sandbox, the set mcp-exec 0.5.4's image had.
# runsc: gVisor, the second runtime (MCP_EXEC_RUNTIME=runsc).
# python3-munkres: satisfies python3-fonttools' "python3-scipy |
# python3-munkres", else apt takes scipy, which drags in pythran and g++
# (hundreds of MB nobody asked for).
RUN apt-get update \
    && apt-get install -y --no-install-recommends \
        python3 runsc \
        python3-numpy python3-pandas python3-matplotlib python3-pil python3-yaml python3-jinja2 \
        python3-munkres fonts-dejavu-core busybox-static \
    && rm -rf /var/lib/apt/lists/* \
    && groupadd --system --gid 65532 nonroot \
    && useradd --system --uid 65532 --gid 65532 --no-create-home --home-dir /nonexistent --shell /usr/sbin/nologin nonroot
COPY --from=build /out/mcp-exec /usr/local/bin/mcp-exec

# Stdio by default, as an mcpServers entry runs it; MCP_EXEC_ADDR is what
# HTTP listens on when MCP_EXEC_TRANSPORT=http or sse is set.
ENV MCP_EXEC_TRANSPORT=stdio \
    MCP_EXEC_ADDR=0.0.0.0:8080 \
    MCP_EXEC_RUNTIME=auto \
    MCP_EXEC_PACKAGES=numpy,pandas,matplotlib,pillow,pyyaml,jinja2 \
    MCP_EXEC_SHELL=true \
    MCP_EXEC_ROOTFS=/opt/mcp-exec/rootfs

# The rootfs is built into the image: the first start is quick and needs
# no writable cache, so the container can run --read-only as any user
# (everything here is root-owned and world-readable). It is built with
# the ENV above, so the server finds it matching its configuration.
# /data is empty: the process runtime binds MCP_EXEC_DATA_DIR over it.
RUN mkdir -p /opt/mcp-exec /data \
    && mcp-exec rootfs build --out "$MCP_EXEC_ROOTFS"

# Not root by default: without the privileges of the full sandbox, `auto`
# runs the process runtime. The full sandbox needs --user 0:0 (above).
USER 65532:65532
EXPOSE 8080
# Over HTTP the probe is /healthz (no token needed), with busybox's wget
# (busybox-static is installed above; its wget -T crashes in Debian 12,
# HEALTHCHECK --timeout bounds it instead); over stdio there is nothing to probe
# from outside: the server lives exactly as long as its client's pipe, so
# a running container is a healthy one. The probe reads MCP_EXEC_TRANSPORT
# and MCP_EXEC_ADDR: set those, not the flags, for it to follow.
HEALTHCHECK --interval=30s --timeout=5s --start-period=20s --retries=3 \
    CMD case "$MCP_EXEC_TRANSPORT" in http|sse) \
        h="${MCP_EXEC_ADDR%:*}"; case "$h" in ""|0.0.0.0|"[::]") h=127.0.0.1 ;; esac; \
        exec busybox wget -q -O /dev/null "http://$h:${MCP_EXEC_ADDR##*:}/healthz" ;; esac

ARG VERSION=dev
LABEL org.opencontainers.image.title="mcp-exec" \
      org.opencontainers.image.description="MCP server that runs untrusted Python in a fresh, locked-down container per call (runc's libcontainer or gVisor)" \
      org.opencontainers.image.source="https://github.com/inhuman/mcp-exec" \
      org.opencontainers.image.url="https://github.com/inhuman/mcp-exec" \
      org.opencontainers.image.documentation="https://github.com/inhuman/mcp-exec#readme" \
      org.opencontainers.image.version="${VERSION}" \
      org.opencontainers.image.base.name="docker.io/library/debian:bookworm-slim"

ENTRYPOINT ["mcp-exec"]
CMD ["serve"]
