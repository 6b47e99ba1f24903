# Tally: one entry point for building, testing and benchmarking.
# `make test`, `make bench` and `make demo` install the Debian packages they
# need when they are missing (scripts/need): redis-server, and for the tests
# redis-sentinel (shards that fail over), prometheus (promtool and a real
# scrape), nginx and caddy (which Tally is tested behind) and python3 (a
# second implementation of the key contract), and for the packaging
# checks skopeo, podman and runc (the image), systemd (systemd-analyze
# verifies the units).
#
# make release and make image need Go and git only: their tools live in a
# Go module of their own (tools/), fetched through the Go module proxy, so
# that the packaging libraries never enter the product's build.

GO        ?= go
PKGS      ?= ./...
BENCHTIME ?= 2s
BENCHCOUNT ?= 5
BENCHFLAGS ?=
REDIS_MIN_MAJOR := 7

.DEFAULT_GOAL := help
.PHONY: help build test lint bench microbench demo binaries release image redis-server redis-sentinel prometheus gateways python3 packaging

help: ## List the targets.
	@awk 'BEGIN {FS = ":.*## "} /^[a-z-]+:.*## / {printf "  make %-8s %s\n", $$1, $$2}' $(MAKEFILE_LIST)

build: ## Compile every package, and the commands into bin/.
	$(GO) build $(PKGS)
	$(GO) build -o bin/ ./cmd/edge-checker ./cmd/accountant ./cmd/demo ./cmd/bench ./cmd/tally

binaries:
	$(GO) build -o bin/ ./cmd/edge-checker ./cmd/accountant ./cmd/demo ./cmd/bench ./cmd/tally
	$(GO) build -o bin/nats-server github.com/nats-io/nats-server/v2

test: redis-server redis-sentinel prometheus gateways python3 packaging ## Run every test with the race detector (real Redis and Sentinel, NATS, Prometheus, nginx and Caddy; no mocks), the key contract in Python, and the packaging: release, image, Helm chart, systemd units.
	python3 examples/python/check_keys.py docs/keys.vectors.json
	$(GO) test -race -count=1 -timeout 30m $(PKGS)
	cd tools && $(GO) test -count=1 -timeout 20m ./...

release: ## Build the release into dist/: static binaries for linux/amd64 and linux/arm64, SBOMs, SHA256SUMS (docs/install.md).
	cd tools && $(GO) run ./cmd/release -root .. -dist ../dist

image: release ## Build the OCI image (linux/amd64 and linux/arm64) from the release, as dist/tally_<version>_oci.tar, without Docker.
	cd tools && $(GO) run ./cmd/image -root .. -dist ../dist

lint: ## Check formatting (gofmt) and run go vet.
	@out=$$(gofmt -l $$(git ls-files '*.go' 2>/dev/null || find . -name '*.go')); \
	  if [ -n "$$out" ]; then echo "gofmt would change:"; echo "$$out"; exit 1; fi
	$(GO) vet $(PKGS)
	cd tools && $(GO) vet ./...

bench: redis-server binaries ## Measure the whole pipeline against a no-op handler and mode exact; writes docs/performance.md.
	./bin/bench $(BENCHFLAGS)

microbench: redis-server ## Go benchmarks of the window layer (scripts on real Redis).
	$(GO) test -run '^$$' -bench . -benchtime $(BENCHTIME) -count $(BENCHCOUNT) ./internal/...

demo: redis-server binaries ## Run the whole pipeline locally: Redis shards, NATS, accountant, edge, traffic, summary.
	./bin/demo

# gateways: the tests run Tally behind real nginx and Caddy (Debian's
# packages). prometheus: promtool checks the alert rules in deploy/prometheus,
# and the fault suite has a real Prometheus scrape both binaries. python3 runs
# the second implementation of the key contract (examples/python).
gateways:
	@scripts/need nginx nginx caddy caddy

redis-sentinel:
	@scripts/need redis-sentinel redis-sentinel

prometheus:
	@scripts/need promtool prometheus prometheus prometheus

python3:
	@scripts/need python3 python3

# packaging: skopeo reads the image archive, podman (with runc: crun cannot
# run on every kernel's cgroups) runs the image, systemd-analyze checks the
# units.
packaging:
	@scripts/need skopeo skopeo podman podman runc runc systemd-analyze systemd

# redis-server: present and >= 7.0, or installed from Debian's packages when
# we are root; otherwise stop and say what to install.
redis-server:
	@scripts/need redis-server redis-server || exit 1; \
	v=$$(redis-server --version | sed -n 's/.*v=\([0-9]*\)\..*/\1/p'); \
	if [ -z "$$v" ] || [ "$$v" -lt $(REDIS_MIN_MAJOR) ]; then \
	  echo "redis-server $$(redis-server --version) is too old: Tally needs Redis >= $(REDIS_MIN_MAJOR).0" >&2; exit 1; \
	fi
