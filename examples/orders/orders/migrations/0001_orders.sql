-- Works on PostgreSQL and SQLite (rerunnable: a second handler may apply it too).
-- One row per accepted order: the order id is the message identity too.
CREATE TABLE IF NOT EXISTS orders (
    order_id TEXT PRIMARY KEY,
    sku TEXT NOT NULL,
    qty BIGINT NOT NULL,
    placed_ms BIGINT NOT NULL  -- the placing message's publish time (ms since the epoch)
);
