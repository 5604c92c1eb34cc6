-- The flush as rows of hash ranges, step 2 (docs/capacity.md): a session's last sight
-- read in one place. A session is seen when its row says so (`last_seen`, which every
-- flush still moves) or when its gateway's range row (migration 0037) names it at its
-- epoch — the reading every reader of a session's sight goes through, so that the step
-- that stops writing matched sessions' rows changes no reader.

-- When the range row of `p_gateway` covering `p_node`'s hash last saw it at `p_epoch`
-- (the row's time applied less the entry's age); NULL when no such row names it. Rows of
-- two cuts may overlap for a moment (`workers/liveness/ranges.py`): the latest sight of
-- any. One row's entries are parsed: for one session, or a few.
CREATE FUNCTION range_sight(p_node text, p_epoch bigint, p_gateway text) RETURNS timestamptz
    LANGUAGE sql STABLE PARALLEL SAFE AS $$
    SELECT max(r.applied_at - (e ->> 2)::bigint * interval '1 millisecond')
      FROM liveness_ranges r
     CROSS JOIN LATERAL json_array_elements(r.entries) AS e  -- [node_id, epoch, age_ms]
     WHERE r.gateway_id = p_gateway
       AND r.range_start <= node_hash(p_node) AND node_hash(p_node) < r.range_end
       AND e ->> 0 = p_node AND (e ->> 1)::bigint = p_epoch
$$;

-- A session's last sight: the later of its row's `last_seen` and its range sight (none
-- while it has no gateway: a disconnected session's last sight is its row's).
CREATE FUNCTION last_sight(p_last_seen timestamptz, p_node text, p_epoch bigint, p_gateway text)
    RETURNS timestamptz LANGUAGE sql STABLE PARALLEL SAFE AS $$
    SELECT CASE WHEN p_gateway IS NULL THEN p_last_seen
                ELSE greatest(p_last_seen, range_sight(p_node, p_epoch, p_gateway)) END
$$;

-- The Hello transaction reads whether the previous session was live (a duplicate
-- identity is a live session's node Hello-ing with another boot) through it: as in
-- migration 0030, but for that expression.
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
    -- live: seen within the window, by its row or its gateway's range row (read only
    -- when its row alone says no: a herd's Hellos of gone or just-seen sessions parse none)
    SELECT s.session_epoch, s.boot_id,
           s.gateway_id IS NOT NULL
           AND (s.last_seen > compute_now() - least(p_live_window, interval '5 minutes')
                OR range_sight(s.node_id, s.session_epoch, s.gateway_id)
                   > compute_now() - least(p_live_window, interval '5 minutes')) AS live
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
