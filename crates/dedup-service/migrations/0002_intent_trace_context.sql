-- The trace context of the Begin that acquired the current token (JSON of the W3C fields), so the
-- reconciler's look-up of an UNKNOWN joins the trace of the event that left it UNKNOWN. NULL
-- when the caller sent none.
ALTER TABLE dedup_intents ADD COLUMN trace_context TEXT;
