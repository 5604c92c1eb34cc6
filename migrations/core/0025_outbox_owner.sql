-- Outbox rows belong to the worker that wrote them: a process's relay claims only its own
-- workers' rows (and publishes them with that worker's principal, which may publish only
-- what the worker emits). A release that writes no owner (before 0.4.0) gets one from the
-- message's type: every type has exactly one sender (workers/runtime/bus/principals.py,
-- EMITS; a unit test keeps this table equal to it).
ALTER TABLE outbox ADD COLUMN worker text;

CREATE TABLE outbox_senders (
    bc_type text PRIMARY KEY,
    worker  text NOT NULL
);
INSERT INTO outbox_senders (bc_type, worker) VALUES
    ('node.capabilities-changed', 'labeler'),
    ('node.connected', 'liveness'),
    ('node.disconnected', 'liveness'),
    ('gateway.blind', 'liveness'),
    ('gateway.seeing', 'liveness'),
    ('liveness.breaker-open', 'liveness'),
    ('zombie', 'liveness'),
    ('security.node.duplicate-session', 'quarantine'),
    ('security.node.quarantined', 'quarantine'),
    ('revocations', 'quarantine'),
    ('event-ack', 'recorder'),
    ('command.replayed', 'replay'),
    ('command.cancelled', 'replay'),
    ('command.failed', 'replay'),
    ('command.completed', 'replay'),
    ('security.node.hold-expired', 'replay'),
    ('dispatch', 'replay'),
    ('hello-again', 'replay');

CREATE FUNCTION outbox_owner() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    NEW.worker := (SELECT s.worker FROM outbox_senders s WHERE s.bc_type = NEW.headers->>'Bc-Type');
    RETURN NEW;
END $$;

-- only rows written without an owner: the WHEN clause costs a current release nothing
CREATE TRIGGER outbox_owner BEFORE INSERT ON outbox
    FOR EACH ROW WHEN (NEW.worker IS NULL) EXECUTE FUNCTION outbox_owner();
