//! The integration tests: one binary, real Kafka and real PostgreSQL from `deploy/local/stack`.

mod audit_boundaries;
mod dedup_auth;
mod dedup_replicas;
mod dedup_service;
mod demo;
mod eosctl_audit;
mod held_operations;
mod kafka_cluster;
mod kafka_transactions;
mod migrate;
mod outbox;
mod payments_api;
mod poison_input;
mod postgres_idempotency;
mod processor;
mod provider_sim;
mod provider_tls;
mod scale_out;
mod secrets;
mod sink_provider;
mod sink_rules;
mod sink_writer;
mod total_overflow;
mod trace_cli;
mod traces;
mod transport_tls;
