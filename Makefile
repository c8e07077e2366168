# strata: directory-level copy-on-write checkpoints.
# `make run` starts guestd and hostproxy with one local sandbox; `make test`
# runs every test as root, mounts included, in a private mount namespace.

SHELL := /bin/bash
export PATH := /usr/local/go/bin:$(PATH)
GO ?= go
BIN := $(CURDIR)/bin
LISTEN ?= 127.0.0.1:8080
STATE ?= /var/lib/strata

.PHONY: all build deps test test-short bench run vet fmt clean

all: build

deps:
	@command -v $(GO) >/dev/null || { echo "Go 1.26 is required at /usr/local/go/bin (see README)"; exit 1; }
	@missing=""; for c in unshare mount tar; do command -v $$c >/dev/null || missing="$$missing $$c"; done; \
	if [ -n "$$missing" ]; then apt-get update -qq && apt-get install -y -qq util-linux mount tar; fi
	$(GO) mod download

build: deps
	$(GO) build -o $(BIN)/ ./cmd/...

vet:
	$(GO) vet ./...
	@test -z "$$(gofmt -l $$(git ls-files '*.go'))" || { gofmt -l $$(git ls-files '*.go'); exit 1; }

# Every test, as root, in a private mount namespace so no mount leaks.
test: deps vet
	@[ "$$(id -u)" = 0 ] || { echo "make test needs root (mount tests); use 'make test-short' otherwise"; exit 1; }
	STRATA_OUTER_MNTNS=$$(readlink /proc/self/ns/mnt) unshare --mount --propagation private -- $(GO) test -count=1 -timeout 40m ./...

test-short:
	$(GO) test -short -count=1 ./...

bench: build
	unshare --mount --propagation private -- $(GO) run ./integration/cmd/benchtable $(BENCHFLAGS)

clean:
	rm -rf $(BIN)
