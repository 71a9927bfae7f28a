//! The last stream sequence applied per ordering key, for a handler with
//! `refuse_out_of_order` (ARCHITECTURE.md, "Partitions"): recorded in the
//! message's own transaction, after its receipt, so a message older than
//! one already applied for its key is refused instead of applied.

use super::backend::Transaction as _;
use super::receipts::to_i64;
use super::{StoreError, Tx, dispatch};

impl Tx {
    /// Records `seq` as `consumer`'s last applied stream sequence for
    /// ordering key `key`, unless one at least as high is recorded: `true`
    /// recorded, `false` the message comes out of order. On PostgreSQL it
    /// waits for another transaction recording the same key and then
    /// compares with what that one committed.
    ///
    /// # Errors
    /// The stream sequence does not fit a BIGINT, or the statement fails.
    pub async fn advance_key_sequence(
        &mut self,
        consumer: &str,
        key: &str,
        seq: u64,
    ) -> Result<bool, StoreError> {
        let seq = to_i64(seq)?;
        Ok(dispatch!(&mut self.0, t => t.advance_key_sequence(consumer, key, seq).await)?)
    }
}
