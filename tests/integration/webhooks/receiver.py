"""A real HTTP receiver on loopback for webhook tests: records what it was sent, answers with
the status it is told, and can be stopped (connections refused) and started again on the
same port."""

from __future__ import annotations

import threading
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from standardwebhooks.webhooks import Webhook


@dataclass(frozen=True)
class Received:
    headers: dict[str, str]
    body: bytes

    @property
    def webhook_id(self) -> str:
        return self.headers["webhook-id"]

    def verify(self, secret: str) -> Any:
        """The parsed body, if signed by `secret`; raises WebhookVerificationError if not."""
        return Webhook(secret).verify(self.body, self.headers)


class Receiver:
    """`url` answers POSTs with `status` (200 by default) and keeps them in `received`."""

    def __init__(self) -> None:
        self.received: list[Received] = []
        self.status = 200
        self.port = 0
        self._lock = threading.Lock()
        self._server: ThreadingHTTPServer | None = None
        self.start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/hook"

    def start(self) -> None:
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                length = int(self.headers.get("content-length", 0))
                body = self.rfile.read(length)
                headers = {k.lower(): v for k, v in self.headers.items()}
                status = receiver.status
                if status < 300:
                    with receiver._lock:
                        receiver.received.append(Received(headers, body))
                self.send_response(status)
                self.send_header("content-length", "2")
                self.end_headers()
                self.wfile.write(b"ok" if status < 300 else b"no")

            def log_message(self, format: str, *args: Any) -> None:
                pass

        self._server = ThreadingHTTPServer(("127.0.0.1", self.port), Handler)
        self.port = self._server.server_address[1]
        threading.Thread(target=self._server.serve_forever, daemon=True).start()

    def stop(self) -> None:
        """Close the listening socket: connections are refused until `start`."""
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None

    def unique(self) -> dict[str, Received]:
        """What arrived, deduplicated by `webhook-id` (at-least-once delivery)."""
        with self._lock:
            return {r.webhook_id: r for r in self.received}
