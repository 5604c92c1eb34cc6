-- Grants as the job (issue #41): what a worker's login may write is what its rules write,
-- and no row it writes is one another principal will trust beyond that.
--
-- * A session epoch is issued to one gateway for good: the trigger that records it refuses
--   to rebind an existing (node, epoch) to another gateway (a login that may set
--   `node_sessions.gateway_id` — a 0.3 gateway's group — could otherwise move a session's
--   facts to a gateway of its choosing).
-- * A node's Hello no longer scans its earlier epochs to prune them: an index on
--   (node_id, issued_at) finds only those older than a day.
-- * The liveness worker disconnects sessions through `liveness_disconnect` (its owner's
--   rights, its group only), which only ever clears the gateway of the sessions at the
--   epoch and gateway it read; its group loses UPDATE of `gateway_id` (roles.py).
-- * Nobody sets a `last_seen` or a `last_flush_at` in the future (a session or a gateway
--   seen for ever).
-- * `outbox_dead` rows name the worker whose outbox row they were (row-level security
--   then lets a worker's login insert only its own: roles.py's row rules); an older
--   release's gets it from the message's type, as an outbox row does.

CREATE INDEX session_epochs_node_issued ON session_epochs (node_id, issued_at);

CREATE OR REPLACE FUNCTION record_session_epoch() RETURNS trigger
LANGUAGE plpgsql SECURITY DEFINER SET search_path FROM CURRENT AS $$
DECLARE
    said text := nullif(current_setting('bcw.hello_fact_id', true), '');
    live text := nullif(current_setting('bcw.hello_previous_live', true), '');
    proven text := nullif(current_setting('bcw.hello_proven', true), '');
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
                                     previous_journal_id, previous_live, proven)
    VALUES (NEW.node_id, NEW.session_epoch, NEW.gateway_id, NEW.boot_id, NEW.journal_id,
            said::uuid,
            CASE WHEN bumped THEN OLD.session_epoch END,
            CASE WHEN bumped THEN OLD.gateway_id END,
            CASE WHEN bumped THEN OLD.boot_id END,
            CASE WHEN bumped THEN OLD.journal_id END,
            CASE WHEN bumped THEN live::boolean END,
            proven::boolean)
    ON CONFLICT (node_id, epoch) DO UPDATE
       SET boot_id = EXCLUDED.boot_id, journal_id = EXCLUDED.journal_id,
           issued_at = EXCLUDED.issued_at, hello_fact_id = EXCLUDED.hello_fact_id
     WHERE e.gateway_id = EXCLUDED.gateway_id;
    -- by (node_id, issued_at): only what is old, however many epochs the node had today
    DELETE FROM session_epochs
     WHERE node_id = NEW.node_id AND issued_at < compute_now() - interval '1 day'
       AND epoch < NEW.session_epoch;
    RETURN NULL;
END $$;

-- The liveness worker's disconnections: the sessions given, each only at the epoch and
-- gateway the worker read (locked, in its transaction) — the gateway cleared, never set.
CREATE FUNCTION liveness_disconnect(
    p_nodes text[], p_epochs bigint[], p_gateways text[], p_reasons text[], p_at timestamptz
) RETURNS SETOF text
LANGUAGE sql SECURITY DEFINER SET search_path FROM CURRENT AS $$
    UPDATE node_sessions s
       SET gateway_id = NULL, disconnected_at = coalesce(p_at, compute_now()),
           disconnect_reason = t.reason
      FROM unnest(p_nodes, p_epochs, p_gateways, p_reasons) AS t(node_id, epoch, gateway_id, reason)
     WHERE s.node_id = t.node_id AND s.session_epoch = t.epoch AND s.gateway_id = t.gateway_id
    RETURNING s.node_id
$$;
REVOKE EXECUTE ON FUNCTION liveness_disconnect(text[], bigint[], text[], text[], timestamptz)
    FROM PUBLIC;

-- Seen in the future: refused (a legitimate writer sets compute_now() less an age). Only
-- a value that moves is checked — a row seen "in the future" after the server's clock
-- stepped back keeps being written (GREATEST keeps it), and must not fail every flush.
-- The triggers' conditions are checked without calling the function; it runs only when
-- the value is ahead of the server's own clock (a test's offset clock, or an attack).
CREATE FUNCTION refuse_future_sight() RETURNS trigger
LANGUAGE plpgsql AS $$
DECLARE
    seen timestamptz := (to_jsonb(NEW) ->> TG_ARGV[0])::timestamptz;  -- the column named
BEGIN
    IF seen > compute_now() + interval '5 seconds' THEN
        RAISE EXCEPTION '%.%: % is in the future (now %)', TG_TABLE_NAME, TG_ARGV[0], seen,
            compute_now() USING ERRCODE = 'check_violation';
    END IF;
    RETURN NEW;
END $$;

CREATE TRIGGER node_sessions_seen_not_ahead
    BEFORE UPDATE OF last_seen ON node_sessions
    FOR EACH ROW WHEN (NEW.last_seen > now() + interval '5 seconds'
                       AND NEW.last_seen IS DISTINCT FROM OLD.last_seen)
    EXECUTE FUNCTION refuse_future_sight('last_seen');

CREATE TRIGGER liveness_gateways_flush_not_ahead
    BEFORE UPDATE OF last_flush_at ON liveness_gateways
    FOR EACH ROW WHEN (NEW.last_flush_at > now() + interval '5 seconds'
                       AND NEW.last_flush_at IS DISTINCT FROM OLD.last_flush_at)
    EXECUTE FUNCTION refuse_future_sight('last_flush_at');

CREATE TRIGGER liveness_gateways_first_flush_not_ahead
    BEFORE INSERT ON liveness_gateways
    FOR EACH ROW WHEN (NEW.last_flush_at > now() + interval '5 seconds')
    EXECUTE FUNCTION refuse_future_sight('last_flush_at');

ALTER TABLE outbox_dead ADD COLUMN worker text;

-- the owner an outbox row gets (0025): the same function, on the same columns
CREATE TRIGGER outbox_dead_owned BEFORE INSERT ON outbox_dead
    FOR EACH ROW WHEN (NEW.worker IS NULL) EXECUTE FUNCTION outbox_owner();

-- Functions with their owner's rights search this schema, then pg_temp last (as 0024).
DO $$
DECLARE
    fn regprocedure;
BEGIN
    FOR fn IN
        SELECT p.oid::regprocedure FROM pg_proc p
         WHERE p.pronamespace = current_schema()::regnamespace
           AND p.proname IN ('liveness_disconnect', 'record_session_epoch')
    LOOP
        EXECUTE format('ALTER FUNCTION %s SET search_path = %I, pg_temp', fn, current_schema());
    END LOOP;
END $$;
