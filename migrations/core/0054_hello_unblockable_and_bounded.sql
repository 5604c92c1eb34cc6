-- The Hello transaction that no other login can block, that takes only a node's newest
-- proof, admits no unrecorded serial of a revoked generation, and is bounded per node and
-- minute (issue #59, items 1 to 4; docs/contract.md, "The Hello's proof").
--
-- * **No lock another login can take.** The policy cannot change under a Hello: the
--   Hello transaction takes the `fleet_policy` row FOR SHARE (the function runs with its
--   owner's rights; no group may lock that row), where it took a shared advisory lock on
--   `hashtext('bcw-fleet-policy')` that any login could hold (pg_advisory_lock is PUBLIC's)
--   and so stop every Hello. `bcw migrate` changes the policy with an UPDATE of that row
--   under a lock timeout: it waits for the Hellos in flight, and none opens under the old
--   policy once it has. Share lockers of a share-locked row never sleep, so Hellos do not
--   queue behind a waiting UPDATE.
-- * **The generation retired.** A serial with no record is not admitted (outcome
--   `revoked`) for a node with a revoked certificate of its current identity generation
--   (migration 0053): after a revocation only a certificate recorded since opens.
-- * **The newest proof.** A proven Hello records, under the node's lock, its proof's `at`
--   and the database's time (`hello_marks`, migration 0053), after checking again there
--   that its proof is not older than the newest accepted one and its key not retired: of
--   two Hellos racing with proofs of one time, or a key retired meanwhile, none slips by.
-- * **Hellos per node and minute bounded**: `hellos_per_node_minute()` (120) Hellos of a
--   node opened in the last minute (`session_epochs` by `issued_at`), counted apart for
--   Hellos that give a proof and those that do not (so unproven Hellos a gateway says for
--   a node with a key never stop its proven ones), and beyond it the Hello is refused
--   (outcome `too-many`: the gateway says UNAVAILABLE with a pushback) before anything is
--   read of its proof or written. An honest daemon redials with full jitter, 0 to 2 s
--   after a session that ended at once: a link that flaps at once makes 60 a minute on
--   average, and 120 of such draws sum to under a minute with a chance below 10^-20.

-- The bound: a constant of the schema, the one place it is written (docs/contract.md).
CREATE FUNCTION hellos_per_node_minute() RETURNS integer LANGUAGE sql IMMUTABLE AS $$ SELECT 120 $$;

-- The Hello transaction as in migration 0049, but as said above.
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
    claims boolean;
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
    -- a serial of the node's revoked generation: only one recorded since opens
    IF NOT EXISTS (SELECT 1 FROM node_certs c WHERE c.serial = p_cert_serial)
       AND EXISTS (SELECT 1 FROM node_certs c JOIN nodes n ON n.node_id = c.node_id
                    WHERE c.node_id = p_node AND c.revoked_at IS NOT NULL
                      AND c.identity_generation >= n.identity_generation) THEN
        outcome := 'revoked'; RETURN;
    END IF;
    -- the policy cannot change under a Hello (bcw migrate updates this row): a row lock
    -- only the owner can take, never an advisory key any login could hold
    SELECT f.hello_proof INTO policy FROM fleet_policy f FOR SHARE;
    -- a node with a Hello key (retired or not) proves its Hellos whatever the policy
    keyed := EXISTS (SELECT 1 FROM node_hello_keys k WHERE k.node_id = p_node);
    -- Hellos per node and minute, counted apart for those that give a proof: beyond the
    -- bound, refused before anything is read of the proof or written
    claims := p_proof_mac IS NOT NULL AND (keyed OR policy <> 'off');
    IF (SELECT count(*) FROM (SELECT 1 FROM session_epochs e
                               WHERE e.node_id = p_node
                                 AND e.issued_at > compute_now() - interval '1 minute'
                                 AND (e.proven IS TRUE) = claims
                               LIMIT hellos_per_node_minute()) AS opened)
       >= hellos_per_node_minute() THEN
        outcome := 'too-many'; RETURN;
    END IF;
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
    IF proven THEN
        -- again under the node's lock: the newest proof only, by a key not retired since
        IF NOT hello_proof_fresh(p_node, p_proof_at, p_proof_nonce)
           OR NOT EXISTS (SELECT 1 FROM node_hello_keys k
                           WHERE k.node_id = p_node AND k.retired_at IS NULL) THEN
            outcome := 'unproven'; RETURN;
        END IF;
        INSERT INTO hello_marks AS m (node_id, at, accepted_at)
        VALUES (p_node, p_proof_at, compute_now())
        ON CONFLICT (node_id) DO UPDATE
           SET at = greatest(m.at, EXCLUDED.at), accepted_at = greatest(m.accepted_at, EXCLUDED.accepted_at);
    END IF;
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

-- CREATE OR REPLACE keeps its grants and takes its settings from the new text: its search
-- path again, as migrations 0030 and 0049 set it; the bound is the owner's.
DO $$
BEGIN
    EXECUTE format(
        'ALTER FUNCTION gateway_hello(text, bigint, text, text, text, text, text, text, integer, '
        'text, boolean, bigint, bigint, text, interval, text, uuid, bigint, text, text, text[]) '
        'SET search_path = %I, pg_temp', current_schema());
    REVOKE EXECUTE ON FUNCTION hellos_per_node_minute() FROM PUBLIC;
END $$;
