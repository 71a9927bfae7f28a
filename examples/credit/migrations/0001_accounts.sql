-- Works on PostgreSQL and SQLite.
CREATE TABLE IF NOT EXISTS accounts (
    account_id BIGINT PRIMARY KEY,
    balance BIGINT NOT NULL
);
