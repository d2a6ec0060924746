"""The web dashboard: one page and a JSON API (docs/operations.md) on the stdlib server,
answering from a background :class:`~shardq.ops.sampler.Sampler`. With a token, POSTs and
dead jobs need it; without one it serves loopback only and refuses cross-origin POSTs."""

from __future__ import annotations

import hmac
import ipaddress
import json
import signal
import socket
import socketserver
import sys
import threading
from collections.abc import Callable, Iterable
from contextlib import suppress
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from importlib import resources
from typing import Any
from urllib.parse import parse_qs, unquote, urlsplit

import structlog

from shardq.api.app import App
from shardq.core.envelope import parse_json
from shardq.core.errors import ConfigError, ShardqError, UnknownWorkerError
from shardq.core.signals import StopSignals
from shardq.morgue import COUNTED, REASON_UNREADABLE, Filter, Morgue, MorgueRecord
from shardq.ops import selection
from shardq.ops.admin_morgue import record_dict
from shardq.ops.sampler import Sampler, SampleUnavailable
from shardq.ops.selection import DONE, SelectionError, act, parse_range

log = structlog.get_logger("shardq.dashboard")

MAX_BODY = 1 << 20
MAX_RAW = 4000  # characters of an unreadable record the API shows
MAX_LIMIT = 1000  # most dead jobs on one page of the API
MIN_REFRESH, MAX_REFRESH = 0.1, 3600.0  # seconds between samples (--refresh)
HEADERS = {
    "Cache-Control": "no-store",
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    "Content-Security-Policy": "default-src 'none'; script-src 'unsafe-inline'; style-src "
    "'unsafe-inline'; connect-src 'self'; img-src data:; frame-ancestors 'none'; base-uri "
    "'none'; form-action 'none'",
}


class HttpError(Exception):
    """An answer other than 200: its status, and the ``Allow`` header of a 405."""

    def __init__(self, status: int, message: str, allow: str | None = None) -> None:
        super().__init__(message)
        self.status, self.allow = status, allow


class DashboardServer(ThreadingHTTPServer):
    """The dashboard's HTTP server; :meth:`start` serves in a background thread."""

    daemon_threads = True
    poll_interval = 0.5  # how often serving looks whether stop() was called

    def __init__(self, app: App, host: str, port: int, token: str | None, sampler: Sampler) -> None:
        self.address_family = socket.AF_INET6 if ":" in host else socket.AF_INET
        self.host = host
        super().__init__((host, port), Handler)
        self.app, self.token, self.sampler = app, token, sampler
        self.morgue_lock = threading.Lock()  # one requeue or purge at a time
        self.page = resources.files("shardq.ops").joinpath("static/dashboard.html").read_bytes()
        self._thread: threading.Thread | None = None
        self._open: set[socket.socket] = set()  # connections being served (kept alive)
        self._open_lock = threading.Lock()

    def server_bind(self) -> None:  # HTTPServer's would look up the host's FQDN
        socketserver.TCPServer.server_bind(self)
        self.server_name, self.server_port = self.host, int(self.socket.getsockname()[1])

    def handle_error(self, request: Any, client_address: Any) -> None:
        """A client that hung up is logged at debug, one line; anything else with its
        traceback in the log (socketserver would print it to stderr)."""
        exc = sys.exc_info()[1]
        if isinstance(exc, ConnectionError):
            log.debug("dashboard.client_gone", client=client_address[0], error=str(exc))
        else:
            log.exception("dashboard.request_failed", client=client_address[0])

    def process_request(self, request: Any, client_address: Any) -> None:
        with self._open_lock:
            self._open.add(request)
        super().process_request(request, client_address)

    def shutdown_request(self, request: Any) -> None:
        with self._open_lock:
            self._open.discard(request)
        super().shutdown_request(request)

    @property
    def url(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.server_port}/"

    def start(self) -> DashboardServer:
        self.sampler.start()
        self._thread = threading.Thread(
            target=self.serve_forever, args=(self.poll_interval,), name="shardq-http", daemon=True
        )
        self._thread.start()
        return self

    def stop(self) -> None:
        if self._thread is not None:
            self.shutdown()
            self._thread.join(timeout=10)
            self._thread = None
        with self._open_lock:  # a browser's connection kept alive is answered no more
            connections, self._open = self._open, set()
        for connection in connections:
            with suppress(OSError):
                connection.shutdown(socket.SHUT_RDWR)
        self.server_close()
        self.sampler.stop()


