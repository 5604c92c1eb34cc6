-- Commands delivered to nodes, and the events nodes journal.

CREATE TABLE commands (
    command_id       uuid        PRIMARY KEY DEFAULT gen_random_uuid(),
    node_id          text        NOT NULL REFERENCES nodes (node_id) ON DELETE CASCADE,
    seq              bigint      NOT NULL CHECK (seq >= 1),
    kind             text        NOT NULL CHECK (kind <> ''),
    lane             text        NOT NULL DEFAULT 'default' CHECK (lane <> ''),
    state            text        NOT NULL DEFAULT 'pending'
        CHECK (state IN ('pending', 'dispatched', 'acked', 'running', 'done', 'failed', 'cancelled')),
    -- the session epoch the command was dispatched to (NULL while pending)
    session_epoch    bigint      CHECK (session_epoch >= 0),
    delivery_attempt integer     NOT NULL DEFAULT 0 CHECK (delivery_attempt >= 0),
    busy_attempts    integer     NOT NULL DEFAULT 0 CHECK (busy_attempts >= 0),
    busy_epoch       bigint,
    not_before       timestamptz,
    payload          jsonb       NOT NULL DEFAULT '{}',
    signature        text,
    result           jsonb,
    failure_reason   text,
    created_at       timestamptz NOT NULL DEFAULT now(),
    updated_at       timestamptz NOT NULL DEFAULT now(),
    CONSTRAINT commands_node_seq UNIQUE (node_id, seq),
    CONSTRAINT in_flight_has_epoch
        CHECK (state NOT IN ('dispatched', 'acked', 'running') OR session_epoch IS NOT NULL)
);
-- replay and credits: a node's commands by state in seq order
CREATE INDEX commands_node_state_seq ON commands (node_id, state, seq);
-- the dispatch loop: pending commands whose time has come
CREATE INDEX commands_pending ON commands (not_before NULLS FIRST, node_id) WHERE state = 'pending';

CREATE TABLE node_events (
    node_id     text        NOT NULL REFERENCES nodes (node_id) ON DELETE CASCADE,
    journal_id  text        NOT NULL,
    seq         bigint      NOT NULL CHECK (seq >= 1),
    kind        text        NOT NULL,
    body        jsonb       NOT NULL,
    at          timestamptz NOT NULL,
    recorded_at timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (node_id, journal_id, seq)
);
-- retention prunes by age in bounded batches
CREATE INDEX node_events_recorded_at ON node_events (recorded_at);
