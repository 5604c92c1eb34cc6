-- Nodes, their sessions, certificates and labels, and the gateways that hold sessions.

CREATE TABLE nodes (
    node_id             text        PRIMARY KEY CHECK (node_id ~ '^[!-~]{1,253}$'),
    role                text        NOT NULL CHECK (role <> ''),
    -- raised by each join with a new certificate; older generations are refused at admission
    identity_generation integer     NOT NULL DEFAULT 1 CHECK (identity_generation >= 1),
    -- the last command seq handed out by enqueue_command()
    last_command_seq    bigint      NOT NULL DEFAULT 0 CHECK (last_command_seq >= 0),
    joined_at           timestamptz NOT NULL DEFAULT now()
);

CREATE TABLE gateways (
    gateway_id       text        PRIMARY KEY CHECK (gateway_id ~ '^[A-Za-z0-9_-]{1,64}$'),
    lease_epoch      bigint      NOT NULL DEFAULT 0 CHECK (lease_epoch >= 0),
    lease_expires_at timestamptz NOT NULL,
    draining         boolean     NOT NULL DEFAULT false
);

-- One row per node, inserted at join with epoch 0. Routing and liveness writes to it are
-- fenced on session_epoch (and gateway_id where the gateway matters).
CREATE TABLE node_sessions (
    node_id             text        PRIMARY KEY REFERENCES nodes (node_id) ON DELETE CASCADE,
    -- NULL when disconnected: the gateway the session is routed to
    gateway_id          text        CHECK (gateway_id ~ '^[A-Za-z0-9_-]{1,64}$'),
    session_id          text,
    session_epoch       bigint      NOT NULL DEFAULT 0 CHECK (session_epoch >= 0),
    boot_id             text,
    journal_id          text,
    role                text        NOT NULL,
    daemon_version      text,
    proto_max           integer     CHECK (proto_max >= 0),
    transport           text        CHECK (transport IN ('grpc', 'websocket')),
    upgrade_required    boolean     NOT NULL DEFAULT false,
    trust_version       bigint      NOT NULL DEFAULT 0 CHECK (trust_version >= 0),
    capabilities        text[]      NOT NULL DEFAULT '{}',
    approver_set_epoch  bigint      CHECK (approver_set_epoch >= 0),
    approver_set_sha256 text        CHECK (approver_set_sha256 ~ '^[0-9a-f]{64}$'),
    acked_event_seq     bigint      NOT NULL DEFAULT 0 CHECK (acked_event_seq >= 0),
    observed_generation bigint      NOT NULL DEFAULT 0 CHECK (observed_generation >= 0),
    connected_at        timestamptz,
    last_seen           timestamptz,
    disconnected_at     timestamptz,
    disconnect_reason   text,
    duplicate_hellos    integer     NOT NULL DEFAULT 0 CHECK (duplicate_hellos >= 0),
    duplicate_since     timestamptz,
    CONSTRAINT approver_set_both_or_neither
        CHECK ((approver_set_epoch IS NULL) = (approver_set_sha256 IS NULL))
);

-- The liveness sweep: connected sessions by age, and sessions routed to a gateway.
CREATE INDEX node_sessions_connected_last_seen
    ON node_sessions (last_seen) WHERE gateway_id IS NOT NULL;
CREATE INDEX node_sessions_by_gateway
    ON node_sessions (gateway_id) WHERE gateway_id IS NOT NULL;

CREATE TABLE node_certs (
    serial              text        PRIMARY KEY CHECK (serial <> ''),
    node_id             text        NOT NULL REFERENCES nodes (node_id) ON DELETE CASCADE,
    identity_generation integer     NOT NULL CHECK (identity_generation >= 1),
    role                text        NOT NULL,
    -- NULL: the certificate does not restrict command kinds
    allowed_kinds       text[],
    not_after           timestamptz NOT NULL,
    revoked_at          timestamptz,
    revocation_reason   text,
    CONSTRAINT revoked_with_reason CHECK ((revoked_at IS NULL) = (revocation_reason IS NULL))
);
CREATE INDEX node_certs_live_by_node ON node_certs (node_id) WHERE revoked_at IS NULL;

CREATE TABLE node_labels (
    node_id text NOT NULL REFERENCES nodes (node_id) ON DELETE CASCADE,
    key     text NOT NULL CHECK (key <> '' AND length(key) <= 317),
    value   text NOT NULL CHECK (length(value) <= 1024),
    source  text NOT NULL CHECK (source IN ('system', 'operator')),
    PRIMARY KEY (node_id, source, key)
);
-- placement: "which nodes have capability X" reads system labels by key
CREATE INDEX node_labels_system_by_key ON node_labels (key, node_id) WHERE source = 'system';
