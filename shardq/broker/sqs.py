"""Amazon SQS FIFO through boto3.

Credentials come only from boto3's default chain (environment, shared files,
instance or task roles); ``region`` and ``endpoint_url`` (for emulators) come from
the config. Every HTTP request to SQS is counted in :attr:`SqsBroker.requests`, per
operation, so benchmarks and metrics can report what a workload costs.

The hot calls (receive, delete, change visibility and send, in batches) go through
boto3 once each, then over the broker's wire (:mod:`shardq.broker.sqs_wire`): the
same requests, signed and sent with the client's own credentials, signer and
connection pool, without botocore's per-request pipeline. Whatever fails there is
sent again through boto3, which retries and raises as usual.
"""

from __future__ import annotations

import math
import threading
import time
from collections import Counter
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

import botocore
import botocore.config
import botocore.exceptions

from shardq.broker import sqs_wire
from shardq.broker.base import (
    BatchResult,
    Broker,
    Message,
    QueueCounts,
    QueueSettings,
    SendEntry,
    SendResult,
    check_batch,
    check_send_batch,
    entry_problem,
)
from shardq.broker.sqs_client import (
    POLL_READ_TIMEOUT,
    READ_TIMEOUT,
    TIMEOUTS,
    make_client,
    timed_out,
)
from shardq.errors import BrokerError, QueueNotFoundError
from shardq.limits import MAX_BATCH_ENTRIES, MAX_WAIT_SECONDS

_T = TypeVar("_T")
_SYSTEM_ATTRIBUTES = [
    "ApproximateReceiveCount",
    "SentTimestamp",
    "MessageGroupId",
    "SequenceNumber",
]
#: What a failed call means for the jobs it was about (by the first word of ``what``).
_SAFE = {
    "sending": "; whether it was queued is unknown: sent again with the same dedup ids "
    "within 5 minutes, each job is queued once",
    "receiving": "; queued jobs are not lost",
    "deleting": "; the jobs stay queued and may run again",
    "changing": "; the jobs keep their current visibility",
}
_METHODS = {
    "ReceiveMessage": "receive_message",
    "DeleteMessageBatch": "delete_message_batch",
    "ChangeMessageVisibilityBatch": "change_message_visibility_batch",
    "SendMessageBatch": "send_message_batch",
}
_MISSING_QUEUE = {"AWS.SimpleQueueService.NonExistentQueue", "QueueDoesNotExist"}


