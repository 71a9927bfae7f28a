//! A component built for `idem:handler@0.1.0` (`wit/versions/0.1.0`), the
//! world before `outbox`, as handlers built before 0.2.0 are: it must load
//! and run unchanged on a host of 0.2.0. It does the credit example's
//! upsert: `{"account_id": i64, "amount": i64}` adds `amount` to the
//! account's balance.

#[allow(clippy::too_many_arguments)]
mod bindings {
    wit_bindgen::generate!({
        world: "handler",
        path: "../../../wit/versions/0.1.0",
    });
}

use bindings::idem::handler::transaction;
use bindings::idem::handler::types::{HandlerError, Message, Value};
use bindings::{Guest, export};

struct Credit;

fn number(payload: &str, name: &str) -> Option<i64> {
    let at = payload.find(&format!("\"{name}\""))?;
    let rest = payload.get(at + name.len() + 2..)?;
    let rest = rest.trim_start().strip_prefix(':')?.trim_start();
    let end = rest
        .find(|c: char| !(c.is_ascii_digit() || c == '-'))
        .unwrap_or(rest.len());
    rest.get(..end)?.parse().ok()
}

impl Guest for Credit {
    fn handle(msg: Message) -> Result<(), HandlerError> {
        let payload = String::from_utf8_lossy(&msg.payload);
        let (Some(account), Some(amount)) =
            (number(&payload, "account_id"), number(&payload, "amount"))
        else {
            return Err(HandlerError::Reject("bad payload".into()));
        };
        transaction::execute(
            "INSERT INTO accounts (account_id, balance) VALUES ($1, $2)
             ON CONFLICT (account_id) DO UPDATE SET balance = accounts.balance + excluded.balance",
            &[Value::Integer(account), Value::Integer(amount)],
        )
        .map_err(|e| HandlerError::Retry(e.message))?;
        Ok(())
    }
}

export!(Credit with_types_in bindings);
