"""A dead --scrape target is logged once when it stops answering and once when it is back,
not on every refresh."""

from __future__ import annotations

import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
from structlog.testing import capture_logs

from shardq.core.config import Config
from shardq.ops.sampler import Sampler
from tests.conftest import make_broker
from tests.test_dashboard_methods import app

pytestmark = pytest.mark.sqs


class Metrics(BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        body = b'shardq_jobs_total{worker="Noop",outcome="succeeded",node="a"} 5.0\n'
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: Any) -> None:
        pass


def serve(port: int = 0) -> ThreadingHTTPServer:
    server = ThreadingHTTPServer(("127.0.0.1", port), Metrics)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


def stop(server: ThreadingHTTPServer) -> None:
    server.shutdown()
    server.server_close()


def test_a_dead_scrape_target_is_logged_once_per_state_change(
    tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    # given a dashboard on SQS scraping one node's metrics
    broker = make_broker("sqs", tmp_path, request)
    server = serve()
    port = server.server_address[1]
    url = f"http://127.0.0.1:{port}/metrics"
    try:
        app.configure(Config(queue_prefix=f"w{time.monotonic_ns() % 10**9}-"), broker=broker)
        app.store.ensure_table()  # DynamoDB's, as `shardq queues ensure` makes it
        sampler = Sampler(app, refresh=5, scrape=[url])
        with capture_logs() as logs:
            sampler.sample()
            # when the node stops answering for three refreshes, then comes back, then
            # stops again
            stop(server)
            for _ in range(3):
                sampler.sample()
            server = serve(port)
            sampler.sample()
            sampler.sample()
            stop(server)
            sampler.sample()
            sampler.sample()
        # then each change is logged once: down, up, down
        events = [(e["event"], e["log_level"]) for e in logs if "scrape" in e["event"]]
        assert events == [
            ("dashboard.scrape_failed", "warning"),
            ("dashboard.scrape_recovered", "info"),
            ("dashboard.scrape_failed", "warning"),
        ]
        assert all(e["url"] == url for e in logs if "scrape" in e["event"])
    finally:
        server.server_close()
        broker.close()
