-- Observability (issue "observability").
--
-- Trace context of the work that waits: the W3C traceparent of the Hello that opened a
-- session (written by the Hello transaction), and of the BUSY answer that sent a command
-- back to pending (written by the replay dispatcher). The dispatch loop continues that
-- trace when it sends a command that was waiting for the node, or for its back-off.
ALTER TABLE node_sessions ADD COLUMN trace_context text CHECK (length(trace_context) <= 512);
ALTER TABLE commands ADD COLUMN trace_context text CHECK (length(trace_context) <= 512);

-- Session history: what happened to a node, append-only, written in the transaction of
-- the effect itself (every event and notice about a node that a worker publishes through
-- its outbox), pruned after BCW_RETENTION_SESSION_HISTORY. Read by `bcw explain NODE`.
CREATE TABLE session_history (
    id         bigint      GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    node_id    text        NOT NULL,
    at         timestamptz NOT NULL DEFAULT compute_now(),
    what       text        NOT NULL,  -- the event or notice type (node.connected, dispatch, …)
    epoch      bigint,
    gateway_id text,
    worker     text        NOT NULL,  -- who wrote it
    fact_id    uuid,                  -- the fact that caused it; NULL for a loop's own work
    trace_id   text        CHECK (trace_id ~ '^[0-9a-f]{32}$'),
    detail     jsonb       NOT NULL   -- the message as published
);
CREATE INDEX session_history_by_node ON session_history (node_id, at);
CREATE INDEX session_history_by_age ON session_history (at);
