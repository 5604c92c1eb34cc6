-- A flush as rows of hash ranges (issue #42; docs/capacity.md, "The design for a
-- million"), its first step: a gateway cuts its sessions by a hash of the node id into
-- ranges and publishes one liveness fact per range, naming it (`range_start`,
-- `range_end`); the liveness worker keeps, per gateway and range, the newest such fact
-- as one row — beside the session rows it still writes, which every reader of
-- `last_seen` (and a previous release's sweep, in a rolling upgrade) still reads.

-- A node's place in the hash space: the first 4 bytes of the MD5 of its id (UTF-8),
-- big-endian — `schemas.facts.node_hash`, which a test holds equal to it.
CREATE FUNCTION node_hash(node_id text) RETURNS bigint
    LANGUAGE sql IMMUTABLE STRICT PARALLEL SAFE
    AS $$ SELECT ('x' || substr(md5(node_id), 1, 8))::bit(32)::bigint $$;

-- A gateway's sessions in one range of node hashes, `[range_start, range_end)`, as its
-- newest liveness fact of that range named them. `entries` holds one `[node_id, epoch,
-- age_ms]` per entry of the fact (json: kept as text, where jsonb would parse it three
-- times as slowly), each seen at `applied_at` less its age; `oldest_at` is the oldest of
-- those sights. A row is
-- replaced only by a fact published later (`stream_seq`, the facts stream's sequence), of
-- the same gateway, whose range overlaps it.
CREATE TABLE liveness_ranges (
    gateway_id  text        NOT NULL,
    range_start bigint      NOT NULL CHECK (range_start >= 0),
    range_end   bigint      NOT NULL CHECK (range_end > range_start AND range_end <= 4294967296),
    stream_seq  bigint      NOT NULL CHECK (stream_seq > 0),
    applied_at  timestamptz NOT NULL,
    oldest_at   timestamptz NOT NULL,
    sessions    integer     NOT NULL CHECK (sessions >= 0),
    entries     json        NOT NULL,
    PRIMARY KEY (gateway_id, range_start)
);
