-- Clones refused in time (issue "session rules"): the epoch of a session whose Hello was
-- a duplicate identity (the previous session live, another boot), held until the
-- quarantine enforcer has counted it. Set by the Hello transaction, cleared by the
-- quarantine enforcer unless it quarantined the node; a non-duplicate Hello clears it.
-- While it is set, nothing is dispatched or replayed to the session.
ALTER TABLE node_sessions ADD COLUMN held_epoch bigint CHECK (held_epoch IS NULL OR held_epoch >= 1);
