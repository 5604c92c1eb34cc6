-- Quarantine as the seed says where proofs make it safe (issue #58, item 3; docs/workers.md,
-- "Quarantine enforcer").
--
-- * Each counted alternation records whether it was proven (`node_alternations.proven`):
--   its Hello proven, and so the live session before it (for a node that proves its
--   Hellos the Hello transaction calls a Hello a duplicate identity only then, migration
--   0049). A window of proven alternations revokes at the fourth whatever gateways they
--   came through: no gateway makes up a proven Hello of another boot. The breaker holds
--   only what an unproven Hello could have made up (a window with one: through one
--   gateway, or past its gateway's share) and anything past the fleet-wide bound.
-- * A held quarantine holds every session of its node. Migration 0031 said "a held
--   quarantine keeps its session held: no command reaches it" — only the session of its
--   epoch was held: the node's next alternation began a new window, its session was
--   released, and a clone pair got commands in three sessions of four. From now on the
--   dispatch loop and the replay send nothing to a node with a quarantine neither revoked
--   nor dismissed: an operator releases it (`bcw quarantine release`: revoked) or judges
--   it no clone (`bcw quarantine dismiss`: `dismissed_at`, `dismissed_by`).
-- * A takeover attempt (migration 0049: an unproven Hello of a node that proves its
--   Hellos) is recorded once per epoch beside the alternations, never counted
--   (`node_alternations.takeover`): its `security.node.unproven-hello` is said once.
ALTER TABLE node_alternations
    ADD COLUMN proven   boolean NOT NULL DEFAULT false,
    ADD COLUMN takeover boolean NOT NULL DEFAULT false;

ALTER TABLE quarantines
    ADD COLUMN dismissed_at timestamptz,
    ADD COLUMN dismissed_by text;

-- The new event's sender, for rows written without an owner (0025).
INSERT INTO outbox_senders (bc_type, worker) VALUES
    ('security.node.unproven-hello', 'quarantine')
ON CONFLICT (bc_type) DO NOTHING;
