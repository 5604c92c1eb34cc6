-- No downgrade, secure by default (issue #58, item 4; docs/contract.md, "The Hello's proof").
--
-- * A node that has enrolled a Hello key proves its Hellos whatever the fleet's policy:
--   its proof is checked even at `off`, a proof that does not hold is refused, and a Hello
--   without one opens only where the policy lets one open (`warn`, `off`) — as a takeover
--   attempt: recorded `proven = false` (from now on `false` says only that: a Hello of a
--   node without a key is recorded NULL, nothing to prove it by), held for good
--   (`held_epoch`: the hold bound never releases it), no capability stored, said by the
--   quarantine (`security.node.unproven-hello`). Nothing acts on it: no command, label or
--   revocation reaches or comes from it.
-- * For such a node only its proven sessions are its own: a Hello is a duplicate identity
--   only when it and the live session before it were both proven; a proven Hello after a
--   takeover attempt is the node back, not a clone.
-- * The session's proof on its row (`node_sessions.proven`: the dispatch loop never sends
--   to `false`; `bcw migrate` and the quarantine count the unproven), and the Hello
--   transaction's judgement of a duplicate identity on its epoch (`session_epochs.duplicate`:
--   what the workers count, never recomputed from the fact).
-- * A new database starts at `require`; one with a node, or whose policy was ever set,
--   keeps its own (`bcw migrate` sets it from BCW_HELLO_PROOF only when given).
ALTER TABLE node_sessions ADD COLUMN proven boolean;
ALTER TABLE session_epochs ADD COLUMN duplicate boolean;

ALTER TABLE fleet_policy ALTER COLUMN hello_proof SET DEFAULT 'require';
-- new: no node joined, and the policy as migration 0030 made it (its changed_at is that
-- migration's transaction's time, the time its ledger row was written)
UPDATE fleet_policy f SET hello_proof = 'require', changed_at = now()
 WHERE f.hello_proof = 'warn' AND NOT EXISTS (SELECT 1 FROM nodes)
   AND f.changed_at = (SELECT m.applied_at FROM schema_migrations m
                        WHERE m.name = '0030_hello_proof.sql');

-- The epoch's record as in migration 0032, and the Hello transaction's judgement of a
-- duplicate identity (`bcw.hello_duplicate`; NULL: a writer that did not say).
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
    -- by (node_id, issued_at): only what is old, however many epochs the node had today
    DELETE FROM session_epochs
     WHERE node_id = NEW.node_id AND issued_at < compute_now() - interval '1 day'
       AND epoch < NEW.session_epoch;
    RETURN NULL;
END $$;

-- The Hello transaction as in migration 0044, but for the proof of a node with a Hello
-- key (checked whatever the policy; without one: a takeover attempt, held), a keyed
-- node's duplicate identity (proven both), and what it records (`node_sessions.proven`,
-- `bcw.hello_duplicate`).
CREATE OR REPLACE FUNCTION gateway_hello(
    p_gateway text, p_lease bigint, p_node text, p_cert_serial text, p_boot text,
    p_journal text, p_role text, p_daemon_version text, p_proto_max integer,
    p_transport text, p_upgrade_required boolean, p_trust_version bigint,
    p_approver_set_epoch bigint, p_approver_set_sha256 text, p_live_window interval,
    p_trace_context text, p_hello_fact_id uuid,
    p_proof_at bigint, p_proof_nonce text, p_proof_mac text, p_capabilities text[] DEFAULT NULL,
    OUT outcome text, OUT epoch bigint, OUT session_id text, OUT acked_event_seq bigint,
    OUT duplicate boolean, OUT proven boolean, OUT inventory jsonb)
LANGUAGE plpgsql SECURITY DEFINER SET lock_timeout = '2s' AS $$
DECLARE
    gw text := gateway_as(p_gateway);
    is_draining boolean;
    policy text;
    keyed boolean;
    takeover boolean;
    prev record;
    prev_proven boolean;
