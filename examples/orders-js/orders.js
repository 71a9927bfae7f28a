// Handler `orders` of examples/orders in JavaScript (see its README.md):
// takes an order in and publishes `orders.accepted` through the
// transactional outbox (docs/outbox.md).
//
// One JSON order per message on `orders.placed`:
// {"order_id": "o-1", "sku": "sku-3", "qty": 2}. The handler inserts it
// into `orders` and publishes `orders.accepted` with the same three fields
// (the Rust handler's bytes), keyed by the order id. The publish is stored
// in the message's transaction and sent by the host after the COMMIT. An
// order already taken changes nothing and publishes nothing again; a
// payload that is not such an order, or a publish the config does not
// grant, is rejected (dead-lettered).
import { I64, STRING, log, publish, readEvent, reject, statements } from '../js-common/idem.js';

const ORDER = [
  ['order_id', STRING],
  ['sku', STRING],
  ['qty', I64],
];

// Granted by `publish` in the handler's config.
const ACCEPTED = 'orders.accepted';

// Works on PostgreSQL and SQLite alike.
const TAKE =
  'INSERT INTO orders (order_id, sku, qty, placed_ms) ' +
  'VALUES ($1, $2, $3, $4) ON CONFLICT (order_id) DO NOTHING';

export function handle(msg) {
  const order = readEvent(msg, 'not an order', ORDER);
  if (order.order_id === '' || order.sku === '' || order.qty < 1n) {
    throw reject(`order \`${order.order_id}\`: needs an order id, a SKU and a quantity of at least 1`);
  }
  const taken = statements(msg).execute(TAKE, [order.order_id, order.sku, order.qty, msg.publishedMs]);
  if (taken === 0) {
    log('info', `order ${order.order_id} was taken before`);
    return;
  }
  // As serde_json writes the Rust handler's struct: fields in order, no spaces.
  const payload = `{"order_id":${JSON.stringify(order.order_id)},"sku":${JSON.stringify(order.sku)},"qty":${order.qty}}`;
  try {
    publish(ACCEPTED, payload, [['Content-Type', 'application/json']], order.order_id);
  } catch (e) {
    if (e.payload && e.payload.tag) {
      throw reject(`outbox refused ${ACCEPTED}: ${e.payload.tag}: ${e.payload.val}`);
    }
    throw e;
  }
}
