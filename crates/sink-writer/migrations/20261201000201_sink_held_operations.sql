-- Events set aside because their provider operation cannot be settled (docs/ARCHITECTURE.md
-- "Held operations"): dedup-service's reconciler found no record at the provider after the
-- provider's key retention, which proves nothing, so the intent stays UNKNOWN until an operator
-- resolves it. Holding such an event lets the partition move on without charging it again and
-- without recording a success nobody has evidence for. Written in the transaction that moves the
-- checkpoint past the event, one row per input record; `eosctl held resolve` calls dedup-service's
-- Resolve and fills resolved_at and resolution.
CREATE TABLE IF NOT EXISTS sink_held_operations (
    sink             TEXT        NOT NULL,
    target           TEXT        NOT NULL,
    operation_id     TEXT        NOT NULL,
    event_id         TEXT        NOT NULL,
    source_topic     TEXT        NOT NULL,
    source_partition INTEGER     NOT NULL,
    source_offset    BIGINT      NOT NULL,
    reason           TEXT        NOT NULL,
    held_at          TIMESTAMPTZ NOT NULL DEFAULT now(),
    resolved_at      TIMESTAMPTZ,
    -- 'succeeded' or 'failed' (the operator's outcome), NULL while held.
    resolution       TEXT CHECK (resolution IN ('succeeded', 'failed')),
    CHECK ((resolved_at IS NULL) = (resolution IS NULL)),
    PRIMARY KEY (sink, target, source_topic, source_partition, source_offset)
);

-- `eosctl held list` and the alert read the unresolved ones.
CREATE INDEX IF NOT EXISTS sink_held_operations_unresolved
    ON sink_held_operations (held_at) WHERE resolved_at IS NULL;
CREATE INDEX IF NOT EXISTS sink_held_operations_by_operation
    ON sink_held_operations (operation_id);
