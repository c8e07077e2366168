# strata: directory-level copy-on-write checkpoints.
# `make run` starts hostproxy with a microVM sandbox; `make test` runs every
# test as root, mounts and microVMs included, in a private mount namespace.
#
# `make image` builds the microVM guest image (package guestimage) into
# $(IMAGE_CACHE), or finds it there (well under a second), and prints its
# directory: the only line on stdout, absolute, holding image.json
# (vmlinux, initramfs, disk...). A recipe that needs it runs
#   dir=$$($(MAKE) -s --no-print-directory image) || exit 1
# Nothing is written to a shared "current" file: two checkouts building
# different images at once each get their own directory.

SHELL := /bin/bash
export PATH := /usr/local/go/bin:$(PATH)
GO ?= go
BIN := $(CURDIR)/bin
LISTEN ?= 127.0.0.1:8080
STATE ?= /var/lib/strata
IMAGE_CACHE ?= /var/cache/strata
KERNEL ?= 6.12-cloud

.PHONY: all build deps qemu image test test-short bench run run-local vet lint-openapi sdk-deps lint-sdk clean

all: build

# deps also installs the guest image's tools (command:package), each only
# when missing, with --no-install-recommends, and fetches the apt lists when
# there are none (the guest kernel package is resolved from them); that
# output goes to stderr, so that `make -s image` prints only the image
# directory on stdout.
deps:
	@command -v $(GO) >/dev/null || { echo "Go 1.26 is required at /usr/local/go/bin (see README)"; exit 1; }
	@missing=""; for c in unshare mount tar curl gcc; do command -v $$c >/dev/null || missing="$$missing $$c"; done; \
	if [ -n "$$missing" ]; then apt-get update -qq && apt-get install -y -qq util-linux mount tar curl gcc; fi
	@$(MAKE) -s --no-print-directory qemu >&2
	@missing=""; for cp in mmdebstrap:mmdebstrap \
	  mkfs.xfs:xfsprogs mkfs.btrfs:btrfs-progs zstd:zstd xz:xz-utils lz4:lz4 depmod:kmod modprobe:kmod; do \
	  PATH=$$PATH:/usr/sbin:/sbin command -v $${cp%%:*} >/dev/null || missing="$$missing $${cp#*:}"; done; \
	if [ -n "$$missing" ] || ! ls /var/lib/apt/lists/*_Packages* >/dev/null 2>&1; then apt-get update -qq >&2; fi; \
	if [ -n "$$missing" ]; then apt-get install -y -qq --no-install-recommends $$(echo $$missing | tr ' ' '\n' | sort -u) >&2; fi
	$(GO) mod download

# QEMU 10 from Debian's bookworm-backports (hostproxy refuses an older
# one: read-only template RAM, block-stream with base-node and the frozen
# layer reopened read-only need it). The suite is added to apt's sources
# and only QEMU's packages (and the firmware they need) are pinned to it;
# everything else stays bookworm's. Nothing is done when QEMU_MIN or
# newer is installed.
QEMU_MIN := 10.0
QEMU_PACKAGES := qemu-system-x86 qemu-system-common qemu-system-data qemu-utils seabios ipxe-qemu
qemu:
	@have=$$(qemu-system-x86_64 --version 2>/dev/null | sed -n 's/^QEMU emulator version \([0-9.]*\).*/\1/p'); \
	img=$$(qemu-img --version 2>/dev/null | sed -n 's/^qemu-img version \([0-9.]*\).*/\1/p'); \
	if [ -n "$$have" ] && [ -n "$$img" ] && [ "$$(printf '%s\n' $(QEMU_MIN) $$have | sort -V | head -1)" = $(QEMU_MIN) ] \
	  && [ "$$(printf '%s\n' $(QEMU_MIN) $$img | sort -V | head -1)" = $(QEMU_MIN) ]; then exit 0; fi; \
	[ "$$(id -u)" = 0 ] || { echo "QEMU $(QEMU_MIN) or newer is needed (have: $${have:-none}); run make as root to install it from bookworm-backports" >&2; exit 1; }; \
	echo "installing QEMU $(QEMU_MIN) from bookworm-backports (have: $${have:-none})" >&2; \
	printf '%s\n' 'Types: deb' 'URIs: http://deb.debian.org/debian' 'Suites: bookworm-backports' 'Components: main' \
	  'Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg' > /etc/apt/sources.list.d/strata-backports.sources; \
	printf '%s\n' 'Package: $(QEMU_PACKAGES)' 'Pin: release n=bookworm-backports' 'Pin-Priority: 990' > /etc/apt/preferences.d/strata-qemu; \
	apt-get update -qq && apt-get install -y -qq --no-install-recommends $(QEMU_PACKAGES) >/dev/null && \
	qemu-system-x86_64 --version | head -1

