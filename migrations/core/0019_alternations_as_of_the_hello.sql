-- Alternations timed by the Hellos (issue "truth as of the Hello", docs/contract.md).
-- The quarantine counts each alternation at the time its Hello transaction issued the
-- epoch (`session_epochs.issued_at`), in epoch order, however late or out of order it
-- applies the facts: a backlog of Hellos spaced wider than the window is not read as a
-- burst. One row per (node, epoch): an epoch is at most one alternation.
CREATE TABLE node_alternations (
    node_id   text        NOT NULL REFERENCES nodes (node_id) ON DELETE CASCADE,
    epoch     bigint      NOT NULL CHECK (epoch >= 1),
    issued_at timestamptz NOT NULL,
    PRIMARY KEY (node_id, epoch)
);

-- The epoch of the node's last quarantine: the count up to it was acted on.
ALTER TABLE node_sessions ADD COLUMN alternations_judged_epoch bigint;
