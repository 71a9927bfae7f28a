#!/usr/bin/env python3
"""A notification service for the orders example: accepts the `notify`
calls of the `stock` handler (HTTP POST with an `Idempotency-Key` header)
on 127.0.0.1:8088 and applies each key once.

    python3 examples/orders/notify_receiver.py [PORT]

Each call prints one line: `applied KEY BODY` the first time a key comes,
`duplicate KEY` when it comes again (a call the host sent again after a
crash between the send and the delete of its outbox row). The keys seen
are kept in memory only: a real service keeps them in its own database.
"""

import sys
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from threading import Lock

seen = set()
lock = Lock()


class Notify(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def do_POST(self):
        length = int(self.headers.get("Content-Length") or 0)
        body = self.rfile.read(length).decode("utf-8", "replace")
        key = self.headers.get("Idempotency-Key")
        if key is None:
            self.answer(400)
            return
        with lock:
            first = key not in seen
            seen.add(key)
        if first:
            print(f"applied {key} {body}", flush=True)
        else:
            print(f"duplicate {key}", flush=True)
        self.answer(200)

    def answer(self, status):
        self.send_response(status)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, format, *args):
        pass


if __name__ == "__main__":
    port = int(sys.argv[1]) if len(sys.argv) > 1 else 8088
    print(f"notify receiver on http://127.0.0.1:{port}/notify", flush=True)
    ThreadingHTTPServer(("127.0.0.1", port), Notify).serve_forever()
