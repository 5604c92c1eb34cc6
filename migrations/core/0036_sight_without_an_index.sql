-- A million sessions flushed every 15 s (issue #42): every flush moves `last_seen`, and
-- while an index holds `last_seen` no such update can be HOT — each writes a new entry
-- into every index of node_sessions, and the index on `last_seen` fills with entries of
-- dead row versions that the sweep's search for stale rows then walks (measured: 0.95 s
-- sweeps at 200,000 sessions, 0 % HOT). Without it a flush rewrites the row in its own
-- page (HOT; pruned without vacuum) and the sweep finds stale sessions with one
-- sequential scan (`workers/liveness/sweep.py`). Free room in each page lets the new row
-- version stay there: new pages are filled to 70 %.
DROP INDEX IF EXISTS node_sessions_connected_last_seen;
ALTER TABLE node_sessions SET (fillfactor = 70);
