-- Whether a certificate serial has been revoked (admission refuses it). An unknown serial
-- is not "revoked": admission refuses it for being unknown.
CREATE FUNCTION is_revoked(p_serial text) RETURNS boolean LANGUAGE sql STABLE AS $$
    SELECT coalesce((SELECT revoked_at IS NOT NULL FROM node_certs WHERE serial = p_serial), false)
$$;
