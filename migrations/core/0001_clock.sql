-- compute_now(): the one clock of every time comparison in SQL.
-- Production keeps the offset at zero; tests and the simulator move it to travel through
-- grace periods without sleeping.

CREATE TABLE clock_offset (
    only_row  boolean  PRIMARY KEY DEFAULT true CHECK (only_row),
    offset_by interval NOT NULL DEFAULT interval '0'
);
INSERT INTO clock_offset (only_row, offset_by) VALUES (true, interval '0');

CREATE FUNCTION compute_now() RETURNS timestamptz
    LANGUAGE sql STABLE PARALLEL SAFE
    AS $$ SELECT now() + (SELECT offset_by FROM clock_offset) $$;

-- Sets the offset (not adds to it) and returns the new compute_now().
CREATE FUNCTION set_compute_now_offset(new_offset interval) RETURNS timestamptz
    LANGUAGE sql VOLATILE
    AS $$
        UPDATE clock_offset SET offset_by = new_offset;
        SELECT now() + new_offset;
    $$;
