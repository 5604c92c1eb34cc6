-- Inventory and load (issue "session rules").
--
-- node_inventory: each section of a node's inventory as its daemon last sent it, with its
-- hash. The hashes a Hello (and every 10th heartbeat) carries are compared with these; a
-- section whose hash differs, or that is not stored, is asked for (the Welcome's
-- request_sections), and the daemon sends it. Written by the node's gateway, fenced on
-- the node's session (epoch and gateway) and the gateway's lease; a section is never
-- overwritten from an older session.
CREATE TABLE node_inventory (
    node_id       text        NOT NULL REFERENCES nodes (node_id) ON DELETE CASCADE,
    section       text        NOT NULL CHECK (section ~ '^[!-~]+$' AND length(section) <= 256),
    hash          text        NOT NULL CHECK (hash ~ '^[!-~]+$' AND length(hash) <= 256),
    body          jsonb       NOT NULL CHECK (jsonb_typeof(body) = 'object'),
    session_epoch bigint      NOT NULL CHECK (session_epoch >= 1),
    reported_at   timestamptz NOT NULL,
    PRIMARY KEY (node_id, section)
);

-- The load the daemon's last heartbeat reported (a flush entry's optional `load`), written
-- by the liveness controller under the flush's fence; NULL until reported, and a new
-- session starts unknown.
ALTER TABLE node_sessions ADD COLUMN load real CHECK (load IS NULL OR load >= 0);
