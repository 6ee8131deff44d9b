# mcp-exec in a container. The server starts one sandbox per call inside
# this container, so the container needs root and the privileges listed in
# the README ("Without root, or nested in a container"); without them the
# server refuses to start and says what is missing.
#
#   docker build -t mcp-exec .
#   docker run --user 0:0 --cap-add SYS_ADMIN --cap-add NET_ADMIN \
#     --security-opt seccomp=unconfined --security-opt apparmor=unconfined \
#     --cgroupns=host -v /sys/fs/cgroup:/sys/fs/cgroup:rw \
#     -e MCP_EXEC_AUTH_TOKEN=... -p 127.0.0.1:8080:8080 mcp-exec

FROM golang:1.26-bookworm AS build
RUN apt-get update && apt-get install -y --no-install-recommends libseccomp-dev pkg-config \
    && rm -rf /var/lib/apt/lists/*
WORKDIR /src
COPY go.mod go.sum ./
RUN go mod download
COPY . .
RUN make build

FROM debian:bookworm-slim
# python3: the interpreter the sandbox's read-only rootfs is built from at
# first start (nothing is downloaded then). libseccomp2: the filter library
# the server links. runsc: the optional gVisor runtime.
RUN apt-get update && apt-get install -y --no-install-recommends python3 libseccomp2 runsc ca-certificates \
    && rm -rf /var/lib/apt/lists/*
COPY --from=build /src/bin/mcp-exec /usr/local/bin/mcp-exec
# Build the rootfs into the image, so that the first start is quick and
# the image needs no writable cache.
RUN mcp-exec rootfs build --out /opt/mcp-exec/rootfs
ENV MCP_EXEC_ROOTFS=/opt/mcp-exec/rootfs \
    MCP_EXEC_TRANSPORT=http \
    MCP_EXEC_ADDR=0.0.0.0:8080
EXPOSE 8080
HEALTHCHECK CMD ["python3", "-c", "import urllib.request; urllib.request.urlopen('http://127.0.0.1:8080/healthz', timeout=3)"]
ENTRYPOINT ["mcp-exec", "serve"]
