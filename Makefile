# Tally: one entry point for building, testing and benchmarking.
# `make test` and `make bench` install Debian's redis-server (and `make test`
# Debian's prometheus, for promtool and a real scrape, and nginx and caddy,
# which Tally is tested behind) when they are missing.

GO        ?= go
PKGS      ?= ./...
BENCHTIME ?= 2s
BENCHCOUNT ?= 5
BENCHFLAGS ?=
REDIS_MIN_MAJOR := 7

.DEFAULT_GOAL := help
.PHONY: help build test lint bench microbench demo binaries redis-server prometheus gateways

help: ## List the targets.
	@awk 'BEGIN {FS = ":.*## "} /^[a-z-]+:.*## / {printf "  make %-8s %s\n", $$1, $$2}' $(MAKEFILE_LIST)

build: ## Compile every package, and the commands into bin/.
	$(GO) build $(PKGS)
	$(GO) build -o bin/ ./cmd/edge-checker ./cmd/accountant ./cmd/demo ./cmd/bench

binaries:
	$(GO) build -o bin/ ./cmd/edge-checker ./cmd/accountant ./cmd/demo ./cmd/bench
	$(GO) build -o bin/nats-server github.com/nats-io/nats-server/v2

test: redis-server prometheus gateways ## Run every test with the race detector (real Redis, NATS, Prometheus, nginx and Caddy; no mocks).
	$(GO) test -race -count=1 -timeout 30m $(PKGS)

lint: ## Check formatting (gofmt) and run go vet.
	@out=$$(gofmt -l $$(git ls-files '*.go' 2>/dev/null || find . -name '*.go')); \
	  if [ -n "$$out" ]; then echo "gofmt would change:"; echo "$$out"; exit 1; fi
	$(GO) vet $(PKGS)

bench: redis-server binaries ## Measure the whole pipeline against a no-op handler and mode exact; writes docs/performance.md.
	./bin/bench $(BENCHFLAGS)

microbench: redis-server ## Go benchmarks of the window layer (scripts on real Redis).
	$(GO) test -run '^$$' -bench . -benchtime $(BENCHTIME) -count $(BENCHCOUNT) ./internal/...

demo: redis-server binaries ## Run the whole pipeline locally: Redis shards, NATS, accountant, edge, traffic, summary.
	./bin/demo

# gateways: the tests run Tally behind real nginx and Caddy (Debian's
# packages), installed when missing as below.
gateways:
	@missing=""; \
	command -v nginx >/dev/null 2>&1 || [ -x /usr/sbin/nginx ] || missing="$$missing nginx"; \
	command -v caddy >/dev/null 2>&1 || missing="$$missing caddy"; \
	if [ -n "$$missing" ]; then \
	  if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then \
	    echo "missing:$$missing: installing Debian's packages"; \
	    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends $$missing >/dev/null \
	      || { echo "installing$$missing failed" >&2; exit 1; }; \
	  else \
	    echo "$$missing are missing. Install them, e.g. 'sudo apt-get install$$missing', and run make again." >&2; \
	    exit 1; \
	  fi; \
	fi

# prometheus: promtool checks the alert rules in deploy/prometheus, and the
# fault suite has a real Prometheus scrape both binaries. Installed from
# Debian's packages when we are root; otherwise stop and say what to install.
prometheus:
	@if ! command -v promtool >/dev/null 2>&1 || ! command -v prometheus >/dev/null 2>&1; then \
	  if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then \
	    echo "prometheus is missing: installing Debian's prometheus package"; \
	    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends prometheus >/dev/null \
	      || { echo "installing prometheus failed" >&2; exit 1; }; \
	  else \
	    echo "prometheus and promtool are missing. Install them, e.g. 'sudo apt-get install prometheus', and run make again." >&2; \
	    exit 1; \
	  fi; \
	fi

# redis-server: present and >= 7.0, or installed from Debian's packages when
# we are root; otherwise stop and say what to install.
redis-server:
	@if ! command -v redis-server >/dev/null 2>&1; then \
	  if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then \
	    echo "redis-server is missing: installing Debian's redis-server package"; \
	    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends redis-server >/dev/null \
	      || { echo "installing redis-server failed" >&2; exit 1; }; \
	  else \
	    echo "redis-server (>= $(REDIS_MIN_MAJOR).0) is missing. Install it, e.g. 'sudo apt-get install redis-server', and run make again." >&2; \
	    exit 1; \
	  fi; \
	fi; \
	v=$$(redis-server --version | sed -n 's/.*v=\([0-9]*\)\..*/\1/p'); \
	if [ -z "$$v" ] || [ "$$v" -lt $(REDIS_MIN_MAJOR) ]; then \
	  echo "redis-server $$(redis-server --version) is too old: Tally needs Redis >= $(REDIS_MIN_MAJOR).0" >&2; exit 1; \
	fi
