//! An order projection, made idempotent by a **state-based update**: an event
//! is applied only when it advances the order's version.
//!
//! One JSON event per message, carrying the order's whole state at a version:
//! `{"event_id": "evt_1", "order_id": 1001, "version": 3, "status": "shipped", "total_cents": 4599}`.
//! The handler keeps one row per order in `orders`.
//!
//! The upsert's `DO UPDATE ... WHERE orders.version < excluded.version` makes
//! the version the judge: a redelivered, replayed or late (out of order) event
//! carries a version the row already has or has passed, so it changes
//! nothing. Events may arrive in any order (JetStream redelivers out of order,
//! and `concurrency` runs several messages at once): the row always ends at
//! the highest version seen. Versions start at 1; two different events with
//! the same version are a producer bug, and the first one applied wins.
//!
//! A payload that is not such an event is rejected (dead-lettered).

use idem_guest::{Handler, HandlerError, Message, params, tx};
use serde::Deserialize;

/// The order-state event. `event_id` is the message identity (the host reads
/// it with `identity = "json:/event_id"`); the handler does not need it.
#[derive(Deserialize)]
struct OrderEvent {
    order_id: i64,
    version: i64,
    status: String,
    total_cents: i64,
}

/// Works on PostgreSQL and SQLite alike: insert the first state seen, else
/// overwrite only with a newer version.
const APPLY: &str = "INSERT INTO orders (order_id, version, status, total_cents) \
     VALUES ($1, $2, $3, $4) \
     ON CONFLICT (order_id) DO UPDATE SET \
     version = excluded.version, status = excluded.status, total_cents = excluded.total_cents \
     WHERE orders.version < excluded.version";

struct Projection;

impl Handler for Projection {
    fn handle(msg: Message) -> Result<(), HandlerError> {
        let event: OrderEvent = serde_json::from_slice(&msg.payload)
            .map_err(|e| HandlerError::reject(format!("not an order event: {e}")))?;
        if event.version < 1 {
            return Err(HandlerError::reject(format!(
                "order {} version {} is not positive",
                event.order_id, event.version
            )));
        }
        let applied = tx::execute(
            APPLY,
            params![
                event.order_id,
                event.version,
                event.status.as_str(),
                event.total_cents
            ],
        )?;
        if applied == 0 {
            idem_guest::info!(
                "order {} version {} ignored: the projection is at that version or newer",
                event.order_id,
                event.version
            );
        }
        Ok(())
    }
}

idem_guest::export_handler!(Projection);
