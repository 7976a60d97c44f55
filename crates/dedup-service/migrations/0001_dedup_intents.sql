-- Durable intents: one row per operation id, the single source of truth for whether an external
-- effect may happen. Every state change is one conditional statement (see intent_store.rs);
-- the triggers below append it to the history in the same statement, so no code path can change
-- state without leaving an audit row.

CREATE TABLE dedup_intents (
    operation_id     TEXT        PRIMARY KEY,
    fingerprint      BYTEA       NOT NULL,
    state            TEXT        NOT NULL CHECK (state IN ('RESERVED', 'SUCCEEDED', 'FAILED', 'UNKNOWN')),
    -- Grows by one on every acquisition of the operation; reports must present the current one.
    fencing_token    BIGINT      NOT NULL CHECK (fencing_token >= 1),
    holder           TEXT        NOT NULL,
    -- The request id of the Begin that acquired the current token (tells a retried Begin apart).
    request_id       TEXT        NOT NULL,
    lease_expires_at TIMESTAMPTZ NOT NULL,
    acquired_at      TIMESTAMPTZ NOT NULL,
    occurred_at      TIMESTAMPTZ NOT NULL,
    created_at       TIMESTAMPTZ NOT NULL,
    updated_at       TIMESTAMPTZ NOT NULL,
    result           BYTEA,
    failure_reason   TEXT,
    retryable        BOOLEAN     NOT NULL DEFAULT FALSE,
    -- What the last transition was about (recorded in the history with it).
    detail           TEXT        NOT NULL DEFAULT ''
);

-- The reconciler's work list and backlog gauge.
CREATE INDEX dedup_intents_unknown ON dedup_intents (updated_at) WHERE state = 'UNKNOWN';
-- The lease sweep.
CREATE INDEX dedup_intents_leases ON dedup_intents (lease_expires_at) WHERE state = 'RESERVED';
-- The purge (only settled rows are ever purged).
CREATE INDEX dedup_intents_settled ON dedup_intents (occurred_at) WHERE state IN ('SUCCEEDED', 'FAILED');

CREATE TABLE dedup_intent_history (
    id            BIGSERIAL   PRIMARY KEY,
    operation_id  TEXT        NOT NULL,
    from_state    TEXT,        -- NULL: the row was created
    to_state      TEXT        NOT NULL,
    fencing_token BIGINT      NOT NULL,
    holder        TEXT        NOT NULL,
    at            TIMESTAMPTZ NOT NULL,
    detail        TEXT        NOT NULL
);

CREATE INDEX dedup_intent_history_operation ON dedup_intent_history (operation_id, id);
-- Arrival rate u (into UNKNOWN) and reconcile rate r (out of UNKNOWN) over a sliding window.
CREATE INDEX dedup_intent_history_into_unknown ON dedup_intent_history (at) WHERE to_state = 'UNKNOWN';
CREATE INDEX dedup_intent_history_out_of_unknown ON dedup_intent_history (at) WHERE from_state = 'UNKNOWN';

CREATE FUNCTION dedup_record_transition() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO dedup_intent_history (operation_id, from_state, to_state, fencing_token, holder, at, detail)
    VALUES (
        NEW.operation_id,
        CASE WHEN TG_OP = 'INSERT' THEN NULL ELSE OLD.state END,
        NEW.state,
        NEW.fencing_token,
        NEW.holder,
        NEW.updated_at,
        NEW.detail
    );
    RETURN NULL;
END;
$$;

CREATE TRIGGER dedup_intents_created
    AFTER INSERT ON dedup_intents
    FOR EACH ROW EXECUTE FUNCTION dedup_record_transition();

-- A Begin that changes nothing still rewrites its row (so its answer comes from the locked,
-- latest version in the same statement); only real transitions are history.
CREATE TRIGGER dedup_intents_transitioned
    AFTER UPDATE ON dedup_intents
    FOR EACH ROW
    WHEN (OLD.state IS DISTINCT FROM NEW.state OR OLD.fencing_token IS DISTINCT FROM NEW.fencing_token)
    EXECUTE FUNCTION dedup_record_transition();
