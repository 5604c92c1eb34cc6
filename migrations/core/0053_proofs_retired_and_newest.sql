-- A revocation retires the node's Hello key and identity generation, and a proof holds
-- only if it is not older than the newest the node's Hellos gave (issue #59, items 2 and 3;
-- docs/contract.md, "The Hello's proof").
--
-- * **A revocation retires the key.** When a certificate of the node's current identity
--   generation is revoked — by the quarantine worker, `bcw quarantine release`, or an
--   operator writing `node_certs.revoked_at` (or a serial recorded revoked) — the trigger
--   below marks the node's Hello key retired (`node_hello_keys.retired_at`). The node still
--   counts as one that proves its Hellos (its row stays: an unproven Hello of it is a
--   takeover attempt at any policy, as migration 0049 says) but no proof by the old key
--   holds, until the control plane enrolls a new key (`enroll_hello_key`, which clears
--   it) with the node's new certificate (`join_node`, which raises the generation).
--   Revoking a certificate of an older generation (one admission already refuses, say
--   after an honest rotation) retires nothing.
-- * **The generation too**: an unrecorded serial is not admitted for a node with a
--   revoked certificate of its current generation (the Hello transaction, migration
--   0054): after a revocation, only a certificate recorded since (a new generation) opens.
--   `node_certs_revoked_by_node` finds those certificates without a scan.
-- * **The newest proof.** `hello_marks` keeps per node the newest `at` of its accepted
--   proofs and the database's time the last was accepted (written by the Hello
--   transaction under the node's lock, migration 0054). A plain proof holds only if its
--   `at` is not before that newest `at` (two Hellos in the same second both hold: their
--   nonces differ); a challenge proof (`srv-…`, migration 0047) only if the database issued
--   it (its `at`) in or after the second the last proven Hello was accepted. A proof a
--   gateway kept back is dead once the node has said a proven Hello anywhere. An honest
--   daemon whose clock went back past its last accepted `at` is refused once, and signs
--   the refusal's challenge (issued now: it holds).

ALTER TABLE node_hello_keys ADD COLUMN retired_at timestamptz;

CREATE INDEX node_certs_revoked_by_node ON node_certs (node_id) WHERE revoked_at IS NOT NULL;

-- The newest accepted proof per node: owner-only, as the keys (no group is granted it).
CREATE TABLE hello_marks (
    node_id     text PRIMARY KEY REFERENCES nodes (node_id) ON DELETE CASCADE,
    at          bigint      NOT NULL,  -- the newest `at` of a proof accepted (Unix seconds)
    accepted_at timestamptz NOT NULL   -- compute_now() when the last proven Hello was accepted
);

-- Whether a proof at `p_at` with `p_nonce` is not older than the node's newest accepted
-- proof: the one place the rule is written (hello_proof_holds checks it before it takes
-- the nonce, and the Hello transaction again under the node's lock).
CREATE FUNCTION hello_proof_fresh(p_node text, p_at bigint, p_nonce text) RETURNS boolean
LANGUAGE sql STABLE AS $$
    SELECT NOT EXISTS (
        SELECT 1 FROM hello_marks m
         WHERE m.node_id = p_node
           AND CASE WHEN left(p_nonce, 4) = 'srv-'
                    THEN p_at < floor(extract(epoch FROM m.accepted_at))::bigint
                    ELSE p_at < m.at END)
$$;

-- A revocation of the node's current generation retires its Hello key (whatever path
-- writes it: the trigger runs with its owner's rights, the quarantine's role writes no key).
CREATE FUNCTION retire_hello_key() RETURNS trigger
LANGUAGE plpgsql SECURITY DEFINER SET search_path FROM CURRENT AS $$
BEGIN
    UPDATE node_hello_keys k SET retired_at = compute_now()
      FROM nodes n
     WHERE k.node_id = NEW.node_id AND n.node_id = NEW.node_id AND k.retired_at IS NULL
       AND NEW.identity_generation >= n.identity_generation;
    RETURN NULL;
END $$;

CREATE TRIGGER node_certs_revoked_retire_key AFTER INSERT ON node_certs
   FOR EACH ROW WHEN (NEW.revoked_at IS NOT NULL) EXECUTE FUNCTION retire_hello_key();
CREATE TRIGGER node_certs_revoking_retires_key AFTER UPDATE OF revoked_at ON node_certs
   FOR EACH ROW WHEN (OLD.revoked_at IS NULL AND NEW.revoked_at IS NOT NULL)
   EXECUTE FUNCTION retire_hello_key();

