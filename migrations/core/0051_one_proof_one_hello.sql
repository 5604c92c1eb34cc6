-- A proof holds for the one Hello it was given for (found by an attack on real servers,
-- issue 58): the message a node signs joins its fields with line feeds, and
-- `concat_ws` skips a NULL, so a proof given for (boot "b1", journal "j1") also held for
-- a boot "b1\nj1" with no journal — a gateway that was given two of a node's proofs could
-- open two sessions from "another boot" with them, and at `require` revoke an honest
-- node as a clone. `hello_proof_holds` as in migration 0047, but it refuses a field that
-- is missing or holds a line break; the daemon's ids never do (schemas/facts.py: `Ident`).

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

DO $$
BEGIN
    EXECUTE format('ALTER FUNCTION hello_proof_holds(text, text, text, text, bigint, text, text) '
                   'SET search_path = %I, pg_temp', current_schema());
    REVOKE EXECUTE ON FUNCTION hello_proof_holds(text, text, text, text, bigint, text, text) FROM PUBLIC;
END $$;
