-- A gateway writes only through these functions, and only as itself (issue "trust
-- boundaries"). Each runs with its owner's rights (SECURITY DEFINER), and first checks
-- that the login calling it may act as the gateway it names: a login bound to gateway ids
-- in `gateway_logins` (bcw auth db --bind) acts as those only; an unbound login only if
-- it could write the tables anyway (the schema's owner: the demo, the tests). Then each
-- checks the lease epoch and, for a session, the node's binding to that gateway — what
-- the reference gateway's statements checked, now out of the caller's reach. The group
-- `bcw_gateway_bound` executes these and reads what admission reads; it writes no table.
-- (`bcw_gateway`, with direct writes, stays for gateways of earlier releases until they
-- are upgraded: gateways upgrade last.)

CREATE TABLE gateway_logins (
    login      name PRIMARY KEY,
    gateway_id text NOT NULL,
    bound_at   timestamptz NOT NULL DEFAULT now()
);

-- The gateway id `p_gateway` if the calling login may act as it; an error otherwise.
CREATE FUNCTION gateway_as(p_gateway text) RETURNS text
LANGUAGE plpgsql STABLE SECURITY DEFINER AS $$
DECLARE
    bound text[];
BEGIN
    IF p_gateway IS NULL THEN
        RAISE EXCEPTION 'no gateway id given' USING ERRCODE = 'null_value_not_allowed';
    END IF;
    SELECT array_agg(gateway_id) INTO bound FROM gateway_logins WHERE login = session_user;
    IF bound IS NULL THEN
        IF pg_has_role(session_user, (SELECT relowner FROM pg_class WHERE oid = 'gateways'::regclass), 'USAGE') THEN
            RETURN p_gateway;
        END IF;
        RAISE EXCEPTION 'login % is bound to no gateway (bcw auth db --bind %=<gateway id>)',
            session_user, session_user USING ERRCODE = 'insufficient_privilege';
    END IF;
    IF NOT p_gateway = ANY (bound) THEN
        RAISE EXCEPTION 'login % acts as gateway % only, not as %',
            session_user, array_to_string(bound, ', '), p_gateway USING ERRCODE = 'insufficient_privilege';
    END IF;
    RETURN p_gateway;
END $$;

-- Take the lease: a new incarnation of the gateway wins over an older one.
CREATE FUNCTION gateway_acquire(p_gateway text, p_ttl interval) RETURNS bigint
LANGUAGE plpgsql SECURITY DEFINER AS $$
DECLARE
    gw text := gateway_as(p_gateway);
    taken bigint;
BEGIN
    INSERT INTO gateways AS g (gateway_id, lease_epoch, lease_expires_at)
    VALUES (gw, 1, compute_now() + least(p_ttl, interval '5 minutes'))
    ON CONFLICT (gateway_id) DO UPDATE
       SET lease_epoch = g.lease_epoch + 1, lease_expires_at = EXCLUDED.lease_expires_at,
           draining = false
    RETURNING g.lease_epoch INTO taken;
    RETURN taken;
END $$;

-- Renew the lease held at `p_lease`; false when it is no longer held.
CREATE FUNCTION gateway_renew(p_gateway text, p_lease bigint, p_ttl interval) RETURNS boolean
LANGUAGE plpgsql SECURITY DEFINER AS $$
DECLARE
    gw text := gateway_as(p_gateway);
BEGIN
    UPDATE gateways SET lease_expires_at = compute_now() + least(p_ttl, interval '5 minutes')
     WHERE gateway_id = gw AND lease_epoch = p_lease AND lease_expires_at > compute_now();
    RETURN FOUND;
END $$;

-- Set or clear draining (new Hellos refused, sessions kept); false when the lease is gone.
CREATE FUNCTION gateway_drain(p_gateway text, p_lease bigint, p_draining boolean) RETURNS boolean
LANGUAGE plpgsql SECURITY DEFINER AS $$
DECLARE
    gw text := gateway_as(p_gateway);
BEGIN
    UPDATE gateways SET draining = coalesce(p_draining, true)
     WHERE gateway_id = gw AND lease_epoch = p_lease AND lease_expires_at > compute_now();
    RETURN FOUND;
END $$;

-- Give the lease up at once (a graceful stop, its sessions closed first).
CREATE FUNCTION gateway_release(p_gateway text, p_lease bigint) RETURNS boolean
LANGUAGE plpgsql SECURITY DEFINER AS $$
DECLARE
    gw text := gateway_as(p_gateway);
BEGIN
    UPDATE gateways SET lease_expires_at = compute_now()
     WHERE gateway_id = gw AND lease_epoch = p_lease AND lease_expires_at > compute_now();
    RETURN FOUND;
END $$;

-- The Hello transaction: fenced on the lease (locked FOR SHARE), the node's row locked,
-- its epoch bumped, the Hello fact's id recorded beside the epoch (for its trigger). The
-- outcome says why nothing was written: 'lease-gone', 'draining', 'not-joined', 'revoked'.
-- A session held for the quarantine: the previous one live, from another boot (the rule
-- of schemas.facts.is_duplicate_identity).
CREATE FUNCTION gateway_hello(
    p_gateway text, p_lease bigint, p_node text, p_cert_serial text, p_boot text,
    p_journal text, p_role text, p_daemon_version text, p_proto_max integer,
    p_transport text, p_upgrade_required boolean, p_trust_version bigint,
    p_approver_set_epoch bigint, p_approver_set_sha256 text, p_live_window interval,
    p_trace_context text, p_hello_fact_id uuid,
    OUT outcome text, OUT epoch bigint, OUT session_id text, OUT acked_event_seq bigint,
    OUT previous_epoch bigint, OUT previous_gateway_id text, OUT previous_boot_id text,
    OUT previous_journal_id text, OUT previous_live boolean, OUT inventory jsonb)
LANGUAGE plpgsql SECURITY DEFINER AS $$
DECLARE
    gw text := gateway_as(p_gateway);
    is_draining boolean;
    prev record;
    duplicate boolean;
BEGIN
    PERFORM set_config('bcw.hello_fact_id', coalesce(p_hello_fact_id::text, ''), true);
    SELECT g.draining INTO is_draining FROM gateways g
     WHERE g.gateway_id = gw AND g.lease_epoch = p_lease AND g.lease_expires_at > compute_now()
       FOR SHARE;
    IF NOT FOUND THEN outcome := 'lease-gone'; RETURN; END IF;
    IF is_draining THEN outcome := 'draining'; RETURN; END IF;
    SELECT s.session_epoch, s.gateway_id, s.boot_id, s.journal_id,
           s.gateway_id IS NOT NULL AND s.last_seen > compute_now() - p_live_window AS live
      INTO prev FROM node_sessions s WHERE s.node_id = p_node FOR UPDATE;
    IF NOT FOUND THEN outcome := 'not-joined'; RETURN; END IF;
    IF EXISTS (SELECT 1 FROM node_certs c WHERE c.serial = p_cert_serial AND c.revoked_at IS NOT NULL) THEN
        outcome := 'revoked'; RETURN;
    END IF;
    duplicate := prev.live AND prev.boot_id IS NOT NULL AND prev.boot_id <> p_boot;
    session_id := replace(gen_random_uuid()::text, '-', '');
    UPDATE node_sessions s
       SET session_epoch = s.session_epoch + 1, gateway_id = gw, session_id = gateway_hello.session_id,
           boot_id = p_boot, journal_id = p_journal, role = p_role, daemon_version = p_daemon_version,
           proto_max = p_proto_max, transport = p_transport, upgrade_required = p_upgrade_required,
           trust_version = p_trust_version,
           approver_set_epoch = CASE WHEN p_approver_set_sha256 <> '' THEN p_approver_set_epoch END,
           approver_set_sha256 = nullif(p_approver_set_sha256, ''),
           acked_event_seq = CASE WHEN s.journal_id IS DISTINCT FROM p_journal THEN 0 ELSE s.acked_event_seq END,
           connected_at = compute_now(), last_seen = compute_now(), disconnected_at = NULL,
           disconnect_reason = NULL, cert_serial = p_cert_serial, lane_credits = NULL, load = NULL,
           node_load = NULL, held_epoch = CASE WHEN duplicate THEN s.session_epoch + 1 END,
           trace_context = p_trace_context
     WHERE s.node_id = p_node
    RETURNING s.session_epoch, s.acked_event_seq INTO epoch, acked_event_seq;
    outcome := 'opened';
    previous_epoch := prev.session_epoch;
    previous_gateway_id := prev.gateway_id;
    previous_boot_id := prev.boot_id;
    previous_journal_id := prev.journal_id;
    previous_live := prev.live;
    inventory := coalesce((SELECT jsonb_object_agg(i.section, i.hash) FROM node_inventory i
                            WHERE i.node_id = p_node), '{}'::jsonb);
END $$;

-- A session's close, by its gateway at once; fenced on the node's epoch, this gateway
-- and its lease. Whether it closed.
CREATE FUNCTION gateway_close(p_gateway text, p_lease bigint, p_node text, p_epoch bigint, p_reason text)
RETURNS boolean LANGUAGE plpgsql SECURITY DEFINER AS $$
DECLARE
    gw text := gateway_as(p_gateway);
BEGIN
    UPDATE node_sessions s
       SET gateway_id = NULL, disconnected_at = compute_now(), disconnect_reason = p_reason
      FROM gateways g
     WHERE s.node_id = p_node AND s.session_epoch = p_epoch AND s.gateway_id = gw
       AND g.gateway_id = gw AND g.lease_epoch = p_lease AND g.lease_expires_at > compute_now();
    RETURN FOUND;
END $$;

-- One inventory section of a session this gateway holds (at most 256 sections a node:
-- schemas.facts.MAX_INVENTORY_SECTIONS); a section of an older session never overwrites a
-- newer one's. Whether it was written.
CREATE FUNCTION gateway_write_section(
    p_gateway text, p_lease bigint, p_node text, p_epoch bigint, p_section text, p_hash text,
    p_body jsonb)
RETURNS boolean LANGUAGE plpgsql SECURITY DEFINER AS $$
DECLARE
    gw text := gateway_as(p_gateway);
BEGIN
    INSERT INTO node_inventory AS i (node_id, section, hash, body, session_epoch, reported_at)
    SELECT s.node_id, p_section, p_hash, p_body, s.session_epoch, compute_now()
      FROM node_sessions s
      JOIN gateways g ON g.gateway_id = s.gateway_id
     WHERE s.node_id = p_node AND s.session_epoch = p_epoch AND s.gateway_id = gw
       AND g.lease_epoch = p_lease AND g.lease_expires_at > compute_now()
       AND (EXISTS (SELECT 1 FROM node_inventory x WHERE x.node_id = p_node AND x.section = p_section)
            OR (SELECT count(*) FROM node_inventory x WHERE x.node_id = p_node) < 256)
    ON CONFLICT (node_id, section) DO UPDATE
       SET hash = EXCLUDED.hash, body = EXCLUDED.body, session_epoch = EXCLUDED.session_epoch,
           reported_at = EXCLUDED.reported_at
     WHERE i.session_epoch <= EXCLUDED.session_epoch;
    RETURN FOUND;
END $$;

-- The search path of every SECURITY DEFINER function: this schema, then pg_temp (0024).
DO $$
DECLARE
    fn regprocedure;
BEGIN
    FOR fn IN
        SELECT p.oid::regprocedure FROM pg_proc p
         WHERE p.prosecdef AND p.pronamespace = current_schema()::regnamespace
           AND p.proname IN ('gateway_as', 'gateway_acquire', 'gateway_renew', 'gateway_drain',
                             'gateway_release', 'gateway_hello', 'gateway_close',
                             'gateway_write_section')
    LOOP
        EXECUTE format('ALTER FUNCTION %s SET search_path = %I, pg_temp', fn, current_schema());
        EXECUTE format('REVOKE EXECUTE ON FUNCTION %s FROM PUBLIC', fn);
    END LOOP;
END $$;
