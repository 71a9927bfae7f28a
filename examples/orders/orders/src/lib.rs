//! Handler `orders` of the orders example: takes an order in and says so,
//! with the **transactional outbox** (docs/outbox.md).
//!
//! One JSON order per message on `orders.placed`:
//! `{"order_id": "o-1", "sku": "sku-3", "qty": 2}`. The handler inserts it
//! into `orders` and publishes `orders.accepted` with the same three fields,
//! keyed by the order id. The publish is stored in the message's
//! transaction and sent by the host after the COMMIT, with a `Nats-Msg-Id`
//! derived from this handler, the message identity and the call's place:
//! the order row and the accepted message exist together or not at all,
//! and a send repeated after a crash is dropped by the target stream as a
//! copy. The `stock` handler consumes `orders.accepted`.
//!
//! The insert is `ON CONFLICT DO NOTHING`: an order already taken (a copy
//! that arrives after its receipt was pruned) changes nothing and publishes
//! nothing again. A payload that is not such an order is rejected
//! (dead-lettered).

use idem_guest::outbox::{self, OutboxError};
use idem_guest::{Handler, HandlerError, Message, params, tx};
use serde::{Deserialize, Serialize};

/// A placed order, and the payload of `orders.accepted`. `order_id` is
/// also the message identity (`identity = "json:/order_id"`).
#[derive(Deserialize, Serialize)]
struct Order {
    order_id: String,
    sku: String,
    qty: i64,
}

/// The subject an accepted order is published to (granted by `publish` in
/// the handler's config).
const ACCEPTED: &str = "orders.accepted";

/// Works on PostgreSQL and SQLite alike.
const TAKE: &str = "INSERT INTO orders (order_id, sku, qty, placed_ms) \
     VALUES ($1, $2, $3, $4) ON CONFLICT (order_id) DO NOTHING";

struct Orders;

impl Handler for Orders {
    fn handle(msg: Message) -> Result<(), HandlerError> {
        let order: Order = serde_json::from_slice(&msg.payload)
            .map_err(|e| HandlerError::reject(format!("not an order: {e}")))?;
        if order.order_id.is_empty() || order.sku.is_empty() || order.qty < 1 {
            return Err(HandlerError::reject(format!(
                "order `{}`: needs an order id, a SKU and a quantity of at least 1",
                order.order_id
            )));
        }
        let taken = tx::execute(
            TAKE,
            params![
                order.order_id.as_str(),
                order.sku.as_str(),
                order.qty,
                msg.published_ms
            ],
        )?;
        if taken == 0 {
            idem_guest::info!("order {} was taken before", order.order_id);
            return Ok(());
        }
        let payload = serde_json::to_vec(&order).map_err(HandlerError::reject)?;
        outbox::publish(
            ACCEPTED,
            &payload,
            &[("Content-Type", "application/json")],
            Some(&order.order_id),
        )
        .map_err(|e| refused(ACCEPTED, e))
    }
}

/// A refused outbox call rejects the message: the same message would be
/// refused again (the config does not grant the subject, say).
fn refused(target: &str, e: OutboxError) -> HandlerError {
    let (kind, detail) = match e {
        OutboxError::NotGranted(m) => ("not-granted", m),
        OutboxError::OverLimit(m) => ("over-limit", m),
        OutboxError::Invalid(m) => ("invalid", m),
    };
    HandlerError::reject(format!("outbox refused {target}: {kind}: {detail}"))
}

idem_guest::export_handler!(Orders);
