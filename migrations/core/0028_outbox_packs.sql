-- One row per transaction for the messages it wants published (issue "exactly-once at
-- 1.5x"): written, claimed and deleted once per batch instead of once per message. Only
-- relays of 0.4.0 and later read this table, so a relay of an older release never
-- publishes a pack as one message; `outbox` stays for rows an older release writes
-- during a rolling upgrade, and the relays publish those too.
--
-- The arrays are parallel, one element per message in the order the transaction queued
-- them: its Nats-Msg-Id, subject, headers (JSON text), body and order key (NULL for
-- none). `keys` holds the pack's distinct order keys: a pack is published only when no
-- earlier pack sharing a key, and no `outbox` row of one of its keys, is still waiting.
CREATE TABLE outbox_packs (
    id         bigint      GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    worker     text,
    msg_ids    uuid[]      NOT NULL,
    subjects   text[]      NOT NULL,
    headers    text[]      NOT NULL,
    bodies     bytea[]     NOT NULL,
    order_keys text[]      NOT NULL,
    keys       text[]      NOT NULL DEFAULT '{}',
    created_at timestamptz NOT NULL DEFAULT now(),
    CHECK (cardinality(msg_ids) > 0
       AND cardinality(subjects) = cardinality(msg_ids)
       AND cardinality(headers) = cardinality(msg_ids)
       AND cardinality(bodies) = cardinality(msg_ids)
       AND cardinality(order_keys) = cardinality(msg_ids))
);
CREATE INDEX outbox_packs_keys ON outbox_packs USING gin (keys);
CREATE INDEX outbox_packs_worker ON outbox_packs (worker, id);

CREATE TRIGGER outbox_packs_notify AFTER INSERT ON outbox_packs
    FOR EACH STATEMENT EXECUTE FUNCTION outbox_notify();
