-- The bound on a duplicate-identity hold (issue "truth as of the Hello"): the replay
-- worker's dispatch loop releases sessions held longer than BCW_QUARANTINE_HOLD_MAX.
-- Held sessions are few; this index finds them without reading every session.
CREATE INDEX node_sessions_held ON node_sessions (connected_at) WHERE held_epoch IS NOT NULL;
