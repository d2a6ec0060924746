"""The SQS broker's wire (``shardq.broker.sqs_wire``): after botocore has sent a hot call
once, the broker sends it itself, with the same bytes, signed the same way, and any
failure goes back through botocore.

Runs against the ministack emulator, through a small HTTP front (:class:`Front`) that
forwards every request, keeps what it saw, and can answer the next request itself
with an error or drop the connection. The contract tests run on a broker with a
primed wire as well (``tests/test_broker_contract.py``).
"""

from __future__ import annotations

import contextlib
import hashlib
import hmac
import http.client
import json
import re
import socket
import threading
import uuid
from collections import deque
from collections.abc import Iterator
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest

from shardq.broker import Message, SendEntry
from shardq.broker.sqs import SqsBroker
from shardq.broker.sqs_wire import OPERATIONS
from shardq.errors import BrokerError, QueueNotFoundError
from tests import emulator as emu
from tests.conftest import prime_wire

pytestmark = pytest.mark.sqs

SECRET = "test"  # AWS_SECRET_ACCESS_KEY of the sqs_emulator fixture


@dataclass(frozen=True)
class Seen:
    """One request the front received."""

    operation: str
    headers: dict[str, str]
    body: bytes


class Front:
    """An HTTP/1.1 server on 127.0.0.1 in front of the emulator."""

    def __init__(self, upstream_port: int) -> None:
        self.seen: list[Seen] = []
        self.faults: deque[tuple[int, dict[str, str], bytes] | None] = deque()
        self._connections: set[socket.socket] = set()
        front = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, format: str, *args: Any) -> None:
                pass

            def setup(self) -> None:
                super().setup()
                front._connections.add(self.connection)

            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
                target = self.headers.get("X-Amz-Target", "")
                front.seen.append(Seen(target.rpartition(".")[2], dict(self.headers), body))
                if front.faults:
                    fault = front.faults.popleft()
                    if fault is None:  # drop the connection without an answer
                        self.close_connection = True
                        return
                    self._answer(*fault)
                    return
                upstream = http.client.HTTPConnection("127.0.0.1", upstream_port, timeout=30)
                try:
                    headers = {k: v for k, v in self.headers.items() if k.lower() != "host"}
                    upstream.request("POST", self.path, body=body, headers=headers)
                    resp = upstream.getresponse()
                    hop = {"transfer-encoding", "content-length", "connection"}
                    kept = {k: v for k, v in resp.getheaders() if k.lower() not in hop}
                    self._answer(resp.status, kept, resp.read())
                finally:
                    upstream.close()

            def _answer(self, status: int, headers: dict[str, str], body: bytes) -> None:
                self.send_response(status)
                for name, value in headers.items():
                    self.send_header(name, value)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self._server.server_address[1]}"
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)
        self._thread.start()

    def fail_next(self, status: int, code: str, message: str = "injected") -> None:
        """Answer the next request with ``status`` and an SQS JSON error ``code``."""
        body = json.dumps({"__type": f"com.amazonaws.sqs#{code}", "message": message})
        headers = {
            "Content-Type": "application/x-amz-json-1.0",
            "x-amzn-query-error": f"{code};Sender",
        }
        self.faults.append((status, headers, body.encode()))

    def drop_next(self) -> None:
        self.faults.append(None)

    def of(self, operation: str) -> list[Seen]:
        return [s for s in self.seen if s.operation == operation]

    def stop(self) -> None:
        """Stop listening and cut every open connection."""
        self._server.shutdown()
        self._server.server_close()
        for connection in list(self._connections):
            with contextlib.suppress(OSError):
                connection.shutdown(socket.SHUT_RDWR)


@pytest.fixture
def front(sqs_emulator: emu.Emulator) -> Iterator[Front]:
    server = Front(sqs_emulator.port)
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
def broker(front: Front) -> Iterator[SqsBroker]:
    instance = SqsBroker(region="us-east-1", endpoint_url=front.url)
    try:
        yield instance
    finally:
        instance.close()


@pytest.fixture
def queue(broker: SqsBroker) -> str:
    name = f"wire-{uuid.uuid4().hex[:12]}.fifo"
    broker.ensure_queue(name, visibility_timeout=30)
    return name


def receive(broker: SqsBroker, queue: str) -> list[Message]:
    return broker.receive(queue, max_messages=10, wait_seconds=0, visibility_timeout=30)


def one_of_each(broker: SqsBroker, queue: str, tag: str) -> None:
    """Send, receive, change the visibility of and delete one message."""
    assert not broker.send_batch(queue, [SendEntry("0", f"body-{tag}", "g", tag)]).failed
    (message,) = receive(broker, queue)
    assert message.body == f"body-{tag}"
    assert not broker.change_visibility_batch(queue, [(message.receipt, 30)]).failed
    assert not broker.delete_batch(queue, [message.receipt]).failed


