-- Credits from heartbeats (issue "session rules"): the free credits per lane a session's
-- daemon last reported (a flush entry's optional `credits`), written by the liveness
-- controller under the flush's fence; NULL until reported (dispatch then assumes
-- BCW_REPLAY_CREDITS per lane). A new session (the Hello transaction) starts unknown.
ALTER TABLE node_sessions ADD COLUMN lane_credits jsonb
    CHECK (lane_credits IS NULL OR jsonb_typeof(lane_credits) = 'object');
