-- A breaker for revocations (issue "a compromised gateway cannot reach nodes that never
-- connected to it"): one gateway's credentials revoke a few certificates at most. Every
-- quarantine the enforcer decides is a row here: revoked at once (`revoked_at`), or held
-- for an operator (`held`: 'one-gateway' — every alternation came through one gateway;
-- 'breaker' — its gateway, or the fleet, revoked as many as the breaker allows in its
-- window) until `bcw quarantine release` (`released_at`, `released_by`), after which the
-- enforcer revokes it. A held quarantine keeps its session held: no command reaches it.
CREATE TABLE quarantines (
    node_id      text        NOT NULL REFERENCES nodes (node_id) ON DELETE CASCADE,
    epoch        bigint      NOT NULL CHECK (epoch >= 1),
    gateway_id   text        NOT NULL,  -- the gateway whose Hello completed the count
    decided_at   timestamptz NOT NULL DEFAULT compute_now(),
    alternations integer     NOT NULL,
    gateways     text[]      NOT NULL,  -- the gateways the counted alternations came through
    serials      text[]      NOT NULL,
    held         text        CHECK (held IN ('one-gateway', 'breaker')),
    revoked_at   timestamptz,
    released_at  timestamptz,
    released_by  text,
    PRIMARY KEY (node_id, epoch)
);
-- the breaker's count: revocations made at once in its window
CREATE INDEX quarantines_decided ON quarantines (decided_at) WHERE held IS NULL;
-- what waits for an operator, and what an operator released
CREATE INDEX quarantines_waiting ON quarantines (decided_at) WHERE revoked_at IS NULL;

-- The gateway each alternation's epoch was issued to.
ALTER TABLE node_alternations ADD COLUMN gateway_id text;

-- The new events' sender, for rows written without an owner (0025).
INSERT INTO outbox_senders (bc_type, worker) VALUES
    ('security.quarantine.held', 'quarantine'),
    ('security.quarantine.breaker-open', 'quarantine')
ON CONFLICT (bc_type) DO NOTHING;
