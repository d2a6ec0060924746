"""The web dashboard: one page (``static/dashboard.html``) and a JSON API, on the stdlib server.

``GET /api/v1/stats`` is :func:`shardq.stats.collect` plus ``throughput`` (per worker
``[[unix_time, jobs_per_minute], ...]`` over 30 minutes, or null); ``GET
/api/v1/morgue/<worker>?entity=&limit=`` lists dead jobs; ``POST .../requeue`` and
``.../purge`` take ``{"message_ids": [...]}``, ``{"entity": ...}`` (or both) or ``{"all":
true}``, with a Content-Length; anything else (no body, an unknown key) is refused and
changes nothing (:class:`shardq.selection.Selection`).

A background thread samples stats every ``refresh`` seconds and requests read that
sample, so clients never make the broker busier. Throughput is the change of ``done``
between samples (embedded broker) or, on SQS, of ``shardq_jobs_total`` scraped from the
nodes' Prometheus endpoints. With a token, POSTs need ``Authorization: Bearer``;
without one the server binds to loopback only, answers only a loopback ``Host`` (DNS
rebinding) and refuses cross-origin POSTs.
"""

from __future__ import annotations

import hmac
import ipaddress
import json
import signal
import socket
import socketserver
import threading
import time
import urllib.request
from collections import deque
from collections.abc import Callable, Iterable, Sequence
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from importlib import resources
from typing import Any, TypeVar
from urllib.parse import parse_qs, unquote, urlsplit

import structlog

from shardq.app import App
from shardq.errors import ConfigError, QueueNotFoundError, ShardqError, UnknownWorkerError
from shardq.morgue import REASON_UNREADABLE, MorgueQueue, MorgueRecord, payload_of
from shardq.selection import Selection, SelectionError, act
from shardq.stats import collect

log = structlog.get_logger("shardq.dashboard")
T = TypeVar("T")

WINDOW = 1800.0  # seconds of throughput history kept
MAX_BODY = 1 << 20
MAX_RAW = 4000  # characters of an unreadable record shown
MAX_LIMIT = 1000
OUTCOMES = frozenset({"succeeded", "morgued"})
EMBEDDED = frozenset({"sqlite", "memory"})  # brokers that count deleted jobs
NO_THROUGHPUT = "not counted by SQS: pass --scrape http://node:port/metrics"
HEADERS = {
    "Cache-Control": "no-store",
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    "Content-Security-Policy": "default-src 'none'; script-src 'unsafe-inline'; style-src "
    "'unsafe-inline'; connect-src 'self'; img-src data:; frame-ancestors 'none'; base-uri "
    "'none'; form-action 'none'",
}


class HttpError(Exception):
    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


# -- sampling ---------------------------------------------------------------------------
class Sampler:
    """Samples the app's stats every ``refresh`` seconds and derives throughput."""

    def __init__(self, app: App, refresh: float, scrape: Sequence[str] = ()) -> None:
        self.app, self.refresh, self.scrape = app, refresh, list(scrape)
        #: worker -> (unix time, jobs per minute), oldest first, at most WINDOW old.
        self.points: dict[str, deque[tuple[float, float]]] = {}
        self.source: str | None = None
        self._last: dict[str, tuple[float, dict[str, float]]] = {}  # source -> (time, counts)
        self._latest: dict[str, Any] | None = None
        self._error: str | None = None
        self._ready, self._stop, self._lock = threading.Event(), threading.Event(), threading.Lock()
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="shardq-dashboard", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=10)

    def _run(self) -> None:
        while not self._stop.is_set():
            started = time.monotonic()
            self.sample()
            self._stop.wait(max(0.0, self.refresh - (time.monotonic() - started)))

    def sample(self) -> None:
        """Take one sample (the background thread calls this every ``refresh`` s)."""
        try:
            stats = collect(self.app).to_dict()
        except Exception as exc:  # keep serving the last good sample
            log.warning("dashboard.sample_failed", error=f"{type(exc).__name__}: {exc}")
            with self._lock:
                self._error = f"cannot read the broker: {type(exc).__name__}: {exc}"
            self._ready.set()
            return
        workers = stats["by_worker"]
        counts: dict[str, dict[str, float]] = {}
        complete = True
        done = [s["done"] for w in workers.values() for s in w["shards"]]
        if stats["broker"] in EMBEDDED or any(d is not None for d in done):
            self.source = "broker"  # a queue not created yet has done None: nothing done
            counts["broker"] = {
                name: float(sum(s["done"] or 0 for s in w["shards"])) for name, w in workers.items()
            }
        else:
            self.source = "scrape" if self.scrape else None
            for url in self.scrape:
                found = _scrape(url, timeout=max(1.0, min(self.refresh, 5.0)))
                complete = complete and found is not None
                counts.update({url: found} if found is not None else {})
        with self._lock:
            self._add_points(stats["time"], counts, list(workers), complete)
            self._latest = stats
            self._error = None
        self._ready.set()

    def _add_points(
        self, now: float, counts: dict[str, dict[str, float]], names: list[str], complete: bool
    ) -> None:
        """One point per worker: the sum over sources of their counts' change per minute
        (a node that failed to answer leaves a gap rather than a dip)."""
        rates: dict[str, float] = {}
        for source, current in counts.items():
            previous = self._last.get(source)
            self._last[source] = (now, current)
            if previous is None or now <= previous[0]:
                continue
            for name in names:
                before, after = previous[1].get(name, 0.0), current.get(name, 0.0)
                delta = after - before if after >= before else after  # a node restarted
                rates[name] = rates.get(name, 0.0) + delta * 60.0 / (now - previous[0])
        for name in names:
            series = self.points.setdefault(name, deque())
            if complete and name in rates:
                series.append((now, round(rates[name], 2)))
            while series and series[0][0] < now - WINDOW:
                series.popleft()

    def snapshot(self, wait: float = 10.0) -> dict[str, Any]:
        """The latest sample as the API returns it (waits for the first one)."""
        self._ready.wait(wait)
        with self._lock:
            if self._latest is None:
                raise HttpError(503, self._error or "no stats sampled yet; retry in a moment")
            throughput = {
                n: [list(p) for p in self.points.get(n, ())] for n in self._latest["by_worker"]
            }
            return {
                **self._latest,
                "throughput": None if self.source is None else throughput,
                "throughput_source": self.source,
                "throughput_note": NO_THROUGHPUT if self.source is None else None,
                "refresh": self.refresh,
                "error": self._error,
            }


