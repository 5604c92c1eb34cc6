-- Proofs that cannot be kept back, within the second too (issue #59, item 3; migration
-- 0053; docs/contract.md, "The Hello's proof").
--
-- Migration 0053 refused a plain proof only if its `at` was before the node's newest
-- accepted `at`, and a challenge only if issued before the second the node's last proven
-- Hello was accepted: a gateway that kept proofs made in the second T (plain ones, and one
-- signed with a challenge issued at T) could still open the node's session with them after
-- the node said a proven Hello at another gateway in that same second.
--
-- * **A plain proof's `at` rises.** The daemon signs `at` = the later of its clock and the
--   last `at` it signed + 1 (in memory), so two of its Hellos never sign the same second;
--   a plain proof holds only if its `at` is after the node's newest accepted `at`
--   (`hello_marks.at`). A restarted daemon that signs that second again is refused once
--   and signs the refusal's challenge (issued now: it holds).
-- * **A challenge binds the node's mark.** The challenge's MAC covers the node's last
--   accepted proven Hello (`hello_marks.accepted_at`, to the microsecond, 0 when none),
--   and the check recomputes it against the current mark: a challenge is dead once a
--   proven Hello of the node is accepted anywhere after it was issued. Each accepted
--   proven Hello moves `accepted_at` forward (at least a microsecond: the trigger below),
--   so no two accepted Hellos leave one mark. The proof check locks the node's mark row
--   (owner-only; made as "none", `at` 0 at the epoch, for a node that had none) once the
--   proof's MAC by the node's key holds, before it checks a challenge against the mark, so the proven Hellos of one node are checked and written one at a time: the
--   mark a challenge was checked against is the one the Hello transaction writes over.
--   (Not the key row: the quarantine locks the node's session and then retires its key;
--   the Hello locks the mark, then the session, and nothing locks them the other way.)

-- hello_challenge as in migration 0047, over the node's mark too ('bc-hello-challenge-v2').
CREATE OR REPLACE FUNCTION hello_challenge(p_node text, p_gateway text, p_at bigint, p_salt text)
RETURNS text LANGUAGE sql STABLE AS $$
    SELECT 'srv-' || p_salt || '-' || left(encode(sha256(k.outer_pad || sha256(k.inner_pad ||
               convert_to(concat_ws(E'\n', 'bc-hello-challenge-v2', p_node, p_gateway,
                                    p_at::text, p_salt,
                                    coalesce((SELECT (extract(epoch FROM m.accepted_at)
                                                      * 1000000)::bigint
                                                FROM hello_marks m WHERE m.node_id = p_node),
                                             0)::text), 'UTF8'))), 'hex'), 40)
      FROM hello_challenge_key k
$$;

-- Whether a proof is not older than the node's newest accepted one: a plain proof's `at`
-- after the newest accepted `at`; a challenge's freshness is its MAC over the node's mark
-- (hello_challenge, checked under the mark's lock by hello_proof_holds).
CREATE OR REPLACE FUNCTION hello_proof_fresh(p_node text, p_at bigint, p_nonce text) RETURNS boolean
LANGUAGE sql STABLE AS $$
    SELECT left(p_nonce, 4) = 'srv-'
        OR NOT EXISTS (SELECT 1 FROM hello_marks m WHERE m.node_id = p_node AND p_at <= m.at)
$$;

-- Each accepted proven Hello moves the node's mark forward: a challenge issued before it
-- is dead, even when the fleet's clock did not move (or moved back) between two Hellos.
CREATE FUNCTION hello_mark_moves() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    NEW.accepted_at := greatest(NEW.accepted_at, OLD.accepted_at + interval '1 microsecond');
    RETURN NEW;
END $$;

CREATE TRIGGER hello_marks_move BEFORE UPDATE ON hello_marks
   FOR EACH ROW EXECUTE FUNCTION hello_mark_moves();

-- hello_proof_holds as in migration 0053, but once the MAC by the node's key holds, the
-- node's mark is locked and a challenge checked against it (the proven Hellos of a node
-- one at a time; a proof without the key locks and writes nothing).
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
    IF left(p_nonce, 4) = 'srv-' AND p_nonce !~ '^srv-[0-9a-f]{16}-[0-9a-f]{40}$' THEN
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
    -- signed by the node's key: now the node's proven Hellos one at a time, from here to
    -- the Hello's commit — its mark locked (made first, as "none", for a node without one)
    PERFORM 1 FROM hello_marks m WHERE m.node_id = p_node FOR UPDATE;
    IF NOT FOUND THEN
        INSERT INTO hello_marks (node_id, at, accepted_at)
        VALUES (p_node, 0, 'epoch') ON CONFLICT (node_id) DO NOTHING;
        PERFORM 1 FROM hello_marks m WHERE m.node_id = p_node FOR UPDATE;
    END IF;
    IF left(p_nonce, 4) = 'srv-'
       AND p_nonce IS DISTINCT FROM hello_challenge(p_node, p_gateway, p_at,
                                                    substr(p_nonce, 5, 16)) THEN
        RETURN false;  -- not the database's, or a proven Hello of the node accepted since
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
           AND p.proname IN ('hello_challenge', 'hello_proof_fresh', 'hello_proof_holds',
                             'hello_mark_moves')
    LOOP
        EXECUTE format('ALTER FUNCTION %s SET search_path = %I, pg_temp', fn, current_schema());
        IF fn::text NOT LIKE 'hello_mark_moves%' THEN
            EXECUTE format('REVOKE EXECUTE ON FUNCTION %s FROM PUBLIC', fn);
        END IF;
    END LOOP;
END $$;
