//! A second version of the credit handler, for deploy tests: it credits the
//! account as `examples/credit` does and also writes
//! `credit_log (event_id, version)` with its version (`"v2"`), so a test can tell
//! which version applied each event. The same payloads are rejected.

use idem_guest::{Handler, HandlerError, Message, params, tx};
use serde::Deserialize;

/// What this build writes into `credit_log.version`.
const VERSION: &str = "v2";

#[derive(Deserialize)]
struct CreditEvent {
    event_id: String,
    account_id: i64,
    amount: i64,
}

const CREDIT: &str = "INSERT INTO accounts (account_id, balance) VALUES ($1, $2) \
     ON CONFLICT (account_id) DO UPDATE SET balance = accounts.balance + excluded.balance";

const LOG: &str = "INSERT INTO credit_log (event_id, version) VALUES ($1, $2)";

struct CreditLog;

impl Handler for CreditLog {
    fn handle(msg: Message) -> Result<(), HandlerError> {
        let event: CreditEvent = serde_json::from_slice(&msg.payload)
            .map_err(|e| HandlerError::reject(format!("not a credit event: {e}")))?;
        tx::execute(CREDIT, params![event.account_id, event.amount])?;
        tx::execute(LOG, params![event.event_id, VERSION])?;
        Ok(())
    }
}

idem_guest::export_handler!(CreditLog);
