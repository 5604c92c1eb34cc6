-- The verdict on a duplicate identity's Hello (issue #44, "the clone's quarantining Hello
-- is refused"). A Hello that is a duplicate identity opens a session held for the
-- quarantine; its gateway asks, for a bounded while before it answers the daemon, what the
-- quarantine made of it: 'revoked' (the node's certificate was revoked: the Hello is
-- refused UNAUTHENTICATED), 'released' (counted, not quarantined: welcomed), 'held' (not
-- decided yet, or held for an operator: welcomed held, as the hold bound then rules), or
-- 'gone' (the session is no longer this gateway's at that epoch). It reads one session.
CREATE FUNCTION gateway_hello_verdict(p_gateway text, p_node text, p_epoch bigint)
RETURNS text LANGUAGE plpgsql STABLE SECURITY DEFINER AS $$
DECLARE
    gw text := gateway_as(p_gateway);
    s record;
BEGIN
    IF NOT EXISTS (SELECT 1 FROM session_epochs e
                    WHERE e.node_id = p_node AND e.epoch = p_epoch AND e.gateway_id = gw) THEN
        RETURN 'gone';  -- not an epoch issued to this gateway
    END IF;
    SELECT n.held_epoch, n.cert_serial, n.gateway_id, n.session_epoch INTO s
      FROM node_sessions n WHERE n.node_id = p_node;
    IF s.session_epoch <> p_epoch THEN RETURN 'gone'; END IF;
    -- revoked: the revocation may have closed the session already (its notice is quick)
    IF EXISTS (SELECT 1 FROM node_certs c WHERE c.serial = s.cert_serial
                 AND c.revoked_at IS NOT NULL) THEN
        RETURN 'revoked';
    END IF;
    IF s.gateway_id IS DISTINCT FROM gw THEN RETURN 'gone'; END IF;
    RETURN CASE WHEN s.held_epoch IS NULL THEN 'released' ELSE 'held' END;
END $$;

DO $$ BEGIN
    EXECUTE format('ALTER FUNCTION gateway_hello_verdict(text, text, bigint) SET search_path = %I, pg_temp',
                   current_schema());
    REVOKE EXECUTE ON FUNCTION gateway_hello_verdict(text, text, bigint) FROM PUBLIC;
END $$;
