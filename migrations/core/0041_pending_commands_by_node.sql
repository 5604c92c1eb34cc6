-- The dispatch loop's search for nodes with a pending command (`READY_NODES`) goes round
-- the fleet by node id, from a cursor on. The pending commands' only index is ordered by
-- `not_before`, so it was planned through (node_id, state, seq): every command of every
-- node after the cursor read to find the pending ones — 1,050 pages for 100,000 commands
-- that were all dispatched, each time a replay or an answer pokes the loop, and ten times
-- that at a million. This one holds the pending commands alone, in node order: the
-- search reads what is pending, however many commands the fleet has.
CREATE INDEX commands_pending_by_node ON commands (node_id) WHERE state = 'pending';
