// A sharded counter, made idempotent as an aggregate that records the
// operations it applied: the handler of examples/counter in JavaScript (see
// its README.md for the strategy).
//
// One JSON operation per message:
// {"event_id": "evt_1", "op_id": "op_1", "key": "page:home", "amount": 3}
// adds `amount` (negative subtracts) to counter `key`. `op_id` is the
// operation's own identity, kept by the producer across retries; without
// it, the message identity (here `event_id`) is the operation id.
//
// Each counter is split over SHARDS rows of `counter_shards`; the shard of an
// operation is fnv1a64(op_id) % SHARDS, the same in every language. In one
// transaction the handler first records the op id in `applied_ops` (ON
// CONFLICT (op_id) DO NOTHING), and only when that inserted a row adds the
// amount to the shard: an operation applied before adds nothing.
//
// A payload that is not such an operation is rejected (dead-lettered).
import { I64, OPTIONAL_STRING, STRING, log, readEvent, reject, statements, utf8Encode } from '../js-common/idem.js';

// How many rows each counter is spread over.
const SHARDS = 8n;

// The counter operation; `op_id` defaults to the message identity.
const COUNTER_OP = [
  ['op_id', OPTIONAL_STRING],
  ['key', STRING],
  ['amount', I64],
];

const FNV_OFFSET_BASIS = 0xcbf29ce484222325n;
const FNV_PRIME = 0x100000001b3n;

// 64-bit FNV-1a of `bytes`: xor then multiply, wrapping at 2^64.
function fnv1a64(bytes) {
  let h = FNV_OFFSET_BASIS;
  for (const b of bytes) h = BigInt.asUintN(64, (h ^ BigInt(b)) * FNV_PRIME);
  return h;
}

// The shard an operation goes to.
const shardOf = (opId) => fnv1a64(utf8Encode(opId)) % SHARDS;

// The reference vectors, checked when the module is initialised (at build
// time, in the engine that runs it): a wrong hash fails the build.
for (const [text, hash] of [['', 0xcbf29ce484222325n], ['a', 0xaf63dc4c8601ec8cn], ['foobar', 0x85944171f73967e8n]]) {
  if (fnv1a64(utf8Encode(text)) !== hash) throw new Error(`fnv1a64(${JSON.stringify(text)}) is wrong`);
}

// Records the op id; 1 row: new, 0 rows: applied before.
const RECORD =
  'INSERT INTO applied_ops (op_id, counter_key, shard, amount) ' +
  'VALUES ($1, $2, $3, $4) ON CONFLICT (op_id) DO NOTHING';

// Adds to the shard, creating it on its first operation.
const ADD =
  'INSERT INTO counter_shards (counter_key, shard, total) VALUES ($1, $2, $3) ' +
  'ON CONFLICT (counter_key, shard) DO UPDATE SET total = counter_shards.total + excluded.total';

export function handle(msg) {
  const op = readEvent(msg, 'not a counter operation', COUNTER_OP);
  const opId = op.op_id === null ? msg.identity : op.op_id;
  if (opId === '' || op.key === '') {
    throw reject('op_id and key must not be empty');
  }
  const shard = shardOf(opId);
  const tx = statements(msg);
  const recorded = tx.execute(RECORD, [opId, op.key, shard, op.amount]);
  if (recorded === 0) {
    log('info', `operation ${opId} on ${op.key} was applied before`);
    return;
  }
  tx.execute(ADD, [op.key, shard, op.amount]);
}
