-- A range row's place in the facts stream is its fact's stream sequence (migration 0037)
-- and, from here, the time the stream stored that fact. A stream deleted and made again
-- (a NATS storage lost and provisioned anew) numbers its facts from 1, and by sequence
-- alone its every fact would be older than the rows before it: none written, the range
-- rows never replaced, the ranged sessions judged by sights that no longer move. So a
-- fact is later than a row when the stream stored it more than 10 seconds after the
-- row's fact (far beyond the clock skew of a cluster's servers, far within a flush
-- period), earlier when more than 10 seconds before, and otherwise by sequence — the
-- order of one stream, exact. Rows without the time (written before this migration)
-- are ordered by sequence alone.
ALTER TABLE liveness_ranges ADD COLUMN stored_at timestamptz;

CREATE FUNCTION range_fact_later(a_seq bigint, a_at timestamptz, b_seq bigint, b_at timestamptz)
    RETURNS boolean LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
    SELECT CASE WHEN a_at > b_at + interval '10 seconds' THEN true
                WHEN b_at > a_at + interval '10 seconds' THEN false
                ELSE a_seq > b_seq END
$$;
