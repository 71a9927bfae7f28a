//! Test guest: the credit example (`examples/credit`) but for one kind of
//! message: a credit of 100 or more also gets a bonus of 1. A shadow
//! candidate that does what the live credit handler does on every message
//! but those (tests/tests/shadow.rs).

use idem_guest::{Handler, HandlerError, Message, params, tx};
use serde::Deserialize;

#[derive(Deserialize)]
struct CreditEvent {
    account_id: i64,
    amount: i64,
}

const CREDIT: &str = "INSERT INTO accounts (account_id, balance) VALUES ($1, $2) \
     ON CONFLICT (account_id) DO UPDATE SET balance = accounts.balance + excluded.balance";

/// Credits at least this large get [`BONUS`] on top.
const BIG: i64 = 100;
const BONUS: i64 = 1;

struct CreditBonus;

impl Handler for CreditBonus {
    fn handle(msg: Message) -> Result<(), HandlerError> {
        let event: CreditEvent = serde_json::from_slice(&msg.payload)
            .map_err(|e| HandlerError::reject(format!("not a credit event: {e}")))?;
        let amount = if event.amount >= BIG {
            event.amount + BONUS
        } else {
            event.amount
        };
        tx::execute(CREDIT, params![event.account_id, amount])?;
        Ok(())
    }
}

idem_guest::export_handler!(CreditBonus);
