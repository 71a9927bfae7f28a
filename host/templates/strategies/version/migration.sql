-- Works on PostgreSQL and SQLite: idem applies the same files to either.
-- One row per order: its state at the highest version applied.
CREATE TABLE IF NOT EXISTS orders (
    order_id BIGINT PRIMARY KEY,
    version BIGINT NOT NULL CHECK (version > 0),
    status TEXT NOT NULL,
    total_cents BIGINT NOT NULL
);
