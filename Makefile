# The README's two commands: `make demo` (the main job) and `make test` (the tests).
# Both start the local stack themselves (deploy/local/stack up), so they work on a machine that
# has nothing running.

SHELL := /bin/bash
CARGO ?= cargo
STACK := deploy/local/stack

.PHONY: demo test lint doc wasm-examples book deny sqlx-check helm-check rules-check compose-check compose-test stack-up stack-down stack-status

GUARANTEE ?= exactly-once
# The topics' record format: json, or avro or protobuf through the stack's schema registry.
FORMAT ?= json
# The cargo-deny `make deny` installs when cargo has another or none.
CARGO_DENY_VERSION := 0.20.2
DEMO_ARGS ?=

## demo: bring the stack up, build, and run the main job (GUARANTEE=at-least-once for the contrast,
## FORMAT=avro or FORMAT=protobuf for the topics in a schema registry's format) with every
## service's spans in the stack's Jaeger; ends with one payment's trace from it.
## A SIGKILLed service loses the spans it had not exported yet: about its last 200 ms (the
## services' default OTEL_BSP_SCHEDULE_DELAY, docs/OBSERVABILITY.md).
demo: stack-up
	$(CARGO) build --release --workspace --bins
	set -a; eval "$$($(STACK) env)"; set +a; \
	OTEL_EXPORTER_OTLP_ENDPOINT="$$EOS_JAEGER_OTLP_ENDPOINT" \
		target/release/eos-lab demo --guarantee $(GUARANTEE) --format $(FORMAT) \
		--show-trace-from "$$EOS_JAEGER_URL" $(DEMO_ARGS)

## test: bring the stack up, then the offline query data, the Helm chart, the alert rules, the compose file,
## formatting, lints, the API docs, the guide, the dependencies' licenses and sources, the example
## WebAssembly transforms, and every test against the real stack
test: stack-up sqlx-check helm-check rules-check compose-check lint doc book deny wasm-examples
	$(CARGO) build --workspace --bins
	@# The tests fall back to the stack's Kafka and PostgreSQL addresses; the registry's URL is
	@# given, since eos-schema's registry test takes no default (it says which variable it needs).
	EOS_SCHEMA_REGISTRY_URL="$$($(STACK) env | sed -n 's/^EOS_SCHEMA_REGISTRY_URL=//p')" \
		$(CARGO) test --workspace

lint:
	$(CARGO) fmt --all -- --check
	$(CARGO) clippy --workspace --all-targets -- -D warnings

## doc: the API docs build without a warning (the processor library is what users program against)
doc:
	RUSTDOCFLAGS="-D warnings" $(CARGO) doc --no-deps --workspace --exclude integration-tests

## wasm-examples: the example WebAssembly transforms built from source, Go and AssemblyScript
## (examples/wasm/build; the tests load them from target/wasm/)
wasm-examples:
	examples/wasm/build

## book: the guide (docs/, an mdBook) builds into target/book/, its reference pages match the
## binaries' --help and the metrics the code defines, and no relative link in it or in the README
## is broken (docs/build; installs mdbook with cargo when missing). The binaries are built first:
## the reference pages are their --help.
book:
	$(CARGO) build --workspace --bins
	CARGO=$(CARGO) docs/build

## deny: every dependency's licence is one deny.toml allows, no banned crate is in the tree and
## every crate comes from crates.io (`cargo deny check licenses bans sources`; cargo-deny is
## installed with cargo when missing). Advisories need the internet's advisory database, so they
## are a release step, not a test (docs/getting-started.md "Before a release").
deny:
	@if [[ "$$($(CARGO) deny --version 2>/dev/null)" != "cargo-deny $(CARGO_DENY_VERSION)" ]]; then \
		echo "deny: installing cargo-deny $(CARGO_DENY_VERSION) (cargo install, a few minutes once)"; \
		$(CARGO) install cargo-deny --version $(CARGO_DENY_VERSION) --locked; \
	fi
	$(CARGO) deny check licenses bans sources

## sqlx-check: the committed .sqlx/ query data matches the checked queries and the migrations
sqlx-check: stack-up
	CARGO=$(CARGO) deploy/local/sqlx-check

## helm-check: the Helm chart lints, renders, validates against the Kubernetes schemas and keeps
## its guarantees (deploy/helm/check; needs no cluster)
helm-check:
	deploy/helm/check

## rules-check: the Prometheus alert rules pass `promtool check rules` and their unit tests
## (`promtool test rules`), and every alert and Grafana dashboard query names only metrics the
## services export (deploy/prometheus/check; installs Debian's prometheus package when promtool
## is missing)
rules-check:
	deploy/prometheus/check

## compose-check: deploy/compose/docker-compose.yml loads as `docker compose` v2 loads it
## (compose-go) and passes the compose specification's JSON schema; no Docker engine needed
compose-check:
	deploy/compose/check-compose

## compose-test: the real compose run (Docker engine, images, SIGKILLs, audit, Jaeger trace);
## deploy/compose/e2e says what it does
compose-test:
	CARGO=$(CARGO) deploy/compose/e2e

stack-up:
	$(STACK) up

stack-down:
	$(STACK) down

stack-status:
	$(STACK) status
