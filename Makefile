# The README's two commands: `make demo` (the main job) and `make test` (the tests).
# Both start the local stack themselves (deploy/local/stack up), so they work on a machine that
# has nothing running.

SHELL := /bin/bash
CARGO ?= cargo
STACK := deploy/local/stack

.PHONY: demo test lint sqlx-check helm-check compose-check compose-test stack-up stack-down stack-status

GUARANTEE ?= exactly-once
DEMO_ARGS ?=
# The demo's seed: its event ids are evt-<seed>-<n>. Fixed once per make run (the current time by
# default, so each run has new ids); set DEMO_SEED rather than passing --seed in DEMO_ARGS.
DEMO_SEED := $(or $(DEMO_SEED),$(shell date +%s))

## demo: bring the stack up, build, and run the main job (GUARANTEE=at-least-once for the contrast)
## with every service's spans in the stack's Jaeger; ends with the trace of event evt-<seed>-0.
## A SIGKILLed service loses the spans it had not exported yet: OTEL_BSP_SCHEDULE_DELAY=200 (ms)
## keeps that to its last 200 ms. Exit status: the demo's, then the trace's.
demo: stack-up
	$(CARGO) build --release --workspace --bins
	set -a; eval "$$($(STACK) env)"; set +a; \
	status=0; \
	OTEL_EXPORTER_OTLP_ENDPOINT="$$EOS_JAEGER_OTLP_ENDPOINT" OTEL_BSP_SCHEDULE_DELAY=200 \
		target/release/eosctl demo --guarantee $(GUARANTEE) --seed $(DEMO_SEED) $(DEMO_ARGS) || status=$$?; \
	echo; echo "== the trace of one event (eosctl trace evt-$(DEMO_SEED)-0, from Jaeger at $$EOS_JAEGER_URL)"; \
	target/release/eosctl trace "evt-$(DEMO_SEED)-0" || { rc=$$?; [ "$$status" -ne 0 ] || status=$$rc; }; \
	exit $$status

## test: bring the stack up, then the offline query data, the Helm chart, the compose file,
## formatting, lints, and every test against the real stack
test: stack-up sqlx-check helm-check compose-check lint
	$(CARGO) build --workspace --bins
	$(CARGO) test --workspace

lint:
	$(CARGO) fmt --all -- --check
	$(CARGO) clippy --workspace --all-targets -- -D warnings

## sqlx-check: the committed .sqlx/ query data matches the checked queries and the migrations
sqlx-check: stack-up
	CARGO=$(CARGO) deploy/local/sqlx-check

## helm-check: the Helm chart lints, renders, validates against the Kubernetes schemas and keeps
## its guarantees (deploy/helm/check; needs no cluster)
helm-check:
	deploy/helm/check

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
