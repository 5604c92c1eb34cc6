-- Outbox rows the relay can never publish (over the bus's max payload, a subject no
-- stream takes): moved here with the reason, so one bad row cannot jam the relay and
-- nothing is lost. A dead letter on <root>.dead.relay tells operators about each.
CREATE TABLE outbox_dead (
    id         bigint      PRIMARY KEY,
    msg_id     uuid        NOT NULL UNIQUE,
    subject    text        NOT NULL,
    headers    jsonb       NOT NULL,
    body       bytea       NOT NULL,
    order_key  text,
    created_at timestamptz NOT NULL,
    dead_at    timestamptz NOT NULL DEFAULT now(),
    reason     text        NOT NULL
);
