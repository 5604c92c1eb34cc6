-- One epoch, one Hello (issue "trust boundaries"). The Hello transaction records the id
-- of the Hello fact it is about to publish beside the epoch it issues (the gateway sets
-- `bcw.hello_fact_id` for its transaction); every worker takes a Hello fact only if it
-- is that one: a second Hello fact of the epoch, with other content, is foreign. A
-- gateway that does not say (an older release) records nothing, and nothing is checked.
ALTER TABLE session_epochs ADD COLUMN hello_fact_id uuid;

CREATE OR REPLACE FUNCTION record_session_epoch() RETURNS trigger
LANGUAGE plpgsql SECURITY DEFINER SET search_path FROM CURRENT AS $$
DECLARE
    said text := nullif(current_setting('bcw.hello_fact_id', true), '');
BEGIN
    INSERT INTO session_epochs (node_id, epoch, gateway_id, boot_id, journal_id, hello_fact_id)
    VALUES (NEW.node_id, NEW.session_epoch, NEW.gateway_id, NEW.boot_id, NEW.journal_id,
            said::uuid)
    ON CONFLICT (node_id, epoch) DO UPDATE
       SET gateway_id = EXCLUDED.gateway_id, boot_id = EXCLUDED.boot_id,
           journal_id = EXCLUDED.journal_id, issued_at = EXCLUDED.issued_at,
           hello_fact_id = EXCLUDED.hello_fact_id;
    DELETE FROM session_epochs
     WHERE node_id = NEW.node_id AND epoch < NEW.session_epoch
       AND issued_at < compute_now() - interval '1 day';
    RETURN NULL;
END $$;
