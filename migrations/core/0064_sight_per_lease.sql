-- A gateway's sight belongs to the lease that made it (issue #61; docs/workers.md,
-- "Blindness"). A rolling restart's gateway is drained, closes its sessions, stops its
-- flush and gives its lease up; back under a new lease it flushes at once. When no sweep
-- fell between its old lease's end and its new lease's start, the controller still held
-- the sight of its last life — older than `blind_after` after a slow drain — and, the
-- gateway undrained by its new lease, called it blind until its first flush was applied:
-- a false alarm, holding no session (seen in 1 of 3 rollouts of 20,000 nodes). A lease
-- taken after a drained life is a gateway that just appeared, and its start is not news —
-- unless it still holds a session from before that lease (closes not written: those
-- sessions are unseen and held, news). A lease after an undrained life (a crash, a crash
-- loop, a takeover) is no such start: its gateway is blind as ever, so that a gateway
-- restarting faster than `blind_after` is never kept quiet by its restarts.
--
-- `lease_acquired_at` is when the gateway's current lease began, on the clock of every
-- comparison (`compute_now()`), set by the database at each new lease epoch whoever
-- writes the row: a gateway's login only calls `gateway_acquire` (migration 0026), and no
-- value it passes reaches this column. NULL on rows leased before this migration (no
-- restart is recognised for them until their next lease). A 0.3 worker never reads it.
ALTER TABLE gateways ADD COLUMN lease_acquired_at timestamptz;
ALTER TABLE gateways ADD COLUMN lease_follows_drain boolean NOT NULL DEFAULT false;

COMMENT ON COLUMN gateways.lease_acquired_at IS
    'when the current lease (lease_epoch) began, compute_now() at its acquisition; set by '
    'a trigger, never by the writer (NULL: leased before migration 0064)';
COMMENT ON COLUMN gateways.lease_follows_drain IS
    'the current lease was taken while the gateway was draining (its last life drained); '
    'set by a trigger with lease_acquired_at, never by the writer';

-- the start of a new lease: now, and whether the life before it was draining (an upsert
-- of `gateway_acquire` clears `draining` in the same row version: OLD has it); the same
-- lease keeps both, whatever the writer says
CREATE FUNCTION gateway_lease_started() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    IF TG_OP = 'UPDATE' AND NEW.lease_epoch IS NOT DISTINCT FROM OLD.lease_epoch THEN
        NEW.lease_acquired_at := OLD.lease_acquired_at;
        NEW.lease_follows_drain := OLD.lease_follows_drain;
    ELSE
        NEW.lease_acquired_at := compute_now();
        NEW.lease_follows_drain := TG_OP = 'UPDATE' AND OLD.draining;
    END IF;
    RETURN NEW;
END $$;

CREATE TRIGGER gateways_lease_started
    BEFORE INSERT ON gateways
    FOR EACH ROW EXECUTE FUNCTION gateway_lease_started();

CREATE TRIGGER gateways_lease_renewed_epoch
    BEFORE UPDATE ON gateways
    FOR EACH ROW WHEN (NEW.lease_epoch IS DISTINCT FROM OLD.lease_epoch
                       OR NEW.lease_acquired_at IS DISTINCT FROM OLD.lease_acquired_at
                       OR NEW.lease_follows_drain IS DISTINCT FROM OLD.lease_follows_drain)
    EXECUTE FUNCTION gateway_lease_started();

-- it searches this schema, then pg_temp last (as 0024)
DO $$
BEGIN
    EXECUTE format('ALTER FUNCTION gateway_lease_started() SET search_path = %I, pg_temp',
                   current_schema());
END $$;
