-- The session before a Hello stays known (found by a review of issue 58 against the
-- seed): an epoch's row was deleted as soon as the next was issued if it was a day old,
-- so a session that lasted more than a day lost its binding the moment the node moved —
-- its gateway's late result was foreign, the command re-sent. `record_session_epoch` as
-- in migration 0049, but it keeps the epoch just before the new one, whatever its age.

CREATE OR REPLACE FUNCTION record_session_epoch() RETURNS trigger
LANGUAGE plpgsql SECURITY DEFINER SET search_path FROM CURRENT AS $$
DECLARE
    said text := nullif(current_setting('bcw.hello_fact_id', true), '');
    live text := nullif(current_setting('bcw.hello_previous_live', true), '');
    proven text := nullif(current_setting('bcw.hello_proven', true), '');
    duplicate text := nullif(current_setting('bcw.hello_duplicate', true), '');
    -- the Hello transaction's bump: one more epoch, and gateway_hello said what it saw
    bumped boolean := TG_OP = 'UPDATE' AND NEW.session_epoch = OLD.session_epoch + 1
                      AND live IS NOT NULL;
    issued_to text;
BEGIN
    SELECT e.gateway_id INTO issued_to FROM session_epochs e
     WHERE e.node_id = NEW.node_id AND e.epoch = NEW.session_epoch;
    IF issued_to IS NOT NULL AND issued_to <> NEW.gateway_id THEN
        RAISE EXCEPTION 'session epoch % of node % was issued to gateway %: it is not rebound to %',
            NEW.session_epoch, NEW.node_id, issued_to, NEW.gateway_id
            USING ERRCODE = 'insufficient_privilege';
    END IF;
    INSERT INTO session_epochs AS e (node_id, epoch, gateway_id, boot_id, journal_id, hello_fact_id,
                                     previous_epoch, previous_gateway_id, previous_boot_id,
                                     previous_journal_id, previous_live, proven, duplicate)
    VALUES (NEW.node_id, NEW.session_epoch, NEW.gateway_id, NEW.boot_id, NEW.journal_id,
            said::uuid,
            CASE WHEN bumped THEN OLD.session_epoch END,
            CASE WHEN bumped THEN OLD.gateway_id END,
            CASE WHEN bumped THEN OLD.boot_id END,
            CASE WHEN bumped THEN OLD.journal_id END,
            CASE WHEN bumped THEN live::boolean END,
            proven::boolean,
            CASE WHEN bumped THEN duplicate::boolean END)
    ON CONFLICT (node_id, epoch) DO UPDATE
       SET boot_id = EXCLUDED.boot_id, journal_id = EXCLUDED.journal_id,
           issued_at = EXCLUDED.issued_at, hello_fact_id = EXCLUDED.hello_fact_id
     WHERE e.gateway_id = EXCLUDED.gateway_id;
    -- by (node_id, issued_at): only what is old, however many epochs the node had today —
    -- never the epoch just before this one, however long it lasted: its gateway's late
    -- facts (a result the daemon sent before it moved) are still the node's
    DELETE FROM session_epochs
     WHERE node_id = NEW.node_id AND issued_at < compute_now() - interval '1 day'
       AND epoch < NEW.session_epoch - 1;
    RETURN NULL;
END $$;

DO $$
BEGIN
    EXECUTE format('ALTER FUNCTION record_session_epoch() SET search_path = %I, pg_temp',
                   current_schema());
END $$;
