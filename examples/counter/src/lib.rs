//! A sharded counter, made idempotent as an **aggregate that records the
//! operations it applied**.
//!
//! One JSON operation per message:
//! `{"event_id": "evt_1", "op_id": "op_1", "key": "page:home", "amount": 3}`
//! adds `amount` (negative subtracts) to counter `key`. `op_id` is the
//! operation's own identity, kept by the producer across retries even when it
//! publishes a new message (new `event_id`); without `op_id`, the message
//! identity (here `event_id`) is the operation id.
//!
//! Each counter is split over [`SHARDS`] rows of `counter_shards`, so
//! concurrent operations on one hot key mostly update different rows; the
//! shard of an operation is `fnv1a64(op_id) % SHARDS`, a pure function of the
//! op id, the same in every language and on every replay. A counter's value is
//! the sum of its shards.
//!
//! In one transaction the handler first records the op id in `applied_ops`
//! (`ON CONFLICT (op_id) DO NOTHING`); only when that inserted a row (the op is
//! new) does it add the amount to the shard. An operation applied before,
//! under any message, any consumer or any replay of the whole stream, adds
//! nothing. `applied_ops` also keeps each op's counter, shard and amount, so
//! every shard can be reconciled against the operations that built it.
//!
//! A payload that is not such an operation is rejected (dead-lettered).

use idem_guest::{Handler, HandlerError, Message, params, tx};
use serde::Deserialize;

/// How many rows each counter is spread over. Changing it later is safe:
/// totals are sums over every shard row, and `applied_ops` is keyed by op id.
pub const SHARDS: u64 = 8;

/// The counter operation.
#[derive(Deserialize)]
struct CounterOp {
    /// The operation's identity; defaults to the message identity.
    op_id: Option<String>,
    key: String,
    amount: i64,
}

/// 64-bit FNV-1a of `bytes`: offset basis 0xcbf29ce484222325, prime
/// 0x100000001b3, xor then multiply, wrapping.
pub fn fnv1a64(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325, |h, b| {
        (h ^ u64::from(*b)).wrapping_mul(0x0000_0100_0000_01b3)
    })
}

/// The shard an operation goes to.
pub fn shard_of(op_id: &str) -> i64 {
    // Below SHARDS, so the cast is exact.
    (fnv1a64(op_id.as_bytes()) % SHARDS) as i64
}

/// Records the op id; 1 row: new, 0 rows: applied before.
const RECORD: &str = "INSERT INTO applied_ops (op_id, counter_key, shard, amount) \
     VALUES ($1, $2, $3, $4) ON CONFLICT (op_id) DO NOTHING";

/// Adds to the shard, creating it on its first operation.
const ADD: &str = "INSERT INTO counter_shards (counter_key, shard, total) VALUES ($1, $2, $3) \
     ON CONFLICT (counter_key, shard) DO UPDATE SET total = counter_shards.total + excluded.total";

struct Counter;

impl Handler for Counter {
    fn handle(msg: Message) -> Result<(), HandlerError> {
        let op: CounterOp = serde_json::from_slice(&msg.payload)
            .map_err(|e| HandlerError::reject(format!("not a counter operation: {e}")))?;
        let op_id = op.op_id.unwrap_or_else(|| msg.identity.clone());
        if op_id.is_empty() || op.key.is_empty() {
            return Err(HandlerError::reject("op_id and key must not be empty"));
        }
        let shard = shard_of(&op_id);
        let recorded = tx::execute(
            RECORD,
            params![op_id.as_str(), op.key.as_str(), shard, op.amount],
        )?;
        if recorded == 0 {
            idem_guest::info!("operation {op_id} on {} was applied before", op.key);
            return Ok(());
        }
        tx::execute(ADD, params![op.key.as_str(), shard, op.amount])?;
        Ok(())
    }
}

idem_guest::export_handler!(Counter);
