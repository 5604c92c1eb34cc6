-- A session's last sight as the rest of the control plane reads it (issue #58): with
-- range sight (migration 0039) a ranged session's `last_seen` is only a lower bound —
-- its sight is its entry in its gateway's range row — so the column alone no longer
-- says when a node was last seen.

-- Each node's current session (one row a joined node, as `node_sessions`) and its last
-- sight: `last_sight()` of migration 0038 — the later of its row's `last_seen` and its
-- entry at its epoch in a range row of its gateway whose range holds its hash — set-based.
-- One node (`WHERE node_id = …`) or one gateway's sessions are found through the keys and
-- read only the range rows that hold them; the whole fleet parses every range row once
-- (a hash join), where `last_sight()` per row would parse a range row per session. A
-- disconnected session has no gateway and its row's `last_seen` (kept at its disconnect,
-- below); a node never connected, none. Rows of two cuts may overlap for a moment: the
-- latest sight of any (GROUP BY the key: one row a node).
CREATE VIEW node_last_seen AS
SELECT s.node_id, s.session_epoch, s.gateway_id, greatest(s.last_seen, max(e.seen)) AS last_seen
  FROM node_sessions s
  LEFT JOIN (SELECT r.gateway_id, r.range_start, r.range_end,
                    x ->> 0 AS node_id, (x ->> 1)::bigint AS epoch,  -- [node_id, epoch, age_ms]
                    r.applied_at - (x ->> 2)::bigint * interval '1 millisecond' AS seen
               FROM liveness_ranges r CROSS JOIN LATERAL json_array_elements(r.entries) AS x) e
    ON e.gateway_id = s.gateway_id
   AND e.range_start <= node_hash(s.node_id) AND node_hash(s.node_id) < e.range_end
   AND e.node_id = s.node_id AND e.epoch = s.session_epoch
 GROUP BY s.node_id;

COMMENT ON VIEW node_last_seen IS
    'each node''s current session and its last sight (last_sight(), set-based): a ranged '
    'session''s entry in its gateway''s range row, else its row''s last_seen';

-- As its caller (PostgreSQL 15 and later): the grants and row rules of the tables it reads
-- hold through it as on them. On 14 a view runs with its owner's rights: it is granted
-- to the same groups (`workers/runtime/store/roles.py`), and no row rule guards either
-- table today.
DO $$
BEGIN
    IF current_setting('server_version_num')::int >= 150000 THEN
        EXECUTE 'ALTER VIEW node_last_seen SET (security_invoker = true)';
    END IF;
END $$;

-- A disconnect keeps a ranged session's last sight: once its gateway is cleared no reader
-- looks in the range rows for it (and its gateway's next flush no longer names it), so
-- its `last_seen` takes the sight its range row holds, and it is no longer ranged. Every
-- statement that clears a session's gateway at its epoch and leaves it ranged goes
-- through this trigger, row by row (one range row parsed a session): a gateway's own
-- close (`gateway_close`), a 0.3 gateway's direct write. The liveness worker's
-- disconnections (the sweep's, a `closed` fact's) write it themselves, a batch at once
-- (`liveness_disconnect`, below). A new epoch (a Hello) is unranged by itself. With its
-- owner's rights (as `record_session_epoch`, migration 0032): whoever clears a gateway,
-- the range rows are read whatever that login's grants.
CREATE FUNCTION keep_last_sight() RETURNS trigger
LANGUAGE plpgsql SECURITY DEFINER SET search_path FROM CURRENT AS $$
BEGIN
    NEW.last_seen := greatest(NEW.last_seen,
                              range_sight(OLD.node_id, OLD.session_epoch, OLD.gateway_id));
    NEW.ranged_epoch := NULL;
    RETURN NEW;
END $$;

CREATE TRIGGER node_sessions_sight_kept
    BEFORE UPDATE OF gateway_id ON node_sessions
    FOR EACH ROW WHEN (OLD.gateway_id IS NOT NULL AND NEW.gateway_id IS NULL
                       AND NEW.session_epoch = OLD.session_epoch
                       AND NEW.ranged_epoch = OLD.session_epoch)
    EXECUTE FUNCTION keep_last_sight();

-- The liveness worker's disconnections (migration 0032), each keeping its last sight as
-- the trigger above would, for the whole batch in the same write: the range rows that
-- hold a ranged session of it are parsed once each (a sweep that loses a gateway of 5,000
-- sessions parses its few rows, not one a session), and the sessions left unranged.
CREATE OR REPLACE FUNCTION liveness_disconnect(
    p_nodes text[], p_epochs bigint[], p_gateways text[], p_reasons text[], p_at timestamptz
) RETURNS SETOF text
LANGUAGE sql SECURITY DEFINER SET search_path FROM CURRENT AS $$
    WITH t AS MATERIALIZED (
        SELECT u.node_id, u.epoch, u.gateway_id, u.reason, node_hash(u.node_id) AS h,
               coalesce(s.ranged_epoch = s.session_epoch, false) AS ranged
          FROM unnest(p_nodes, p_epochs, p_gateways, p_reasons) AS u(node_id, epoch, gateway_id, reason)
          JOIN node_sessions s
            ON s.node_id = u.node_id AND s.session_epoch = u.epoch AND s.gateway_id = u.gateway_id
    ), e AS MATERIALIZED (
        SELECT r.gateway_id, r.range_start, r.range_end, x ->> 0 AS node_id,
               (x ->> 1)::bigint AS epoch,  -- [node_id, epoch, age_ms]
               r.applied_at - (x ->> 2)::bigint * interval '1 millisecond' AS seen
          FROM (SELECT * FROM liveness_ranges r
                 WHERE EXISTS (SELECT 1 FROM t WHERE t.ranged AND t.gateway_id = r.gateway_id
                                  AND r.range_start <= t.h AND t.h < r.range_end)) AS r
         CROSS JOIN LATERAL json_array_elements(r.entries) AS x
    ), seen AS (
        SELECT t.node_id, t.epoch, t.gateway_id, t.reason, t.ranged, max(e.seen) AS at
          FROM t LEFT JOIN e
            ON t.ranged AND e.gateway_id = t.gateway_id AND e.node_id = t.node_id
           AND e.epoch = t.epoch AND e.range_start <= t.h AND t.h < e.range_end
         GROUP BY t.node_id, t.epoch, t.gateway_id, t.reason, t.ranged
    )
    UPDATE node_sessions s
       SET gateway_id = NULL, disconnected_at = coalesce(p_at, compute_now()),
           disconnect_reason = seen.reason,
           last_seen = CASE WHEN seen.ranged THEN greatest(s.last_seen, seen.at) ELSE s.last_seen END,
           ranged_epoch = CASE WHEN seen.ranged THEN NULL ELSE s.ranged_epoch END
      FROM seen
     WHERE s.node_id = seen.node_id AND s.session_epoch = seen.epoch
       AND s.gateway_id = seen.gateway_id
    RETURNING s.node_id
$$;

-- Functions with their owner's rights search this schema, then pg_temp last (as 0032).
-- CREATE OR REPLACE keeps `liveness_disconnect`'s grants (its group's alone:
-- `workers/runtime/store/roles.py`) and takes its settings from the new text: its search
-- path again.
DO $$
BEGIN
    EXECUTE format(
        'ALTER FUNCTION liveness_disconnect(text[], bigint[], text[], text[], timestamptz) '
        'SET search_path = %I, pg_temp', current_schema());
    EXECUTE format('ALTER FUNCTION keep_last_sight() SET search_path = %I, pg_temp',
                   current_schema());
END $$;
