//! The integration tests: one binary, real Kafka and real PostgreSQL from `deploy/local/stack`.

mod audit_boundaries;
mod dedup_replicas;
mod dedup_service;
mod demo;
mod eosctl_audit;
mod kafka_transactions;
mod migrate;
mod outbox;
mod payments_api;
mod postgres_idempotency;
mod processor;
mod provider_sim;
mod sink_provider;
mod sink_writer;
mod trace_cli;
mod traces;
mod transport_tls;
