-- Session history, one row per transaction (issue "exactly-once at 1.5x"): the entries a
-- worker's transaction makes — one per event or notice about a node it publishes — in
-- parallel arrays, in the order it queued them, written in the same statement as its
-- outbox pack. A row per entry in `session_history` cost PostgreSQL about 7 µs (a heap
-- row, three index entries, a jsonb parse); an entry of a pack about 2 (the GIN index
-- takes its node ids into its pending list and sorts them in later, in bulk).
--
-- `session_history` stays: an older release's workers write it during a rolling upgrade,
-- and `bcw explain` reads both. Pruned by `at`, as it is; a worker's login sees, writes and
-- deletes only its own packs, and none younger than a day (roles.py: as session_history).
CREATE TABLE session_history_packs (
    id          bigint      GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    at          timestamptz NOT NULL DEFAULT compute_now(),
    worker      text        NOT NULL,  -- who wrote it
    node_ids    text[]      NOT NULL,
    whats       text[]      NOT NULL,  -- the event or notice types
    epochs      bigint[]    NOT NULL,
    gateway_ids text[]      NOT NULL,
    fact_ids    uuid[]      NOT NULL,  -- the facts that caused them; NULL for a loop's own work
    trace_ids   text[]      NOT NULL,
    details     text[]      NOT NULL,  -- the messages as published (JSON)
    CHECK (cardinality(node_ids) BETWEEN 1 AND 999999
       AND cardinality(whats) = cardinality(node_ids)
       AND cardinality(epochs) = cardinality(node_ids)
       AND cardinality(gateway_ids) = cardinality(node_ids)
       AND cardinality(fact_ids) = cardinality(node_ids)
       AND cardinality(trace_ids) = cardinality(node_ids)
       AND cardinality(details) = cardinality(node_ids)
       AND array_to_string(trace_ids, '') ~ '^([0-9a-f]{32})*$')  -- NULLs are left out
);
CREATE INDEX session_history_packs_by_node ON session_history_packs USING gin (node_ids);
CREATE INDEX session_history_packs_by_age ON session_history_packs (at);
-- kept out of line but not compressed: compressing costs more CPU than it saves here
ALTER TABLE session_history_packs ALTER COLUMN details SET STORAGE EXTERNAL,
                                  ALTER COLUMN node_ids SET STORAGE EXTERNAL;