build: deps
	$(GO) build -o $(BIN)/ ./cmd/...

# guestd, strata-init and createos for the guest are static (CGO_ENABLED=0: the
# initramfs has no libc), stripped (a smaller initramfs boots faster under
# TCG) and path-free (-trimpath: every checkout of a commit makes the same
# binaries, so the same image; TestBuildAndBoot builds them the same way).
# The first build takes about a minute (Debian userland, kernel); the next
# ones only rebuild the initramfs when the binaries changed. KERNEL=6.1
# builds with Debian 12's own kernel.
GUEST_BUILD := CGO_ENABLED=0 $(GO) build -trimpath -ldflags="-s -w"
# The Python SDK's package, which every guest's system Python imports.
PYTHON_SDK := sdk/python/src/strata
image:
	@$(MAKE) -s --no-print-directory deps >&2
	@$(GUEST_BUILD) -o $(BIN)/guest/guestd ./cmd/guestd
	@$(GUEST_BUILD) -o $(BIN)/guest/strata-init ./cmd/strata-init
	@$(GUEST_BUILD) -o $(BIN)/guest/createos ./cmd/createos
	@$(GO) build -o $(BIN)/strata-image ./cmd/strata-image
	@$(BIN)/strata-image build --cache $(IMAGE_CACHE) --kernel $(KERNEL) --guestd $(BIN)/guest/guestd --init $(BIN)/guest/strata-init --createos $(BIN)/guest/createos --python $(PYTHON_SDK)

# staticcheck is pinned as a tool in go.mod (go get -tool …@version), so
# every machine runs the same version, from the module cache that deps
# fills. go.mod and go.sum must be tidy: a dependency added or dropped
# without `go mod tidy` fails here, not in someone else's build.
vet:
	@$(GO) mod tidy -diff >/dev/null 2>&1 || { $(GO) mod tidy -diff; echo "go.mod/go.sum are not tidy: run 'go mod tidy' and commit the result"; exit 1; }
	$(GO) vet ./...
	$(GO) tool staticcheck ./...
	@test -z "$$(gofmt -l $$(git ls-files '*.go'))" || { gofmt -l $$(git ls-files '*.go'); exit 1; }

# The outside linter of the API's OpenAPI document: Redocly's CLI from the
# npm registry, pinned, installed once into $(IMAGE_CACHE)/npm (outside the
# repository) with the machine's Node.js (20.19 or newer).
REDOCLY := 2.77.0
REDOCLY_DIR := $(IMAGE_CACHE)/npm/redocly-$(REDOCLY)
lint-openapi:
	@command -v node >/dev/null && node -e 'const [a,b]=process.versions.node.split(".").map(Number); process.exit(a>20||a==20&&b>=19?0:1)' || { echo "lint-openapi needs Node.js 20.19 or newer (node: $$(node --version 2>/dev/null || echo none))"; exit 1; }
	@[ -x $(REDOCLY_DIR)/node_modules/.bin/redocly ] || { mkdir -p $(REDOCLY_DIR) && npm install --prefix $(REDOCLY_DIR) --no-audit --no-fund --silent @redocly/cli@$(REDOCLY) >&2; }
	cd hostproxy && REDOCLY_TELEMETRY=off REDOCLY_SUPPRESS_UPDATE_NOTICE=true $(REDOCLY_DIR)/node_modules/.bin/redocly lint --config redocly.yaml openapi.json

