-- A stopping gateway's sessions closed in one statement (a rolling restart's drain): as
-- `gateway_close` (0026), fenced on this gateway, its lease and each session's epoch, but
-- the range rows that hold its ranged sessions parsed once each, as `liveness_disconnect`
-- does (0050) — not once a session, as the `node_sessions_sight_kept` trigger does for a
-- single close (a drained gateway of 4,000 sessions parsed its range rows 4,000 times).
-- The rows are locked in node order, as every writer of `node_sessions` locks them. At
-- most 10,000 sessions a call. Returns the nodes it closed.
CREATE FUNCTION gateway_close_many(
    p_gateway text, p_lease bigint, p_nodes text[], p_epochs bigint[], p_reason text
) RETURNS SETOF text
LANGUAGE plpgsql SECURITY DEFINER AS $$
DECLARE
    gw text := gateway_as(p_gateway);
BEGIN
    IF cardinality(p_nodes) IS DISTINCT FROM cardinality(p_epochs)
       OR cardinality(p_nodes) > 10000 THEN
        RAISE EXCEPTION 'gateway_close_many: as many epochs as nodes, 10,000 at most'
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    -- the lease held (FOR SHARE, as the Hello holds it) while the rows are waited for: a
    -- new incarnation's lease waits for this write, never lets a stale one through
    PERFORM 1 FROM gateways g
     WHERE g.gateway_id = gw AND g.lease_epoch = p_lease AND g.lease_expires_at > compute_now()
       FOR SHARE;
    IF NOT FOUND THEN RETURN; END IF;
    PERFORM 1 FROM node_sessions s
     WHERE s.node_id = ANY(p_nodes) AND s.gateway_id = gw
     ORDER BY s.node_id FOR UPDATE;
    RETURN QUERY
    WITH t AS MATERIALIZED (
        SELECT s.node_id, s.session_epoch AS epoch, node_hash(s.node_id) AS h,
               coalesce(s.ranged_epoch = s.session_epoch, false) AS ranged
          FROM (SELECT DISTINCT * FROM unnest(p_nodes, p_epochs)) AS u(node_id, epoch)
          JOIN node_sessions s
            ON s.node_id = u.node_id AND s.session_epoch = u.epoch AND s.gateway_id = gw
    ), e AS MATERIALIZED (
        SELECT r.range_start, r.range_end, x ->> 0 AS node_id,
               (x ->> 1)::bigint AS epoch,  -- [node_id, epoch, age_ms]
               r.applied_at - (x ->> 2)::bigint * interval '1 millisecond' AS seen
          FROM (SELECT * FROM liveness_ranges r
                 WHERE r.gateway_id = gw
                   AND EXISTS (SELECT 1 FROM t WHERE t.ranged
                                  AND r.range_start <= t.h AND t.h < r.range_end)) AS r
         CROSS JOIN LATERAL json_array_elements(r.entries) AS x
    ), seen AS (
        SELECT t.node_id, t.epoch, t.ranged, max(e.seen) AS at
          FROM t LEFT JOIN e
            ON t.ranged AND e.node_id = t.node_id AND e.epoch = t.epoch
           AND e.range_start <= t.h AND t.h < e.range_end
         GROUP BY t.node_id, t.epoch, t.ranged
    )
    UPDATE node_sessions s
       SET gateway_id = NULL, disconnected_at = compute_now(), disconnect_reason = p_reason,
           last_seen = CASE WHEN seen.ranged THEN greatest(s.last_seen, seen.at) ELSE s.last_seen END,
           ranged_epoch = CASE WHEN seen.ranged THEN NULL ELSE s.ranged_epoch END
      FROM seen
     WHERE s.node_id = seen.node_id AND s.session_epoch = seen.epoch AND s.gateway_id = gw
    RETURNING s.node_id;
END $$;

-- As every gateway function (0026): this schema, then pg_temp; no PUBLIC execute (the
-- bound gateways' group is granted it: `workers/runtime/store/roles.py`).
DO $$
BEGIN
    EXECUTE format('ALTER FUNCTION gateway_close_many(text, bigint, text[], bigint[], text) '
                   'SET search_path = %I, pg_temp', current_schema());
    REVOKE EXECUTE ON FUNCTION gateway_close_many(text, bigint, text[], bigint[], text) FROM PUBLIC;
END $$;
