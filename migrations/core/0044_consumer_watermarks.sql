-- As of when a worker's consumer has applied its facts (issue "overload never reads as
-- death", item 3; docs/workers.md, "One clock for sight"): a rule that concludes from a
-- fact's absence, or from how old the newest applied fact is, must know whether the fact
-- is absent or only not applied yet.
--
-- One row per consumer, written by that worker (its row alone: row-level security,
-- `workers/runtime/store/policies.py`) every few seconds: `applied_through`, when the bus
-- stored the oldest of its facts it has not applied (`bus_time`), or the time it looked
-- when none waited; `reported_at`, when it looked; `moved_at`, when `applied_through`
-- last moved forward.
--
-- - The quarantine's: a session held for the quarantine is released after
--   BCW_QUARANTINE_HOLD_MAX only once the quarantine has applied what the bus stored up
--   to its Hello, or is down (said nothing, or did not move, for that long), or after
--   three times the bound in any case (`workers/replay/holds.py`).
-- - The liveness controller's: the Hello transaction below takes a previous session for
--   live when it was seen within the live window before what the controller has applied.
CREATE TABLE consumer_watermarks (
    consumer        text        PRIMARY KEY,
    applied_through timestamptz NOT NULL,
    reported_at     timestamptz NOT NULL,
    moved_at        timestamptz NOT NULL
);

-- Whether a node's session (routed to `p_gateway`, last seen `p_last_seen` by its row, at
-- `p_epoch`) was live when the Hello transaction reads it: seen within `p_window` by its
-- row or its gateway's range row (read only when its row alone says no: a herd's Hellos
-- of gone or just-seen sessions parse none), before what the liveness controller has
-- applied — sights are when the bus stored a flush (migration 0043), so a controller
-- behind its flushes by L saw every live session L ago at best, and a clone must not pass
-- for a session gone quiet for it. A function of its own, so that the rule changes
-- without the Hello transaction being written again; it runs with its caller's rights
-- (the Hello transaction's: the owner's).
CREATE FUNCTION session_was_live(
    p_gateway text, p_last_seen timestamptz, p_node text, p_epoch bigint, p_window interval
) RETURNS boolean LANGUAGE sql STABLE AS $$
    WITH seen_up_to AS (
        SELECT compute_now() - coalesce(
                   (SELECT greatest(interval '0', w.reported_at - w.applied_through)
                      FROM consumer_watermarks w WHERE w.consumer = 'liveness'),
                   interval '0') AS at)
    SELECT p_gateway IS NOT NULL
       AND (p_last_seen > (SELECT at FROM seen_up_to) - p_window
            OR range_sight(p_node, p_epoch, p_gateway) > (SELECT at FROM seen_up_to) - p_window)
$$;

-- The Hello transaction as in migration 0038, but for whether the previous session was
-- live: `session_was_live`.
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
    prev record;
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
    IF policy = 'off' THEN
        proven := NULL;
    ELSIF p_proof_mac IS NULL THEN
        proven := false;
    ELSE
        proven := hello_proof_holds(p_node, p_boot, p_journal, gw, p_proof_at, p_proof_nonce,
                                    p_proof_mac);
        IF NOT proven THEN outcome := 'unproven'; RETURN; END IF;  -- a bad proof is never taken
    END IF;
    IF policy = 'require' AND proven IS NOT TRUE THEN outcome := 'unproven'; RETURN; END IF;
    -- live: `session_was_live` (below), the one place the rule is written
    SELECT s.session_epoch, s.boot_id,
           session_was_live(s.gateway_id, s.last_seen, s.node_id, s.session_epoch,
                            least(p_live_window, interval '5 minutes')) AS live
      INTO prev FROM node_sessions s WHERE s.node_id = p_node FOR UPDATE;
    IF NOT FOUND THEN outcome := 'not-joined'; RETURN; END IF;
    duplicate := coalesce(prev.live AND prev.boot_id IS NOT NULL AND prev.boot_id <> p_boot, false);
    PERFORM set_config('bcw.hello_fact_id', p_hello_fact_id::text, true),
            set_config('bcw.hello_previous_live', coalesce(prev.live, false)::text, true),
            set_config('bcw.hello_proven', coalesce(proven::text, ''), true);
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
           node_load = NULL, held_epoch = CASE WHEN duplicate THEN s.session_epoch + 1 END,
           trace_context = p_trace_context, capabilities = coalesce(p_capabilities, '{}')
     WHERE s.node_id = p_node
    RETURNING s.session_epoch, s.acked_event_seq INTO epoch, acked_event_seq;
    PERFORM set_config('bcw.hello_previous_live', '', true), set_config('bcw.hello_proven', '', true);
    outcome := 'opened';
    inventory := coalesce((SELECT jsonb_object_agg(i.section, i.hash) FROM node_inventory i
                            WHERE i.node_id = p_node), '{}'::jsonb);
END $$;

-- CREATE OR REPLACE keeps its grants, and takes the function's settings from the new
-- text: its search path again, as migration 0030 set it.
DO $$
BEGIN
    EXECUTE format(
        'ALTER FUNCTION gateway_hello(text, bigint, text, text, text, text, text, text, integer, '
        'text, boolean, bigint, bigint, text, interval, text, uuid, bigint, text, text, text[]) '
        'SET search_path = %I, pg_temp', current_schema());
END $$;