# Every test, as root, with the race detector (which needs cgo: gcc comes
# with deps). Each package's test binary runs in its own private
# mount namespace (go test -exec): no mount leaks onto the machine, and a
# process one package starts in a new namespace cannot hold (a copy of)
# another package's mounts.
# The 1,000-checkpoint scale test is syscalls, not goroutines: it runs
# once without the race detector (4x slower under it), everything else
# with it.
SCALE_TESTS := TestManyCheckpoints

# The SDKs' own tools: the TypeScript SDK's exact dependencies from its
# lockfile (npm ci, with npm's cache outside the repository), its
# compiler's and typedoc's checks (no warning passes), and Debian's pytest
# for the Python SDK, whose reference pydoc must write for every module.
NPM_CACHE := $(IMAGE_CACHE)/npm-cache
sdk-deps:
	@command -v node >/dev/null || { echo "the TypeScript SDK needs Node.js 20 or newer"; exit 1; }
	@cd sdk/typescript && { [ node_modules/.package-lock.json -nt package-lock.json ] || npm ci --cache $(NPM_CACHE) --no-audit --no-fund --silent >&2; }
	@/usr/bin/python3 -m pytest --version >/dev/null 2>&1 || { apt-get update -qq >&2 && apt-get install -y -qq --no-install-recommends python3-pytest >&2; }

# sdk/typescript/dist is in the repository (a new project installs the SDK
# with one command, docs/sdk.md): it must be the build of src, byte for
# byte, with no file more or less.
lint-sdk: sdk-deps
	cd sdk/typescript && npm run --silent build && npm run --silent docs
	@git diff --quiet -- sdk/typescript/dist && [ -z "$$(git status --porcelain -- sdk/typescript/dist)" ] || { git status --short -- sdk/typescript/dist; echo "sdk/typescript/dist is not the build of sdk/typescript/src: run 'npm run build' there and commit dist"; exit 1; }
	@out=$$(mktemp -d) && cd sdk/python && ./docs.sh $$out >/dev/null; rc=$$?; rm -rf $$out; exit $$rc

test: deps vet lint-openapi lint-sdk
	@[ "$$(id -u)" = 0 ] || { echo "make test needs root (mount tests, microVMs); use 'make test-short' otherwise"; exit 1; }
	@image=$$($(MAKE) -s --no-print-directory image) || exit 1; \
	echo "guest image: $$image"; \
	export STRATA_IMAGE=$$image STRATA_IMAGE_CACHE=$(IMAGE_CACHE) STRATA_OUTER_MNTNS=$$(readlink /proc/self/ns/mnt); \
	set -x; \
	$(GO) test -race -count=1 -timeout 40m \
	  -exec 'unshare --mount --propagation private --' -skip '^$(SCALE_TESTS)$$' ./... && \
	$(GO) test -count=1 -timeout 20m \
	  -exec 'unshare --mount --propagation private --' -run '^$(SCALE_TESTS)$$' ./layers/

test-short:
	$(GO) test -short -count=1 ./...

