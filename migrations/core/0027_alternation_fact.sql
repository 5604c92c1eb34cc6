-- The quarantine keeps no inbox (issue "exactly-once at 1.5x"): an epoch is counted at most
-- once (node_alternations' key), which makes its count idempotent by construction. The id
-- of the Hello fact an alternation was counted for tells a redelivery of that fact (a
-- duplicate) from another Hello fact of the same epoch (foreign). NULL: counted by a
-- release that did not record it.
ALTER TABLE node_alternations ADD COLUMN fact_id uuid;
