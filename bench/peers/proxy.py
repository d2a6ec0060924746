"""A counting HTTP/1.1 reverse proxy for SQS, bound to 127.0.0.1.

Every client (boto3, botocore, kombu's pycurl client) sends its SQS requests here
instead of to the emulator. The proxy counts each request by SQS action and forwards
it unchanged to the upstream emulator over one upstream connection per client
connection (keep-alive on both sides). The action comes from the ``X-Amz-Target``
header (JSON protocol, ``AmazonSQS.ReceiveMessage``) or from ``Action=`` in the query
string or the form body (query protocol). ReceiveMessage answers are also sorted into
"with messages" and "empty" by looking for a receipt handle in the response body.

Counts are served at ``GET /__proxy/counts`` (JSON, never forwarded), so a driver can
snapshot them before and after each phase and take the difference.
``GET /__proxy/queues`` serves the same requests counted per queue, keyed
``"<queue name> <action>"`` plus a detail where one applies: ReceiveMessage gets
``:with-messages`` or ``:empty`` and ``:vt=<VisibilityTimeout>`` when the request sets
one; ChangeMessageVisibilityBatch gets ``:vt=<timeouts of its entries>`` (distinct,
sorted). The queue comes from ``QueueUrl`` or ``QueueName`` in the request (requests
naming no queue count under ``-``).

``--latency-ms MS`` holds every forwarded request for MS milliseconds before sending it
upstream (each connection on its own, so concurrent requests wait concurrently): an
emulator on the same machine then answers about as late as SQS in the same region.
The counts endpoint is answered at once.

Run (the runner does this itself and stops it by its pid)::

    python bench/peers/proxy.py --upstream http://127.0.0.1:4566 [--port 0] [--latency-ms 20]

It prints ``PROXY <port>`` on stdout once it listens.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import re
import sys
import time
from collections import Counter
from typing import Any
from urllib.parse import parse_qs, urlsplit

COUNTS: Counter[str] = Counter()
QUEUES: Counter[str] = Counter()  # "<queue> <action>[:detail]"
MESSAGE_ID = re.compile(rb'"MessageId"\s*:\s*"([^"]+)"')
GROUP_ID = re.compile(rb'"MessageGroupId"\s*:\s*"([^"]+)"')
LOG: list = []  # [file] when --log is given: one line per request
HOP = {b"connection", b"keep-alive", b"proxy-connection", b"expect", b"transfer-encoding"}


async def read_head(reader: asyncio.StreamReader) -> bytes | None:
    try:
        return await reader.readuntil(b"\r\n\r\n")
    except asyncio.IncompleteReadError as exc:
        if exc.partial.strip():
            raise
        return None


def parse_head(head: bytes) -> tuple[bytes, list[tuple[bytes, bytes]]]:
    lines = head[:-4].split(b"\r\n")
    headers = []
    for line in lines[1:]:
        name, _, value = line.partition(b":")
        headers.append((name.strip(), value.strip()))
    return lines[0], headers


def header(headers: list[tuple[bytes, bytes]], name: bytes) -> bytes | None:
    for key, value in headers:
        if key.lower() == name:
            return value
    return None


async def read_body(
    reader: asyncio.StreamReader, headers: list[tuple[bytes, bytes]], *, until_eof: bool
) -> bytes:
    te = header(headers, b"transfer-encoding")
    if te is not None and b"chunked" in te.lower():
        chunks = []
        while True:
            size_line = await reader.readuntil(b"\r\n")
            size = int(size_line.split(b";")[0].strip(), 16)
            if size == 0:
                while (await reader.readuntil(b"\r\n")) != b"\r\n":  # trailers
                    pass
                break
            chunks.append(await reader.readexactly(size))
            await reader.readexactly(2)
        return b"".join(chunks)
    length = header(headers, b"content-length")
    if length is not None:
        return await reader.readexactly(int(length))
    return await reader.read() if until_eof else b""


def action_of(request_line: bytes, headers: list[tuple[bytes, bytes]], body: bytes) -> str:
    target = header(headers, b"x-amz-target")
    if target:
        return target.decode().rsplit(".", 1)[-1]
    parts = request_line.split(b" ")
    query = urlsplit(parts[1].decode() if len(parts) > 1 else "").query
    action = parse_qs(query).get("Action")
    if not action and body:
        action = parse_qs(body.decode("utf-8", "replace")).get("Action")
    return action[0] if action else "unknown"


def request_fields(headers: list[tuple[bytes, bytes]], body: bytes) -> dict[str, Any]:
    """The request's parameters: the JSON body (JSON protocol) or the form (query protocol)."""
    if not body:
        return {}
    target = header(headers, b"x-amz-target")
    if target:
        try:
            fields = json.loads(body)
        except ValueError:
            return {}
        return fields if isinstance(fields, dict) else {}
    form = parse_qs(body.decode("utf-8", "replace"))
    return {k: v[0] for k, v in form.items()}


