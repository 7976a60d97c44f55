-- payments-api's domain tables (docs/ARCHITECTURE.md "Outbox"). Each payment row and its outbox
-- event are written in one transaction.

CREATE TABLE payments_api_accounts (
    account_id TEXT PRIMARY KEY,
    -- Bumped by every payment: the event's version, so consumers' versioned upserts see the
    -- account's payments in commit order.
    version    BIGINT NOT NULL,
    balance    BIGINT NOT NULL
);

CREATE TABLE payments_api_payments (
    payment_id          TEXT PRIMARY KEY,
    -- A retry with the same key returns the stored answer and writes nothing.
    idempotency_key     TEXT NOT NULL UNIQUE,
    -- Of the request body: the same key with another body is refused.
    request_fingerprint TEXT NOT NULL,
    account_id          TEXT NOT NULL,
    amount              BIGINT NOT NULL,
    currency            TEXT NOT NULL,
    account_version     BIGINT NOT NULL,
    created_at          TIMESTAMPTZ NOT NULL DEFAULT now()
);
