-- A node's desired state (issue "truth as of the Hello"): the spec the control plane
-- wants the daemon to apply, and its generation, raised by each new spec. A reconnecting
-- daemon whose applied generation is behind it (or that reports no spec hash) gets the
-- full DesiredState from its gateway right after the Welcome, before the replay. A
-- WebSocket session gets only a signed spec (`spec_signature`).
ALTER TABLE nodes ADD COLUMN spec jsonb CHECK (spec IS NULL OR jsonb_typeof(spec) = 'object');
ALTER TABLE nodes ADD COLUMN spec_generation bigint NOT NULL DEFAULT 0 CHECK (spec_generation >= 0);
ALTER TABLE nodes ADD COLUMN spec_signature text CHECK (length(spec_signature) <= 8192);

-- The entry point: a new spec for a node, its generation raised; returns the generation.
CREATE FUNCTION set_node_spec(p_node_id text, p_spec jsonb, p_signature text DEFAULT NULL)
RETURNS bigint LANGUAGE plpgsql AS $$
DECLARE
    generation bigint;
BEGIN
    UPDATE nodes SET spec = p_spec, spec_generation = spec_generation + 1, spec_signature = p_signature
     WHERE node_id = p_node_id
    RETURNING spec_generation INTO generation;
    IF generation IS NULL THEN
        RAISE EXCEPTION 'unknown node %', p_node_id USING ERRCODE = 'foreign_key_violation';
    END IF;
    RETURN generation;
END $$;
