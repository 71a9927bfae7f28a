// An order projection, made idempotent by a state-based update: the handler
// of examples/projection in JavaScript (see its README.md for the strategy).
//
// One JSON event per message, carrying the order's whole state at a version:
// {"event_id": "evt_1", "order_id": 1001, "version": 3, "status": "shipped", "total_cents": 4599}.
// The handler keeps one row per order in `orders`; the upsert's
// `DO UPDATE ... WHERE orders.version < excluded.version` makes the version
// the judge, so a redelivered, replayed or late event changes nothing and
// the row ends at the highest version seen, whatever the arrival order.
//
// A version below 1, or a payload that is not such an event, is rejected
// (dead-lettered).
import { I64, STRING, log, readEvent, reject, statements } from '../js-common/idem.js';

// The order-state event. `event_id` is the message identity (the host reads
// it with `identity = "json:/event_id"`); the handler does not need it.
const ORDER_EVENT = [
  ['order_id', I64],
  ['version', I64],
  ['status', STRING],
  ['total_cents', I64],
];

// Works on PostgreSQL and SQLite alike: insert the first state seen, else
// overwrite only with a newer version.
const APPLY =
  'INSERT INTO orders (order_id, version, status, total_cents) ' +
  'VALUES ($1, $2, $3, $4) ' +
  'ON CONFLICT (order_id) DO UPDATE SET ' +
  'version = excluded.version, status = excluded.status, total_cents = excluded.total_cents ' +
  'WHERE orders.version < excluded.version';

export function handle(msg) {
  const event = readEvent(msg, 'not an order event', ORDER_EVENT);
  if (event.version < 1n) {
    throw reject(`order ${event.order_id} version ${event.version} is not positive`);
  }
  const applied = statements(msg).execute(APPLY, [
    event.order_id,
    event.version,
    event.status,
    event.total_cents,
  ]);
  if (applied === 0) {
    log('info', `order ${event.order_id} version ${event.version} ignored: the projection is at that version or newer`);
  }
}
