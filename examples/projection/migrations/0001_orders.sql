-- Works on PostgreSQL and SQLite (rerunnable: a second handler may apply it too).
-- One row per order: its state at the highest version applied.
CREATE TABLE IF NOT EXISTS orders (
    order_id BIGINT PRIMARY KEY,
    version BIGINT NOT NULL,
    status TEXT NOT NULL,
    total_cents BIGINT NOT NULL
);