# A microVM sandbox to try: hostproxy on $(LISTEN) runs sandboxes as QEMU
# microVMs (state under $(STATE): registry, vms), and the sandbox
# "dev" is created, or started again, and waited for. The first run builds
# the guest image (about a minute, progress shown); the next ones reuse it
# and adopt the sandbox, which keeps running when make run stops: they
# start in seconds. The account key is $$CREATEOS_API_KEY, or one generated
# on the first run and kept in $(STATE)/api-key. DEBUG=1 adds debug lines.
#
# A second run on the same STATE would share the first one's registry: the
# lock on $(STATE)/run.lock, taken before anything is printed and inherited
# by hostproxy, refuses it at once, naming the holder. Ctrl-C stops
# hostproxy; the sandbox keeps running (createos sandbox stop stops it).
RUN_LOCK = $(STATE)/run.lock
# The start of run and run-local, one shell line: root, the lock on
# $(RUN_LOCK) (fd 9, inherited by the daemons, so it lasts as long as any of
# them lives) refusing a second run at once with the holder's pid, and a
# LISTEN that nothing else serves (serving, kept for the recipe).
RUN_PRELUDE = \
	[ "$$(id -u)" = 0 ] || { echo "make $@ needs root (QEMU runs under uids of its own; guestd mounts overlays)" >&2; exit 1; }; \
	command -v flock >/dev/null || { echo "make $@ needs flock (util-linux): make deps" >&2; exit 1; }; \
	mkdir -p $(STATE); chmod 711 $(STATE); exec 9<>$(RUN_LOCK); \
	if ! flock -n 9; then \
	  pid=$$(cat $(RUN_LOCK) 2>/dev/null); kill -0 "$$pid" 2>/dev/null || pid=""; \
	  echo "make $@: strata is already running with STATE=$(STATE)$${pid:+ (pid $$pid)}; stop it, or pass another STATE" >&2; \
	  exit 1; \
	fi; \
	echo $$$$ > $(RUN_LOCK); \
	listen="$(LISTEN)"; port=$${listen\#\#*:}; host=$${listen%:*}; host=$${host\#[}; host=$${host%]}; host=$${host:-127.0.0.1}; \
	serving() { timeout 1 bash -c "exec 3<>/dev/tcp/$$host/$$port" 2>/dev/null; }; \
	if serving; then echo "make $@: LISTEN=$(LISTEN) is in use by another program; pass another LISTEN" >&2; exit 1; fi

run:
	@$(RUN_PRELUDE); \
	mkdir -p $(STATE)/vms; chmod 711 $(STATE)/vms; \
	echo "make run: building the binaries and the guest image (the first time about a minute)..." >&2; \
	image=$$($(MAKE) -s --no-print-directory image) || exit 1; \
	$(MAKE) -s --no-print-directory build >/dev/null || exit 1; \
	KEY="$${CREATEOS_API_KEY:-}"; \
	if [ -z "$$KEY" ]; then \
	  [ -s $(STATE)/api-key ] || (umask 077; $(BIN)/hostproxy --print-new-key > $(STATE)/api-key); \
	  KEY="$$(cat $(STATE)/api-key)"; \
	fi; \
	CREATEOS_API_KEY="$$KEY" $(BIN)/hostproxy $(if $(CONFIG),--config $(abspath $(CONFIG))) --listen $(LISTEN) --data $(STATE)/hostproxy $(if $(DEBUG),--debug) \
	  --account local --key-env CREATEOS_API_KEY --vms $(STATE)/vms --image $$image & H=$$!; \
	trap 'kill -TERM $$H 2>/dev/null' INT TERM; \
	until serving; do kill -0 $$H 2>/dev/null || exit 1; sleep 0.1; done; \
	export CREATEOS_API_URL=http://$(LISTEN) CREATEOS_API_KEY="$$KEY"; \
	SB=$$(cat $(STATE)/sandbox-id 2>/dev/null); \
	if [ -n "$$SB" ] && $(BIN)/createos sandbox get $$SB >/dev/null 2>&1; then \
	  echo "make run: starting sandbox $$SB (it is booted again if it was stopped)..." >&2; \
	  $(BIN)/createos sandbox start $$SB >/dev/null || { kill $$H; exit 1; }; \
	else \
	  echo "make run: creating sandbox dev (a QEMU microVM; under TCG the boot takes about 10 s)..." >&2; \
	  SB=$$($(BIN)/createos sandbox create dev -o json | sed -n 's/.*"id": *"\([^"]*\)".*/\1/p' | head -1); \
	  [ -n "$$SB" ] || { kill $$H; exit 1; }; echo $$SB > $(STATE)/sandbox-id; \
	fi; \
	NAME=$$($(BIN)/createos sandbox get $$SB -o json | sed -n 's/.*"name": *"\([^"]*\)".*/\1/p' | head -1); NAME=$${NAME:-$$SB}; \
	echo; echo "strata is running with sandbox $$NAME ($$SB; state in $(STATE)). In another shell:"; echo; \
	echo "  export CREATEOS_API_URL=http://$(LISTEN)"; \
	echo "  export CREATEOS_API_KEY=$$KEY"; \
	echo "  export CREATEOS_SANDBOX_ID=$$SB"; \
	echo "  export PATH=$(BIN):\$$PATH"; \
	echo "  createos sandbox exec $$NAME -- python3 -c 'print(6*7)'"; \
	echo "  createos sandbox exec $$NAME -- sh -c 'mkdir -p /workspace/project && echo hello > /workspace/project/README'"; \
	echo "  createos sandbox checkpoint create $$NAME --path /workspace/project --name first"; echo; \
	echo "Ctrl-C stops hostproxy; the sandbox keeps running, and the next make run adopts it."; echo; \
	wait $$H

# The previous mode: guestd on this machine as the guest of the configured
# sandbox sb-local (how guestd runs in someone else's VM). See README.
run-local:
	@$(RUN_PRELUDE); \
	$(MAKE) -s --no-print-directory build || exit 1; \
	mkdir -p /workspace/project; \
	[ -n "$$(ls -A /workspace/project)" ] || echo "hello from strata" > /workspace/project/README; \
	KEY="$${CREATEOS_API_KEY:-}"; \
	if [ -z "$$KEY" ]; then \
	  [ -s $(STATE)/api-key ] || (umask 077; $(BIN)/hostproxy --print-new-key > $(STATE)/api-key); \
	  KEY="$$(cat $(STATE)/api-key)"; \
	fi; \
	$(BIN)/guestd --listen unix://$(STATE)/guestd.sock --store $(STATE)/guestd \
	  --credentials $(STATE)/credentials.env $(if $(DEBUG),--debug) & G=$$!; \
	CREATEOS_API_KEY="$$KEY" $(BIN)/hostproxy --listen $(LISTEN) --data $(STATE)/hostproxy $(if $(DEBUG),--debug) \
	  --account local --key-env CREATEOS_API_KEY --sandbox sb-local=unix://$(STATE)/guestd.sock & H=$$!; \
	trap 'kill -TERM $$G $$H 2>/dev/null' INT TERM; \
	alive() { kill -0 $$G 2>/dev/null && kill -0 $$H 2>/dev/null; }; \
	until [ -n "$$(find $(STATE)/guestd.sock -newer $(RUN_LOCK) 2>/dev/null)" ] && serving; do alive || break; sleep 0.1; done; \
	if alive; then \
	  echo; echo "strata is running (state in $(STATE)). In another shell:"; echo; \
	  echo "  export CREATEOS_API_URL=http://$(LISTEN)"; \
	  echo "  export CREATEOS_API_KEY=$$KEY"; \
	  echo "  export CREATEOS_SANDBOX_ID=sb-local"; \
	  echo "  export PATH=$(BIN):\$$PATH"; \
	  echo "  createos sandbox checkpoint create sb-local --path /workspace/project --name first"; echo; \
	  echo "Once an access token is issued, the sandbox's credentials are in $(STATE)/credentials.env;"; \
	  echo "a process inside the sandbox would run: CREATEOS_CREDENTIALS=$(STATE)/credentials.env createos ..."; echo; \
	fi; \
	while alive; do sleep 0.2; done; kill -TERM $$G $$H 2>/dev/null; \
	wait $$G; g=$$?; wait $$H; h=$$?; [ $$g = 0 ] && [ $$h = 0 ]

# The engine's table, then the microVM sandboxes' (BENCHFLAGS=-vm-only for
# those alone; -vm-image= with nothing after it skips them).
bench: build
	@image=$$($(MAKE) -s --no-print-directory image) || exit 1; \
	STRATA_BIN=$(BIN) unshare --mount --propagation private -- $(GO) run ./integration/cmd/benchtable -vm-image $$image $(BENCHFLAGS)

clean:
	rm -rf $(BIN)
