-- An UNKNOWN intent the reconciler cannot settle (docs/ARCHITECTURE.md "Held operations"): the
-- provider has no record, but the attempt is older than the provider's key retention, so "no
-- record" proves nothing. The reconciler writes why, with the fencing token of the attempt it
-- judged; Begin reports the reason only while the intent is still UNKNOWN at that token, so a
-- later attempt (after an operator's Resolve made it retryable) never inherits it. The state
-- stays UNKNOWN: only an operator's Resolve settles it.
ALTER TABLE dedup_intents
    ADD COLUMN stuck_reason        TEXT,
    ADD COLUMN stuck_fencing_token BIGINT;
