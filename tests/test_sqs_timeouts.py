"""An SQS endpoint that accepts connections and never answers fails calls with a clear
error, within the client's bounded timeouts and retries, instead of blocking for minutes."""

from __future__ import annotations

import math
import os
import re
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest

import shardq
from shardq.broker.sqs import SqsBroker
from shardq.broker.sqs_client import CALL_ATTEMPTS, Unanswered, worst_call_seconds
from shardq.core.config import CONNECT_TIMEOUT, READ_TIMEOUT, Config
from shardq.core.errors import BrokerError
from shardq.store import StoreError
from tests.children import ROOT

#: The longest a hung endpoint may hold a command, timeouts and retries included.
BUDGET = 20.0
#: What a command may take beyond one call's bound, from its first connection to its exit.
SLACK = BUDGET - worst_call_seconds()
#: Short timeouts (``connect_timeout``, ``read_timeout``) for the tests that need not
#: wait out the default ones, and what the error then says.
SHORT = (0.5, 0.5)
SHORT_SAID = f"did not answer within 3 s ({CALL_ATTEMPTS} attempts, 0.5 s to connect and 0.5 s"


class Mute:
    """A TCP server on 127.0.0.1 that accepts every connection and never answers."""

    def __init__(self) -> None:
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(64)
        self.accepted: list[socket.socket] = []
        #: When the first connection came (monotonic): a command's bound is measured from
        #: there, so a loaded machine's slow Python start does not count against it.
        self.first_accept: float | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._accept, daemon=True)
        self._thread.start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.sock.getsockname()[1]}"

    def _accept(self) -> None:
        self.sock.settimeout(0.2)
        while not self._stop.is_set():
            try:
                conn, _ = self.sock.accept()
            except OSError:
                continue
            if self.first_accept is None:
                self.first_accept = time.monotonic()
            self.accepted.append(conn)  # held open, never read from nor written to

    def held_for(self) -> float:
        """Seconds from the first connection until now (the command's exit)."""
        assert self.first_accept is not None, "nothing connected"
        return time.monotonic() - self.first_accept

    def close(self) -> None:
        self._stop.set()
        self._thread.join(5)
        for conn in self.accepted:
            conn.close()
        self.sock.close()


@pytest.fixture
def mute() -> Iterator[Mute]:
    server = Mute()
    yield server
    server.close()


