"""A WSGI app (stdlib ``wsgiref``) that turns status changes into shardq jobs.

    POST /orders/<order_id>/status   {"status": "paid", ...}
      202 {"order_id": ..., "message_id": ...}    published; a node applies it later
      400 {"error": ...}   body is not JSON, or shardq refused the job (bad order id,
                           payload it cannot carry); nothing was published

    python -m examples.web_publisher.server [--host 127.0.0.1] [--port 8000]

``--port 0`` picks a free port; the first line printed says which.
"""

from __future__ import annotations

import argparse
import json
import signal
import threading
from collections.abc import Callable, Iterable
from typing import Any
from wsgiref.simple_server import make_server

import shardq
from examples.web_publisher.tasks import ApplyOrderStatus

#: Bodies up to this size reach shardq, which refuses jobs over the queue limit (1 MiB).
MAX_BODY_BYTES = 2 * 1024 * 1024

StartResponse = Callable[..., Any]


def application(environ: dict[str, Any], start_response: StartResponse) -> Iterable[bytes]:
    # WSGI gives PATH_INFO percent-decoded, as latin-1; get the real characters back
    path = environ.get("PATH_INFO", "").encode("latin-1").decode("utf-8", "replace")
    parts = path.split("/")
    if len(parts) != 4 or parts[:2] != ["", "orders"] or parts[3] != "status" or not parts[2]:
        return respond(start_response, 404, {"error": "try POST /orders/<order_id>/status"})
    if environ["REQUEST_METHOD"] != "POST":
        return respond(start_response, 405, {"error": "use POST"}, [("Allow", "POST")])
    order_id = parts[2]
    try:
        length = int(environ.get("CONTENT_LENGTH") or 0)
    except ValueError:
        return respond(start_response, 400, {"error": "bad Content-Length"})
    if length > MAX_BODY_BYTES:
        return respond(start_response, 413, {"error": f"body over {MAX_BODY_BYTES} bytes"})
    body = environ["wsgi.input"].read(length)
    try:
        change = json.loads(body)
    except ValueError as exc:  # JSONDecodeError, or bytes that are not UTF-8
        return respond(start_response, 400, {"error": f"body is not JSON: {exc}"})
    if not isinstance(change, dict) or not isinstance(change.get("status"), str):
        return respond(start_response, 400, {"error": 'expected {"status": "<text>", ...}'})
    try:
        message_id = ApplyOrderStatus.publish(
            order_id, change, dedup_id=environ.get("HTTP_IDEMPOTENCY_KEY")
        )
    except (shardq.InvalidEntityIdError, shardq.PayloadError) as exc:
        # raised before anything is sent: the order id cannot be an SQS group id, or the
        # payload is not strict JSON (NaN, Infinity) or too large for the queue
        return respond(start_response, 400, {"error": str(exc)})
    except shardq.BrokerError as exc:
        return respond(start_response, 503, {"error": f"broker unavailable: {exc}"})
    return respond(start_response, 202, {"order_id": order_id, "message_id": message_id})


def respond(
    start_response: StartResponse,
    status: int,
    doc: dict[str, Any],
    headers: list[tuple[str, str]] | None = None,
) -> list[bytes]:
    reasons = {202: "Accepted", 400: "Bad Request", 404: "Not Found", 405: "Method Not Allowed"}
    reasons |= {413: "Content Too Large", 503: "Service Unavailable"}
    body = json.dumps(doc).encode("utf-8") + b"\n"
    start_response(
        f"{status} {reasons[status]}",
        [
            ("Content-Type", "application/json"),
            ("Content-Length", str(len(body))),
            *(headers or []),
        ],
    )
    return [body]


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m examples.web_publisher.server")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8000, help="0 picks a free port")
    args = parser.parse_args(argv)
    with make_server(args.host, args.port, application) as server:

        def stop(signum: int, frame: Any) -> None:
            # Not an exception: wsgiref swallows exceptions raised while it finishes a
            # request. shutdown() waits for serve_forever to return, so call it from
            # another thread.
            threading.Thread(target=server.shutdown, daemon=True).start()

        signal.signal(signal.SIGTERM, stop)
        signal.signal(signal.SIGINT, stop)
        print(f"listening on http://{args.host}:{server.server_port}", flush=True)
        server.serve_forever()


if __name__ == "__main__":
    main()
