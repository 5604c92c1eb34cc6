-- Which gateway each session epoch was issued to (DESIGN §9, issue "facts bound to their
-- gateway"). A fact about a node takes effect only when it comes from the gateway its
-- epoch was issued to; the quarantine counts only Hellos whose epoch was issued to the
-- gateway that published them. A forged fact from another gateway changes nothing.
--
-- Written by a trigger on the Hello transaction's epoch bump, whoever performs it (the
-- reference gateway, another gateway, a test), so no gateway implementation can forget
-- it. SECURITY DEFINER: a gateway's role needs no right on this table.
CREATE TABLE session_epochs (
    node_id    text        NOT NULL REFERENCES nodes (node_id) ON DELETE CASCADE,
    epoch      bigint      NOT NULL CHECK (epoch >= 1),
    gateway_id text        NOT NULL CHECK (gateway_id ~ '^[A-Za-z0-9_-]{1,64}$'),
    boot_id    text,
    journal_id text,
    issued_at  timestamptz NOT NULL DEFAULT compute_now(),
    PRIMARY KEY (node_id, epoch)
);

-- Retention: an epoch is kept for a day after it was issued (facts are kept 24 h on the
-- bus, so none older can still arrive), and a node's newest epoch is always kept. Pruned
-- by the node's next Hello, so nothing scans the table.
CREATE FUNCTION record_session_epoch() RETURNS trigger
LANGUAGE plpgsql SECURITY DEFINER SET search_path FROM CURRENT AS $$
BEGIN
    INSERT INTO session_epochs (node_id, epoch, gateway_id, boot_id, journal_id)
    VALUES (NEW.node_id, NEW.session_epoch, NEW.gateway_id, NEW.boot_id, NEW.journal_id)
    ON CONFLICT (node_id, epoch) DO UPDATE
       SET gateway_id = EXCLUDED.gateway_id, boot_id = EXCLUDED.boot_id,
           journal_id = EXCLUDED.journal_id, issued_at = EXCLUDED.issued_at;
    DELETE FROM session_epochs
     WHERE node_id = NEW.node_id AND epoch < NEW.session_epoch
       AND issued_at < compute_now() - interval '1 day';
    RETURN NULL;
END $$;

CREATE TRIGGER node_sessions_epoch_issued
    AFTER INSERT OR UPDATE OF session_epoch, gateway_id ON node_sessions
    FOR EACH ROW WHEN (NEW.session_epoch > 0 AND NEW.gateway_id IS NOT NULL)
    EXECUTE FUNCTION record_session_epoch();

-- Sessions open when this migration runs keep working; the gateways of epochs already
-- closed are unknown, so their late results count as foreign.
INSERT INTO session_epochs (node_id, epoch, gateway_id, boot_id, journal_id, issued_at)
SELECT node_id, session_epoch, gateway_id, boot_id, journal_id, coalesce(connected_at, now())
  FROM node_sessions
 WHERE session_epoch > 0 AND gateway_id IS NOT NULL;
