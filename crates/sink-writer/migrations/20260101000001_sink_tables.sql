-- The sink's own tables and the seed's default targets (seed 000, "Практика").
--
-- sink_checkpoints is the source of truth for input positions in `--offsets postgres` mode: it is
-- updated in the same transaction as the rows, guarded by owner_epoch. A new owner bumps the epoch
-- before reading next_offset, so an older owner's batch can no longer commit.
CREATE TABLE IF NOT EXISTS sink_checkpoints (
    sink        TEXT        NOT NULL,
    topic       TEXT        NOT NULL,
    partition   INTEGER     NOT NULL,
    -- The offset of the next record to read (last written + 1); NULL until the first batch
    -- commits, which means "from the beginning of the partition".
    next_offset BIGINT,
    owner_epoch BIGINT      NOT NULL DEFAULT 0,
    -- Instance id of the owner that last fenced this partition; for humans only.
    owner       TEXT,
    updated_at  TIMESTAMPTZ NOT NULL DEFAULT now(),
    PRIMARY KEY (sink, topic, partition)
);

-- Same key, other content: a broken producer contract (DESIGN.md §2.2). Never overwritten, never
-- dropped: one row per conflicting input record, keyed by its source position so a replay in
-- `--offsets kafka` mode does not count it twice.
CREATE TABLE IF NOT EXISTS sink_conflicts (
    id                   BIGSERIAL   PRIMARY KEY,
    sink                 TEXT        NOT NULL,
    target               TEXT        NOT NULL,
    key                  TEXT        NOT NULL,
    event_id             TEXT        NOT NULL,
    reason               TEXT        NOT NULL,
    stored_fingerprint   TEXT,
    incoming_fingerprint TEXT        NOT NULL,
    stored_row           JSONB,
    incoming_record      JSONB,
    detail               TEXT        NOT NULL,
    source_topic         TEXT        NOT NULL,
    source_partition     INTEGER     NOT NULL,
    source_offset        BIGINT      NOT NULL,
    detected_at          TIMESTAMPTZ NOT NULL DEFAULT now(),
    UNIQUE (sink, target, source_topic, source_partition, source_offset)
);

-- Every record sent to the dead-letter topic, written in the transaction that moves the checkpoint
-- past it: Postgres alone accounts for every input offset (row, duplicate, conflict or dead letter).
CREATE TABLE IF NOT EXISTS sink_dead_letters (
    sink             TEXT        NOT NULL,
    source_topic     TEXT        NOT NULL,
    source_partition INTEGER     NOT NULL,
    source_offset    BIGINT      NOT NULL,
    reason           TEXT        NOT NULL,
    detail           TEXT        NOT NULL,
    dlq_topic        TEXT        NOT NULL,
    recorded_at      TIMESTAMPTZ NOT NULL DEFAULT now(),
    PRIMARY KEY (sink, source_topic, source_partition, source_offset)
);

-- Default append target: one row per logical event, keyed by event_id.
CREATE TABLE IF NOT EXISTS event_sink (
    event_id         TEXT        PRIMARY KEY,
    entity_id        TEXT        NOT NULL,
    value            BIGINT      NOT NULL,
    payload          JSONB,
    fingerprint      TEXT        NOT NULL,
    -- Where the sink read the event; NULL for rows loaded by other means (backfills).
    source_topic     TEXT,
    source_partition INTEGER,
    source_offset    BIGINT,
    written_at       TIMESTAMPTZ NOT NULL DEFAULT now()
);

-- Default versioned target: the latest state per entity; only a higher version replaces it.
CREATE TABLE IF NOT EXISTS entity_state (
    entity_id  TEXT        PRIMARY KEY,
    version    BIGINT      NOT NULL,
    payload    JSONB,
    event_id   TEXT        NOT NULL,
    updated_at TIMESTAMPTZ NOT NULL DEFAULT now()
);
