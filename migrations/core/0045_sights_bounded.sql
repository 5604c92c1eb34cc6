-- Sights bounded: a range row never in the future, the Hello's live window widened by a
-- fresh, bounded lag only.

-- A range row's time is a sight (migration 0043: its sessions' and, by the rows' coverage,
-- its gateway's), so it is refused in the future as the others are (migration 0032's
-- `refuse_future_sight`): a liveness login that wrote one a day ahead would keep a dead
-- gateway's sessions connected for that day. Only a value that moves is checked.
CREATE TRIGGER liveness_ranges_seen_not_ahead
    BEFORE UPDATE OF applied_at ON liveness_ranges
    FOR EACH ROW WHEN (NEW.applied_at > now() + interval '5 seconds'
                       AND NEW.applied_at IS DISTINCT FROM OLD.applied_at)
    EXECUTE FUNCTION refuse_future_sight('applied_at');

CREATE TRIGGER liveness_ranges_first_seen_not_ahead
    BEFORE INSERT ON liveness_ranges
    FOR EACH ROW WHEN (NEW.applied_at > now() + interval '5 seconds')
    EXECUTE FUNCTION refuse_future_sight('applied_at');

-- The Hello's live window (migration 0044) widens by the liveness controller's lag as it
-- last said it — only while what it said is fresh (a minute), and by five minutes at
-- most (the window's own bound): a controller that died an hour behind must not make
-- every reboot for an hour a duplicate identity. A controller that says nothing is
-- taken as caught up, as before 0044 (its sights stop; a quiet session goes quiet).
CREATE OR REPLACE FUNCTION session_was_live(
    p_gateway text, p_last_seen timestamptz, p_node text, p_epoch bigint, p_window interval
) RETURNS boolean LANGUAGE sql STABLE AS $$
    WITH seen_up_to AS (
        SELECT compute_now() - coalesce(
                   (SELECT least(greatest(interval '0', w.reported_at - w.applied_through),
                                 interval '5 minutes')
                      FROM consumer_watermarks w
                     WHERE w.consumer = 'liveness'
                       AND w.reported_at > compute_now() - interval '1 minute'),
                   interval '0') AS at)
    SELECT p_gateway IS NOT NULL
       AND (p_last_seen > (SELECT at FROM seen_up_to) - p_window
            OR range_sight(p_node, p_epoch, p_gateway) > (SELECT at FROM seen_up_to) - p_window)
$$;
