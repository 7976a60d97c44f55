-- The transactional outbox (docs/ARCHITECTURE.md "Outbox"). A service writes its domain change
-- and `eos_outbox_enqueue(...)` in one transaction; outbox-relay publishes the rows to Kafka.

-- One row per event to publish. The CHECKs are the envelope's own rules (docs/ARCHITECTURE.md
-- "Wire format"), so no row can exist that the relay could not turn into a valid record.
CREATE TABLE eos_outbox (
    -- Assigned at insert, not at commit: on its own it is NOT a safe read order.
    position      BIGSERIAL PRIMARY KEY,
    -- The relay's read order is (order_xid, position); see eos_outbox_enqueue.
    order_xid     BIGINT NOT NULL,
    topic         TEXT NOT NULL CHECK (topic <> ''),
    message_key   TEXT NOT NULL,
    event_id      TEXT NOT NULL UNIQUE
                  CHECK (octet_length(event_id) BETWEEN 1 AND 128 AND event_id !~ '[[:cntrl:]]'),
    entity_id     TEXT NOT NULL
                  CHECK (octet_length(entity_id) BETWEEN 1 AND 128 AND entity_id !~ '[[:cntrl:]]'),
    value         BIGINT NOT NULL,
    version       BIGINT CHECK (version >= 0),
    payload       JSONB,
    occurred_at   TIMESTAMPTZ,
    -- W3C trace context of the enqueuing span (JSON of its header fields), so the event's trace
    -- starts at the domain change.
    trace_context TEXT,
    enqueued_at   TIMESTAMPTZ NOT NULL DEFAULT now()
);
CREATE INDEX eos_outbox_read_order ON eos_outbox (order_xid, position);

-- One row per entity: its lock serialises the transactions that enqueue for one entity, and it
-- remembers the entity's last order_xid so the entity's events are read in commit order.
CREATE TABLE eos_outbox_entity_order (
    entity_id      TEXT PRIMARY KEY,
    last_order_xid BIGINT NOT NULL
);

-- How far each relay is known to have published. In exactly-once mode the authority is the
-- relay's position topic in Kafka and this row is written after the Kafka commit (so it can only
-- lag); in at-least-once mode this row is the authority. Purging never goes past the lowest row.
CREATE TABLE eos_outbox_relay_positions (
    relay_name TEXT PRIMARY KEY,
    order_xid  BIGINT NOT NULL,
    position   BIGINT NOT NULL,
    updated_at TIMESTAMPTZ NOT NULL DEFAULT now()
);

-- Enqueues one event inside the caller's transaction and returns its position. Use it, never a
-- plain INSERT: the read order depends on what it does.
--
-- Why (order_xid, position) never skips a row: the relay reads only rows whose order_xid is below
-- the xmin of its snapshot, i.e. rows of transactions that have all ended, and it reads them in
-- (order_xid, position) order. Every transaction still running, or not yet started, has a
-- transaction id at or above that xmin, and order_xid is never below the enqueuing
-- transaction's own id, so no row can later appear behind a position the relay has passed. A
-- bigserial alone is not enough: a transaction that took position 10 can commit after one that
-- took 11.
--
-- Why per-entity order is commit order: the upsert below locks the entity's row until commit, so
-- two transactions enqueuing for one entity run one after the other, and the later one takes an
-- order_xid no lower than the earlier one's (and a higher position).
CREATE FUNCTION eos_outbox_enqueue(
    p_topic         TEXT,
    p_message_key   TEXT,
    p_event_id      TEXT,
    p_entity_id     TEXT,
    p_value         BIGINT,
    p_version       BIGINT DEFAULT NULL,
    p_payload       JSONB DEFAULT NULL,
    p_occurred_at   TIMESTAMPTZ DEFAULT NULL,
    p_trace_context TEXT DEFAULT NULL
) RETURNS BIGINT
LANGUAGE plpgsql
AS $$
DECLARE
    own_xid   BIGINT := pg_current_xact_id()::TEXT::BIGINT;
    entity_order_xid BIGINT;
    enqueued  BIGINT;
BEGIN
    INSERT INTO eos_outbox_entity_order AS entity (entity_id, last_order_xid)
    VALUES (p_entity_id, own_xid)
    ON CONFLICT (entity_id) DO UPDATE
        SET last_order_xid = greatest(entity.last_order_xid, own_xid)
    RETURNING entity.last_order_xid INTO entity_order_xid;

    INSERT INTO eos_outbox (order_xid, topic, message_key, event_id, entity_id, value, version,
                            payload, occurred_at, trace_context)
    VALUES (entity_order_xid, p_topic, p_message_key, p_event_id, p_entity_id, p_value, p_version,
            p_payload, p_occurred_at, p_trace_context)
    RETURNING position INTO enqueued;

    -- Delivered at commit only (and not at all on rollback): wakes the relay without polling.
    PERFORM pg_notify('eos_outbox', '');
    RETURN enqueued;
END
$$;
