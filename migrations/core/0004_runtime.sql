-- The worker runtime's tables: the inbox, the outbox and the singleton loops' leases.

-- The inbox: a fact with effects is recorded in the transaction that applies it, so a
-- redelivery finds it and does nothing.
CREATE TABLE processed_facts (
    consumer     text        NOT NULL,
    fact_id      uuid        NOT NULL,
    processed_at timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (consumer, fact_id)
);
CREATE INDEX processed_facts_processed_at ON processed_facts (processed_at);

-- The outbox: messages a transaction wants published, relayed after commit with their
-- Nats-Msg-Id. Rows with the same order_key are published in id order.
CREATE TABLE outbox (
    id         bigint      GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    msg_id     uuid        NOT NULL UNIQUE,
    subject    text        NOT NULL,
    headers    jsonb       NOT NULL DEFAULT '{}',
    body       bytea       NOT NULL,
    order_key  text,
    created_at timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX outbox_order_key ON outbox (order_key, id) WHERE order_key IS NOT NULL;

CREATE FUNCTION outbox_notify() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_notify('bcw_outbox', '');
    RETURN NULL;
END $$;
CREATE TRIGGER outbox_notify AFTER INSERT ON outbox
    FOR EACH STATEMENT EXECUTE FUNCTION outbox_notify();

-- Leases of singleton loops (the liveness sweep, retention, ...). The epoch rises with
-- each new holder; every write of a singleton loop re-checks it.
CREATE TABLE controller_leases (
    name       text        PRIMARY KEY,
    holder     text        NOT NULL,
    epoch      bigint      NOT NULL CHECK (epoch >= 1),
    expires_at timestamptz NOT NULL
);
