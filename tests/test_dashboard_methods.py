"""The dashboard answers methods it does not serve with a JSON 405 naming what it allows."""

from __future__ import annotations

import http.client
import json
from collections.abc import Iterator

import pytest

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
