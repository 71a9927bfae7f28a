-- Works on PostgreSQL and SQLite: idem applies the same files to either.
-- One notification per (recipient, actor, post, kind): the natural key.
CREATE TABLE IF NOT EXISTS notifications (
    recipient_id BIGINT NOT NULL,
    actor_id BIGINT NOT NULL,
    post_id BIGINT NOT NULL,
    kind TEXT NOT NULL,
    event_id TEXT NOT NULL, -- the event that created the notification
    CONSTRAINT notifications_once UNIQUE (recipient_id, actor_id, post_id, kind)
);
