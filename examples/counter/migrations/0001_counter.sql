-- Works on PostgreSQL and SQLite (rerunnable: a second handler may apply it too).
-- A counter's value is the sum of its shard rows.
CREATE TABLE IF NOT EXISTS counter_shards (
    counter_key TEXT NOT NULL,
    shard BIGINT NOT NULL,  -- fnv1a64(op_id) % 8
    total BIGINT NOT NULL,
    PRIMARY KEY (counter_key, shard)
);

-- Every operation applied, once: the aggregate's own memory of what it did.
CREATE TABLE IF NOT EXISTS applied_ops (
    op_id TEXT PRIMARY KEY,
    counter_key TEXT NOT NULL,
    shard BIGINT NOT NULL,
    amount BIGINT NOT NULL
);
