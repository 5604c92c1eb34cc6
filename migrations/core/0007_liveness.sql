-- The liveness sweep's memory: when the last successful sweep ran, and until when
-- age-based transitions wait after an outage (of the database or the controller).
CREATE TABLE liveness_sweeps (
    only_row      boolean     PRIMARY KEY DEFAULT true CHECK (only_row),
    last_sweep_at timestamptz,
    grace_until   timestamptz
);
INSERT INTO liveness_sweeps (only_row) VALUES (true);
