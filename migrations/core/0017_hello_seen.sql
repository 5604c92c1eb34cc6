-- Lost Hellos (issue "durability"). JetStream can lose a message it acknowledged (a power
-- loss with the default sync_interval); a lost Hello fact leaves its session without
-- labels, without node.connected, and with its lanes waiting for a replay that never
-- comes. The replay worker records the epoch of each Hello it applied; its dispatch loop
-- asks the gateway of a session whose Hello it has not seen, once nothing is left to
-- consume, to publish it again (`hello-again`), and records when it asked.
CREATE TABLE hello_seen (
    node_id     text        PRIMARY KEY REFERENCES nodes (node_id) ON DELETE CASCADE,
    seen_epoch  bigint      CHECK (seen_epoch IS NULL OR seen_epoch >= 1),
    asked_epoch bigint      CHECK (asked_epoch IS NULL OR asked_epoch >= 1),
    asked_at    timestamptz
);

-- Sessions that exist now had their Hellos applied before this table: nothing to ask.
INSERT INTO hello_seen (node_id, seen_epoch)
SELECT node_id, session_epoch FROM node_sessions WHERE session_epoch >= 1;
