-- The history triggers of 0001, once per statement instead of once per row. A row trigger runs
-- its function, and the function's INSERT, for every row a statement changes; a Begin or Complete
-- batch of 100 rows paid that a hundred times. A statement trigger sees the statement's rows as
-- transition tables and appends all their history in one INSERT, still inside the statement
-- that changed them, so no code path can change state without leaving an audit row.
-- (docs/BENCHMARKS.md "History per statement" has the figures.)

DROP TRIGGER dedup_intents_created ON dedup_intents;
DROP TRIGGER dedup_intents_transitioned ON dedup_intents;
DROP FUNCTION dedup_record_transition();

CREATE FUNCTION dedup_record_creations() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO dedup_intent_history (operation_id, from_state, to_state, fencing_token, holder, at, detail)
    SELECT created.operation_id, NULL, created.state, created.fencing_token, created.holder,
           created.updated_at, created.detail
      FROM created_intents AS created
     ORDER BY created.operation_id;
    RETURN NULL;
END;
$$;

-- An upsert's DO UPDATE (a Begin on an existing row) fires this trigger with the rows it updated.
-- A Begin that changes nothing still rewrites its row (so its answer comes from the locked,
-- latest version in the same statement); only real transitions are history.
CREATE FUNCTION dedup_record_transitions() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO dedup_intent_history (operation_id, from_state, to_state, fencing_token, holder, at, detail)
    SELECT changed.operation_id, previous.state, changed.state, changed.fencing_token, changed.holder,
           changed.updated_at, changed.detail
      FROM intents_after AS changed
      JOIN intents_before AS previous USING (operation_id)
     WHERE previous.state IS DISTINCT FROM changed.state
        OR previous.fencing_token IS DISTINCT FROM changed.fencing_token
     ORDER BY changed.operation_id;
    RETURN NULL;
END;
$$;

CREATE TRIGGER dedup_intents_created
    AFTER INSERT ON dedup_intents
    REFERENCING NEW TABLE AS created_intents
    FOR EACH STATEMENT EXECUTE FUNCTION dedup_record_creations();

CREATE TRIGGER dedup_intents_transitioned
    AFTER UPDATE ON dedup_intents
    REFERENCING OLD TABLE AS intents_before NEW TABLE AS intents_after
    FOR EACH STATEMENT EXECUTE FUNCTION dedup_record_transitions();