def queue_key(action: str, fields: dict[str, Any], answer: bytes) -> str:
    """``"<queue> <action>[:detail]"`` for the per-queue counts (see the module doc)."""
    url = fields.get("QueueUrl") or ""
    queue = str(url).rstrip("/").rsplit("/", 1)[-1] if url else str(fields.get("QueueName", "-"))
    key = f"{queue} {action}"
    if action == "ReceiveMessage":
        key += ":with-messages" if b"ReceiptHandle" in answer else ":empty"
        if "VisibilityTimeout" in fields:
            key += f":vt={fields['VisibilityTimeout']}"
    elif action == "ChangeMessageVisibilityBatch":
        entries = fields.get("Entries") or []
        if isinstance(entries, list):
            timeouts = sorted(
                {str(e.get("VisibilityTimeout")) for e in entries if isinstance(e, dict)}
            )
            key += ":vt=" + ",".join(timeouts)
    return key


def rebuild(start: bytes, headers: list[tuple[bytes, bytes]], body: bytes) -> bytes:
    out = [start]
    for key, value in headers:
        if key.lower() in HOP or key.lower() == b"content-length":
            continue
        out.append(key + b": " + value)
    out.append(b"Content-Length: " + str(len(body)).encode())
    return b"\r\n".join(out) + b"\r\n\r\n" + body


async def handle(
    client_r: asyncio.StreamReader,
    client_w: asyncio.StreamWriter,
    upstream: tuple[str, int],
    latency: float = 0.0,
) -> None:
    up_r = up_w = None
    try:
        while True:
            head = await read_head(client_r)
            if head is None:
                return
            start, headers = parse_head(head)
            if start.startswith((b"GET /__proxy/counts", b"GET /__proxy/queues")):
                counts = QUEUES if start.startswith(b"GET /__proxy/queues") else COUNTS
                payload = json.dumps(counts).encode()
                client_w.write(
                    b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: "
                    + str(len(payload)).encode()
                    + b"\r\n\r\n"
                    + payload
                )
                await client_w.drain()
                continue
            expect = header(headers, b"expect")
            if expect is not None and expect.lower() == b"100-continue":
                client_w.write(b"HTTP/1.1 100 Continue\r\n\r\n")
                await client_w.drain()
            body = await read_body(client_r, headers, until_eof=False)
            action = action_of(start, headers, body)
            COUNTS[action] += 1
            if latency > 0:
                await asyncio.sleep(latency)
            if up_w is None:
                up_r, up_w = await asyncio.open_connection(*upstream)
            up_w.write(rebuild(start, headers, body))
            await up_w.drain()
            rhead = await read_head(up_r)
            if rhead is None:
                raise ConnectionError("upstream closed the connection")
            rstart, rheaders = parse_head(rhead)
            status = rstart.split(b" ")[1] if b" " in rstart else b"000"
            bodyless = start.startswith(b"HEAD ") or status in (b"204", b"304")
            rbody = b"" if bodyless else await read_body(up_r, rheaders, until_eof=True)
            if action == "ReceiveMessage":
                got = b"ReceiptHandle" in rbody
                COUNTS["ReceiveMessage:" + ("with-messages" if got else "empty")] += 1
            fields = request_fields(headers, body)
            QUEUES[queue_key(action, fields, rbody)] += 1
            if LOG:
                peer = client_w.get_extra_info("peername")
                ids = MESSAGE_ID.findall(rbody) if action == "ReceiveMessage" else []
                ids += GROUP_ID.findall(body) if action == "SendMessage" else []
                LOG[0].write(
                    f"{time.time():.3f} {peer[1]} {action} {status.decode()} "
                    f"queue={queue_key(action, fields, rbody).split(' ', 1)[0]} "
                    f"handles={rbody.count(b'ReceiptHandle')} "
                    f"ids/groups={[i.decode()[:8] for i in ids]}\n"
                )
            client_w.write(rebuild(rstart, rheaders, rbody))
            await client_w.drain()
            conn = header(rheaders, b"connection")
            if conn is not None and conn.lower() == b"close":
                up_w.close()
                up_r = up_w = None
    except (ConnectionError, asyncio.IncompleteReadError, asyncio.LimitOverrunError):
        return
    finally:
        for writer in (client_w, up_w):
            if writer is not None:
                writer.close()
                with contextlib.suppress(Exception):
                    await writer.wait_closed()


async def serve(port: int, upstream: str, latency: float = 0.0) -> None:
    parts = urlsplit(upstream)
    target = (parts.hostname or "127.0.0.1", parts.port or 80)
    server = await asyncio.start_server(
        lambda r, w: handle(r, w, target, latency), "127.0.0.1", port, limit=2**24, backlog=512
    )
    bound = server.sockets[0].getsockname()[1]
    print(f"PROXY {bound}", flush=True)
    async with server:
        await server.serve_forever()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--upstream", required=True, help="emulator URL, http://127.0.0.1:PORT")
    parser.add_argument("--port", type=int, default=0, help="port on 127.0.0.1 (0: any free)")
    parser.add_argument("--log", help="write one line per request here (for debugging)")
    parser.add_argument(
        "--latency-ms",
        type=float,
        default=0.0,
        help="hold each request this long before forwarding it (default 0)",
    )
    args = parser.parse_args()
    if args.latency_ms < 0:
        parser.error(f"--latency-ms must be >= 0, got {args.latency_ms}")
    if args.log:
        LOG.append(open(args.log, "w", buffering=1))  # noqa: SIM115
    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(serve(args.port, args.upstream, args.latency_ms / 1000.0))
    sys.exit(0)


if __name__ == "__main__":
    main()
