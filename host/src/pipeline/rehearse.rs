//! One message through a handler inside a transaction its caller owns and
//! decides on, recorded statement by statement: what `idem invoke` and
//! `idem test` run (ARCHITECTURE.md, "Rehearsals"). The steps are the
//! protocol's, as a batch runs each of its messages:
//!
//! ```text
//! (caller) BEGIN                                 PreparedHandler::begin_batch
//! INSERT receipt ON CONFLICT DO NOTHING (as the host's user)
//!   0 rows → the guest does not run              Rehearsed::Duplicate
//! SAVEPOINT (with the guest's first statement)
//! SET LOCAL ROLE idem_handler_<name>_<grants> (PostgreSQL, when set up)
//! run the guest's handle(msg), every statement recorded
//!   ok     → RELEASE (with the next statement)   Rehearsed::Ran(Ok)
//!   failed → ROLLBACK TO SAVEPOINT, receipt deleted  Rehearsed::Ran(Err)
//! (caller) COMMIT or ROLLBACK
//! ```
//!
//! Several messages can run this way in one transaction, one after another,
//! each seeing what the ones before it did.

use super::step::{PreparedHandler, StepFailed, rolled_back};
use crate::runtime::rehearsal::Rehearsal;
use crate::runtime::{GuestMessage, HandlerFailure};
use crate::store::{Receipt, Rows, Tx};
use std::sync::Arc;

/// How a rehearsed message ended; the transaction stays open either way.
#[derive(Debug)]
pub enum Rehearsed {
    /// A receipt for its message id existed: the guest did not run (a
    /// delivery would be acked as a duplicate).
    Duplicate,
    /// The guest ran. `Ok`: its effects and receipt stay in the
    /// transaction, with this many outbox rows. `Err`: everything it did
    /// and its receipt were taken back.
    Ran(Result<usize, HandlerFailure>),
}

impl PreparedHandler {
    /// Runs `msg` in `tx` as the module docs show, recording the guest's
    /// call in `rehearsal`, and hands `tx` back open for the caller to
    /// commit or roll back. A statement that lost a lock conflict counts as
    /// a `retry`.
    ///
    /// # Errors
    /// A database step failed, or the guest's effects could not be rolled
    /// back to its savepoint ([`StepFailed`]): `tx` was rolled back whole.
    pub async fn rehearse(
        &self,
        mut tx: Tx,
        msg: GuestMessage,
        rehearsal: Arc<Rehearsal>,
    ) -> Result<(Rehearsed, Tx), StepFailed> {
        let component = self.slot().current();
        let message_id = msg.message_id.clone();
        let receipt = Receipt {
            consumer: self.name(),
            message_id: &message_id,
            stream_sequence: msg.stream_sequence,
            module_digest: component.digest(),
            published_ms: msg.published_ms,
        };
        if let Err(error) = tx.host_turn().await {
            return Err(rolled_back(tx, "SET LOCAL ROLE NONE", error).await);
        }
        match tx.insert_receipt(&receipt).await {
            Ok(true) => {}
            Ok(false) => return Ok((Rehearsed::Duplicate, tx)),
            Err(error) => return Err(rolled_back(tx, "receipt insert", error).await),
        }
        if let Err(error) = tx.begin_message(self.statement_timeout()).await {
            return Err(rolled_back(tx, "SAVEPOINT", error).await);
        }
        if let Some(role) = self.role()
            && let Err(error) = tx.enter_handler_role(role).await
        {
            return Err(rolled_back(tx, "SET LOCAL ROLE", error).await);
        }
        let (result, mut back) = self.call_guest(&component, tx, msg, Some(rehearsal)).await;
        let result = if back.take_conflict() {
            Err(HandlerFailure::Retry(
                "a statement lost a lock conflict with another transaction".into(),
            ))
        } else {
            result
        };
        let mut tx = self.end_message(back, result.is_ok()).await?;
        if result.is_err()
            && let Err(error) = tx.forget_receipts(self.name(), &[&message_id]).await
        {
            return Err(rolled_back(tx, "receipt delete", error).await);
        }
        Ok((Rehearsed::Ran(result), tx))
    }

    /// Runs `sql` (no parameters) in `tx` as one of the guest's statements
    /// is run: judged by the handler's SQL guard, as its role on
    /// PostgreSQL, at most `max_rows` rows and `max_bytes` bytes of values,
    /// inside a savepoint that is always rolled back, so a statement that
    /// writes changes nothing. What `idem test` reads its expected rows
    /// with. `Ok((Err(reason), tx))`: the guard refused it or it failed.
    ///
    /// # Errors
    /// The savepoint could not be rolled back ([`StepFailed`]): `tx` was
    /// rolled back whole.
    pub async fn read_rows(
        &self,
        mut tx: Tx,
        sql: &str,
        max_rows: usize,
        max_bytes: usize,
    ) -> Result<(Result<Rows, String>, Tx), StepFailed> {
        if let Err(error) = tx.begin_message(self.statement_timeout()).await {
            return Err(rolled_back(tx, "SAVEPOINT", error).await);
        }
        let read = match self.guard().check(&mut tx, sql, &[]).await {
            Err(e) => Err(e.message),
            Ok(checked) => match self.role() {
                Some(role) => match tx.enter_handler_role(role).await {
                    Err(e) => Err(e.to_string()),
                    Ok(()) => tx
                        .query(&checked, &[], max_rows, max_bytes)
                        .await
                        .map_err(|e| e.to_string()),
                },
                None => tx
                    .query(&checked, &[], max_rows, max_bytes)
                    .await
                    .map_err(|e| e.to_string()),
            },
        };
        let tx = self.end_message(tx, false).await?;
        Ok((read, tx))
    }
}