def test_each_hot_call_skips_botocores_pipeline_after_its_first_request(
    broker: SqsBroker, queue: str
) -> None:
    # given a broker that has made each hot call once, through botocore
    through_botocore: list[str] = []
    broker.client.meta.events.register(
        "before-send.sqs.*", lambda event_name="", **_: through_botocore.append(event_name)
    )
    one_of_each(broker, queue, "first")
    hot = sorted(op for e in through_botocore if (op := e.rpartition(".")[2]) in OPERATIONS)
    assert hot == sorted(OPERATIONS)
    assert broker.wire_operations == OPERATIONS
    # when it makes them again
    through_botocore.clear()
    one_of_each(broker, queue, "second")
    # then none of them went through botocore, yet each was sent and counted
    assert through_botocore == []
    assert all(broker.requests[op] == 2 for op in OPERATIONS)
    assert receive(broker, queue) == []


def test_the_wire_sends_what_botocore_sends_but_the_date_and_signature(
    broker: SqsBroker, queue: str, front: Front
) -> None:
    # given each hot call made twice with the same arguments: first by botocore, then
    # by the wire
    entry = SendEntry("0", "x", "g", "d")
    for _ in range(2):
        assert not broker.send_batch(queue, [entry]).failed  # the second: a duplicate
    (message,) = receive(broker, queue)
    assert receive(broker, queue) == []  # the group is in flight
    for _ in range(2):
        assert not broker.change_visibility_batch(queue, [(message.receipt, 30)]).failed
    for _ in range(2):
        broker.delete_batch(queue, [message.receipt])
    per_request = {"authorization", "x-amz-date", "amz-sdk-invocation-id", "amz-sdk-request"}

    def stable(seen: Seen) -> dict[str, str]:
        return {k.lower(): v for k, v in seen.headers.items() if k.lower() not in per_request}

    for operation in sorted(OPERATIONS):
        by_botocore, by_wire = front.of(operation)
        # then the bodies are byte for byte the same, and so is every header but the
        # few that belong to one request
        assert by_wire.body == by_botocore.body, operation
        assert stable(by_wire) == stable(by_botocore), operation
        # and both are signed with SigV4 for the same scope, correctly
        assert scope(by_wire) == scope(by_botocore) == "us-east-1/sqs/aws4_request"
        assert signature_ok(by_botocore, SECRET)  # the check itself is right
        assert signature_ok(by_wire, SECRET), operation


def test_a_session_token_is_sent_and_signed_by_the_wire(
    front: Front, monkeypatch: pytest.MonkeyPatch
) -> None:
    # given credentials with a session token, as a role gives them
    monkeypatch.setenv("AWS_SESSION_TOKEN", "token-of-the-session")
    broker = SqsBroker(region="us-east-1", endpoint_url=front.url)
    prime_wire(broker)
    queue = f"wire-{uuid.uuid4().hex[:12]}.fifo"
    broker.ensure_queue(queue)
    front.seen.clear()
    # when the wire sends a request
    assert not broker.send_batch(queue, [SendEntry("0", "x", "g", "d")]).failed
    (sent,) = front.of("SendMessageBatch")
    # then it carries the token, signed
    assert sent.headers["X-Amz-Security-Token"] == "token-of-the-session"
    assert "x-amz-security-token" in signed_headers(sent)
    assert signature_ok(sent, SECRET)


@pytest.mark.parametrize(
    "fault",
    ["500 InternalError", "503 ServiceUnavailable", "400 RequestThrottled", "dropped"],
)
def test_a_failed_request_on_the_wire_is_sent_again_through_botocore(
    broker: SqsBroker, queue: str, front: Front, fault: str
) -> None:
    # given a primed wire and a message waiting
    prime_wire(broker)
    assert not broker.send_batch(queue, [SendEntry("0", "x", "g", "d")]).failed
    before = broker.requests["ReceiveMessage"]
    # when the wire's receive fails
    if fault == "dropped":
        front.drop_next()
    else:
        status, code = fault.split()
        front.fail_next(int(status), code)
    messages = receive(broker, queue)
    # then botocore sent it again and got the message; both requests are counted
    assert [m.body for m in messages] == ["x"]
    assert broker.requests["ReceiveMessage"] - before == 2