def cli(
    mute: Mute, *args: str, timeout: float, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    env = {
        **os.environ,
        **(env or {}),
        "SHARDQ_APP": "tests.apps.ledger",
        "SHARDQ_BROKER_URL": "sqs://",
        "SHARDQ_ENDPOINT_URL": mute.url,
        "SHARDQ_REGION": "us-east-1",
        "AWS_ACCESS_KEY_ID": "test",
        "AWS_SECRET_ACCESS_KEY": "test",
    }
    return subprocess.run(
        [sys.executable, "-m", "shardq", *args],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def test_the_timeouts_and_retries_of_a_call_fit_the_budget() -> None:
    # the worst case of one call: every attempt connects late, or waits for an answer
    # until the read timeout, plus the retries' back-off
    assert worst_call_seconds() < BUDGET
    assert CALL_ATTEMPTS >= 2 and CONNECT_TIMEOUT <= READ_TIMEOUT


def test_the_broker_client_uses_the_timeouts_and_adaptive_retries() -> None:
    broker = SqsBroker(region="us-east-1", endpoint_url="http://127.0.0.1:9")
    config: Any = broker.client.meta.config
    assert (config.connect_timeout, config.read_timeout) == (CONNECT_TIMEOUT, READ_TIMEOUT)
    assert config.retries == {"mode": "adaptive", "total_max_attempts": CALL_ATTEMPTS}


def test_the_timeout_keys_reach_the_broker_and_the_state_table_clients() -> None:
    # given an sqs:// app configured with other timeouts
    app = shardq.App()
    app.configure(
        Config(
            broker_url="sqs://",
            region="us-east-1",
            endpoint_url="http://127.0.0.1:9",
            connect_timeout=0.5,
            read_timeout=1.5,
        )
    )
    # then its SQS client and its DynamoDB client both use them, with the same retries
    broker: Any = app.broker
    store: Any = app.store
    for client in (broker.client, store.client):
        config: Any = client.meta.config
        assert (config.connect_timeout, config.read_timeout) == (0.5, 1.5)
        assert config.retries == {"mode": "adaptive", "total_max_attempts": CALL_ATTEMPTS}
    assert store.client.meta.service_model.service_name == "dynamodb"
    # and a one-shot command remembers a hung endpoint for one call's bound at those
    # timeouts, not the default's, in one memory shared by both clients
    broker.unanswered.fail_fast()
    assert broker.unanswered.hold == worst_call_seconds(0.5, 1.5) < worst_call_seconds()
    assert store.unanswered is broker.unanswered
    broker.close()


def test_a_broker_given_shorter_timeouts_fails_a_call_within_them(
    mute: Mute, monkeypatch: pytest.MonkeyPatch
) -> None:
    # given a broker whose calls get 0.5 s to connect and 0.5 s to be answered
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "test")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "test")
    broker = SqsBroker(
        region="us-east-1", endpoint_url=mute.url, connect_timeout=0.5, read_timeout=0.5
    )
    config: Any = broker.client.meta.config
    assert (config.connect_timeout, config.read_timeout) == (0.5, 0.5)
    # when it calls an endpoint that never answers
    started = time.monotonic()
    with pytest.raises(BrokerError) as raised:
        broker.counts("q.fifo")
    elapsed = time.monotonic() - started
    # then the call fails within the bound of those timeouts, with an error saying them
    assert elapsed < worst_call_seconds(0.5, 0.5) + 1, f"{elapsed:.1f} s"
    assert "did not answer within 3 s" in str(raised.value)
    assert f"{CALL_ATTEMPTS} attempts, 0.5 s to connect and 0.5 s to answer each" in str(
        raised.value
    )
    assert mute.accepted


def test_a_command_against_a_mute_endpoint_fails_with_a_clear_error(mute: Mute) -> None:
    # when a command talks, with the default timeouts, to an SQS endpoint that never
    # answers (its state table too)
    result = cli(mute, "stats", timeout=90)  # was ~145 s: the run would time out here
    elapsed = mute.held_for()
    # then it exits 1 saying the endpoint (SQS, or the state table on it) did not answer in
    # time, with no traceback
    assert result.returncode == 1, result.stderr
    assert "shardq: broker error:" in result.stderr or "shardq: state store error:" in result.stderr
    assert "did not answer within" in result.stderr
    assert "Traceback" not in result.stderr
    assert mute.accepted  # it did connect: the hang was in the answer
    # and it let go within the bound of one call from its first connection, although it
    # needs the table and then SQS (each call after the first that timed out fails at once)
    assert elapsed < BUDGET, f"{elapsed:.1f} s"


def test_a_command_given_short_timeouts_fails_within_their_bound(mute: Mute) -> None:
    # when a command given short timeouts by the config keys publishes to an SQS
    # endpoint that never answers (its state table too)
    keys = {"SHARDQ_CONNECT_TIMEOUT": str(SHORT[0]), "SHARDQ_READ_TIMEOUT": str(SHORT[1])}
    result = cli(mute, "publish", "Ledgered", "e", '{"n": 1}', timeout=90, env=keys)
    elapsed = mute.held_for()
    # then it exits 1 with the clear error, which states those timeouts, no traceback
    assert result.returncode == 1, result.stderr
    assert "shardq: broker error:" in result.stderr or "shardq: state store error:" in result.stderr
    assert SHORT_SAID in result.stderr
    assert "Traceback" not in result.stderr
    assert mute.accepted
    # and it let go within the bound of one call at those timeouts (from its first
    # connection), far below the default timeouts' bound
    assert elapsed < worst_call_seconds(*SHORT) + SLACK < BUDGET, f"{elapsed:.1f} s"