class SqsBroker(Broker):
    """SQS FIFO queues in one account and region."""

    kind = "sqs"
    settle_linger = 0.02
    prefetch_wait = 1.0

    def __init__(
        self,
        *,
        region: str | None = None,
        endpoint_url: str | None = None,
        max_connections: int = 50,
        client: Any = None,
    ) -> None:
        own_client = client is None
        poll_client = client
        if client is None:
            client = make_client(region, endpoint_url, max_connections, READ_TIMEOUT)
            # Long polls wait up to 20 s for an answer by design: their own client.
            poll_client = make_client(region, endpoint_url, max_connections, POLL_READ_TIMEOUT)
        self.client = client
        self._poll_client = poll_client
        self.endpoint_url = endpoint_url
        self.requests: Counter[str] = Counter()
        self._count_lock = threading.Lock()
        for each in {id(client): client, id(poll_client): poll_client}.values():
            each.meta.events.register("before-send.sqs.*", self._count_request)
        # The hot calls skip botocore's per-request pipeline once it has shown how to
        # make them (see shardq.broker.sqs_wire); only on a client built here.
        self._wire = sqs_wire.Wire.attach(client, self._count) if own_client else None
        self._poll_wire = sqs_wire.Wire.attach(poll_client, self._count) if own_client else None
        self._urls: dict[str, str] = {}
        self._sizes: dict[str, int] = {}

    @property
    def wire_operations(self) -> frozenset[str]:
        """The hot operations sent without botocore's per-request pipeline by now (each
        once botocore has sent it; see :mod:`shardq.broker.sqs_wire`)."""
        wires = [w for w in (self._wire, self._poll_wire) if w is not None]
        return frozenset(op for op in sqs_wire.OPERATIONS for w in wires if w.ready(op))

    def _count_request(self, event_name: str = "", **_: Any) -> None:
        self._count(event_name.rsplit(".", 1)[-1])

    def _count(self, operation: str) -> None:
        with self._count_lock:
            self.requests[operation] += 1

    # -- plumbing -------------------------------------------------------------
    def _call(self, what: str, fn: Callable[..., _T], **kwargs: Any) -> _T:
        try:
            return fn(**kwargs)
        except botocore.exceptions.ClientError as exc:
            code = exc.response.get("Error", {}).get("Code", "")
            if code in _MISSING_QUEUE:
                raise QueueNotFoundError(
                    f"{what}: the SQS queue does not exist; run `shardq queues ensure`"
                ) from exc
            raise BrokerError(f"{what}: SQS answered {code}: {exc}") from exc
        except botocore.exceptions.NoCredentialsError as exc:
            raise _no_credentials(what) from exc
        except TIMEOUTS as exc:
            raise timed_out(what, exc, _SAFE.get(what.split()[0], "")) from exc
        except botocore.exceptions.BotoCoreError as exc:
            meaning = _SAFE.get(what.split()[0], "")
            raise BrokerError(f"{what}: cannot reach SQS ({exc}){meaning}") from exc

    def _hot(
        self, what: str, operation: str, *, poll: bool = False, **params: Any
    ) -> dict[str, Any]:
        """One of the hot calls: over the wire when it can, else through the client
        (which also sends again, retries and raises whatever failed on the wire).
        ``poll``: a long poll, sent with the client that waits long enough for it."""
        wire, client = (self._poll_wire, self._poll_client) if poll else (self._wire, self.client)
        if wire is not None:
            response = wire.send(operation, params)
            if response is not None:
                return response
        method: Callable[..., dict[str, Any]] = getattr(client, _METHODS[operation])
        return self._call(what, method, **params)

    def url(self, queue: str) -> str:
        """The queue's URL (looked up once, then cached)."""
        url = self._urls.get(queue)
        if url is None:
            response = self._call(
                f"looking up queue {queue}", self.client.get_queue_url, QueueName=queue
            )
            url = self._urls[queue] = response["QueueUrl"]
        return url

    # -- queues -------------------------------------------------------------
    def ensure_queue(
        self, name: str, *, visibility_timeout: int = 30, max_message_bytes: int | None = None
    ) -> None:
        attributes = {
            "FifoQueue": "true",
            "ContentBasedDeduplication": "false",
            "VisibilityTimeout": str(int(visibility_timeout)),
        }
        if max_message_bytes is not None:
            attributes["MaximumMessageSize"] = str(max_message_bytes)
        try:
            response = self.client.create_queue(QueueName=name, Attributes=attributes)
            self._urls[name] = response["QueueUrl"]
        except botocore.exceptions.ClientError as exc:
            code = exc.response.get("Error", {}).get("Code", "")
            if code not in {"QueueAlreadyExists", "QueueNameExists"}:
                raise BrokerError(f"creating queue {name}: SQS answered {code}: {exc}") from exc
            self.url(name)  # exists with other attributes: use it as it is
        except botocore.exceptions.NoCredentialsError as exc:
            raise _no_credentials(f"creating queue {name}") from exc
        except TIMEOUTS as exc:
            raise timed_out(f"creating queue {name}", exc) from exc
        except botocore.exceptions.BotoCoreError as exc:
            raise BrokerError(f"creating queue {name}: cannot reach SQS ({exc})") from exc

    def delete_queue(self, queue: str) -> None:
        try:
            url = self.url(queue)
        except QueueNotFoundError:
            return
        self._call(f"deleting queue {queue}", self.client.delete_queue, QueueUrl=url)
        self._urls.pop(queue, None)

    def _attributes(self, queue: str, names: list[str]) -> dict[str, str]:
        response = self._call(
            f"reading attributes of {queue}",
            self.client.get_queue_attributes,
            QueueUrl=self.url(queue),
            AttributeNames=names,
        )
        return dict(response.get("Attributes", {}))

    def queue_settings(self, queue: str) -> QueueSettings | None:
        try:
            attrs = self._attributes(
                queue,
                [
                    "FifoQueue",
                    "VisibilityTimeout",
                    "MaximumMessageSize",
                    "ContentBasedDeduplication",
                ],
            )
        except QueueNotFoundError:
            return None
        return QueueSettings(
            fifo=attrs.get("FifoQueue") == "true",
            visibility_timeout=int(attrs.get("VisibilityTimeout", 30)),
            max_message_bytes=int(attrs.get("MaximumMessageSize", 262144)),
            content_based_dedup=attrs.get("ContentBasedDeduplication") == "true",
        )

    def max_message_bytes(self, queue: str) -> int:
        size = self._sizes.get(queue)
        if size is None:
            size = self._sizes[queue] = int(
                self._attributes(queue, ["MaximumMessageSize"])["MaximumMessageSize"]
            )
        return size

    def counts(self, queue: str) -> QueueCounts:
        attrs = self._attributes(
            queue, ["ApproximateNumberOfMessages", "ApproximateNumberOfMessagesNotVisible"]
        )
        return QueueCounts(
            int(attrs.get("ApproximateNumberOfMessages", 0)),
            int(attrs.get("ApproximateNumberOfMessagesNotVisible", 0)),
        )

    # -- messages -------------------------------------------------------------
    def send_batch(self, queue: str, entries: Sequence[SendEntry]) -> SendResult:
        check_send_batch(entries)
        result = SendResult()
        max_bytes = self.max_message_bytes(queue)
        valid = []
        for entry in entries:
            problem = entry_problem(entry, max_bytes)
            if problem:
                result.failed[entry.id] = problem
            else:
                valid.append(entry)
        if not valid:
            return result
        response = self._hot(
            f"sending {len(valid)} messages to {queue}",
            "SendMessageBatch",
            QueueUrl=self.url(queue),
            Entries=[
                {
                    "Id": e.id,
                    "MessageBody": e.body,
                    "MessageGroupId": e.group_id,
                    "MessageDeduplicationId": e.dedup_id,
                }
                for e in valid
            ],
        )
        for ok in response.get("Successful", []):
            result.message_ids[ok["Id"]] = ok["MessageId"]
        for bad in response.get("Failed", []):
            result.failed[bad["Id"]] = f"{bad.get('Code')}: {bad.get('Message')}"
        for entry in valid:  # an entry SQS neither accepted nor refused was not sent
            if entry.id not in result.message_ids and entry.id not in result.failed:
                result.failed[entry.id] = "missing from the SendMessageBatch response"
        return result

    def receive(
        self, queue: str, *, max_messages: int, wait_seconds: float, visibility_timeout: float
    ) -> list[Message]:
        if not 1 <= max_messages <= MAX_BATCH_ENTRIES:
            raise BrokerError(f"max_messages {max_messages} is outside 1..{MAX_BATCH_ENTRIES}")
        wait = min(MAX_WAIT_SECONDS, max(0, math.ceil(wait_seconds)))
        response = self._hot(
            f"receiving from {queue}",
            "ReceiveMessage",
            poll=wait > 0,
            QueueUrl=self.url(queue),
            MaxNumberOfMessages=max_messages,
            WaitTimeSeconds=wait,
            VisibilityTimeout=math.ceil(visibility_timeout),
            MessageSystemAttributeNames=_SYSTEM_ATTRIBUTES,
        )
        messages = []
        now = time.time()
        for raw in response.get("Messages", []):
            attrs = raw.get("Attributes", {})
            messages.append(
                Message(
                    queue=queue,
                    message_id=raw["MessageId"],
                    receipt=raw["ReceiptHandle"],
                    body=raw["Body"],
                    group_id=attrs.get("MessageGroupId", ""),
                    receive_count=int(attrs.get("ApproximateReceiveCount", 1)),
                    sent_at=int(attrs.get("SentTimestamp", 0)) / 1000.0,
                    sequence=attrs.get("SequenceNumber", ""),
                    received_at=now,
                )
            )
        return messages

    def delete_batch(self, queue: str, receipts: Sequence[str]) -> BatchResult:
        check_batch(receipts, list(receipts))
        response = self._hot(
            f"deleting {len(receipts)} messages from {queue}",
            "DeleteMessageBatch",
            QueueUrl=self.url(queue),
            Entries=[{"Id": str(i), "ReceiptHandle": r} for i, r in enumerate(receipts)],
        )
        return _batch_result(receipts, response)

    def change_visibility_batch(
        self, queue: str, changes: Sequence[tuple[str, float]]
    ) -> BatchResult:
        check_batch(changes, [r for r, _ in changes])
        response = self._hot(
            f"changing visibility of {len(changes)} messages in {queue}",
            "ChangeMessageVisibilityBatch",
            QueueUrl=self.url(queue),
            Entries=[
                {"Id": str(i), "ReceiptHandle": r, "VisibilityTimeout": math.ceil(s)}
                for i, (r, s) in enumerate(changes)
            ],
        )
        return _batch_result([r for r, _ in changes], response)


def _no_credentials(what: str) -> BrokerError:
    return BrokerError(
        f"{what}: no AWS credentials found; configure them for boto3 (environment, "
        "~/.aws/credentials or an instance role), never in shardq.yaml"
    )


def _batch_result(receipts: Sequence[str], response: dict[str, Any]) -> BatchResult:
    result = BatchResult()
    done = {ok["Id"] for ok in response.get("Successful", [])}
    reasons = {
        bad["Id"]: f"{bad.get('Code')}: {bad.get('Message')}" for bad in response.get("Failed", [])
    }
    for i, receipt in enumerate(receipts):
        if str(i) not in done:  # refused, or absent from the response: not done
            result.failed[receipt] = reasons.get(str(i), "missing from the batch response")
    return result
