-- The random half of the fencing token (docs/ARCHITECTURE.md "Fencing"): 32 bytes drawn at every
-- acquisition and returned only to the acquiring Begin. Complete / Fail / MarkUnknown must present
-- it with the counter, so the counter (1, 2, 3, ...) alone no longer lets anyone report.
--
-- The service always writes its own secret. The default only fills rows written before this
-- migration (and by an older binary during a rolling upgrade): random values their holders never
-- saw, so such a holder cannot report and its intent goes UNKNOWN and is reconciled, never
-- settled by a guess. gen_random_uuid() draws from pg_strong_random (122 random bits each).
ALTER TABLE dedup_intents
    ADD COLUMN fencing_secret BYTEA NOT NULL
        DEFAULT (uuid_send(gen_random_uuid()) || uuid_send(gen_random_uuid()))
        CHECK (length(fencing_secret) = 32);