def parse_metrics(text: str) -> dict[str, float]:
    """``shardq_jobs_total`` finished jobs (succeeded or morgued) per worker."""
    from prometheus_client.parser import text_string_to_metric_families

    found: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            worker, outcome = sample.labels.get("worker"), sample.labels.get("outcome")
            if sample.name == "shardq_jobs_total" and worker and outcome in OUTCOMES:
                found[worker] = found.get(worker, 0.0) + float(sample.value)
    return found


def _scrape(url: str, timeout: float) -> dict[str, float] | None:
    try:
        with urllib.request.urlopen(url, timeout=timeout) as response:
            return parse_metrics(response.read().decode("utf-8", "replace"))
    except Exception as exc:
        log.warning("dashboard.scrape_failed", url=url, error=f"{type(exc).__name__}: {exc}")
        return None


# -- HTTP -------------------------------------------------------------------------------
class DashboardServer(ThreadingHTTPServer):
    """The dashboard's HTTP server; :meth:`start` serves in a background thread."""

    daemon_threads = True

    def __init__(self, app: App, host: str, port: int, token: str | None, sampler: Sampler) -> None:
        self.address_family = socket.AF_INET6 if ":" in host else socket.AF_INET
        self.host = host
        super().__init__((host, port), Handler)
        self.app, self.token, self.sampler = app, token, sampler
        self.morgue_lock = threading.Lock()  # morgue scans hide messages: one at a time
        self.page = resources.files("shardq").joinpath("static/dashboard.html").read_bytes()
        self._thread: threading.Thread | None = None

    def server_bind(self) -> None:  # HTTPServer's would look up the host's FQDN
        socketserver.TCPServer.server_bind(self)
        self.server_name, self.server_port = self.host, int(self.socket.getsockname()[1])

    @property
    def url(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.server_port}/"

    def start(self) -> DashboardServer:
        self.sampler.start()
        self._thread = threading.Thread(target=self.serve_forever, name="shardq-http", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        if self._thread is not None:
            self.shutdown()
            self._thread.join(timeout=10)
            self._thread = None
        self.server_close()
        self.sampler.stop()


class Handler(BaseHTTPRequestHandler):
    server: DashboardServer
    server_version = "shardq-dashboard"
    protocol_version = "HTTP/1.1"
    timeout = 30  # idle keep-alive connections close after this

    def do_GET(self) -> None:
        self._dispatch("GET")

    def do_POST(self) -> None:
        self._dispatch("POST")

    def _dispatch(self, method: str) -> None:
        try:
            url = urlsplit(self.path)
            parts = [unquote(p) for p in url.path.strip("/").split("/")] if url.path != "/" else []
            self._check_host()
            if method == "POST" or parts[:3] == ["api", "v1", "morgue"]:
                self._check_access(method)
            if method == "GET" and parts in ([], ["index.html"]):
                return self._send(200, self.server.page, "text/html; charset=utf-8")
            if method == "GET" and parts == ["api", "v1", "stats"]:
                return self._json(200, self.server.sampler.snapshot())
            if parts[:3] == ["api", "v1", "morgue"] and len(parts) in (4, 5):
                action = parts[4] if len(parts) == 5 else "list"
                if (method, action) in {("GET", "list"), ("POST", "requeue"), ("POST", "purge")}:
                    return self._morgue(parts[3], action, parse_qs(url.query))
                raise HttpError(405, f"{method} is not allowed on {url.path}")
            raise HttpError(404, f"no such page or endpoint: {url.path}")
        except HttpError as exc:
            self._json(exc.status, {"error": str(exc)})
        except UnknownWorkerError as exc:
            self._json(404, {"error": str(exc)})
        except ShardqError as exc:
            log.warning("dashboard.broker_error", path=self.path, error=str(exc))
            self._json(502, {"error": f"{type(exc).__name__}: {exc}"})
        except Exception as exc:
            log.exception("dashboard.request_failed", path=self.path)
            self._json(500, {"error": f"internal error: {type(exc).__name__}: {exc}"})

    # -- security ---------------------------------------------------------------------
    def _check_host(self) -> None:
        """Without a token, answer only requests addressed to a loopback name."""
        if not self.server.token and not _is_loopback_name(self.headers["Host"] or ""):
            raise HttpError(403, "the Host header is not a loopback address (set a token)")

    def _check_access(self, method: str) -> None:
        """Actions, and dead jobs' payloads, need the token when one is configured;
        without one, a POST must not come from another origin."""
        if self.server.token:
            scheme, _, given = self.headers.get("Authorization", "").partition(" ")
            if scheme.lower() != "bearer" or not hmac.compare_digest(
                given.strip().encode(), self.server.token.encode()
            ):
                raise HttpError(401, "this needs the header 'Authorization: Bearer <token>'")
            return
        origin = self.headers.get("Origin")
        if (
            method == "POST"
            and origin is not None
            and urlsplit(origin).netloc.lower() != self.headers["Host"].lower()
        ):
            raise HttpError(403, f"cross-origin request refused (Origin {origin})")

    # -- morgue -----------------------------------------------------------------------
    def _morgue(self, worker: str, action: str, query: dict[str, list[str]]) -> None:
        app = self.server.app
        name = app.worker(worker).__name__
        morgue = MorgueQueue(app, name)
        if action == "list":
            entity = query.get("entity", [""])[-1] or None
            limit = _int_param(query, "limit", 100)
            with self.server.morgue_lock:
                records = _or_none(lambda: morgue.list_jobs(entity=entity, limit=limit)) or []
            return self._json(
                200, _records_json([_record_dict(r, app.signing_key) for r in records])
            )
        try:
            selection = Selection.from_body(self._body())
        except SelectionError as exc:
            raise HttpError(400, str(exc)) from None
        with self.server.morgue_lock:
            n = _or_none(lambda: act(app, name, action, selection)) or 0
        log.info(
            f"dashboard.morgue_{action}",
            worker=name,
            entity=selection.entity,
            ids=selection.message_ids,
            all=selection.everything,
            count=n,
        )
        self._json(200, {"requeued" if action == "requeue" else "purged": n})

    def _body(self) -> Any:
        """The JSON body; refused unless its length is given and it is all there."""
        if self.headers.get("Transfer-Encoding") is not None:
            raise HttpError(
                411, "send the body with a Content-Length header (chunked bodies are refused)"
            )
        lengths = set(self.headers.get_all("Content-Length") or [])
        if not lengths:
            raise HttpError(411, "a POST needs a Content-Length header and a JSON body")
        try:
            (length,) = (int(v) for v in lengths)
            if length < 0:
                raise ValueError(length)
        except ValueError:
            raise HttpError(400, f"invalid Content-Length {', '.join(sorted(lengths))}") from None
        if length > MAX_BODY:
            raise HttpError(413, f"request body over {MAX_BODY} bytes")
        try:
            raw = self.rfile.read(length)
        except OSError as exc:
            raise HttpError(408, f"the request body did not arrive: {exc}") from None
        if len(raw) < length:
            raise HttpError(
                400, f"the request body is shorter than its Content-Length ({len(raw)} < {length})"
            )
        if not raw.strip():
            raise HttpError(
                400, 'the request body is empty: send a JSON object such as {"all": true}'
            )
        try:
            return json.loads(raw)
        except RecursionError:
            raise HttpError(400, "the request body is nested too deeply") from None
        except ValueError as exc:
            raise HttpError(400, f"the request body is not valid JSON: {exc}") from None

    # -- responses ----------------------------------------------------------------------
    def _json(self, status: int, doc: Any) -> None:
        data = json.dumps(doc, default=str, allow_nan=False).encode()
        self._send(status, data, "application/json")

    def _send(self, status: int, data: bytes, kind: str) -> None:
        if self.command == "POST" and status >= 400:
            self.close_connection = True  # the body may not have been read
        self.send_response(status)
        for name, value in {**HEADERS, "Content-Type": kind, "Content-Length": len(data)}.items():
            self.send_header(name, str(value))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, format: str, *args: Any) -> None:
        log.debug("dashboard.request", client=self.client_address[0], line=format % args)


