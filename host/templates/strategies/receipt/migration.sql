-- Works on PostgreSQL and SQLite: idem applies the same files to either.
CREATE TABLE IF NOT EXISTS accounts (
    account TEXT PRIMARY KEY,
    balance BIGINT NOT NULL
);
