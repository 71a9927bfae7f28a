-- Works on PostgreSQL and SQLite: idem applies the same files to either.
-- One row per parcel: its latest state by (at_ms, state); the tie-break compares
-- text with the column's collation (byte order on SQLite and with a "C" collation).
CREATE TABLE IF NOT EXISTS parcels (
    parcel_id TEXT PRIMARY KEY,
    state TEXT NOT NULL,
    at_ms BIGINT NOT NULL -- when that state was observed, ms since the Unix epoch
);
