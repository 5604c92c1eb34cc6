-- Capabilities as of the session (issue "truth as of the Hello", docs/contract.md).
-- The system labels of a node are those of one session: `labeled_epoch`, set whenever
-- the labeler writes a session's capabilities (a trigger, so every labeler release sets
-- it, old or new, and no role needs a right on the column). Placement offers a node only
-- while that is its current, connected session: a reconnect that has not been labeled
-- yet (the labeler behind, or down) offers the node for nothing, rather than for what
-- its previous session advertised.
ALTER TABLE node_sessions ADD COLUMN labeled_epoch bigint;

CREATE FUNCTION mark_labeled_epoch() RETURNS trigger
LANGUAGE plpgsql SET search_path FROM CURRENT AS $$
BEGIN
    NEW.labeled_epoch := NEW.session_epoch;
    RETURN NEW;
END $$;

CREATE TRIGGER node_sessions_labeled
    BEFORE UPDATE OF capabilities ON node_sessions
    FOR EACH ROW EXECUTE FUNCTION mark_labeled_epoch();

-- The labels written so far are taken as the current sessions' (the labeler keeps up
-- within seconds; leaving them unmarked would offer no node until its next Hello).
UPDATE node_sessions SET labeled_epoch = session_epoch WHERE session_epoch >= 1;

CREATE OR REPLACE FUNCTION nodes_with_capability(p_name text)
RETURNS SETOF text LANGUAGE sql STABLE AS $$
    SELECT l.node_id
      FROM node_labels l
      JOIN node_sessions s ON s.node_id = l.node_id
     WHERE l.source = 'system' AND l.key = 'bc.dev/cap.' || p_name AND l.value = '1'
       AND s.session_epoch >= 1 AND s.labeled_epoch = s.session_epoch
       AND s.disconnected_at IS NULL
     ORDER BY l.node_id
$$;
