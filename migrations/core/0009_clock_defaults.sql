-- Rows whose age a retention loop compares with compute_now() are stamped with it too,
-- so moving the clock (tests, the simulator) ages them consistently.
ALTER TABLE node_events ALTER COLUMN recorded_at SET DEFAULT compute_now();
ALTER TABLE processed_facts ALTER COLUMN processed_at SET DEFAULT compute_now();
