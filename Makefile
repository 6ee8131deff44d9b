# mcp-exec: cgo is required (libcontainer's nsenter) and so is the seccomp
# build tag: without it a seccomp profile is refused, which is the right
# failure. Never "fix" that by dropping the tag.
# Go lives in /usr/local/go on a fresh machine, whether or not PATH says so
# (the tests run "go build" too).
export PATH := /usr/local/go/bin:$(PATH)
GO        ?= go
TAGS      := seccomp
export CGO_ENABLED := 1
VERSION   ?= $(shell git describe --tags --always --dirty 2>/dev/null || echo dev)
LDFLAGS   := -s -w -X main.version=$(VERSION)
BIN       := bin/mcp-exec

.PHONY: build test unit integration e2e run bench vet clean image image-test

build: $(BIN)

$(BIN): $(shell find . -name '*.go' -not -path './node_modules/*') go.mod go.sum
	$(GO) build -tags $(TAGS) -trimpath -ldflags '$(LDFLAGS)' -o $(BIN) ./cmd/mcp-exec

vet:
	$(GO) vet -tags $(TAGS) ./...

# test runs everything: unit tests, real containers (root), and the MCP
# end-to-end suites. Under CI=true a missing prerequisite fails.
test: build vet
	$(GO) test -tags $(TAGS) -count=1 -timeout 20m ./...
	test/e2e/run.sh

# e2e: the built binary with the official MCP TypeScript SDK client and the
# MCP conformance suite (test/e2e/run.sh; needs node and npm).
e2e: build
	test/e2e/run.sh

unit:
	$(GO) test -tags $(TAGS) -count=1 -short ./...

# run: a sandboxed hello from the shell.
run: build
	$(BIN) run -c 'import sys, platform; print("hello from", platform.python_version(), "in a sandbox")'

bench: build
	$(GO) test -tags $(TAGS) -run '^$$' -bench . -benchtime 30x -count 1 ./runtime/ ./cmd/mcp-exec/

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
