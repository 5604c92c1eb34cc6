-- The Hellos a node may open in a minute (migration 0054): 240, where 120 held only if a
-- daemon's first redial after a Welcome draws from 0 to 2 s. The seed's "attempt n waits
-- between 0 and min(60 s, 1 s x 2^n); a Welcome resets the count" may as well be read
-- from n = 0: a link that drops each session at once then redials every 0.5 s on average,
-- 120 a minute, and met the old bound in about half of its minutes. 240 such draws sum to
-- under a minute with a chance below 10^-30. docs/contract.md, "Hellos per node and
-- minute".
CREATE OR REPLACE FUNCTION hellos_per_node_minute() RETURNS integer
LANGUAGE sql IMMUTABLE AS $$ SELECT 240 $$;