def test_per_entry_failures_come_back_from_the_wire(broker: SqsBroker, queue: str) -> None:
    # given a primed wire and one message received
    prime_wire(broker)
    assert not broker.send_batch(queue, [SendEntry("0", "x", "g", "d")]).failed
    (message,) = receive(broker, queue)
    # when a batch mixes its receipt with one SQS refuses
    changed = broker.change_visibility_batch(queue, [(message.receipt, 0), ("1.bogus", 0)])
    (again,) = receive(broker, queue)
    deleted = broker.delete_batch(queue, ["1.bogus", again.receipt])
    # then only the bad entry failed, each time
    assert list(changed.failed) == ["1.bogus"]
    assert list(deleted.failed) == ["1.bogus"]
    assert receive(broker, queue) == []


def test_a_queue_deleted_under_the_wire_raises_queue_not_found(
    broker: SqsBroker, queue: str
) -> None:
    # given a primed wire that knows the queue's URL
    prime_wire(broker)
    one_of_each(broker, queue, "known")
    # when the queue is deleted behind the broker's back
    broker.client.delete_queue(QueueUrl=broker.url(queue))
    # then every hot call says so, as botocore's error would
    calls = [
        lambda: receive(broker, queue),
        lambda: broker.send_batch(queue, [SendEntry("0", "x", "g", "d2")]),
        lambda: broker.delete_batch(queue, ["1.gone"]),
        lambda: broker.change_visibility_batch(queue, [("1.gone", 0)]),
    ]
    for call in calls:
        with pytest.raises(QueueNotFoundError, match="shardq queues ensure"):
            call()


def test_an_sqs_gone_after_the_wire_learnt_says_it_cannot_be_reached(
    broker: SqsBroker, queue: str, front: Front
) -> None:
    # given a primed wire
    prime_wire(broker)
    # when the endpoint stops answering
    front.stop()
    # then a receive fails the way it always did, saying nothing is lost
    with pytest.raises(BrokerError, match=r"cannot reach SQS.*queued jobs are not lost"):
        receive(broker, queue)


def test_a_client_passed_in_is_never_bypassed(front: Front) -> None:
    # given a broker on a client built elsewhere (it may carry handlers of its own)
    import boto3

    client = boto3.session.Session().client("sqs", region_name="us-east-1", endpoint_url=front.url)
    broker = SqsBroker(client=client)
    queue = f"wire-{uuid.uuid4().hex[:12]}.fifo"
    broker.ensure_queue(queue)
    through_botocore: list[str] = []
    client.meta.events.register(
        "before-send.sqs.*", lambda event_name="", **_: through_botocore.append(event_name)
    )
    # when it makes the hot calls twice
    one_of_each(broker, queue, "a")
    one_of_each(broker, queue, "b")
    # then every request went through botocore
    assert broker.wire_operations == frozenset()
    hot = [op for e in through_botocore if (op := e.rpartition(".")[2]) in OPERATIONS]
    assert sorted(hot) == sorted(2 * list(OPERATIONS))


# -- an independent SigV4 check (AWS Signature Version 4, for a POST to a path) -------------
_AUTH = re.compile(
    r"AWS4-HMAC-SHA256 Credential=[^/]+/(?P<scope>(?P<date>\d{8})/[^,]+/aws4_request), "
    r"SignedHeaders=(?P<signed>[^,]+), Signature=(?P<signature>[0-9a-f]{64})$"
)


def _auth(seen: Seen) -> re.Match[str]:
    match = _AUTH.match(seen.headers["Authorization"])
    assert match is not None, seen.headers["Authorization"]
    return match


def scope(seen: Seen) -> str:
    return _auth(seen)["scope"].split("/", 1)[1]


def signed_headers(seen: Seen) -> list[str]:
    return _auth(seen)["signed"].split(";")


def signature_ok(seen: Seen, secret: str) -> bool:
    auth = _auth(seen)
    values = {k.lower(): " ".join(v.split()) for k, v in seen.headers.items()}
    names = auth["signed"].split(";")
    canonical = "\n".join(
        [
            "POST",
            "/",
            "",
            "".join(f"{name}:{values[name]}\n" for name in names),
            auth["signed"],
            hashlib.sha256(seen.body).hexdigest(),
        ]
    )
    to_sign = "\n".join(
        [
            "AWS4-HMAC-SHA256",
            values["x-amz-date"],
            auth["scope"],
            hashlib.sha256(canonical.encode()).hexdigest(),
        ]
    )
    key = f"AWS4{secret}".encode()
    for part in auth["scope"].split("/"):
        key = hmac.new(key, part.encode(), hashlib.sha256).digest()
    expected = hmac.new(key, to_sign.encode(), hashlib.sha256).hexdigest()
    return hmac.compare_digest(expected, auth["signature"])
