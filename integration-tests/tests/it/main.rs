//! The integration tests: one binary, real Kafka and real PostgreSQL from `deploy/local/stack`.

mod eosctl_audit;
mod kafka_transactions;
mod postgres_idempotency;
mod processor;
