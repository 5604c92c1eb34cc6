-- A range row's place in the facts stream is its fact's stream sequence (migration 0037)
-- and, from here, the time the stream stored that fact. A stream deleted and made again
-- (a NATS storage lost and provisioned anew) numbers its facts from 1, and by sequence
-- alone its every fact would be older than the rows before it: none written, the range
-- rows never replaced, the ranged sessions judged by sights that no longer move.
--
-- So a fact replaces a row when its sequence is later — the order of one stream, exact —
-- or when the stream stored it more than 10 seconds after the row's fact (far beyond the
-- clock skew of a cluster's servers, within a flush period): a lower sequence stored
-- that much later is a stream made anew. A later sequence stored "earlier" (its
-- leader's clock stepped back) still replaces, by its sequence. Rows without the time
-- (written before this migration) are ordered by sequence alone.
ALTER TABLE liveness_ranges ADD COLUMN stored_at timestamptz;

CREATE FUNCTION range_fact_replaces(f_seq bigint, f_at timestamptz, r_seq bigint, r_at timestamptz)
    RETURNS boolean LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
    SELECT f_seq > r_seq OR coalesce(f_at - r_at > interval '10 seconds', false)
$$;
