-- The Hello transaction and the node's spec in one call (issue #61): a gateway said Hello
-- in three calls — its admission read, the Hello transaction, then the desired state its
-- new session may read — each a round trip and a statement of its own, the last 0.16 ms of
-- PostgreSQL and a round trip a Hello in a rolling restart. `gateway_hello_desired` runs
-- the Hello transaction (`gateway_hello`, its 21 arguments, migration 0054's body) and,
-- once it opened the session and no upgrade is required, reads the spec as
-- `gateway_desired_state` (migration 0058's body) answers the session's holder: in the
-- same transaction, after the session is this gateway's, never before. Neither rule is
-- written again here: it calls the two functions, and each checks the login may act as
-- the gateway it names. `gateway_hello` and `gateway_desired_state` stay (a 0.3 gateway,
-- and a 0.4 gateway before this migration, call them).
CREATE FUNCTION gateway_hello_desired(
    p_gateway text, p_lease bigint, p_node text, p_cert_serial text, p_boot text,
    p_journal text, p_role text, p_daemon_version text, p_proto_max integer,
    p_transport text, p_upgrade_required boolean, p_trust_version bigint,
    p_approver_set_epoch bigint, p_approver_set_sha256 text, p_live_window interval,
    p_trace_context text, p_hello_fact_id uuid,
    p_proof_at bigint, p_proof_nonce text, p_proof_mac text, p_capabilities text[] DEFAULT NULL,
    OUT outcome text, OUT epoch bigint, OUT session_id text, OUT acked_event_seq bigint,
    OUT duplicate boolean, OUT proven boolean, OUT inventory jsonb,
    OUT spec text, OUT spec_generation bigint, OUT spec_signature text)
LANGUAGE plpgsql SECURITY DEFINER AS $$
BEGIN
    SELECT h.outcome, h.epoch, h.session_id, h.acked_event_seq, h.duplicate, h.proven,
           h.inventory
      INTO outcome, epoch, session_id, acked_event_seq, duplicate, proven, inventory
      FROM gateway_hello(p_gateway, p_lease, p_node, p_cert_serial, p_boot, p_journal, p_role,
                         p_daemon_version, p_proto_max, p_transport, p_upgrade_required,
                         p_trust_version, p_approver_set_epoch, p_approver_set_sha256,
                         p_live_window, p_trace_context, p_hello_fact_id, p_proof_at,
                         p_proof_nonce, p_proof_mac, p_capabilities) h;
    IF outcome = 'opened' AND NOT p_upgrade_required THEN
        SELECT d.spec, d.spec_generation, d.spec_signature
          INTO spec, spec_generation, spec_signature
          FROM gateway_desired_state(p_gateway, p_node, epoch) d;
    END IF;
END $$;

-- As every gateway function (0026): this schema, then pg_temp; no PUBLIC execute (the
-- bound gateways' group is granted it: `workers/runtime/store/roles.py`).
DO $$
BEGIN
    EXECUTE format(
        'ALTER FUNCTION gateway_hello_desired(text, bigint, text, text, text, text, text, text, '
        'integer, text, boolean, bigint, bigint, text, interval, text, uuid, bigint, text, text, '
        'text[]) SET search_path = %I, pg_temp', current_schema());
    REVOKE EXECUTE ON FUNCTION gateway_hello_desired(text, bigint, text, text, text, text, text,
        text, integer, text, boolean, bigint, bigint, text, interval, text, uuid, bigint, text,
        text, text[]) FROM PUBLIC;
END $$;
