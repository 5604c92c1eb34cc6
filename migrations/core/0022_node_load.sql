-- A heartbeat's whole NodeLoad (issue "truth as of the Hello"): load average, available
-- memory, running commands and pending events, as the daemon's last heartbeat said them;
-- written by the liveness controller from the flushes, reset by a new session (like
-- `load`, which stays the load average for older readers).
ALTER TABLE node_sessions ADD COLUMN node_load jsonb
    CHECK (node_load IS NULL OR jsonb_typeof(node_load) = 'object');
