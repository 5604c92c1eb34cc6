-- A node's conditions, as readers see them (issue #44: "DuplicateIdentity is an
-- inventory-owned condition"). The quarantine enforcer sets `DuplicateIdentity` when it
-- revokes a node's certificate for a duplicate identity (at once, or when an operator
-- releases a held quarantine), and clears it once the node holds a session again, after
-- that epoch, under a certificate not revoked (a re-joined machine). `bcw explain` shows
-- them; `bcw_reader` and `bcw_operator` read them.
CREATE TABLE node_conditions (
    node_id text NOT NULL REFERENCES nodes (node_id) ON DELETE CASCADE,
    condition text NOT NULL CHECK (condition IN ('DuplicateIdentity')),
    epoch bigint NOT NULL CHECK (epoch >= 0),  -- the session epoch it was set at
    since timestamptz NOT NULL,
    reason text NOT NULL CHECK (length(reason) <= 1024),
    PRIMARY KEY (node_id, condition)
);
