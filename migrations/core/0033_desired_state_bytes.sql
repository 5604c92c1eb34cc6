-- A node's desired state as signed bytes (issue #44, "DesiredState as signed bytes"). A
-- spec's signature covers bytes; `jsonb` keeps neither their key order nor their spacing,
-- so the bytes are kept as given (`spec_body`) beside the JSON view (`spec`), and the
-- gateway relays them verbatim. A spec set as JSON (`set_node_spec`) has no bytes of its
-- own: the view's text goes out, as before.
ALTER TABLE nodes ADD COLUMN spec_body text CHECK (length(spec_body) <= 1048576);

-- The entry point for a signed spec: its exact bytes (a JSON object), their signature;
-- raises and returns the generation, as `set_node_spec` does (which now keeps no bytes).
CREATE FUNCTION set_node_spec_bytes(p_node_id text, p_body text, p_signature text DEFAULT NULL)
RETURNS bigint LANGUAGE plpgsql AS $$
DECLARE
    generation bigint;
BEGIN
    -- the JSON view first: the bytes it keeps beside it, once set_node_spec raised
    generation := set_node_spec(p_node_id, p_body::jsonb, p_signature);
    UPDATE nodes SET spec_body = p_body WHERE node_id = p_node_id;
    RETURN generation;
END $$;

CREATE OR REPLACE FUNCTION set_node_spec(p_node_id text, p_spec jsonb, p_signature text DEFAULT NULL)
RETURNS bigint LANGUAGE plpgsql AS $$
DECLARE
    generation bigint;
BEGIN
    UPDATE nodes SET spec = p_spec, spec_body = NULL, spec_generation = spec_generation + 1,
                     spec_signature = p_signature
     WHERE node_id = p_node_id
    RETURNING spec_generation INTO generation;
    IF generation IS NULL THEN
        RAISE EXCEPTION 'unknown node %', p_node_id USING ERRCODE = 'foreign_key_violation';
    END IF;
    RETURN generation;
END $$;

-- Admission reads the spec's bytes: as given, while they are still the spec (a writer of
-- `spec` alone, an older release's, leaves them behind), else the JSON view's text.
CREATE OR REPLACE FUNCTION gateway_admission(p_gateway text, p_node text, p_serial text,
    OUT now timestamptz, OUT node_generation integer, OUT node_role text, OUT spec text,
    OUT spec_generation bigint, OUT spec_signature text, OUT serial text, OUT node_id text,
    OUT identity_generation integer, OUT role text, OUT not_after timestamptz,
    OUT revoked boolean, OUT allowed_kinds text[])
LANGUAGE plpgsql STABLE SECURITY DEFINER AS $$
DECLARE
    gw text := gateway_as(p_gateway);
BEGIN
    now := compute_now();
    SELECT n.identity_generation, n.role,
           coalesce(CASE WHEN n.spec_body::jsonb = n.spec THEN n.spec_body END, n.spec::text),
           n.spec_generation, n.spec_signature
      INTO node_generation, node_role, spec, spec_generation, spec_signature
      FROM nodes n WHERE n.node_id = p_node;
    SELECT c.serial, c.node_id, c.identity_generation, c.role, c.not_after,
           c.revoked_at IS NOT NULL, c.allowed_kinds
      INTO serial, node_id, identity_generation, role, not_after, revoked, allowed_kinds
      FROM node_certs c WHERE c.serial = p_serial;
END $$;

DO $$ BEGIN
    EXECUTE format('ALTER FUNCTION gateway_admission(text, text, text) SET search_path = %I, pg_temp',
                   current_schema());
END $$;
