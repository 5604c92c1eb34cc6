-- What the liveness controller sees of each gateway on the bus (DESIGN §9): when it last
-- applied one of the gateway's flushes (its own clock, written in the flush's
-- transaction), since when it has said the gateway is blind, and the fleet breaker.
-- A gateway publishes a flush every flush period even with no sessions: an empty flush
-- is its heartbeat on the bus.
CREATE TABLE liveness_gateways (
    gateway_id          text        PRIMARY KEY,
    known_since         timestamptz NOT NULL DEFAULT compute_now(),
    last_flush_at       timestamptz,
    blind_since         timestamptz,
    breaker_opened_at   timestamptz,
    breaker_released_at timestamptz,
    breaker_released_by text
);
