-- Issue 59, findings 13 and 15: wake-ups only the workers' writers can send, the node's
-- epochs bounded in number, and admission that says nothing of a node the gateway is not
-- admitting.

-- 1. The workers' wake-up channels, named with a secret of this database. `pg_notify` is
-- PUBLIC and PostgreSQL has no right on a channel, so any login could NOTIFY `bcw_outbox`
-- or `bcw_dispatch` and make every worker pay for each notification. A channel is now
-- `bcw_<name>_<32 random hex digits>`, read from this table at LISTEN time: only the owner
-- and the workers' groups read it (roles.py: a secret table), and the notifying side is a
-- trigger or a function with its owner's rights (whose source names no channel). A login
-- that does not read it cannot guess the name; one that does is a worker's, whose
-- listener sheds a storm (workers/runtime/store/notify.py).
CREATE TABLE wake_channels (
    name    text PRIMARY KEY CHECK (name IN ('outbox', 'dispatch', 'commands')),
    channel text NOT NULL UNIQUE CHECK (channel ~ '^bcw_[a-z]+_[0-9a-f]{32}$')
);
INSERT INTO wake_channels (name, channel)
SELECT n, 'bcw_' || n || '_' || replace(gen_random_uuid()::text, '-', '')
  FROM unnest(ARRAY['outbox', 'dispatch', 'commands']) AS n;

-- The outbox relay's wake-up: as migration 0004, on the secret channel.
CREATE OR REPLACE FUNCTION outbox_notify() RETURNS trigger
LANGUAGE plpgsql SECURITY DEFINER AS $$
BEGIN
    PERFORM pg_notify(w.channel, '') FROM wake_channels w WHERE w.name = 'outbox';
    RETURN NULL;
END $$;

-- The dispatch loop's wake-up for a new command: a trigger on `commands`, so whoever may
-- enqueue wakes it (enqueue_command runs with its caller's rights), and no one else.
CREATE FUNCTION commands_notify() RETURNS trigger
LANGUAGE plpgsql SECURITY DEFINER AS $$
BEGIN
    PERFORM pg_notify(w.channel, '') FROM wake_channels w WHERE w.name = 'commands';
    RETURN NULL;
END $$;
CREATE TRIGGER commands_notify AFTER INSERT ON commands
    FOR EACH STATEMENT EXECUTE FUNCTION commands_notify();

-- As migration 0005, without its NOTIFY (the trigger above sends it).
CREATE OR REPLACE FUNCTION enqueue_command(p_node_id text, p_kind text, p_payload jsonb,
                                           p_lane text DEFAULT 'default')
RETURNS uuid LANGUAGE plpgsql AS $$
DECLARE
    next_seq bigint;
    new_id   uuid;
BEGIN
    UPDATE nodes SET last_command_seq = last_command_seq + 1
     WHERE node_id = p_node_id
    RETURNING last_command_seq INTO next_seq;
    IF next_seq IS NULL THEN
        RAISE EXCEPTION 'unknown node %', p_node_id USING ERRCODE = 'foreign_key_violation';
    END IF;
    INSERT INTO commands (node_id, seq, kind, lane, payload)
    VALUES (p_node_id, next_seq, p_kind, p_lane, coalesce(p_payload, '{}'::jsonb))
    RETURNING command_id INTO new_id;
    RETURN new_id;
END $$;

-- The dispatch loop's other wake-ups (credits freed, Hellos applied, a quarantine lifted):
-- executable by the replay and quarantine workers and the operator only (roles.EXECUTES).
CREATE FUNCTION wake_dispatch() RETURNS void
LANGUAGE plpgsql SECURITY DEFINER AS $$
BEGIN
    PERFORM pg_notify(w.channel, '') FROM wake_channels w WHERE w.name = 'dispatch';
END $$;

-- 2. A node's epochs bounded in number (finding 13: 10,000 Hellos in 13 s kept 10,000 rows
-- for a day). `record_session_epoch` as in migration 0052, but its prune also takes, of
-- the node's epochs beyond its newest 64, those whose Hello fact the quarantine enforcer
-- has applied (its watermark, a minute past their issue), and any beyond its newest
-- 10,000 whatever; it always keeps the epoch just before the new one and the node's
-- newest epoch that was not a takeover attempt (what `provenance.as_recorded` reads as
-- the session before a takeover). docs/contract.md, "What `session_epochs` keeps".
-- The node's newest epoch that was not a takeover attempt, found at once however many
-- attempts came after it (the prune below keeps it; `provenance.UNBOUND` reads it).
CREATE INDEX session_epochs_not_takeover ON session_epochs (node_id, epoch)
    WHERE proven IS DISTINCT FROM false;

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
    SELECT max(h.epoch) INTO honest FROM session_epochs h
     WHERE h.node_id = NEW.node_id AND h.epoch < NEW.session_epoch
       AND h.proven IS DISTINCT FROM false;
    -- by (node_id, issued_at): only what is old or applied, however many epochs the node
    -- had today — never the epoch just before this one, however long it lasted: its
    -- gateway's late facts (a result the daemon sent before it moved) are still the node's
    -- (`epoch + 0`: never by the key, which would read every epoch the node keeps, as a
    -- cached generic plan did)
    DELETE FROM session_epochs
     WHERE node_id = NEW.node_id AND issued_at < greatest(day_old, applied)
       AND epoch + 0 < NEW.session_epoch - 1
       AND (issued_at < day_old OR (epoch < NEW.session_epoch - 64 AND epoch <> coalesce(honest, 0)));
    -- and beyond the newest 10,000, whatever the quarantine has applied (by the key)
    DELETE FROM session_epochs
     WHERE node_id = NEW.node_id AND epoch < NEW.session_epoch - 10000
       AND epoch <> coalesce(honest, 0);
    RETURN NULL;
END $$;

-- 3. Admission says nothing of a node the gateway is not admitting (finding 15): the
-- presented serial's record only when it is the named node's and not revoked (another
-- node's: its serial alone, so that admission refuses it as another node's; a revoked
-- one: revoked, nothing else), and the node's spec only to the gateway that holds the
-- node's open session (the reference gateway reads it with `gateway_desired_state` once
-- its Hello opened). As migration 0033 otherwise.
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
                                AND s.disconnected_at IS NULL)
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

-- The node's desired state, to the gateway whose Hello opened the node's session at
-- `p_epoch` (and still holds it), nothing to any other.
CREATE FUNCTION gateway_desired_state(p_gateway text, p_node text, p_epoch bigint,
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
       AND s.disconnected_at IS NULL;
END $$;

DO $$
DECLARE
    fn regprocedure;
BEGIN
    FOR fn IN
        SELECT p.oid::regprocedure FROM pg_proc p
         WHERE p.pronamespace = current_schema()::regnamespace
           AND p.proname IN ('outbox_notify', 'commands_notify', 'wake_dispatch',
                             'record_session_epoch', 'gateway_admission',
                             'gateway_desired_state')
    LOOP
        EXECUTE format('ALTER FUNCTION %s SET search_path = %I, pg_temp', fn, current_schema());
    END LOOP;
    REVOKE EXECUTE ON FUNCTION wake_dispatch() FROM PUBLIC;
    REVOKE EXECUTE ON FUNCTION gateway_desired_state(text, text, bigint) FROM PUBLIC;
END $$;
