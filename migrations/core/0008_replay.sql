-- The replay dispatcher: which certificate a session presented (its allowed kinds
-- restrict what may be dispatched to it), and commands in flight per node.
ALTER TABLE node_sessions ADD COLUMN cert_serial text;

CREATE INDEX commands_in_flight ON commands (node_id, lane, seq)
    WHERE state IN ('dispatched', 'acked', 'running');
