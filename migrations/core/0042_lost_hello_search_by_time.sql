-- The dispatch loop's search for lost Hellos (workers/replay/lost.py) read every connected
-- session and its `hello_seen` row each 10 s, once the replay consumer was drained — in a
-- fleet at rest, always: 324 ms of PostgreSQL's CPU a search at 100,000 sessions, 1.1 s
-- at 300,000, 0.4 cores at a million. It now reads only what changed since its
-- last complete search: the sessions that connected in its window, and the asks that
-- came due again in theirs. Neither column changes in a flush (its updates stay HOT), nor
-- `asked_at` when a Hello is recorded as seen.
CREATE INDEX node_sessions_connected_at ON node_sessions (connected_at) WHERE gateway_id IS NOT NULL;
CREATE INDEX hello_seen_asked_at ON hello_seen (asked_at) WHERE asked_at IS NOT NULL;