BEGIN
    IF p_hello_fact_id IS NULL THEN
        RAISE EXCEPTION 'a Hello transaction names its Hello fact' USING ERRCODE = 'null_value_not_allowed';
    END IF;
    SELECT g.draining INTO is_draining FROM gateways g
     WHERE g.gateway_id = gw AND g.lease_epoch = p_lease AND g.lease_expires_at > compute_now()
       FOR SHARE;
    IF NOT FOUND THEN outcome := 'lease-gone'; RETURN; END IF;
    IF is_draining THEN outcome := 'draining'; RETURN; END IF;
    IF EXISTS (SELECT 1 FROM node_certs c WHERE c.serial = p_cert_serial
                 AND (c.revoked_at IS NOT NULL OR c.node_id <> p_node)) THEN
        outcome := 'revoked'; RETURN;
    END IF;
    -- the policy cannot change under a Hello (bcw migrate takes this lock exclusively)
    PERFORM pg_advisory_xact_lock_shared(hashtext('bcw-fleet-policy'));
    SELECT f.hello_proof INTO policy FROM fleet_policy f;
    -- a node with a Hello key proves its Hellos whatever the policy: no downgrade
    keyed := EXISTS (SELECT 1 FROM node_hello_keys k WHERE k.node_id = p_node);
    IF policy = 'off' AND NOT keyed THEN
        proven := NULL;
    ELSIF p_proof_mac IS NULL THEN
        proven := CASE WHEN keyed THEN false END;  -- false: a node that proves, unproven
    ELSE
        proven := hello_proof_holds(p_node, p_boot, p_journal, gw, p_proof_at, p_proof_nonce,
                                    p_proof_mac);
        IF NOT proven THEN outcome := 'unproven'; RETURN; END IF;  -- a bad proof is never taken
    END IF;
    IF policy = 'require' AND proven IS NOT TRUE THEN outcome := 'unproven'; RETURN; END IF;
    takeover := proven IS FALSE;
    -- live: `session_was_live` (migration 0044), the one place the rule is written
    SELECT s.session_epoch, s.boot_id,
           session_was_live(s.gateway_id, s.last_seen, s.node_id, s.session_epoch,
                            least(p_live_window, interval '5 minutes')) AS live
      INTO prev FROM node_sessions s WHERE s.node_id = p_node FOR UPDATE;
    IF NOT FOUND THEN outcome := 'not-joined'; RETURN; END IF;
    duplicate := coalesce(prev.live AND prev.boot_id IS NOT NULL AND prev.boot_id <> p_boot, false);
    IF duplicate AND keyed THEN
        -- a keyed node's sessions are those it proved: two of them, live, from two boots
        SELECT e.proven INTO prev_proven FROM session_epochs e
         WHERE e.node_id = p_node AND e.epoch = prev.session_epoch;
        duplicate := gateway_hello.proven IS TRUE AND prev_proven IS TRUE;
    END IF;
    PERFORM set_config('bcw.hello_fact_id', p_hello_fact_id::text, true),
            set_config('bcw.hello_previous_live', coalesce(prev.live, false)::text, true),
            set_config('bcw.hello_proven', coalesce(gateway_hello.proven::text, ''), true),
            set_config('bcw.hello_duplicate', duplicate::text, true);
    session_id := replace(gen_random_uuid()::text, '-', '');
    UPDATE node_sessions s
       SET session_epoch = s.session_epoch + 1, gateway_id = gw, session_id = gateway_hello.session_id,
           boot_id = p_boot, journal_id = p_journal, role = p_role, daemon_version = p_daemon_version,
           proto_max = p_proto_max, transport = p_transport, upgrade_required = p_upgrade_required,
           trust_version = p_trust_version,
           approver_set_epoch = CASE WHEN p_approver_set_sha256 <> '' THEN p_approver_set_epoch END,
           approver_set_sha256 = nullif(p_approver_set_sha256, ''),
           acked_event_seq = CASE WHEN s.journal_id IS DISTINCT FROM p_journal THEN 0 ELSE s.acked_event_seq END,
           connected_at = compute_now(), last_seen = compute_now(), disconnected_at = NULL,
           disconnect_reason = NULL, cert_serial = p_cert_serial, lane_credits = NULL, load = NULL,
           node_load = NULL,
           held_epoch = CASE WHEN gateway_hello.duplicate OR takeover THEN s.session_epoch + 1 END,
           proven = gateway_hello.proven,
           trace_context = p_trace_context,
           capabilities = CASE WHEN takeover THEN '{}' ELSE coalesce(p_capabilities, '{}') END
     WHERE s.node_id = p_node
    RETURNING s.session_epoch, s.acked_event_seq INTO epoch, acked_event_seq;
    PERFORM set_config('bcw.hello_previous_live', '', true), set_config('bcw.hello_proven', '', true),
            set_config('bcw.hello_duplicate', '', true);
    outcome := 'opened';
    inventory := coalesce((SELECT jsonb_object_agg(i.section, i.hash) FROM node_inventory i
                            WHERE i.node_id = p_node), '{}'::jsonb);
END $$;

-- CREATE OR REPLACE keeps their grants, and takes their settings from the new text: their
-- search path again, as migrations 0030 and 0032 set it.
DO $$
BEGIN
    EXECUTE format(
        'ALTER FUNCTION gateway_hello(text, bigint, text, text, text, text, text, text, integer, '
        'text, boolean, bigint, bigint, text, interval, text, uuid, bigint, text, text, text[]) '
        'SET search_path = %I, pg_temp', current_schema());
    EXECUTE format('ALTER FUNCTION record_session_epoch() SET search_path = %I, pg_temp',
                   current_schema());
END $$;
