# mcp-exec: cgo is required (libcontainer's nsenter) and so is the seccomp
# build tag: without it a seccomp profile is refused, which is the right
# failure. Never "fix" that by dropping the tag.
# Go lives in /usr/local/go on a fresh machine, whether or not PATH says so
# (the tests run "go build" too).
export PATH := /usr/local/go/bin:$(PATH)
GO        ?= go
# netgo and osusergo keep the static link free of glibc's NSS.
TAGS      := seccomp netgo osusergo
export CGO_ENABLED := 1
VERSION   ?= $(shell git describe --tags --always --dirty 2>/dev/null || echo dev)
# Static: the binary is also the sandbox's init, which runs inside the
# sandbox's root filesystem (see runtime/sandboxinit).
STATIC    := -extldflags=-static
LDFLAGS   := -s -w -X main.version=$(VERSION) $(STATIC)
BIN       := bin/mcp-exec

.PHONY: runsc build test test-full unit integration e2e run bench bench-go vet clean deploy-check image image-test

build: $(BIN)

$(BIN): $(shell find . \( -name '*.go' -o -name '*.c' -o -name '*.h' -o -name '*.py' \) -not -path './node_modules/*') go.mod go.sum
	$(GO) build -tags '$(TAGS)' -trimpath -ldflags '$(LDFLAGS)' -o $(BIN) ./cmd/mcp-exec

# runsc: the pinned current gVisor as /usr/local/bin/runsc, where the runsc
# runtime looks first (.ci/install-runsc; root; idempotent).
runsc:
	bash .ci/install-runsc

# vet also compiles the image test (built only under its tag), fails on
# unformatted files (gofmt -l prints them) and on a
# README performance figure docs/performance.md does not hold.
vet:
	@out=$$(gofmt -l $$(git ls-files '*.go')); if [ -n "$$out" ]; then echo "gofmt needed:"; echo "$$out"; exit 1; fi
	$(GO) vet -tags '$(TAGS)' ./...
	$(GO) vet -tags '$(TAGS) imagetest' ./test/image/
	$(GO) run ./test/docfigures

# test runs everything: unit tests, real containers (root), and the MCP
# end-to-end suites, phase by phase with their seconds and the slowest Go
# tests (test/run.sh). Under CI=true a missing prerequisite fails.
# test-full runs the whole test matrix (every sandbox property in every
# mode on every runtime), as the scheduled run does.
test:
	test/run.sh

test-full:
	MCP_EXEC_TEST_MATRIX=full test/run.sh

# e2e: the built binary with the official MCP TypeScript SDK client and the
# MCP conformance suite (test/e2e/run.sh; needs node and npm).
e2e: build
	test/e2e/run.sh

unit:
	$(GO) test -tags '$(TAGS)' -ldflags '$(STATIC)' -count=1 -short ./...

# run: a sandboxed hello from the shell.
run: build
	$(BIN) run -c 'import sys, platform; print("hello from", platform.python_version(), "in a sandbox")'

# bench: the built server over stdio, driven by the Go MCP client, against
# bare /usr/bin/python3 -c measured the same way in the same run
# (cmd/mcp-exec-bench). More with BENCH_FLAGS, e.g.
# BENCH_FLAGS='--packages numpy,pandas --env MCP_EXEC_POOL_SIZE=0'.
# A benchmark, not a test: nothing asserts a timing.
BENCH_FLAGS ?=
bench: build
	$(GO) run ./cmd/mcp-exec-bench --server $(BIN) --json bench.json $(BENCH_FLAGS)

# bench-go: the Go benchmarks of the runtime and of the server.
bench-go: build
	$(GO) test -tags '$(TAGS)' -ldflags '$(STATIC)' -run '^$$' -bench . -benchtime 30x -count 1 ./runtime/ ./cmd/mcp-exec/

# deploy-check: the recipes under deploy/ (Kubernetes manifests, server.json,
# the icon, the systemd unit) checked offline by their own module, which the
# server's module never imports; as root with systemd-nspawn it also boots
# the unit with bin/mcp-exec. Its first run fetches k8s.io/api from the proxy.
deploy-check: build
	cd deploy/validate && $(GO) test -count=1 ./...

clean:
	rm -rf bin

# image: the container image from the Dockerfile, with docker if its
# daemon answers, else podman (--format docker keeps the HEALTHCHECK).
# Bases are pulled as usual; on a machine without a registry run
# image-test once first, which seeds them locally.
CONTAINER_ENGINE  ?= $(shell docker info >/dev/null 2>&1 && echo docker || echo podman)
IMAGE             ?= mcp-exec:$(VERSION)
IMAGE_BUILD_FLAGS ?= $(if $(filter podman,$(notdir $(CONTAINER_ENGINE))),--format docker)

image:
	$(CONTAINER_ENGINE) build $(IMAGE_BUILD_FLAGS) --build-arg VERSION=$(VERSION) -t $(IMAGE) .

# image-test: seeds the bases offline, builds the image with podman and
# runs real calls in it on both runtimes, over stdio and HTTP, and as
# mcp-exec 0.5.4's mcpServers entry runs it (test/image/run.sh; root).
image-test:
	test/image/run.sh
