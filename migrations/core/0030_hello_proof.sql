-- A gateway is trusted with its own sessions only (issue "a compromised gateway cannot
-- reach nodes that never connected to it", docs/contract.md "The Hello's proof").
--
-- * A node proves its Hello: an HMAC-SHA256, by a key the node was given when it joined
--   (`enroll_hello_key`), over its node id, boot id, journal id, the gateway it dialled,
--   a time and a one-time id. The key is readable by this schema's owner alone; the
--   Hello transaction checks the proof before it locks or changes anything, refuses a
--   proof seen before (`hello_nonces`) or more than 5 minutes off the fleet's clock, and
--   — when the fleet requires proofs (`fleet_policy.hello_proof`) — a Hello without one.
-- * The Hello transaction reveals nothing of the node: no previous boot id, journal id
--   or gateway, only whether the Hello is a duplicate identity. What the workers need of
--   the previous session they read from `session_epochs`, recorded under the node's row
--   lock by the trigger below, never from the fact a gateway publishes.
-- * It checks the certificate before it locks, locks with a timeout, and requires the
--   Hello fact's id.
-- * Admission reads one node and one serial through a function, not the tables.

-- The fleet's policy: `off` (proofs not checked), `warn` (a proof is checked when given;
-- a Hello without one opens, recorded unproven), `require` (a Hello without a valid proof
-- is refused). One row; `bcw migrate` sets it from BCW_HELLO_PROOF.
CREATE TABLE fleet_policy (
    one         boolean PRIMARY KEY DEFAULT true CHECK (one),
    hello_proof text    NOT NULL DEFAULT 'warn' CHECK (hello_proof IN ('off', 'warn', 'require')),
    changed_at  timestamptz NOT NULL DEFAULT now()
);
INSERT INTO fleet_policy DEFAULT VALUES;

-- Each node's Hello key, kept as HMAC's inner and outer pads (RFC 2104), so that a proof
-- costs two sha256() calls. Only the owner reads it.
CREATE TABLE node_hello_keys (
    node_id     text PRIMARY KEY REFERENCES nodes (node_id) ON DELETE CASCADE,
    inner_pad   bytea NOT NULL CHECK (length(inner_pad) = 64),
    outer_pad   bytea NOT NULL CHECK (length(outer_pad) = 64),
    enrolled_at timestamptz NOT NULL DEFAULT compute_now()
);

-- The one-time ids of the proofs taken, kept as long as their time can still pass the
-- check (10 minutes), pruned per node by its next proven Hello.
CREATE TABLE hello_nonces (
    node_id text        NOT NULL REFERENCES nodes (node_id) ON DELETE CASCADE,
    nonce   text        NOT NULL,
    at      timestamptz NOT NULL,
    PRIMARY KEY (node_id, nonce)
);

-- What the Hello transaction saw of the session before it, under the node's row lock
-- (NULL: an epoch issued before this migration, or by a writer that did not say), and
-- whether its Hello was proven (NULL: not checked, the policy was `off`).
ALTER TABLE session_epochs
    ADD COLUMN previous_epoch      bigint,
    ADD COLUMN previous_gateway_id text,
    ADD COLUMN previous_boot_id    text,
    ADD COLUMN previous_journal_id text,
    ADD COLUMN previous_live       boolean,
    ADD COLUMN proven              boolean;

-- Give node `p_node` its Hello key (16 to 64 bytes; 32 random bytes recommended), or a
-- new one. The control plane's join flow calls it, as the schema's owner, and hands the
-- same key to the node with its certificate.
CREATE FUNCTION enroll_hello_key(p_node text, p_key bytea) RETURNS void
LANGUAGE plpgsql AS $$
DECLARE
    inner_pad bytea := '\x'::bytea;
    outer_pad bytea := '\x'::bytea;
    k integer;
