-- SQL entry points for the rest of the control plane (and tests), so that no caller
-- depends on the tables' inner columns.

-- What joining leaves behind: the node, its node_sessions row at epoch 0, its
-- certificate. Joining again with a new certificate raises the identity generation (the
-- older certificates are refused at admission); joining again with the same certificate
-- changes nothing.
CREATE FUNCTION join_node(p_node_id text, p_role text, p_cert_serial text, p_allowed_kinds text[])
RETURNS void LANGUAGE plpgsql AS $$
DECLARE
    existing_node text;
    generation    integer;
BEGIN
    SELECT node_id INTO existing_node FROM node_certs WHERE serial = p_cert_serial;
    IF existing_node IS NOT NULL THEN
        IF existing_node <> p_node_id THEN
            RAISE EXCEPTION 'certificate % belongs to node %, not %',
                p_cert_serial, existing_node, p_node_id USING ERRCODE = 'unique_violation';
        END IF;
        RETURN;
    END IF;

    INSERT INTO nodes AS n (node_id, role) VALUES (p_node_id, p_role)
    ON CONFLICT (node_id) DO UPDATE
        SET role = EXCLUDED.role, identity_generation = n.identity_generation + 1
    RETURNING n.identity_generation INTO generation;

    INSERT INTO node_sessions (node_id, role) VALUES (p_node_id, p_role)
    ON CONFLICT (node_id) DO UPDATE SET role = EXCLUDED.role;

    INSERT INTO node_certs (serial, node_id, identity_generation, role, allowed_kinds, not_after)
    VALUES (p_cert_serial, p_node_id, generation, p_role, p_allowed_kinds,
            compute_now() + interval '365 days');
END $$;

-- A pending command with the node's next seq; wakes the dispatchers.
CREATE FUNCTION enqueue_command(p_node_id text, p_kind text, p_payload jsonb,
                                p_lane text DEFAULT 'default')
RETURNS uuid LANGUAGE plpgsql AS $$
DECLARE
    next_seq bigint;
    new_id   uuid;
BEGIN
    UPDATE nodes SET last_command_seq = last_command_seq + 1
     WHERE node_id = p_node_id
    RETURNING last_command_seq INTO next_seq;
    IF next_seq IS NULL THEN
        RAISE EXCEPTION 'unknown node %', p_node_id USING ERRCODE = 'foreign_key_violation';
    END IF;
    INSERT INTO commands (node_id, seq, kind, lane, payload)
    VALUES (p_node_id, next_seq, p_kind, p_lane, coalesce(p_payload, '{}'::jsonb))
    RETURNING command_id INTO new_id;
    PERFORM pg_notify('bcw_commands', p_node_id);
    RETURN new_id;
END $$;

-- Placement's question: which nodes have capability X. Only system labels count, never
-- an operator label of the same key.
CREATE FUNCTION nodes_with_capability(p_name text)
RETURNS SETOF text LANGUAGE sql STABLE AS $$
    SELECT node_id FROM node_labels
     WHERE source = 'system' AND key = 'bc.dev/cap.' || p_name AND value = '1'
     ORDER BY node_id
$$;
