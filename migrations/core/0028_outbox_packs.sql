-- One row per transaction for the messages it wants published (issue "exactly-once at
-- 1.5x"): written, claimed and deleted once per batch instead of once per message. Only
-- relays of 0.4.0 and later read this table, so a relay of an older release never
-- publishes a pack as one message; `outbox` stays for rows an older release writes
-- during a rolling upgrade, and the relays publish those too (first).
--
-- The arrays are parallel, one element per message in the order the transaction queued
-- them: its Nats-Msg-Id, subject, headers (JSON text), body and order key (NULL for
-- none). A worker's packs are published in id order: a pack waits while an earlier pack
-- of its worker is held by another relay, or an `outbox` row of its worker is left.
CREATE TABLE outbox_packs (
    id         bigint      GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    worker     text,
    size       integer     NOT NULL,  -- its messages (a claim reads it, not the arrays)
    msg_ids    uuid[]      NOT NULL,
    subjects   text[]      NOT NULL,
    headers    text[]      NOT NULL,
    bodies     bytea[]     NOT NULL,
    order_keys text[]      NOT NULL,
    created_at timestamptz NOT NULL DEFAULT now(),
    CHECK (size BETWEEN 1 AND 999999
       AND cardinality(msg_ids) = size
       AND cardinality(subjects) = cardinality(msg_ids)
       AND cardinality(headers) = cardinality(msg_ids)
       AND cardinality(bodies) = cardinality(msg_ids)
       AND cardinality(order_keys) = cardinality(msg_ids))
);
CREATE INDEX outbox_packs_worker ON outbox_packs (worker, id);
-- kept out of line but not compressed: a pack lives for milliseconds, and compressing it
-- costs more CPU than the pages it would save
ALTER TABLE outbox_packs ALTER COLUMN bodies SET STORAGE EXTERNAL,
                         ALTER COLUMN headers SET STORAGE EXTERNAL,
                         ALTER COLUMN subjects SET STORAGE EXTERNAL;

CREATE TRIGGER outbox_packs_notify AFTER INSERT ON outbox_packs
    FOR EACH STATEMENT EXECUTE FUNCTION outbox_notify();