BEGIN
    IF p_key IS NULL OR length(p_key) < 16 OR length(p_key) > 64 THEN
        RAISE EXCEPTION 'a Hello key is 16 to 64 bytes' USING ERRCODE = 'invalid_parameter_value';
    END IF;
    FOR i IN 0..63 LOOP
        k := CASE WHEN i < length(p_key) THEN get_byte(p_key, i) ELSE 0 END;
        inner_pad := inner_pad || decode(lpad(to_hex(k # 54), 2, '0'), 'hex');
        outer_pad := outer_pad || decode(lpad(to_hex(k # 92), 2, '0'), 'hex');
    END LOOP;
    INSERT INTO node_hello_keys (node_id, inner_pad, outer_pad) VALUES (p_node, inner_pad, outer_pad)
    ON CONFLICT (node_id) DO UPDATE
       SET inner_pad = EXCLUDED.inner_pad, outer_pad = EXCLUDED.outer_pad,
           enrolled_at = EXCLUDED.enrolled_at;
END $$;

-- The bytes a node signs (schemas/proof.py builds the same): one line per field.
CREATE FUNCTION hello_proof_message(p_node text, p_boot text, p_journal text, p_gateway text,
                                    p_at bigint, p_nonce text) RETURNS bytea
LANGUAGE sql IMMUTABLE AS $$
    SELECT convert_to(concat_ws(E'\n', 'bc-hello-proof-v1', p_node, p_boot, p_journal, p_gateway,
                                p_at::text, p_nonce), 'UTF8')
$$;

-- Whether a Hello's proof holds: the node has a key, the MAC is the key's over the
-- message, its time is within 5 minutes of the fleet's clock, and its one-time id was
-- never taken (it is taken now). Called by gateway_hello only (owner-only: no other
-- login may test MACs against a node's key).
CREATE FUNCTION hello_proof_holds(p_node text, p_boot text, p_journal text, p_gateway text,
                                  p_at bigint, p_nonce text, p_mac text) RETURNS boolean
LANGUAGE plpgsql AS $$
DECLARE
    pads record;
    taken boolean;
BEGIN
    IF p_at IS NULL OR p_nonce IS NULL OR p_mac IS NULL
       OR p_nonce !~ '^[A-Za-z0-9_-]{16,64}$' OR p_mac !~ '^[0-9a-f]{64}$'
       OR abs(extract(epoch FROM compute_now()) - p_at) > 300 THEN
        RETURN false;
    END IF;
    SELECT k.inner_pad, k.outer_pad INTO pads FROM node_hello_keys k WHERE k.node_id = p_node;
    IF NOT FOUND THEN RETURN false; END IF;
    IF encode(sha256(pads.outer_pad || sha256(pads.inner_pad ||
              hello_proof_message(p_node, p_boot, p_journal, p_gateway, p_at, p_nonce))), 'hex')
       <> p_mac THEN
        RETURN false;
    END IF;
    DELETE FROM hello_nonces WHERE node_id = p_node AND at < compute_now() - interval '10 minutes';
    INSERT INTO hello_nonces (node_id, nonce, at) VALUES (p_node, p_nonce, compute_now())
    ON CONFLICT DO NOTHING RETURNING true INTO taken;
    RETURN coalesce(taken, false);
END $$;

-- The session before the Hello, as the Hello transaction saw it under the node's lock:
-- its epoch, gateway, boot and journal from the row's old values; whether it was live
-- and whether this Hello was proven as gateway_hello said (`bcw.hello_previous_live`,
-- `bcw.hello_proven` for its transaction). Any other writer of the row (a test's, a
-- gateway of 0.3 with direct writes) says nothing: NULLs, and the workers take the
-- Hello fact's word, as before.
CREATE OR REPLACE FUNCTION record_session_epoch() RETURNS trigger
LANGUAGE plpgsql SECURITY DEFINER SET search_path FROM CURRENT AS $$
DECLARE
    said text := nullif(current_setting('bcw.hello_fact_id', true), '');
    live text := nullif(current_setting('bcw.hello_previous_live', true), '');
    proven text := nullif(current_setting('bcw.hello_proven', true), '');
    -- the Hello transaction's bump: one more epoch, and gateway_hello said what it saw
    bumped boolean := TG_OP = 'UPDATE' AND NEW.session_epoch = OLD.session_epoch + 1
                      AND live IS NOT NULL;
BEGIN
    INSERT INTO session_epochs AS e (node_id, epoch, gateway_id, boot_id, journal_id, hello_fact_id,
                                     previous_epoch, previous_gateway_id, previous_boot_id,
                                     previous_journal_id, previous_live, proven)
    VALUES (NEW.node_id, NEW.session_epoch, NEW.gateway_id, NEW.boot_id, NEW.journal_id,
            said::uuid,
            CASE WHEN bumped THEN OLD.session_epoch END,
            CASE WHEN bumped THEN OLD.gateway_id END,
            CASE WHEN bumped THEN OLD.boot_id END,
            CASE WHEN bumped THEN OLD.journal_id END,
            CASE WHEN bumped THEN live::boolean END,
            proven::boolean)
    ON CONFLICT (node_id, epoch) DO UPDATE
       SET gateway_id = EXCLUDED.gateway_id, boot_id = EXCLUDED.boot_id,
           journal_id = EXCLUDED.journal_id, issued_at = EXCLUDED.issued_at,
           hello_fact_id = EXCLUDED.hello_fact_id;
    DELETE FROM session_epochs
     WHERE node_id = NEW.node_id AND epoch < NEW.session_epoch
       AND issued_at < compute_now() - interval '1 day';
    RETURN NULL;
END $$;

-- The 0.4 development builds' Hello transaction returned the previous session's boot id,
-- journal id and gateway: no login may call it any more.
CREATE OR REPLACE FUNCTION gateway_hello(
    p_gateway text, p_lease bigint, p_node text, p_cert_serial text, p_boot text,
    p_journal text, p_role text, p_daemon_version text, p_proto_max integer,
    p_transport text, p_upgrade_required boolean, p_trust_version bigint,
    p_approver_set_epoch bigint, p_approver_set_sha256 text, p_live_window interval,
    p_trace_context text, p_hello_fact_id uuid,
    OUT outcome text, OUT epoch bigint, OUT session_id text, OUT acked_event_seq bigint,
    OUT previous_epoch bigint, OUT previous_gateway_id text, OUT previous_boot_id text,
    OUT previous_journal_id text, OUT previous_live boolean, OUT inventory jsonb)
LANGUAGE plpgsql SECURITY DEFINER AS $$
BEGIN
    RAISE EXCEPTION 'this Hello transaction was replaced: upgrade the gateway'
        USING ERRCODE = 'feature_not_supported';
END $$;
DO $$ BEGIN
    IF EXISTS (SELECT 1 FROM pg_roles WHERE rolname = 'bcw_gateway_bound') THEN
        REVOKE EXECUTE ON FUNCTION gateway_hello(text, bigint, text, text, text, text, text, text,
            integer, text, boolean, bigint, bigint, text, interval, text, uuid) FROM bcw_gateway_bound;
    END IF;
END $$;

-- The Hello transaction. In this order, so that a Hello that may not open changes and
-- locks nothing: the login's gateway and its lease; the Hello fact's id (required); the
-- certificate (revoked, or another node's); the proof, under the fleet's policy; then
-- the node's row, locked with a timeout (a lock held elsewhere answers 'busy' within 2 s,
-- never queues the gateway), its epoch bumped. Returns only what the gateway needs: the
-- epoch, the session id, whether the Hello is a duplicate identity (the session is then
-- held for the quarantine), what the node's journal and inventory hold. The outcome says
-- why nothing was written: 'lease-gone', 'draining', 'not-joined', 'revoked', 'unproven'.
-- The session's capabilities are the Hello's (the valid names, as `sanitize` keeps them;
-- none given: none), never the session's before.
CREATE FUNCTION gateway_hello(
    p_gateway text, p_lease bigint, p_node text, p_cert_serial text, p_boot text,
    p_journal text, p_role text, p_daemon_version text, p_proto_max integer,
    p_transport text, p_upgrade_required boolean, p_trust_version bigint,
    p_approver_set_epoch bigint, p_approver_set_sha256 text, p_live_window interval,
    p_trace_context text, p_hello_fact_id uuid,
    p_proof_at bigint, p_proof_nonce text, p_proof_mac text, p_capabilities text[] DEFAULT NULL,
    OUT outcome text, OUT epoch bigint, OUT session_id text, OUT acked_event_seq bigint,
    OUT duplicate boolean, OUT proven boolean, OUT inventory jsonb)
LANGUAGE plpgsql SECURITY DEFINER SET lock_timeout = '2s' AS $$
DECLARE
    gw text := gateway_as(p_gateway);
    is_draining boolean;
    policy text;
    prev record;
BEGIN
    IF p_hello_fact_id IS NULL THEN
        RAISE EXCEPTION 'a Hello transaction names its Hello fact' USING ERRCODE = 'null_value_not_allowed';
    END IF;
    SELECT g.draining INTO is_draining FROM gateways g
     WHERE g.gateway_id = gw AND g.lease_epoch = p_lease AND g.lease_expires_at > compute_now()
       FOR SHARE;
    IF NOT FOUND THEN outcome := 'lease-gone'; RETURN; END IF;
    IF is_draining THEN outcome := 'draining'; RETURN; END IF;
    IF EXISTS (SELECT 1 FROM node_certs c WHERE c.serial = p_cert_serial
                 AND (c.revoked_at IS NOT NULL OR c.node_id <> p_node)) THEN
        outcome := 'revoked'; RETURN;
    END IF;
    -- the policy cannot change under a Hello (bcw migrate takes this lock exclusively)
    PERFORM pg_advisory_xact_lock_shared(hashtext('bcw-fleet-policy'));
    SELECT f.hello_proof INTO policy FROM fleet_policy f;
    IF policy = 'off' THEN
        proven := NULL;
    ELSIF p_proof_mac IS NULL THEN
        proven := false;
    ELSE
        proven := hello_proof_holds(p_node, p_boot, p_journal, gw, p_proof_at, p_proof_nonce,
                                    p_proof_mac);
        IF NOT proven THEN outcome := 'unproven'; RETURN; END IF;  -- a bad proof is never taken
    END IF;
    IF policy = 'require' AND proven IS NOT TRUE THEN outcome := 'unproven'; RETURN; END IF;
    SELECT s.session_epoch, s.boot_id,
           s.gateway_id IS NOT NULL
           AND s.last_seen > compute_now() - least(p_live_window, interval '5 minutes') AS live
      INTO prev FROM node_sessions s WHERE s.node_id = p_node FOR UPDATE;
    IF NOT FOUND THEN outcome := 'not-joined'; RETURN; END IF;
    duplicate := coalesce(prev.live AND prev.boot_id IS NOT NULL AND prev.boot_id <> p_boot, false);
    PERFORM set_config('bcw.hello_fact_id', p_hello_fact_id::text, true),
            set_config('bcw.hello_previous_live', coalesce(prev.live, false)::text, true),
            set_config('bcw.hello_proven', coalesce(proven::text, ''), true);
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
           trace_context = p_trace_context, capabilities = coalesce(p_capabilities, '{}')
     WHERE s.node_id = p_node
    RETURNING s.session_epoch, s.acked_event_seq INTO epoch, acked_event_seq;
    PERFORM set_config('bcw.hello_previous_live', '', true), set_config('bcw.hello_proven', '', true);
    outcome := 'opened';
    inventory := coalesce((SELECT jsonb_object_agg(i.section, i.hash) FROM node_inventory i
                            WHERE i.node_id = p_node), '{}'::jsonb);
END $$;

-- A session is labeled (placement offers it for its system labels) when the labeler
-- writes its capabilities at its epoch; the Hello transaction, which writes them while it
-- bumps the epoch, leaves it unlabeled until the labeler has kept the labels in step.
CREATE OR REPLACE FUNCTION mark_labeled_epoch() RETURNS trigger
LANGUAGE plpgsql SET search_path FROM CURRENT AS $$
BEGIN
    IF NEW.session_epoch = OLD.session_epoch THEN
        NEW.labeled_epoch := NEW.session_epoch;
    END IF;
    RETURN NEW;
END $$;

-- What admission reads, for one node and the one serial it presents (a gateway's login
-- reads no certificate table): the fleet's clock, the node (NULLs: never joined) and its
-- spec, the serial's record (NULLs: not recorded).
CREATE FUNCTION gateway_admission(p_gateway text, p_node text, p_serial text,
    OUT now timestamptz, OUT node_generation integer, OUT node_role text, OUT spec text,
    OUT spec_generation bigint, OUT spec_signature text, OUT serial text, OUT node_id text,
    OUT identity_generation integer, OUT role text, OUT not_after timestamptz,
    OUT revoked boolean, OUT allowed_kinds text[])
LANGUAGE plpgsql STABLE SECURITY DEFINER AS $$
DECLARE
    gw text := gateway_as(p_gateway);
BEGIN
    now := compute_now();
    SELECT n.identity_generation, n.role, n.spec::text, n.spec_generation, n.spec_signature
      INTO node_generation, node_role, spec, spec_generation, spec_signature
      FROM nodes n WHERE n.node_id = p_node;
    SELECT c.serial, c.node_id, c.identity_generation, c.role, c.not_after,
           c.revoked_at IS NOT NULL, c.allowed_kinds
      INTO serial, node_id, identity_generation, role, not_after, revoked, allowed_kinds
      FROM node_certs c WHERE c.serial = p_serial;
END $$;

DO $$
DECLARE
    fn regprocedure;
BEGIN
    FOR fn IN
        SELECT p.oid::regprocedure FROM pg_proc p
         WHERE p.pronamespace = current_schema()::regnamespace
           AND p.proname IN ('gateway_hello', 'gateway_admission', 'enroll_hello_key',
                             'hello_proof_holds', 'record_session_epoch')
    LOOP
        EXECUTE format('ALTER FUNCTION %s SET search_path = %I, pg_temp', fn, current_schema());
        IF fn::text NOT LIKE 'record_session_epoch%' THEN
            EXECUTE format('REVOKE EXECUTE ON FUNCTION %s FROM PUBLIC', fn);
        END IF;
    END LOOP;
END $$;