-- enroll_hello_key as in migration 0030, and a key enrolled is not retired.
CREATE OR REPLACE FUNCTION enroll_hello_key(p_node text, p_key bytea) RETURNS void
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
           enrolled_at = EXCLUDED.enrolled_at, retired_at = NULL;
END $$;

-- hello_proof_holds as in migration 0051, but a retired key proves nothing, and a proof
-- older than the node's newest accepted one does not hold (its nonce is not taken).
CREATE OR REPLACE FUNCTION hello_proof_holds(p_node text, p_boot text, p_journal text,
                                             p_gateway text, p_at bigint, p_nonce text,
                                             p_mac text) RETURNS boolean
LANGUAGE plpgsql AS $$
DECLARE
    pads record;
    taken boolean;
BEGIN
    -- the signed message is its fields joined by line feeds: a field that is missing or
    -- holds one could make a proof given for one Hello hold for another (boot "b1\nj1"
    -- with no journal signs as boot "b1", journal "j1")
    IF p_node IS NULL OR p_boot IS NULL OR p_journal IS NULL OR p_gateway IS NULL
       OR strpos(p_node || p_boot || p_journal || p_gateway, E'\n') > 0
       OR strpos(p_node || p_boot || p_journal || p_gateway, E'\r') > 0 THEN
        RETURN false;
    END IF;
    IF p_at IS NULL OR p_nonce IS NULL OR p_mac IS NULL
       OR p_nonce !~ '^[A-Za-z0-9_-]{16,64}$' OR p_mac !~ '^[0-9a-f]{64}$'
       OR abs(extract(epoch FROM compute_now()) - p_at) > 300 THEN
        RETURN false;
    END IF;
    IF left(p_nonce, 4) = 'srv-'
       AND (p_nonce !~ '^srv-[0-9a-f]{16}-[0-9a-f]{40}$'
            OR p_nonce IS DISTINCT FROM hello_challenge(p_node, p_gateway, p_at,
                                                        substr(p_nonce, 5, 16))) THEN
        RETURN false;
    END IF;
    SELECT k.inner_pad, k.outer_pad INTO pads FROM node_hello_keys k
     WHERE k.node_id = p_node AND k.retired_at IS NULL;
    IF NOT FOUND THEN RETURN false; END IF;  -- no key, or a retired one
    IF encode(sha256(pads.outer_pad || sha256(pads.inner_pad ||
              hello_proof_message(p_node, p_boot, p_journal, p_gateway, p_at, p_nonce))), 'hex')
       <> p_mac THEN
        RETURN false;
    END IF;
    IF NOT hello_proof_fresh(p_node, p_at, p_nonce) THEN RETURN false; END IF;  -- kept back
    DELETE FROM hello_nonces
     WHERE node_id = p_node AND at < compute_now() - interval '10 minutes';
    IF left(p_mac, 1) = '0' THEN  -- one proven Hello in 16: any node's, the oldest first
        DELETE FROM hello_nonces WHERE ctid = ANY (ARRAY(
               SELECT o.ctid FROM hello_nonces o
                WHERE o.at < compute_now() - interval '10 minutes'
                ORDER BY o.at LIMIT 256 FOR UPDATE SKIP LOCKED));
    END IF;
    INSERT INTO hello_nonces (node_id, nonce, at) VALUES (p_node, p_nonce, compute_now())
    ON CONFLICT DO NOTHING RETURNING true INTO taken;
    RETURN coalesce(taken, false);
END $$;

-- Each function's search path, as earlier migrations set their own; PUBLIC may call none
-- of them (workers/runtime/store/roles.py: the owner's alone).
DO $$
DECLARE
    fn regprocedure;
BEGIN
    FOR fn IN
        SELECT p.oid::regprocedure FROM pg_proc p
         WHERE p.pronamespace = current_schema()::regnamespace
           AND p.proname IN ('hello_proof_holds', 'hello_proof_fresh', 'enroll_hello_key',
                             'retire_hello_key')
    LOOP
        EXECUTE format('ALTER FUNCTION %s SET search_path = %I, pg_temp', fn, current_schema());
        IF fn::text NOT LIKE 'retire_hello_key%' THEN
            EXECUTE format('REVOKE EXECUTE ON FUNCTION %s FROM PUBLIC', fn);
        END IF;
    END LOOP;
END $$;
