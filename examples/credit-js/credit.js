// The account-credit handler in JavaScript: the same handler as examples/credit.
//
// One JSON event per message, {"event_id": "evt_8142", "account_id": 73,
// "amount": 500}, adds `amount` to the account's balance, creating the account
// on its first credit. idem runs it inside the transaction that holds the
// message's receipt, so a redelivered or re-published event (same `event_id`,
// read by the host with `identity = "json:/event_id"`) never credits twice.
// A payload that is not such an event is rejected (dead-lettered).
//
// One source for both JS engines scripts/build-js.sh knows (see README.md);
// what differs between them (how WIT s64 crosses, errors of import calls) is
// handled in ../js-common/idem.js, shared with the other JavaScript examples.
import { I64, readEvent, statements } from '../js-common/idem.js';

// The credit event. `event_id` is the message identity; the handler does not need it.
const CREDIT_EVENT = [
  ['account_id', I64],
  ['amount', I64],
];

// Upsert that works on PostgreSQL and SQLite alike.
const CREDIT =
  'INSERT INTO accounts (account_id, balance) VALUES ($1, $2) ' +
  'ON CONFLICT (account_id) DO UPDATE SET balance = accounts.balance + excluded.balance';

export function handle(msg) {
  const event = readEvent(msg, 'not a credit event', CREDIT_EVENT);
  statements(msg).execute(CREDIT, [event.account_id, event.amount]);
}
