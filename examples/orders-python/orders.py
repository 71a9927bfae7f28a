"""Handler `orders` of examples/orders in Python (see its README.md): takes
an order in and publishes `orders.accepted` through the transactional
outbox (docs/outbox.md).

One JSON order per message on `orders.placed`:
`{"order_id": "o-1", "sku": "sku-3", "qty": 2}`. The handler inserts it
into `orders` and publishes `orders.accepted` with the same three fields
(the Rust handler's bytes), keyed by the order id. The publish is stored
in the message's transaction and sent by the host after the COMMIT. An
order already taken changes nothing and publishes nothing again; a payload
that is not such an order, or a publish the config does not grant, is
rejected (dead-lettered). The order is read by `read_event` of
../python-common/idem_json.py as the Rust handler's serde_json reads it.

Built by build.sh with componentize-py --stub-wasi, like examples/credit-python.
"""

import json

import wit_world
from componentize_py_types import Err
from idem_json import I64, STRING, BadPayload, read_event
from wit_world.imports import log, outbox, transaction
from wit_world.imports.types import (
    DbErrorKind,
    HandlerError_Reject,
    HandlerError_Retry,
    Message,
    Value_Integer,
    Value_Text,
)

# The order, as the Rust handler's struct.
ORDER = [("order_id", STRING), ("sku", STRING), ("qty", I64)]

# Granted by `publish` in the handler's config.
ACCEPTED = "orders.accepted"

# Works on PostgreSQL and SQLite alike.
TAKE = (
    "INSERT INTO orders (order_id, sku, qty, placed_ms) "
    "VALUES ($1, $2, $3, $4) ON CONFLICT (order_id) DO NOTHING"
)

# The outbox-error cases by their WIT names.
KINDS = {
    "OutboxError_NotGranted": "not-granted",
    "OutboxError_OverLimit": "over-limit",
    "OutboxError_Invalid": "invalid",
}


def reject(reason: str) -> Err:
    return Err(HandlerError_Reject(reason))


class WitWorld(wit_world.WitWorld):
    def handle(self, msg: Message) -> None:
        try:
            order = read_event(msg.payload, "not an order", ORDER)
        except BadPayload as e:
            raise e.reject()
        order_id, sku, qty = order["order_id"], order["sku"], order["qty"]
        if order_id == "" or sku == "" or qty < 1:
            raise reject(f"order `{order_id}`: needs an order id, a SKU and a quantity of at least 1")
        try:
            taken = transaction.execute(
                TAKE,
                [Value_Text(order_id), Value_Text(sku), Value_Integer(qty), Value_Integer(msg.published_ms)],
            )
        except Err as e:
            err = e.value
            reason = f"database {err.kind.name.lower().replace('_', '-')}: {err.message}"
            if err.kind == DbErrorKind.OTHER:
                raise Err(HandlerError_Retry(reason))
            raise Err(HandlerError_Reject(reason))
        if taken == 0:
            log.log(log.Level.INFO, f"order {order_id} was taken before")
            return
        # As serde_json writes the Rust handler's struct: fields in order, no spaces.
        payload = json.dumps(
            {"order_id": order_id, "sku": sku, "qty": qty}, separators=(",", ":"), ensure_ascii=False
        ).encode()
        try:
            outbox.publish(ACCEPTED, payload, [("Content-Type", "application/json")], order_id)
        except Err as e:
            refusal = e.value
            kind = KINDS.get(type(refusal).__name__, "refused")
            raise reject(f"outbox refused {ACCEPTED}: {kind}: {refusal.value}")
