-- Works on PostgreSQL and SQLite (rerunnable: a second handler may apply it too).
-- One notification per (recipient, actor, post, kind): the natural key.
CREATE TABLE IF NOT EXISTS notifications (
    recipient_id BIGINT NOT NULL,
    actor_id BIGINT NOT NULL,
    post_id BIGINT NOT NULL,
    kind TEXT NOT NULL,
    event_id TEXT NOT NULL,        -- the event that created the notification
    created_at_ms BIGINT NOT NULL, -- that event's publish time, ms since the Unix epoch
    CONSTRAINT notifications_once UNIQUE (recipient_id, actor_id, post_id, kind)
);
