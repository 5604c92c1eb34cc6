-- Trust boundaries: a SECURITY DEFINER function runs with its owner's rights, so it must
-- not find a caller's objects first. Each one's search_path is this schema, then pg_temp
-- last (unlisted, pg_temp would be searched first: a caller's temporary table or
-- function could stand in for ours).
DO $$
DECLARE
    fn regprocedure;
BEGIN
    FOR fn IN
        SELECT p.oid::regprocedure FROM pg_proc p
         WHERE p.prosecdef AND p.pronamespace = current_schema()::regnamespace
    LOOP
        EXECUTE format('ALTER FUNCTION %s SET search_path = %I, pg_temp', fn, current_schema());
    END LOOP;
END $$;
