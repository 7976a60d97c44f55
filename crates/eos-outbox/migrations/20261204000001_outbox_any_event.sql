-- The general outbox (docs/ARCHITECTURE.md "Outbox"): any JSON event, published as it is, next to
-- the ledger-shaped rows of eos_outbox_enqueue, which keeps working unchanged.
--
-- A general row carries the record value in `record` (a JSON object) and extra Kafka headers in
-- `headers` (an object of string values); `value` is then NULL. Its `entity_id` is its record
-- key: the key is what orders a topic's events (one partition), so the read order keeps it.

-- Whether every value of a JSON object is a string (a header value).
CREATE FUNCTION eos_outbox_string_values(p_object JSONB) RETURNS BOOLEAN
LANGUAGE sql IMMUTABLE
AS $$
    SELECT coalesce(bool_and(jsonb_typeof(entry.value) = 'string'), true)
      FROM jsonb_each(p_object) AS entry
$$;

ALTER TABLE eos_outbox
    ALTER COLUMN value DROP NOT NULL,
    ADD COLUMN record JSONB CHECK (record IS NULL OR jsonb_typeof(record) = 'object'),
    ADD COLUMN headers JSONB CHECK (
        headers IS NULL OR (jsonb_typeof(headers) = 'object' AND eos_outbox_string_values(headers))
    ),
    ADD CONSTRAINT eos_outbox_value_or_record CHECK ((value IS NULL) <> (record IS NULL));

-- Enqueues any JSON event inside the caller's transaction and returns its position: published to
-- `p_topic` with key `p_key`, value `p_record` as it is, the `event_id` header `p_event_id`, and
-- the string entries of `p_headers` as headers. The read order and its guarantees are
-- eos_outbox_enqueue's, with the key as the entity.
CREATE FUNCTION eos_outbox_enqueue_event(
    p_topic         TEXT,
    p_key           TEXT,
    p_event_id      TEXT,
    p_record        JSONB,
    p_headers       JSONB DEFAULT NULL,
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
    VALUES (p_key, own_xid)
    ON CONFLICT (entity_id) DO UPDATE
        SET last_order_xid = greatest(entity.last_order_xid, own_xid)
    RETURNING entity.last_order_xid INTO entity_order_xid;

    INSERT INTO eos_outbox (order_xid, topic, message_key, event_id, entity_id, record, headers,
                            trace_context)
    VALUES (entity_order_xid, p_topic, p_key, p_event_id, p_key, p_record, p_headers,
            p_trace_context)
    RETURNING position INTO enqueued;

    PERFORM pg_notify('eos_outbox', '');
    RETURN enqueued;
END
$$;
