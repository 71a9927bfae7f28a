-- Works on PostgreSQL and SQLite (rerunnable: a second handler may apply it too).
-- One row per parcel: its latest state by (at_ms, state).
CREATE TABLE IF NOT EXISTS parcels (
    parcel_id TEXT PRIMARY KEY,
    state TEXT NOT NULL,
    at_ms BIGINT NOT NULL -- when that state was observed, ms since the Unix epoch
);