def _record_dict(record: MorgueRecord, key: bytes | None) -> dict[str, Any]:
    """A dead job as the API shows it. A record that is not a shardq morgue record, or
    whose job body cannot be read, is ``unreadable`` and shows its ``raw`` text."""
    payload = payload_of(record, key)
    unreadable = record.reason == REASON_UNREADABLE or payload is None
    raw = record.body[:MAX_RAW] if unreadable else None
    return {**record.__dict__, "payload": payload, "unreadable": unreadable, "raw": raw}


def _records_json(docs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """``docs``, with any job whose payload JSON cannot carry (NaN, nested too deeply)
    shown as unreadable instead."""
    try:
        json.dumps(docs, allow_nan=False)
        return docs
    except (ValueError, RecursionError):
        pass
    for doc in docs:
        try:
            json.dumps(doc["payload"], allow_nan=False)
        except (ValueError, RecursionError):
            doc.update(payload=None, unreadable=True, raw=doc["body"][:MAX_RAW])
    return docs


def _or_none(call: Callable[[], T]) -> T | None:
    try:
        return call()
    except QueueNotFoundError:  # nothing ever died: the morgue queue does not exist yet
        return None


def _int_param(query: dict[str, list[str]], name: str, default: int) -> int:
    text = query.get(name, [str(default)])[-1]
    try:
        value = int(text)
    except ValueError:
        raise HttpError(400, f"{name} must be an integer, got {text!r}") from None
    if not 1 <= value <= MAX_LIMIT:
        raise HttpError(400, f"{name} must be between 1 and {MAX_LIMIT}, got {value}")
    return value


def _is_loopback_name(host: str) -> bool:
    """``localhost``, ``127.0.0.1:8642``, ``[::1]``: names only this machine answers to."""
    try:
        name = urlsplit(f"//{host}").hostname or ""
        return name == "localhost" or ipaddress.ip_address(name).is_loopback
    except ValueError:
        return False


def is_loopback(host: str) -> bool:
    """True if binding ``host`` exposes the server to this machine only."""
    try:
        infos = socket.getaddrinfo(host, None) if host else []
    except OSError:
        return False
    return bool(infos) and all(ipaddress.ip_address(i[4][0]).is_loopback for i in infos)


# -- entry points ---------------------------------------------------------------------
def make_server(
    app: App,
    host: str = "127.0.0.1",
    port: int = 8642,
    token: str | None = None,
    refresh: float = 5.0,
    scrape: Iterable[str] = (),
) -> DashboardServer:
    """A dashboard bound to ``host:port`` (0 = any free port), not yet serving."""
    token = token or None
    if token is None and not is_loopback(host):
        raise ConfigError(
            f"the dashboard would serve {host or 'every address'} without a token: anyone "
            "who can reach it could requeue or delete dead jobs. Set dashboard_token "
            "(or SHARDQ_DASHBOARD_TOKEN), or bind to 127.0.0.1"
        )
    if refresh <= 0:
        raise ConfigError(f"refresh must be a positive number of seconds, got {refresh}")
    urls = list(scrape)
    for url in urls:
        if urlsplit(url).scheme not in ("http", "https"):
            raise ConfigError(f"--scrape {url!r}: expected an http(s):// metrics URL")
    try:
        return DashboardServer(app, host, port, token, Sampler(app, refresh, urls))
    except OSError as exc:
        raise ConfigError(f"cannot serve the dashboard on {host}:{port}: {exc}") from None


def serve(
    app: App,
    host: str = "127.0.0.1",
    port: int = 8642,
    token: str | None = None,
    refresh: float = 5.0,
    scrape: Iterable[str] = (),
) -> None:
    """Serve the dashboard until Ctrl-C or SIGTERM."""
    urls = list(scrape)
    server = make_server(app, host, port, token=token, refresh=refresh, scrape=urls)
    stop = threading.Event()
    previous: dict[signal.Signals, Any] = {}
    if threading.current_thread() is threading.main_thread():
        for sig in (signal.SIGINT, signal.SIGTERM):
            previous[sig] = signal.signal(sig, lambda *_: stop.set())
    server.start()
    log.info("dashboard.started", url=server.url, token=bool(server.token), scrape=len(urls))
    try:
        while not stop.wait(0.5):
            pass
    finally:
        server.stop()
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        log.info("dashboard.stopped")
