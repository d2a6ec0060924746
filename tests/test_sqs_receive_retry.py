"""A receive whose answer is lost is sent again with the same ReceiveRequestAttemptId.

Between the SQS broker and the ministack process sits a small proxy on 127.0.0.1 that
forwards every request but drops the answer of the first ReceiveMessage (it closes
the connection instead): the broker must send that receive again, with the same
attempt id, so that SQS can return the same messages instead of hiding them.
"""

from __future__ import annotations

import http.client
import json
import socket
import threading
import uuid
from collections.abc import Iterator
from urllib.parse import urlsplit

import pytest

from shardq.broker import SendEntry
from shardq.broker.sqs import SqsBroker

pytestmark = pytest.mark.sqs


class DroppingProxy:
    """Forwards HTTP/1.1 requests; the first ReceiveMessage's answer is never sent."""

    def __init__(self, upstream: str) -> None:
        self.upstream = urlsplit(upstream)
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.port = self.sock.getsockname()[1]
        self.attempt_ids: list[str] = []
        self.dropped = 0
        self._lock = threading.Lock()
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            threading.Thread(target=self._serve, args=(conn,), daemon=True).start()

    def _serve(self, conn: socket.socket) -> None:
        with conn, conn.makefile("rb") as reader:
            while True:
                line = reader.readline()
                if not line:
                    return
                method, path, _ = line.decode().split(" ", 2)
                headers: dict[str, str] = {}
                while (header := reader.readline().decode()) not in ("\r\n", ""):
                    name, _, value = header.partition(":")
                    headers[name.strip()] = value.strip()
                body = reader.read(int(headers.get("Content-Length", "0")))
                if headers.get("X-Amz-Target", "").endswith(".ReceiveMessage"):
                    with self._lock:
                        self.attempt_ids.append(json.loads(body)["ReceiveRequestAttemptId"])
                        drop = self.dropped == 0
                        self.dropped += drop
                    if drop:
                        self._forward(method, path, headers, body)  # SQS hides its messages
                        return  # ... and the answer is lost
                status, reason, out_headers, data = self._forward(method, path, headers, body)
                conn.sendall(f"HTTP/1.1 {status} {reason}\r\n".encode())
                for name, value in out_headers:
                    if name.lower() not in ("transfer-encoding", "content-length", "connection"):
                        conn.sendall(f"{name}: {value}\r\n".encode())
                conn.sendall(f"Content-Length: {len(data)}\r\n\r\n".encode() + data)

    def _forward(
        self, method: str, path: str, headers: dict[str, str], body: bytes
    ) -> tuple[int, str, list[tuple[str, str]], bytes]:
        up = http.client.HTTPConnection(self.upstream.hostname, self.upstream.port, timeout=30)
        try:
            up.request(method, path, body=body, headers=headers)
            answer = up.getresponse()
            return answer.status, answer.reason, answer.getheaders(), answer.read()
        finally:
            up.close()

    def close(self) -> None:
        self.sock.close()


@pytest.fixture
def proxy(sqs_emulator: object) -> Iterator[DroppingProxy]:
    server = DroppingProxy(sqs_emulator.endpoint_url)  # type: ignore[attr-defined]
    try:
        yield server
    finally:
        server.close()


def test_a_receive_whose_answer_is_lost_is_sent_again_with_the_same_attempt_id(
    proxy: DroppingProxy,
) -> None:
    # Given a FIFO queue with a job, reached through a proxy that loses the first
    # receive's answer
    broker = SqsBroker(region="us-east-1", endpoint_url=f"http://127.0.0.1:{proxy.port}")
    queue = f"t-{uuid.uuid4().hex[:16]}.fifo"
    broker.ensure_queue(queue, visibility_timeout=30)
    assert not broker.send_batch(queue, [SendEntry("0", "job", "order-1", "d1")]).failed

    # When the broker receives
    broker.receive(queue, max_messages=10, wait_seconds=0, visibility_timeout=30)

    # Then the receive went out more than once, always with the same attempt id
    assert proxy.dropped == 1
    assert len(proxy.attempt_ids) >= 2
    assert len(set(proxy.attempt_ids)) == 1

    # And a new receive carries a new attempt id
    broker.receive(queue, max_messages=10, wait_seconds=0, visibility_timeout=30)
    assert len(set(proxy.attempt_ids)) == 2
    broker.close()
