//! Handler `stock` of the orders example: reserves stock for each accepted
//! order and calls a notification service, with the **transactional
//! outbox** (docs/outbox.md).
//!
//! One JSON order per message on `orders.accepted`, as the `orders`
//! handler publishes it: `{"order_id": "o-1", "sku": "sku-3", "qty": 2}`.
//! The message identity is its `Nats-Msg-Id` (the default identity), which
//! the `orders` handler's relay derived from that order: the same on every
//! send of it. The handler inserts one row into `reservations`, takes `qty`
//! from the SKU's `stock` row, and calls the endpoint `notify` with the
//! order (an HTTP `POST` after the COMMIT, with an `Idempotency-Key` derived
//! from this handler, the message identity and the call's place).
//!
//! The reservation's key is the order id and its insert is
//! `ON CONFLICT DO NOTHING`: an order already reserved (an accepted message
//! stored twice past the stream's duplicate window and past the receipts,
//! or a copy under another id) takes no stock and calls nothing again. An
//! unknown SKU, or a payload that is not such an order, is rejected
//! (dead-lettered): nothing is reserved.

use idem_guest::outbox::{self, OutboxError};
use idem_guest::{Handler, HandlerError, Message, params, tx};
use serde::{Deserialize, Serialize};

/// An accepted order, and the body of the `notify` call.
#[derive(Deserialize, Serialize)]
struct Accepted {
    order_id: String,
    sku: String,
    qty: i64,
}

/// The endpoint called for each reservation (named in `endpoints` in the
/// handler's config, which maps it to a URL).
const NOTIFY: &str = "notify";

/// Works on PostgreSQL and SQLite alike.
const RESERVE: &str = "INSERT INTO reservations (order_id, sku, qty) VALUES ($1, $2, $3) \
     ON CONFLICT (order_id) DO NOTHING";
const TAKE: &str = "UPDATE stock SET available = available - $1 WHERE sku = $2";

struct Stock;

impl Handler for Stock {
    fn handle(msg: Message) -> Result<(), HandlerError> {
        let order: Accepted = serde_json::from_slice(&msg.payload)
            .map_err(|e| HandlerError::reject(format!("not an accepted order: {e}")))?;
        if order.qty < 1 {
            return Err(HandlerError::reject(format!(
                "order {}: quantity {} is not positive",
                order.order_id, order.qty
            )));
        }
        let reserved = tx::execute(
            RESERVE,
            params![order.order_id.as_str(), order.sku.as_str(), order.qty],
        )?;
        if reserved == 0 {
            idem_guest::info!("order {} is reserved already", order.order_id);
            return Ok(());
        }
        let taken = tx::execute(TAKE, params![order.qty, order.sku.as_str()])?;
        if taken == 0 {
            // Rejecting rolls the reservation back too.
            return Err(HandlerError::reject(format!(
                "order {}: unknown SKU `{}`",
                order.order_id, order.sku
            )));
        }
        let body = serde_json::to_vec(&order).map_err(HandlerError::reject)?;
        outbox::call(
            NOTIFY,
            &body,
            &[("Content-Type", "application/json")],
            Some(&order.order_id),
        )
        .map_err(|e| refused(NOTIFY, e))
    }
}

/// A refused outbox call rejects the message: the same message would be
/// refused again (the config does not name the endpoint, say).
fn refused(target: &str, e: OutboxError) -> HandlerError {
    let (kind, detail) = match e {
        OutboxError::NotGranted(m) => ("not-granted", m),
        OutboxError::OverLimit(m) => ("over-limit", m),
        OutboxError::Invalid(m) => ("invalid", m),
    };
    HandlerError::reject(format!("outbox refused {target}: {kind}: {detail}"))
}

idem_guest::export_handler!(Stock);
