-- Works on PostgreSQL and SQLite (rerunnable: a second handler may apply it too).
-- What is on the shelf, per SKU. `available` may go below zero: units
-- promised to orders that wait for a delivery (backorders).
CREATE TABLE IF NOT EXISTS stock (
    sku TEXT PRIMARY KEY,
    available BIGINT NOT NULL
);

-- One reservation per order, whatever number of times its accepted message
-- arrives: the order id is the natural key.
CREATE TABLE IF NOT EXISTS reservations (
    order_id TEXT PRIMARY KEY,
    sku TEXT NOT NULL,
    qty BIGINT NOT NULL
);

-- The shop's catalogue: eight SKUs with 10,000 units each.
INSERT INTO stock (sku, available) VALUES
    ('sku-1', 10000), ('sku-2', 10000), ('sku-3', 10000), ('sku-4', 10000),
    ('sku-5', 10000), ('sku-6', 10000), ('sku-7', 10000), ('sku-8', 10000)
ON CONFLICT (sku) DO NOTHING;
