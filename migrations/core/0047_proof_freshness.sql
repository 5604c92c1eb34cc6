-- A Hello's proof that does not depend on the daemon's clock (issue 58, item 5;
-- docs/contract.md, "The Hello's proof").
--
-- A proof signs a time. The daemon's own clock may be wrong by more than the 5 minutes a
-- proof may be off the fleet's clock; then its Hello is refused, and the refusal carries
-- the database's time and a **challenge**: a nonce `srv-<salt>-<mac>`, the MAC by a key
-- only this schema's owner reads over the node, the gateway and that time. The daemon signs
-- its next Hello with that time and that nonce. The check takes a nonce of that form only
-- when it is the database's own for this node, this gateway and this time, so a gateway
-- cannot make up a challenge for a time to come: a daemon never signs a time a gateway told
-- it with a nonce of its own, and a proof signed with a challenge holds only within 5
-- minutes of when the database issued it — as a proof signed at a right clock does.
--
-- The one-time ids stay bounded: each proven Hello deletes its node's ids older than 10
-- minutes (as before), and one in 16 (those whose MAC begins with 0) also up to 256 of any
-- node's, the oldest first, skipping rows another Hello is deleting: ids no longer needed
-- never pile up for nodes that stopped saying Hello. The table holds the ids of the last
-- 10 minutes' proven Hellos and what expired since the last pruning one, whatever the
-- fleet's size. (Pruning in every Hello cost 3 times the check itself: each scan from the
-- oldest end of the index passed the entries deleted before it and not yet vacuumed.)

-- The key challenges are MACed with, as HMAC's inner and outer pads: one row, the owner's
-- alone (no group is granted it). Made here, from 4 random UUIDs (pg_strong_random).
CREATE TABLE hello_challenge_key (
    one        boolean PRIMARY KEY DEFAULT true CHECK (one),
    inner_pad  bytea NOT NULL CHECK (length(inner_pad) = 64),
    outer_pad  bytea NOT NULL CHECK (length(outer_pad) = 64),
    created_at timestamptz NOT NULL DEFAULT now()
);

DO $$
DECLARE
    k bytea := sha256(convert_to(gen_random_uuid()::text || gen_random_uuid()::text
                                 || gen_random_uuid()::text || gen_random_uuid()::text, 'UTF8'));
    inner_pad bytea := '\x'::bytea;
    outer_pad bytea := '\x'::bytea;
    b integer;
BEGIN
    FOR i IN 0..63 LOOP
        b := CASE WHEN i < length(k) THEN get_byte(k, i) ELSE 0 END;
        inner_pad := inner_pad || decode(lpad(to_hex(b # 54), 2, '0'), 'hex');
        outer_pad := outer_pad || decode(lpad(to_hex(b # 92), 2, '0'), 'hex');
    END LOOP;
    INSERT INTO hello_challenge_key (inner_pad, outer_pad) VALUES (inner_pad, outer_pad);
END $$;

-- The challenge for a node, a gateway, a time (Unix seconds) and a salt of 16 hex digits:
-- `srv-<salt>-<the first 40 hex digits of the MAC>`. Owner-only: whoever could call it
-- could make a challenge for any time.
CREATE FUNCTION hello_challenge(p_node text, p_gateway text, p_at bigint, p_salt text)
RETURNS text LANGUAGE sql STABLE AS $$
    SELECT 'srv-' || p_salt || '-' || left(encode(sha256(k.outer_pad || sha256(k.inner_pad ||
               convert_to(concat_ws(E'\n', 'bc-hello-challenge-v1', p_node, p_gateway,
                                    p_at::text, p_salt), 'UTF8'))), 'hex'), 40)
      FROM hello_challenge_key k
$$;

-- What a gateway hands a daemon whose Hello's proof did not hold: the database's time
-- (whole seconds) and a challenge for that node, this gateway and that time. It reveals
-- nothing of the node (whether it has a key, or exists): any gateway may ask for any node,
-- and a challenge is of use only with the node's key, within 5 minutes, once.
CREATE FUNCTION gateway_hello_challenge(p_gateway text, p_node text,
                                        OUT server_time bigint, OUT challenge text)
LANGUAGE plpgsql SECURITY DEFINER AS $$
DECLARE
    gw text := gateway_as(p_gateway);
BEGIN
    server_time := floor(extract(epoch FROM compute_now()))::bigint;
    challenge := hello_challenge(p_node, gw, server_time, left(md5(gen_random_uuid()::text), 16));
END $$;

-- The pruning's search: the oldest one-time ids first.
CREATE INDEX hello_nonces_at ON hello_nonces (at);

-- Whether a Hello's proof holds (migration 0030's, and): a nonce beginning `srv-` is a
-- challenge, taken only as the database's own for this node, this gateway and this `at`;
-- the one-time ids pruned as said above. Called by gateway_hello only (owner-only).
-- Neither the outcome nor anything the gateway sees tells a stale proof from a bad MAC.
CREATE OR REPLACE FUNCTION hello_proof_holds(p_node text, p_boot text, p_journal text,
                                             p_gateway text, p_at bigint, p_nonce text,
                                             p_mac text) RETURNS boolean
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
    IF left(p_nonce, 4) = 'srv-'
       AND (p_nonce !~ '^srv-[0-9a-f]{16}-[0-9a-f]{40}$'
            OR p_nonce IS DISTINCT FROM hello_challenge(p_node, p_gateway, p_at,
                                                        substr(p_nonce, 5, 16))) THEN
        RETURN false;
    END IF;
    SELECT k.inner_pad, k.outer_pad INTO pads FROM node_hello_keys k WHERE k.node_id = p_node;
    IF NOT FOUND THEN RETURN false; END IF;
    IF encode(sha256(pads.outer_pad || sha256(pads.inner_pad ||
              hello_proof_message(p_node, p_boot, p_journal, p_gateway, p_at, p_nonce))), 'hex')
       <> p_mac THEN
        RETURN false;
    END IF;
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

-- Each function's search path, as migration 0030 set its own (CREATE OR REPLACE takes the
-- settings from the new text); PUBLIC may call none of them (`bcw migrate` grants the
-- gateways' group its one: workers/runtime/store/roles.py).
DO $$
DECLARE
    fn regprocedure;
BEGIN
    FOR fn IN
        SELECT p.oid::regprocedure FROM pg_proc p
         WHERE p.pronamespace = current_schema()::regnamespace
           AND p.proname IN ('hello_proof_holds', 'hello_challenge', 'gateway_hello_challenge')
    LOOP
        EXECUTE format('ALTER FUNCTION %s SET search_path = %I, pg_temp', fn, current_schema());
        EXECUTE format('REVOKE EXECUTE ON FUNCTION %s FROM PUBLIC', fn);
    END LOOP;
END $$;
