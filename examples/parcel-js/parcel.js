// The latest delivery state of each parcel, made idempotent by an upsert that
// converges: the handler of examples/parcel in JavaScript (see its README.md
// for the strategy).
//
// One JSON event per message:
// {"event_id": "evt_1", "parcel_id": "PCL-1", "state": "in_transit", "at": 1700000002000}
// (`at`: when the state was observed, in milliseconds since the Unix epoch).
// The handler keeps one row per parcel in `parcels`. "Latest" is a total
// order on (at, state): the upsert overwrites the row only with a greater
// (at, state), so whatever the order and number of deliveries the row ends
// at the same state.
//
// A payload that is not such an event is rejected (dead-lettered).
import { I64, STRING, log, readEvent, statements } from '../js-common/idem.js';

// The parcel-scan event. `event_id` is the message identity (the host reads
// it with `identity = "json:/event_id"`); the handler does not need it.
const PARCEL_EVENT = [
  ['parcel_id', STRING],
  ['state', STRING],
  ['at', I64], // observation time, ms since the Unix epoch
];

// Works on PostgreSQL and SQLite alike. The tie-break compares text with the
// column's collation (byte order on SQLite and on a `C` collation).
const UPSERT =
  'INSERT INTO parcels (parcel_id, state, at_ms) VALUES ($1, $2, $3) ' +
  'ON CONFLICT (parcel_id) DO UPDATE SET state = excluded.state, at_ms = excluded.at_ms ' +
  'WHERE excluded.at_ms > parcels.at_ms ' +
  'OR (excluded.at_ms = parcels.at_ms AND excluded.state > parcels.state)';

export function handle(msg) {
  const event = readEvent(msg, 'not a parcel event', PARCEL_EVENT);
  const changed = statements(msg).execute(UPSERT, [event.parcel_id, event.state, event.at]);
  if (changed === 0) {
    log('debug', `parcel ${event.parcel_id}: ${event.state} at ${event.at} is not newer than its current state`);
  }
}
