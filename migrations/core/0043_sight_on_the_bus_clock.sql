-- One clock for sight (issue "overload never reads as death"; docs/workers.md, "One
-- clock for sight"). A session's last sight, a range row's, and a gateway's were all
-- taken at the moment the liveness worker *applied* a flush: a controller behind its
-- facts then made a late flush look fresh, and judged a gateway "seen" while the flushes
-- of some of its ranges still waited in the stream. From here every sight is the time
-- the bus *stored* the flush (its JetStream timestamp, which a gateway cannot fake) less
-- the entry's age.

-- When the bus stored a fact (`stored`, the facts stream's own timestamp), on the clock
-- of every comparison (`compute_now()`, which tests move by an offset), and never later
-- than now: a bus whose clock runs ahead of the database's must not make a flush look
-- fresher than its application. A fact whose stored time is not known (applied from
-- outside the stream) is taken as stored now.
CREATE FUNCTION bus_time(stored timestamptz) RETURNS timestamptz
    LANGUAGE sql STABLE PARALLEL SAFE AS $$
    SELECT coalesce(least(stored + (compute_now() - now()), compute_now()), compute_now())
$$;

-- `applied_at` keeps its name (migrations only expand within a major) and holds, from
-- here, the time its fact's sightings are measured from: `bus_time` of the fact.
COMMENT ON COLUMN liveness_ranges.applied_at IS
    'the time its entries'' ages are measured from: when the bus stored the fact (bus_time), '
    'never later than when it was applied (before migration 0043: the time applied)';

COMMENT ON COLUMN liveness_gateways.last_flush_at IS
    'bus_time of the newest flush of the gateway the controller has applied (a liveness '
    'worker of 0.3 writes the time it applied it: later, never earlier)';

-- A gateway's sight, from here, is the time as of which the flushes the controller has
-- applied cover every session of it: for a gateway that cuts its flushes by ranges of
-- node hashes, the earliest over the hash space of the newest range row covering it
-- (read by the sweep from `liveness_ranges`); `whole_flush_at` is the newest flush it
-- applied that named no range (a gateway before 0.4, or one rolled back to it), which
-- covers every session by itself.
ALTER TABLE liveness_gateways ADD COLUMN whole_flush_at timestamptz;

-- Why the controller said a gateway blind, and how many sessions it held then:
-- `lag` (the controller's own consumer holds flushes stored before the blind threshold)
-- or `no-flush` (none of its flushes reached the controller lately).
ALTER TABLE liveness_gateways ADD COLUMN blind_reason text;
ALTER TABLE liveness_gateways ADD COLUMN blind_sessions integer;

-- As `last_flush_at` (migration 0032): a sight in the future is refused.
CREATE TRIGGER liveness_gateways_whole_flush_not_ahead
    BEFORE UPDATE OF whole_flush_at ON liveness_gateways
    FOR EACH ROW WHEN (NEW.whole_flush_at > now() + interval '5 seconds'
                       AND NEW.whole_flush_at IS DISTINCT FROM OLD.whole_flush_at)
    EXECUTE FUNCTION refuse_future_sight('whole_flush_at');

CREATE TRIGGER liveness_gateways_first_whole_flush_not_ahead
    BEFORE INSERT ON liveness_gateways
    FOR EACH ROW WHEN (NEW.whole_flush_at > now() + interval '5 seconds')
    EXECUTE FUNCTION refuse_future_sight('whole_flush_at');
