-- The flush as rows of hash ranges, step 3 (docs/capacity.md): with
-- `BCW_LIVENESS_RANGE_SIGHT`, a range fact no longer writes the rows of the sessions it
-- names; their range row is their sight.
--
-- `ranged_epoch`: set to the session's epoch when a range fact first names it (its
-- `last_seen` written then too), cleared when a fact of its range no longer names it
-- (its `last_seen` written from the row that did). A session is *ranged* while it equals
-- `session_epoch`: its sight is its gateway's range row, and its `last_seen` only a lower
-- bound of it; a new epoch is unranged by itself. The sweep searches the stale range rows
-- for ranged sessions and `last_seen` for the others.
ALTER TABLE node_sessions ADD COLUMN ranged_epoch bigint;

-- The set check: a gateway's sessions in one range of node hashes, read from the index
-- alone. Nothing a flush writes is in it (`last_seen`, credits and load stay HOT).
CREATE INDEX node_sessions_by_gateway_hash
    ON node_sessions (gateway_id, node_hash(node_id), node_id, session_epoch)
    INCLUDE (ranged_epoch) WHERE gateway_id IS NOT NULL;

-- The sweep's search for stale sessions not ranged (new ones, ones that left a range):
-- an index of whether a session is connected and not ranged, on no column a flush
-- writes (a flush's update of `last_seen` stays HOT). An expression index, not a partial
-- one: ANALYZE keeps statistics of its expression, so the planner knows how few sessions
-- are unranged (with range sight: the sweep reads those, not a million rows) or how many
-- (without: every connected session, and the sweep scans the table as before).
CREATE INDEX node_sessions_unranged ON node_sessions
    ((CASE WHEN gateway_id IS NOT NULL AND ranged_epoch IS DISTINCT FROM session_epoch
           THEN true END));
