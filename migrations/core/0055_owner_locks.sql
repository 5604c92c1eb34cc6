-- Locks no other login can take (issue 59, item 1). The migrations and the quarantine's
-- breaker serialized on advisory keys, and `pg_advisory_lock` is PUBLIC's: any login that
-- held a key stopped every `bcw migrate`, or every quarantine, for as long as it liked.
-- Each now locks a row of a table of its own; a row lock (`FOR UPDATE`) needs the UPDATE
-- privilege on the table, which only the owner has, and the quarantine's group on its
-- breaker's (workers/runtime/store/roles.py).

-- `bcw migrate`'s lock, held FOR UPDATE for its whole run in a transaction on a connection
-- of its own (workers/runtime/store/migrate.py, `schema_lock`). On an empty database it
-- makes this table itself, with this very statement, before the first migration.
CREATE TABLE IF NOT EXISTS schema_lock (
    one       boolean     PRIMARY KEY DEFAULT true CHECK (one),
    locked_at timestamptz NOT NULL DEFAULT now()
);
INSERT INTO schema_lock DEFAULT VALUES ON CONFLICT DO NOTHING;

-- The breaker's count (workers/quarantine/breaker.py): two replicas deciding at once do not
-- both see room for one more.
CREATE TABLE quarantine_breaker (
    one       boolean     PRIMARY KEY DEFAULT true CHECK (one),
    locked_at timestamptz NOT NULL DEFAULT now()
);
INSERT INTO quarantine_breaker DEFAULT VALUES;
