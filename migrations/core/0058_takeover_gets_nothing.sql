-- A takeover attempt gets nothing of the node, and cannot prune its honest epochs
-- (issue #59, found by an attacker on the merged change).
--
-- * `gateway_admission` and `gateway_desired_state` (migration 0057) gave the node's spec
--   to the gateway holding its open session — a takeover attempt's too: at `warn` a
--   gateway's unproven Hello for a node with a key (held for good, migration 0049) read
--   the node's spec, its secrets included. Now never to a session recorded `proven =
--   false`. A held duplicate (a proven Hello the quarantine judges) still gets it: the
--   seed sends the desired state after every Welcome, and an honest reboot is held too.
-- * `gateway_write_section` (migration 0026) let such a session rewrite the node's
--   inventory under the hash the node reported, so the daemon was never asked again. Now
--   it writes nothing for a session recorded `proven = false`.
-- * `record_session_epoch` (migration 0057) kept the node's newest 64 epochs: 65
--   takeover attempts pushed the node's previous honest epoch out, and its gateway's true
--   late facts became foreign. Now takeover attempts are pruned among themselves: an
--   honest epoch goes only behind 64 newer honest ones (or after a day, or beyond the
--   newest 10,000, as before).
-- Each function is replaced whole; as migrations 0026 and 0057 otherwise.

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
    day_old timestamptz := compute_now() - interval '1 day';
    applied timestamptz;
    honest bigint;
    honest_floor bigint;
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
    -- what the quarantine has applied: every Hello fact the bus stored before its
    -- watermark, and a Hello's fact is published on its transaction's commit (a minute's
    -- grace); none when it never said
    SELECT w.applied_through - interval '1 minute' INTO applied
      FROM consumer_watermarks w WHERE w.consumer = 'quarantine';
    -- the node's newest epoch that was not a takeover attempt, and the oldest of its
    -- newest 64 such: takeover attempts never push an honest epoch out (by the partial
    -- index session_epochs_not_takeover)
    SELECT max(h.epoch), min(h.epoch) INTO honest, honest_floor FROM (
        SELECT e.epoch FROM session_epochs e
         WHERE e.node_id = NEW.node_id AND e.epoch < NEW.session_epoch
           AND e.proven IS DISTINCT FROM false
         ORDER BY e.epoch DESC LIMIT 64) h;
    -- by (node_id, issued_at): only what is old or applied, however many epochs the node
    -- had today — never the epoch just before this one, however long it lasted: its
    -- gateway's late facts (a result the daemon sent before it moved) are still the node's
    -- (`epoch + 0`: never by the key, which would read every epoch the node keeps, as a
    -- cached generic plan did)
    DELETE FROM session_epochs d
     WHERE d.node_id = NEW.node_id AND d.issued_at < greatest(day_old, applied)
       AND d.epoch + 0 < NEW.session_epoch - 1
       AND (d.issued_at < day_old
            OR (d.epoch < NEW.session_epoch - 64
                AND (d.proven IS NOT DISTINCT FROM false OR d.epoch < coalesce(honest_floor, 0))));
    -- and beyond the newest 10,000, whatever the quarantine has applied (by the key)
    DELETE FROM session_epochs
     WHERE node_id = NEW.node_id AND epoch < NEW.session_epoch - 10000
       AND epoch <> coalesce(honest, 0);
    RETURN NULL;
END $$;

CREATE OR REPLACE FUNCTION gateway_admission(p_gateway text, p_node text, p_serial text,
    OUT now timestamptz, OUT node_generation integer, OUT node_role text, OUT spec text,
    OUT spec_generation bigint, OUT spec_signature text, OUT serial text, OUT node_id text,
    OUT identity_generation integer, OUT role text, OUT not_after timestamptz,
    OUT revoked boolean, OUT allowed_kinds text[])
LANGUAGE plpgsql STABLE SECURITY DEFINER AS $$
DECLARE
    gw text := gateway_as(p_gateway);
    cert node_certs%ROWTYPE;
BEGIN
    now := compute_now();
    SELECT n.identity_generation, n.role,
           CASE WHEN EXISTS (SELECT 1 FROM node_sessions s
                              WHERE s.node_id = n.node_id AND s.gateway_id = gw
                                AND s.disconnected_at IS NULL
                                AND s.proven IS DISTINCT FROM false)
                THEN coalesce(CASE WHEN n.spec_body::jsonb = n.spec THEN n.spec_body END,
                              n.spec::text) END,
           n.spec_generation, n.spec_signature
      INTO node_generation, node_role, spec, spec_generation, spec_signature
      FROM nodes n WHERE n.node_id = p_node;
    IF spec IS NULL THEN
        spec_generation := NULL;
        spec_signature := NULL;
    END IF;
    SELECT * INTO cert FROM node_certs c WHERE c.serial = p_serial;
    IF NOT FOUND THEN
        RETURN;
    END IF;
    serial := cert.serial;
    IF cert.node_id IS DISTINCT FROM p_node THEN
        revoked := false;  -- another node's: nothing of it
    ELSIF cert.revoked_at IS NOT NULL THEN
        node_id := cert.node_id;
        revoked := true;
    ELSE
        node_id := cert.node_id;
        identity_generation := cert.identity_generation;
        role := cert.role;
        not_after := cert.not_after;
        revoked := false;
        allowed_kinds := cert.allowed_kinds;
    END IF;
END $$;

CREATE OR REPLACE FUNCTION gateway_desired_state(p_gateway text, p_node text, p_epoch bigint,
    OUT spec text, OUT spec_generation bigint, OUT spec_signature text)
LANGUAGE plpgsql STABLE SECURITY DEFINER AS $$
DECLARE
    gw text := gateway_as(p_gateway);
BEGIN
    SELECT coalesce(CASE WHEN n.spec_body::jsonb = n.spec THEN n.spec_body END, n.spec::text),
           n.spec_generation, n.spec_signature
      INTO spec, spec_generation, spec_signature
      FROM node_sessions s JOIN nodes n ON n.node_id = s.node_id
     WHERE s.node_id = p_node AND s.gateway_id = gw AND s.session_epoch = p_epoch
       AND s.disconnected_at IS NULL AND s.proven IS DISTINCT FROM false;
END $$;

CREATE OR REPLACE FUNCTION gateway_write_section(
    p_gateway text, p_lease bigint, p_node text, p_epoch bigint, p_section text, p_hash text,
    p_body jsonb)
RETURNS boolean LANGUAGE plpgsql SECURITY DEFINER AS $$
DECLARE
    gw text := gateway_as(p_gateway);
BEGIN
    INSERT INTO node_inventory AS i (node_id, section, hash, body, session_epoch, reported_at)
    SELECT s.node_id, p_section, p_hash, p_body, s.session_epoch, compute_now()
      FROM node_sessions s
      JOIN gateways g ON g.gateway_id = s.gateway_id
     WHERE s.node_id = p_node AND s.session_epoch = p_epoch AND s.gateway_id = gw
       AND s.proven IS DISTINCT FROM false
       AND g.lease_epoch = p_lease AND g.lease_expires_at > compute_now()
       AND (EXISTS (SELECT 1 FROM node_inventory x WHERE x.node_id = p_node AND x.section = p_section)
            OR (SELECT count(*) FROM node_inventory x WHERE x.node_id = p_node) < 256)
    ON CONFLICT (node_id, section) DO UPDATE
       SET hash = EXCLUDED.hash, body = EXCLUDED.body, session_epoch = EXCLUDED.session_epoch,
           reported_at = EXCLUDED.reported_at
     WHERE i.session_epoch <= EXCLUDED.session_epoch;
    RETURN FOUND;
END $$;

DO $$
DECLARE
    fn regprocedure;
BEGIN
    FOR fn IN
        SELECT p.oid::regprocedure FROM pg_proc p
         WHERE p.pronamespace = current_schema()::regnamespace
           AND p.proname IN ('record_session_epoch', 'gateway_admission',
                             'gateway_desired_state', 'gateway_write_section')
    LOOP
        EXECUTE format('ALTER FUNCTION %s SET search_path = %I, pg_temp', fn, current_schema());
    END LOOP;
END $$;
