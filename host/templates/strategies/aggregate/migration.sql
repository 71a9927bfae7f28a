-- Works on PostgreSQL and SQLite: idem applies the same files to either.
-- Every operation applied, once: the aggregate's own memory of what it did.
CREATE TABLE IF NOT EXISTS applied_ops (
    op_id TEXT PRIMARY KEY,
    counter_key TEXT NOT NULL,
    amount BIGINT NOT NULL
);

-- A counter's value: the sum of its applied operations.
CREATE TABLE IF NOT EXISTS counters (
    counter_key TEXT PRIMARY KEY,
    total BIGINT NOT NULL
);
