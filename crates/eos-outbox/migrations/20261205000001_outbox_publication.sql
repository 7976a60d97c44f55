-- The publication outbox-relay's logical mode decodes (docs/ARCHITECTURE.md "Outbox"): only the
-- outbox table's inserts. Created here, by the role that owns the schema, so the relay's own role
-- needs no ownership, only the REPLICATION attribute for its slot. It costs nothing while no slot
-- reads it, and is harmless under wal_level=replica (the xmin mode).
DO $$
BEGIN
    IF NOT EXISTS (SELECT 1 FROM pg_publication WHERE pubname = 'eos_outbox') THEN
        CREATE PUBLICATION eos_outbox FOR TABLE eos_outbox WITH (publish = 'insert');
    END IF;
END
$$;
