//! The latest delivery state of each parcel, made idempotent by an **upsert**
//! that converges: whatever the order the scans arrive in, and however often,
//! the row ends at the same state.
//!
//! One JSON event per message:
//! `{"event_id": "evt_1", "parcel_id": "PCL-1", "state": "in_transit", "at": 1700000002000}`
//! (`at`: when the state was observed, in milliseconds since the Unix epoch).
//! The handler keeps one row per parcel in `parcels`.
//!
//! "Latest" is a total order on `(at, state)`: the later observation wins,
//! and two observations at the same millisecond are ordered by the state
//! text, so the winner never depends on arrival order. The upsert overwrites
//! the row only with a greater `(at, state)`; anything else (a duplicate, a
//! replay, an older scan arriving late) changes nothing.
//!
//! A payload that is not such an event is rejected (dead-lettered).

use idem_guest::{Handler, HandlerError, Message, params, tx};
use serde::Deserialize;

/// The parcel-scan event. `event_id` is the message identity (the host reads
/// it with `identity = "json:/event_id"`); the handler does not need it.
#[derive(Deserialize)]
struct ParcelEvent {
    parcel_id: String,
    state: String,
    /// Observation time, ms since the Unix epoch.
    at: i64,
}

/// Works on PostgreSQL and SQLite alike. The tie-break compares text with the
/// column's collation (byte order on SQLite and on a `C` collation).
const UPSERT: &str = "INSERT INTO parcels (parcel_id, state, at_ms) VALUES ($1, $2, $3) \
     ON CONFLICT (parcel_id) DO UPDATE SET state = excluded.state, at_ms = excluded.at_ms \
     WHERE excluded.at_ms > parcels.at_ms \
     OR (excluded.at_ms = parcels.at_ms AND excluded.state > parcels.state)";

struct Parcel;

impl Handler for Parcel {
    fn handle(msg: Message) -> Result<(), HandlerError> {
        let event: ParcelEvent = serde_json::from_slice(&msg.payload)
            .map_err(|e| HandlerError::reject(format!("not a parcel event: {e}")))?;
        let changed = tx::execute(
            UPSERT,
            params![event.parcel_id.as_str(), event.state.as_str(), event.at],
        )?;
        if changed == 0 {
            idem_guest::debug!(
                "parcel {}: {} at {} is not newer than its current state",
                event.parcel_id,
                event.state,
                event.at
            );
        }
        Ok(())
    }
}

idem_guest::export_handler!(Parcel);
