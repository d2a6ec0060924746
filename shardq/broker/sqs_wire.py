"""The hot SQS calls without botocore's per-request pipeline.

A node sends about two requests per ten jobs (a ``ReceiveMessage`` and a
``DeleteMessageBatch``), and botocore spends more CPU on each (events, parameter
handling, endpoint rules, serialising, retry bookkeeping, response parsing) than the
HTTP exchange itself. :class:`Wire` sends ``ReceiveMessage``, ``DeleteMessageBatch``,
``ChangeMessageVisibilityBatch`` and ``SendMessageBatch`` (AWS JSON 1.0, as SQS and
its emulators speak it) with the boto3 client's own parts:

* **learnt from botocore**: the first request of each operation goes through the
  client as usual; as it is sent (``before-send``), its URL, its headers (protocol,
  User-Agent) and the SigV4 scope it was signed with (service, region) become the
  template of that operation. Endpoint, region and credentials resolution therefore
  stay boto3's, whatever configured them (arguments, environment, config files);
* **built like botocore builds it**: the body is ``json.dumps`` of the same
  parameters (what botocore's JSON serializer sends for them), signed by botocore's
  SigV4 signer (``botocore.auth.SigV4Auth``) with the client's own credentials
  (frozen per request, so refreshed credentials are picked up as botocore picks
  them up), and sent through the urllib3 connection pool the client's HTTP session
  uses for that URL (its connections, timeouts, proxy and TLS settings);
* **read like botocore reads it**: a 2xx answer is parsed as JSON; per-entry
  failures come back in it and the broker handles them as before;
* **anything else** (an error status, a connection, TLS or signing failure) makes
  :meth:`Wire.send` return None and the broker sends the request again through the
  client, which retries and raises exactly as it always did. A failed request thus
  costs one request more than through botocore alone.

Only a client the broker builds itself uses the wire (a client passed in may carry
handlers of its own); a request botocore signs with something other than SigV4, and
a botocore without the parts used here, leave every request to the client.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import botocore.auth
import botocore.exceptions
import botocore.handlers
import urllib3.exceptions
from botocore.awsrequest import AWSRequest
from urllib3.util.retry import Retry

#: The operations sent over the wire once learnt.
OPERATIONS = frozenset(
    {"ReceiveMessage", "DeleteMessageBatch", "ChangeMessageVisibilityBatch", "SendMessageBatch"}
)
#: Headers that belong to one request, not to the operation: the signature, the SDK's
#: per-attempt telemetry, the Lambda trace header (added per request, as botocore
#: does) and the body's length.
_PER_REQUEST = frozenset(
    {
        "authorization",
        "x-amz-date",
        "x-amz-security-token",
        "x-amz-content-sha256",
        "amz-sdk-invocation-id",
        "amz-sdk-request",
        "x-amzn-trace-id",
        "content-length",
        "transfer-encoding",
    }
)
_SIGV4 = "AWS4-HMAC-SHA256 "
#: botocore's HTTP session methods used to find the pool and target of a URL.
_SESSION_PARTS = ("_get_connection_manager", "_get_request_target", "_setup_ssl_cert")


@dataclass(frozen=True)
class _Template:
    """What botocore sent for an operation, minus what belongs to one request."""

    url: str
    headers: tuple[tuple[str, str], ...]
    service: str  # the SigV4 scope botocore signed with
    region: str
    pool: Any  # the urllib3 pool botocore's HTTP session sends to ``url`` through
    target: str  # the request target on that pool: the path, or the URL via a proxy


class Wire:
    """Sends the hot operations of one boto3 SQS client (thread-safe)."""

    def __init__(self, client: Any, on_request: Callable[[str], None]) -> None:
        self._credentials = client._request_signer._credentials
        self._session = client._endpoint.http_session
        self._on_request = on_request
        self._templates: dict[str, _Template] = {}
        self._lock = threading.Lock()
        for operation in sorted(OPERATIONS):
            client.meta.events.register(f"before-send.sqs.{operation}", self._learn)

    @classmethod
    def attach(cls, client: Any, on_request: Callable[[str], None]) -> Wire | None:
        """A wire for ``client``, or None if it has no credentials or this botocore
        lacks the parts the wire uses."""
        try:
            credentials = client._request_signer._credentials
            session = client._endpoint.http_session
        except AttributeError:
            return None
        if credentials is None or not callable(
            getattr(credentials, "get_frozen_credentials", None)
        ):
            return None
        if not all(callable(getattr(session, name, None)) for name in _SESSION_PARTS):
            return None
        return cls(client, on_request)

    def ready(self, operation: str) -> bool:
        """Whether ``operation`` goes over the wire (botocore has sent it once)."""
        return operation in self._templates

    def _learn(self, request: Any = None, event_name: str = "", **_: Any) -> None:
        """``before-send``: keep what botocore resolved and signed for an operation."""
        operation = event_name.rsplit(".", 1)[-1]
        if request is None or operation not in OPERATIONS or operation in self._templates:
            return
        scope = _sigv4_scope(request.headers.get("Authorization"))
        if request.method != "POST" or not isinstance(request.url, str) or scope is None:
            return  # not what this wire speaks: such requests stay botocore's
        headers = tuple(
            (name, value.decode("utf-8") if isinstance(value, bytes) else str(value))
            for name, value in request.headers.items()
            if name.lower() not in _PER_REQUEST
        )
        try:
            session, url = self._session, request.url
            proxy = session._proxy_config.proxy_url_for(url)
            pool = session._get_connection_manager(url, proxy).connection_from_url(url)
            session._setup_ssl_cert(pool, url, session._verify)
            target = session._get_request_target(url, proxy)
        except Exception:  # another botocore than this was written for: stay with it
            return
        with self._lock:
            self._templates.setdefault(
                operation, _Template(url, headers, scope[0], scope[1], pool, target)
            )

    def send(self, operation: str, params: dict[str, Any]) -> dict[str, Any] | None:
        """The parsed 2xx answer to one request; None if the broker must send it
        through the client instead: not learnt yet, or it failed in any way."""
        template = self._templates.get(operation)
        if template is None:
            return None
        try:
            body = json.dumps(params).encode("utf-8")
        except (TypeError, ValueError):  # a value only botocore's serializer knows (bytes)
            return None
        request = AWSRequest("POST", template.url, headers=dict(template.headers), data=body)
        botocore.handlers.add_recursion_detection_header({"headers": request.headers})
        try:
            credentials = self._credentials.get_frozen_credentials()
            signer = botocore.auth.SigV4Auth(credentials, template.service, template.region)
            signer.add_auth(request)
            headers = dict(request.headers.items())
            headers["Content-Length"] = str(len(body))
            self._on_request(operation)
            response = template.pool.urlopen(
                "POST",
                template.target,
                body=body,
                headers=headers,
                retries=Retry(False),
                assert_same_host=False,
                preload_content=True,
                decode_content=False,
            )
            status, content = response.status, response.data
        except urllib3.exceptions.ClosedPoolError:
            self._forget(operation, template)  # botocore's session replaced it: learn anew
            return None
        except (botocore.exceptions.BotoCoreError, urllib3.exceptions.HTTPError, OSError):
            return None
        if not 200 <= status < 300:
            return None
        return parse(content)

    def _forget(self, operation: str, template: _Template) -> None:
        with self._lock:
            if self._templates.get(operation) is template:
                del self._templates[operation]


def _sigv4_scope(authorization: Any) -> tuple[str, str] | None:
    """(service, region) of a SigV4 ``Authorization`` header, else None."""
    if isinstance(authorization, bytes):
        authorization = authorization.decode("ascii", "replace")
    if not isinstance(authorization, str) or not authorization.startswith(_SIGV4):
        return None
    credential = authorization[len(_SIGV4) :].split(",", 1)[0].strip()
    parts = credential.removeprefix("Credential=").split("/")
    if len(parts) < 5 or parts[-1] != "aws4_request" or not parts[-2] or not parts[-3]:
        return None
    return parts[-2], parts[-3]


def parse(content: bytes) -> dict[str, Any]:
    """A 2xx body as botocore's JSON parser reads it: an empty or unreadable body has
    none of the keys the broker reads."""
    if not content:
        return {}
    try:
        doc = json.loads(content.decode("utf-8"))
    except ValueError:
        return {}
    return doc if isinstance(doc, dict) else {}
