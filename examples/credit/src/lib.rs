//! The account-credit handler: one JSON event per message,
//! `{"event_id": "evt_8142", "account_id": 73, "amount": 500}`, adds `amount`
//! to the account's balance, creating the account on its first credit.
//!
//! idem runs it inside the transaction that holds the message's receipt, so a
//! redelivered or re-published event (same `event_id`) never credits twice.
//! A payload that is not such an event is rejected (dead-lettered).

use idem_guest::{Handler, HandlerError, Message, params, tx};
use serde::Deserialize;

/// The credit event. `event_id` is the message identity (the host reads it
/// with `identity = "json:/event_id"`); the handler does not need it.
#[derive(Deserialize)]
struct CreditEvent {
    account_id: i64,
    amount: i64,
}

/// Upsert that works on PostgreSQL and SQLite alike.
const CREDIT: &str = "INSERT INTO accounts (account_id, balance) VALUES ($1, $2) \
     ON CONFLICT (account_id) DO UPDATE SET balance = accounts.balance + excluded.balance";

struct Credit;

impl Handler for Credit {
    fn handle(msg: Message) -> Result<(), HandlerError> {
        let event: CreditEvent = serde_json::from_slice(&msg.payload)
            .map_err(|e| HandlerError::reject(format!("not a credit event: {e}")))?;
        tx::execute(CREDIT, params![event.account_id, event.amount])?;
        Ok(())
    }
}

idem_guest::export_handler!(Credit);
