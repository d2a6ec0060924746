"""The dashboard answers methods it does not serve with a JSON 405 naming what it allows."""

from __future__ import annotations

import http.client
import json
import socket
import struct
import time
from collections.abc import Iterator

import pytest
from structlog.testing import capture_logs

import shardq
from shardq.broker import MemoryBroker
from shardq.core.config import Config
from shardq.ops.dashboard import DashboardServer, make_server

app = shardq.App()


@app.register
class Noop(shardq.Worker):
    def perform(self, entity_id: str, payloads: list[object]) -> None:
        pass


@pytest.fixture
def server() -> Iterator[DashboardServer]:
    app.configure(Config(), broker=MemoryBroker())
    srv = make_server(app, "127.0.0.1", 0, refresh=0.2).start()
    yield srv
    srv.stop()


def request(srv: DashboardServer, method: str, path: str) -> tuple[int, str, dict[str, str], bytes]:
    conn = http.client.HTTPConnection("127.0.0.1", srv.server_port, timeout=30)
    try:
        conn.request(method, path, body=b"{}" if method in ("PUT", "PATCH") else None)
        res = conn.getresponse()
        return res.status, res.getheader("Content-Type") or "", dict(res.getheaders()), res.read()
    finally:
        conn.close()


@pytest.mark.parametrize(
    ("method", "path", "allow"),
    [
        ("PUT", "/api/v1/stats", "GET"),
        ("DELETE", "/api/v1/morgue/Noop", "GET"),
        ("PATCH", "/", "GET"),
        ("OPTIONS", "/api/v1/nodes", "GET"),
        ("DELETE", "/api/v1/morgue/Noop/purge", "POST"),
        ("GET", "/api/v1/morgue/Noop/purge", "POST"),
        ("POST", "/api/v1/morgue/Noop", "GET"),
        ("POST", "/api/v1/morgue/Noop/list", "GET"),
        ("PUT", "/api/v2/whatever", "GET, POST"),
        ("FROB", "/api/v1/stats", "GET"),
    ],
)
def test_a_method_not_served_is_a_json_405_with_allow(
    server: DashboardServer, method: str, path: str, allow: str
) -> None:
    # when a client sends a method the dashboard does not serve there
    status, kind, headers, body = request(server, method, path)
    # then it gets a JSON 405 naming the methods allowed, not an HTML 501 page
    assert status == 405
    assert kind == "application/json"
    assert headers["Allow"] == allow
    assert json.loads(body)["error"] == f"{method} is not allowed on {path}; use {allow}"


def test_a_head_request_is_a_405_without_a_body(server: DashboardServer) -> None:
    status, _, headers, body = request(server, "HEAD", "/api/v1/stats")
    assert (status, headers["Allow"], body) == (405, "GET", b"")


@pytest.mark.parametrize("path", ["/api/v1/nothing", "/api/v1/morgue/Noop/frob"])
def test_an_unknown_path_under_get_is_still_a_json_404(server: DashboardServer, path: str) -> None:
    status, kind, _, body = request(server, "GET", path)
    assert (status, kind) == (404, "application/json")
    assert "no such page or endpoint" in json.loads(body)["error"]


def test_a_client_that_hangs_up_mid_request_leaves_no_traceback(
    server: DashboardServer, capfd: pytest.CaptureFixture[str]
) -> None:
    # given clients that send a request and reset the connection at once
    with capture_logs() as logs:
        for _ in range(5):
            sock = socket.create_connection(("127.0.0.1", server.server_port))
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            sock.sendall(b"GET / HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
            sock.close()  # a reset, not a graceful close
        # when the dashboard has answered them, and then a client that stays
        deadline = time.monotonic() + 10
        while len([e for e in logs if e["event"] == "dashboard.client_gone"]) < 5:
            assert time.monotonic() < deadline, capfd.readouterr().err[-2000:]
            time.sleep(0.05)
        status, *_ = request(server, "GET", "/api/v1/nodes")
    # then nothing went to stderr: each went to the log at debug, one line each
    assert status == 200
    assert "Traceback" not in capfd.readouterr().err
    gone = [e for e in logs if e["event"] == "dashboard.client_gone"]
    assert all(e["log_level"] == "debug" for e in gone)


def test_a_stopped_dashboard_answers_nothing_more_on_a_connection_kept_alive() -> None:
    # given a dashboard and a browser's connection kept alive after an answer
    app.configure(Config(), broker=MemoryBroker())
    srv = make_server(app, "127.0.0.1", 0, refresh=0.2).start()
    conn = http.client.HTTPConnection("127.0.0.1", srv.server_port, timeout=5)
    try:
        conn.request("GET", "/api/v1/stats")
        assert conn.getresponse().read() and conn.sock is not None  # kept alive
        # when the dashboard is stopped
        with capture_logs() as logs:
            srv.stop()
            # then a request on that connection gets no answer: it was closed
            with pytest.raises((http.client.HTTPException, OSError)):
                conn.request("GET", "/api/v1/stats")
                conn.getresponse()
        # and nothing was logged about it
        assert logs == []
    finally:
        conn.close()
