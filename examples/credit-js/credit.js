// The account-credit handler in JavaScript: the same handler as examples/credit.
//
// One JSON event per message, {"event_id": "evt_8142", "account_id": 73,
// "amount": 500}, adds `amount` to the account's balance, creating the account
// on its first credit. idem runs it inside the transaction that holds the
// message's receipt, so a redelivered or re-published event (same `event_id`,
// read by the host with `identity = "json:/event_id"`) never credits twice.
// A payload that is not such an event is rejected (dead-lettered).
//
// One source for both JS engines build.sh knows (see README.md):
// - QuickJS (componentize-qjs): WIT s64/u64 are JS numbers;
// - StarlingMonkey (componentize-js): WIT s64/u64 are BigInts.
// Either way a failed import call throws an Error whose `payload` is the WIT
// error value, and `handle` reports its own error by throwing the
// `handler-error` variant ({ tag: "reject" | "retry", val: reason }).
import * as transaction from 'idem:handler/transaction@0.1.0';

// Upsert that works on PostgreSQL and SQLite alike.
const CREDIT =
  'INSERT INTO accounts (account_id, balance) VALUES ($1, $2) ' +
  'ON CONFLICT (account_id) DO UPDATE SET balance = accounts.balance + excluded.balance';

const reject = (reason) => ({ tag: 'reject', val: reason });
const retry = (reason) => ({ tag: 'retry', val: reason });

// Strict UTF-8 (QuickJS has no TextDecoder); throws on malformed input.
function utf8(bytes) {
  if (typeof TextDecoder === 'function') {
    return new TextDecoder('utf-8', { fatal: true }).decode(bytes);
  }
  let out = '';
  for (let i = 0; i < bytes.length; ) {
    const b = bytes[i++];
    let cp, need, min;
    if (b < 0x80) { out += String.fromCharCode(b); continue; }
    else if (b >= 0xc2 && b < 0xe0) { cp = b & 0x1f; need = 1; min = 0x80; }
    else if (b >= 0xe0 && b < 0xf0) { cp = b & 0x0f; need = 2; min = 0x800; }
    else if (b >= 0xf0 && b < 0xf5) { cp = b & 0x07; need = 3; min = 0x10000; }
    else throw new Error(`invalid UTF-8 at byte ${i - 1}`);
    for (; need > 0; need--) {
      const c = bytes[i++];
      if (c === undefined || (c & 0xc0) !== 0x80) throw new Error(`invalid UTF-8 at byte ${i - 1}`);
      cp = (cp << 6) | (c & 0x3f);
    }
    if (cp < min || cp > 0x10ffff || (cp >= 0xd800 && cp <= 0xdfff)) throw new Error('invalid UTF-8');
    out += String.fromCodePoint(cp);
  }
  return out;
}

// JSON numbers are doubles in JS, so only safe integers (|n| < 2^53) are
// exact: anything else is rejected rather than rounded.
function integerField(event, name) {
  if (!(name in event)) throw reject(`not a credit event: missing field \`${name}\``);
  const v = event[name];
  if (!Number.isSafeInteger(v)) {
    throw reject(`not a credit event: \`${name}\` is not an integer in ±2^53: ${JSON.stringify(v)}`);
  }
  return v;
}

export function handle(msg) {
  // The engine's representation of WIT s64: BigInt (StarlingMonkey) or number (QuickJS).
  const s64 = typeof msg.streamSequence === 'bigint' ? BigInt : Number;
  let event;
  try {
    event = JSON.parse(utf8(msg.payload));
  } catch (e) {
    throw reject(`not a credit event: ${e.message}`);
  }
  if (event === null || typeof event !== 'object' || Array.isArray(event)) {
    throw reject('not a credit event: the payload is not a JSON object');
  }
  const accountId = integerField(event, 'account_id');
  const amount = integerField(event, 'amount');
  try {
    transaction.execute(CREDIT, [
      { tag: 'integer', val: s64(accountId) },
      { tag: 'integer', val: s64(amount) },
    ]);
  } catch (e) {
    const err = e && e.payload;
    if (!err || typeof err.kind !== 'string') throw e; // not a db-error: a bug, let it trap
    // As the Rust SDK's `?`: `other` (timeout, connection lost, ...) is worth a
    // retry; every other kind would fail the same way again.
    const reason = `database ${err.kind}: ${err.message}`;
    throw err.kind === 'other' ? retry(reason) : reject(reason);
  }
}