class Handler(BaseHTTPRequestHandler):
    server: DashboardServer
    server_version = "shardq-dashboard"
    protocol_version = "HTTP/1.1"
    timeout = 30  # idle keep-alive connections close after this

    def _dispatch(self) -> None:
        """Answer any method; the path says which methods it allows (``_allowed``)."""
        method = self.command
        try:
            url = urlsplit(self.path)
            parts = [unquote(p) for p in url.path.strip("/").split("/")] if url.path != "/" else []
            self._check_host()
            morgue = parts[:3] == ["api", "v1", "morgue"]
            if method == "POST" or morgue:
                self._check_access(method)
            allow = _allowed(parts)
            if method not in allow.split(", "):
                raise HttpError(405, f"{method} is not allowed on {url.path}; use {allow}", allow)
            if parts in ([], ["index.html"]):
                return self._send(200, self.server.page, "text/html; charset=utf-8")
            if parts == ["api", "v1", "stats"]:
                return self._json(200, self.server.sampler.snapshot())
            if parts == ["api", "v1", "nodes"]:
                return self._json(200, self.server.sampler.nodes())
            if morgue and allow == "GET":
                return self._json(200, morgue_page(self.server.app, parts[3], parse_qs(url.query)))
            if morgue and allow == "POST":
                lock, app = self.server.morgue_lock, self.server.app
                return self._json(200, morgue_act(app, parts[3], parts[4], self._body, lock))
            raise HttpError(404, f"no such page or endpoint: {url.path}")
        except HttpError as exc:
            self._json(exc.status, {"error": str(exc)}, exc.allow)
        except SelectionError as exc:  # a morgue query or body that says no clear selection
            self._json(400, {"error": str(exc)})
        except SampleUnavailable as exc:
            self._json(503, {"error": str(exc)})
        except UnknownWorkerError as exc:
            self._json(404, {"error": str(exc)})
        except ShardqError as exc:
            log.warning("dashboard.broker_error", path=self.path, error=str(exc))
            self._json(502, {"error": f"{type(exc).__name__}: {exc}"})
        except Exception as exc:
            log.exception("dashboard.request_failed", path=self.path)
            self._json(500, {"error": f"internal error: {type(exc).__name__}: {exc}"})

    do_GET = do_POST = do_HEAD = _dispatch

    def send_error(self, code: int, message: str | None = None, explain: str | None = None) -> None:
        """A method with no ``do_<METHOD>`` (PUT, DELETE, ...) is a JSON 405, not a 501."""
        if code == 501 and getattr(self, "command", None):
            return self._dispatch()
        super().send_error(code, message, explain)

    def _check_host(self) -> None:
        """Without a token, answer only requests addressed to a loopback name."""
        if not self.server.token and not _is_loopback_name(self.headers["Host"] or ""):
            raise HttpError(403, "the Host header is not a loopback address (set a token)")

    def _check_access(self, method: str) -> None:
        """Actions, and dead jobs' payloads, need the token when one is configured;
        without one, a POST must not come from another origin."""
        if self.server.token:
            scheme, _, given = self.headers.get("Authorization", "").partition(" ")
            token = self.server.token.encode()
            if scheme.lower() != "bearer" or not hmac.compare_digest(given.strip().encode(), token):
                raise HttpError(401, "this needs the header 'Authorization: Bearer <token>'")
            return
        origin = self.headers.get("Origin")
        host = self.headers["Host"].lower()  # a loopback name: checked before
        if method == "POST" and origin is not None and urlsplit(origin).netloc.lower() != host:
            raise HttpError(403, f"cross-origin request refused (Origin {origin})")

    def _body(self) -> Any:
        """The JSON body; refused unless its length is given and it is all there."""
        lengths = set(self.headers.get_all("Content-Length") or [])
        if not lengths or self.headers.get("Transfer-Encoding") is not None:
            raise HttpError(
                411, "a POST needs a Content-Length header and a JSON body (not chunked)"
            )
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
            return parse_json(raw)
        except ValueError as exc:
            raise HttpError(400, f"the request body is {exc}") from None

    def _json(self, status: int, doc: Any, allow: str | None = None) -> None:
        data = json.dumps(doc, default=str, allow_nan=False).encode()
        self._send(status, data, "application/json", allow)

    def _send(self, status: int, data: bytes, kind: str, allow: str | None = None) -> None:
        if self.command not in ("GET", "HEAD") and status >= 400:
            self.close_connection = True  # the body may not have been read
        self.send_response(status)
        extra = {"Allow": allow} if allow else {}
        headers = {**HEADERS, **extra, "Content-Type": kind, "Content-Length": len(data)}
        for name, value in headers.items():
            self.send_header(name, str(value))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(data)

    def log_message(self, format: str, *args: Any) -> None:
        log.debug("dashboard.request", client=self.client_address[0], line=format % args)