def test_an_endpoint_that_timed_out_is_not_asked_again_for_one_calls_bound() -> None:
    # given the memory of hung endpoints of a one-shot command, on a clock of our own
    now = [100.0]
    unanswered = Unanswered(clock=lambda: now[0])
    unanswered.record("http://a", "SQS did not answer")
    # then it is off until a command turns it on
    assert unanswered.earlier("http://a") is None
    # when a one-shot command turns it on
    unanswered.fail_fast()
    # then a call to that endpoint within one call's bound gets the first error at once,
    # another endpoint is asked as usual, and after the bound the endpoint is asked again
    now[0] += 5
    assert unanswered.earlier("http://a") == (
        "SQS did not answer (not asked again: that endpoint timed out 5 s ago)"
    )
    assert unanswered.earlier("http://b") is None
    now[0] += worst_call_seconds()
    assert unanswered.earlier("http://a") is None


def test_app_publish_from_code_fails_with_a_clear_error(
    mute: Mute, monkeypatch: pytest.MonkeyPatch
) -> None:
    # given an app whose SQS endpoint never answers
    app = shardq.App()

    @app.register
    class Job(shardq.Worker):
        def perform(self, entity_id: str, payloads: list[object]) -> None: ...

    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "test")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "test")
    connect, read = SHORT
    app.configure(
        Config(
            broker_url="sqs://",
            endpoint_url=mute.url,
            region="us-east-1",
            connect_timeout=connect,
            read_timeout=read,
        )
    )
    # when a web request publishes, then it gets a clear error (the state table, read
    # first for the worker's layout, is on the same endpoint), not a hang, within the
    # bound of one call at the app's timeouts
    started = time.monotonic()
    with pytest.raises((BrokerError, StoreError), match=re.escape(SHORT_SAID)):
        Job.publish("e", {"n": 1})
    elapsed = time.monotonic() - started
    assert elapsed < worst_call_seconds(connect, read) + 1, f"{elapsed:.1f} s"


@pytest.mark.parametrize(
    ("key", "value"), [("connect_timeout", 0), ("read_timeout", -1.0), ("read_timeout", math.nan)]
)
def test_a_broker_given_a_timeout_that_is_not_positive_seconds_is_refused(
    key: str, value: float
) -> None:
    # when code makes an SQS broker with a timeout of no seconds, then it is refused by name
    with pytest.raises(ValueError, match=f"SqsBroker {key}: expected seconds above 0"):
        SqsBroker(region="us-east-1", endpoint_url="http://127.0.0.1:9", **{key: value})


def test_a_state_store_given_a_timeout_beyond_the_limit_is_refused() -> None:
    # when code makes a DynamoDB store with a read timeout over 300 s, then it is refused
    from shardq.store.dynamo import DynamoStore

    with pytest.raises(ValueError, match="DynamoStore read_timeout: expected seconds above 0"):
        DynamoStore("t", region="us-east-1", endpoint_url=None, read_timeout=1e12)


class WebPage(threading.Thread):
    """An HTTP server on 127.0.0.1 that answers every request 200 with a web page (an
    endpoint_url pointed at a web server or a proxy's page instead of SQS)."""

    def __init__(self) -> None:
        import http.server

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def do_POST(self) -> None:
                self.rfile.read(int(self.headers.get("Content-Length", 0)))
                body = b"<html><body>It works!</body></html>"
                self.send_response(200)
                self.send_header("Content-Type", "text/html")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args: Any) -> None:
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        super().__init__(target=self.server.serve_forever, daemon=True)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.start()


def test_an_endpoint_that_is_not_sqs_is_a_broker_error(monkeypatch: pytest.MonkeyPatch) -> None:
    # given an endpoint_url where a web server answers every request with a page
    page = WebPage()
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "x")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "y")
    broker = SqsBroker(region="us-east-1", endpoint_url=page.url)
    try:
        # when a queue is created or looked up, then a BrokerError says the answer is not SQS's
        for call in (lambda: broker.ensure_queue("q.fifo"), lambda: broker.url("q.fifo")):
            with pytest.raises(BrokerError, match="answered without the queue's URL"):
                call()
    finally:
        broker.close()
        page.server.shutdown()
        page.server.server_close()
