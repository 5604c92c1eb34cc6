-- A session's close, by its gateway at once, as in 0026 — but its lease held (FOR SHARE,
-- as the Hello and `gateway_close_many` hold it) while the node's row is waited for: a
-- new incarnation that takes the lease meanwhile waits for this close, and a stale
-- incarnation's close, checked before, never goes through once the row is free.
-- CREATE OR REPLACE keeps its grants (the bound gateways' group's alone) and takes its
-- settings from this text: its search path again below.
CREATE OR REPLACE FUNCTION gateway_close(p_gateway text, p_lease bigint, p_node text, p_epoch bigint, p_reason text)
RETURNS boolean LANGUAGE plpgsql SECURITY DEFINER AS $$
DECLARE
    gw text := gateway_as(p_gateway);
BEGIN
    PERFORM 1 FROM gateways g
     WHERE g.gateway_id = gw AND g.lease_epoch = p_lease AND g.lease_expires_at > compute_now()
       FOR SHARE;
    IF NOT FOUND THEN RETURN false; END IF;
    UPDATE node_sessions s
       SET gateway_id = NULL, disconnected_at = compute_now(), disconnect_reason = p_reason
     WHERE s.node_id = p_node AND s.session_epoch = p_epoch AND s.gateway_id = gw;
    RETURN FOUND;
END $$;

DO $$
BEGIN
    EXECUTE format('ALTER FUNCTION gateway_close(text, bigint, text, bigint, text) '
                   'SET search_path = %I, pg_temp', current_schema());
END $$;