def _allowed(parts: list[str]) -> str:
    """The methods served at a path (split on ``/``), as a 405's ``Allow`` names them."""
    morgue = parts[:3] == ["api", "v1", "morgue"]
    if morgue and len(parts) == 5 and parts[4] in DONE:  # an action
        return "POST"
    if parts in ([], ["index.html"], ["api", "v1", "stats"], ["api", "v1", "nodes"]):
        return "GET"
    return "GET" if morgue and (len(parts) == 4 or parts[4:] == ["list"]) else "GET, POST"


# -- the morgue's JSON API -----------------------------------------------------------
def morgue_page(app: App, worker: str, query: dict[str, list[str]]) -> dict[str, Any]:
    """``{"jobs": [...], "next": CURSOR or None, "size": N, "size_more": bool}``: the page
    of ``worker``'s dead jobs the query's search, ``limit`` and ``after`` cursor select
    (``size_more``: N is :data:`~shardq.morgue.COUNTED`, and there may be more)."""
    morgue = Morgue(app, worker)
    when = parse_range(_param(query, "since"), _param(query, "until"))
    where = Filter(_param(query, "entity"), _param(query, "error_type"), *when)
    after = selection.cursor(_param(query, "after"))
    page = morgue.page(where, _int_param(query, "limit", 100), after)
    jobs = [_api_record(r, app.signing_key) for r in page.records]
    size = morgue.size()
    return {"jobs": jobs, "next": page.next, "size": size, "size_more": size >= COUNTED}


def morgue_act(
    app: App, worker: str, action: str, body: Callable[[], Any], lock: threading.Lock
) -> dict[str, Any]:
    """Requeue or purge what the body (read once the worker is known) selects, one
    action at a time under ``lock``: ``{"requeued": N}`` or ``{"purged": N}``, with
    ``not_requeued`` (each job left, and why) and ``missing`` (ids naming no dead job)
    when there are any."""
    morgue = Morgue(app, worker)
    where = selection.from_body(body())
    left: list[dict[str, str]] = []

    def refused(record: MorgueRecord, why: str) -> None:
        left.append({"message_id": record.message_id, "entity_id": record.entity_id, "why": why})

    seen: set[str] = set()
    with lock:
        n = act(app, morgue.worker, action, where, refused=refused, seen=seen)
    missing = selection.unmatched(where, seen)
    log.info(
        f"dashboard.morgue_{action}", worker=morgue.worker, scope=selection.scope(where), count=n
    )
    extra = {"not_requeued": left, "missing": missing}
    return {DONE[action]: n, **{key: value for key, value in extra.items() if value}}


def _api_record(record: MorgueRecord, key: bytes | None) -> dict[str, Any]:
    """A dead job as the API shows it: a record that is not shardq's, or whose payload
    cannot be read or carried in JSON (NaN, nested too deeply), is ``unreadable`` with
    its ``raw`` text."""
    doc = record_dict(record, key)
    try:
        json.dumps(doc["payload"], allow_nan=False)
    except (ValueError, RecursionError):
        doc["payload"] = None
    unreadable = record.reason == REASON_UNREADABLE or doc["payload"] is None
    return {**doc, "unreadable": unreadable, "raw": record.body[:MAX_RAW] if unreadable else None}


def _param(query: dict[str, list[str]], name: str) -> str | None:
    return query.get(name, [""])[-1] or None


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
    if not MIN_REFRESH <= refresh <= MAX_REFRESH:  # NaN too
        raise ConfigError(
            f"--refresh must be a positive number of seconds from {MIN_REFRESH:g} to "
            f"{MAX_REFRESH:g} (the pause after each sample), got {refresh:g}"
        )
    urls = list(scrape)
    for url in urls:
        if urlsplit(url).scheme not in ("http", "https"):
            raise ConfigError(f"--scrape {url!r}: expected an http(s):// metrics URL")
    try:
        return DashboardServer(app, host, port, token, Sampler(app, refresh, urls))
    except (OSError, OverflowError) as exc:  # OverflowError: a port beyond 0-65535
        raise ConfigError(f"cannot serve the dashboard on {host}:{port}: {exc}") from None


def serve(app: App, **options: Any) -> None:
    """Serve the dashboard (``options`` as :func:`make_server` takes them) until Ctrl-C
    or SIGTERM."""
    server = make_server(app, **options)
    stop = StopSignals(threading.Event(), (signal.SIGINT, signal.SIGTERM))
    with stop.installed():  # a second signal: exit at once
        server.start()
        scrape = len(server.sampler.scrape)
        log.info("dashboard.started", url=server.url, token=bool(server.token), scrape=scrape)
        try:
            while not stop.stopping.wait(0.5):
                pass
        finally:
            server.stop()
            log.info("dashboard.stopped")
