"""Amazon SQS FIFO through boto3 (clients and timeouts: :mod:`shardq.broker.sqs_client`);
credentials only from boto3's default chain."""

from __future__ import annotations

import math
import threading
import time
import uuid
from collections import Counter
from collections.abc import Callable, Sequence
from contextlib import suppress
from typing import Any

import botocore.exceptions

from shardq.broker.base import (
    BatchResult,
    Broker,
    Message,
    QueueCounts,
    QueueSettings,
    SendEntry,
    SendResult,
    check_batch,
    check_receive,
    valid_entries,
)
from shardq.broker.sqs_client import (
    POLL_READ_TIMEOUT,
    TIMEOUTS,
    Unanswered,
    bad_region,
    make_client,
    no_credentials,
    timed_out,
    unloadable,
    worst_call_seconds,
)
from shardq.core.config import CONNECT_TIMEOUT, READ_TIMEOUT, check_timeouts
from shardq.core.errors import BrokerError, QueueNotFoundError
from shardq.core.limits import MAX_RETENTION_SECONDS, MAX_WAIT_SECONDS

_SYSTEM_ATTRIBUTES = [
    "ApproximateReceiveCount",
    "SentTimestamp",
    "MessageGroupId",
    "SequenceNumber",
]
#: What a failed call means for its jobs, by the first word of what it was doing.
_SAFE = {
    "sending": "; whether it was queued is unknown: sent again with the same dedup ids "
    "within 5 minutes, each job is queued once",
    "receiving": "; queued jobs are not lost",
    "deleting": "; the jobs stay queued and may run again",
    "changing": "; the jobs keep their current visibility",
}
_MISSING_QUEUE = {"AWS.SimpleQueueService.NonExistentQueue", "QueueDoesNotExist"}
#: Queue attributes read by :meth:`SqsBroker.queue_settings`, with SQS's defaults.
_SETTINGS = {
    "FifoQueue": "false",
    "VisibilityTimeout": "30",
    "MaximumMessageSize": "262144",
    "ContentBasedDeduplication": "false",
    "MessageRetentionPeriod": "345600",
    "RedrivePolicy": "",
}


class SqsBroker(Broker):
    """SQS FIFO queues in one account and region; ``connect_timeout`` and
    ``read_timeout`` (seconds) bound each attempt of a call that is not a long poll.
    Every HTTP request is counted in :attr:`requests`, per operation."""

    kind = "sqs"
    # The deletes of one receive's jobs share a request (docs/design/broker.md).
    settle_linger = 0.1
    prefetch_wait = 1.0

    def __init__(
        self,
        *,
        region: str | None = None,
        endpoint_url: str | None = None,
        connect_timeout: float = CONNECT_TIMEOUT,
        read_timeout: float = READ_TIMEOUT,
    ) -> None:
        check_timeouts("SqsBroker", connect_timeout, read_timeout)
        self.connect_timeout, self.read_timeout = connect_timeout, read_timeout
        try:
            # Long polls wait up to 20 s for an answer by design: a client of their own.
            self.client, self._poll_client = (
                make_client("sqs", region, endpoint_url, connect=connect_timeout, read=read)
                for read in (read_timeout, POLL_READ_TIMEOUT)
            )
        except botocore.exceptions.NoRegionError as exc:
            raise BrokerError(
                "no AWS region for SQS: set `region` in shardq.yaml, SHARDQ_REGION or "
                "AWS_DEFAULT_REGION"
            ) from exc
        except botocore.exceptions.InvalidRegionError as exc:
            where = "`region` in shardq.yaml, SHARDQ_REGION and AWS_DEFAULT_REGION"
            raise BrokerError(bad_region("SQS", exc, where)) from exc
        except botocore.exceptions.BotoCoreError as exc:  # half a key, an unknown profile
            raise BrokerError(unloadable("SQS", exc)) from exc
        self.endpoint_url = endpoint_url
        #: Shared with the app's DynamoDB store on the same endpoint (see ``store_for``).
        self.unanswered = Unanswered(bound=worst_call_seconds(connect_timeout, read_timeout))
        self.requests: Counter[str] = Counter()
        self._count_lock = threading.Lock()
        for client in (self.client, self._poll_client):
            client.meta.events.register("before-send.sqs.*", self._count_request)
        self._urls: dict[str, str] = {}
        self._missing: set[str] = set()  # queues a lookup just found missing
        self._attribute_cache: dict[tuple[str, str], int] = {}

    def _count_request(self, event_name: str = "", **_: Any) -> None:
        with self._count_lock:
            self.requests[event_name.rsplit(".", 1)[-1]] += 1

    def _call(self, what: str, fn: Callable[..., Any], **kwargs: Any) -> Any:
        endpoint = self.client.meta.endpoint_url
        earlier = self.unanswered.earlier(endpoint)
        if earlier is not None:
            raise BrokerError(f"{what}: not sent: {earlier}")
        try:
            return fn(**kwargs)
        except botocore.exceptions.ClientError as exc:
            code = _code(exc)
            if code in _MISSING_QUEUE:
                raise QueueNotFoundError(
                    f"{what}: the SQS queue does not exist; run `shardq queues ensure`"
                ) from exc
            raise BrokerError(f"{what}: SQS answered {code}: {exc}") from exc
        except botocore.exceptions.NoCredentialsError as exc:
            raise BrokerError(no_credentials(what)) from exc
        except TIMEOUTS as exc:
            error = timed_out(
                what, exc, _meaning(what), connect=self.connect_timeout, read=self.read_timeout
            )
            self.unanswered.record(endpoint, error)
            raise BrokerError(error) from exc
        except botocore.exceptions.BotoCoreError as exc:
            raise BrokerError(f"{what}: cannot reach SQS ({exc}){_meaning(what)}") from exc

    def url(self, queue: str) -> str:
        """The queue's URL (looked up once, then cached)."""
        return self._urls.get(queue) or self._look_up(queue)

    def _look_up(self, queue: str) -> str:
        """The queue's URL, asked of SQS; a miss is remembered for ``ensure_queue``."""
        what = f"looking up queue {queue}"
        try:
            found = self._call(what, self.client.get_queue_url, QueueName=queue)
        except QueueNotFoundError:
            self._missing.add(queue)
            raise
        self._missing.discard(queue)
        self._urls[queue] = _queue_url(what, found)
        return self._urls[queue]

    def ensure_queue(
        self, name: str, *, visibility_timeout: int = 30, max_message_bytes: int | None = None
    ) -> None:
        attributes = {
            "FifoQueue": "true",
            "ContentBasedDeduplication": "false",
            "VisibilityTimeout": str(int(visibility_timeout)),
            "MessageRetentionPeriod": str(MAX_RETENTION_SECONDS),
        }
        if max_message_bytes is not None:
            attributes["MaximumMessageSize"] = str(max_message_bytes)
        what = f"creating queue {name}"
        # one that exists is used as it is, with no CreateQueue: a role may not allow it;
        # one just found missing (queue_settings) is created without a second look
        with suppress(QueueNotFoundError):
            if name not in self._missing:
                self._look_up(name)
                return
        self._missing.discard(name)
        try:
            response = self._call(
                what, self.client.create_queue, QueueName=name, Attributes=attributes
            )
            self._urls[name] = _queue_url(what, response)
        except BrokerError as exc:
            if _code(exc.__cause__) not in {"QueueAlreadyExists", "QueueNameExists"}:
                raise
            self.url(name)  # exists with other attributes: use it as it is

    def delete_queue(self, queue: str) -> None:
        try:
            url = self.url(queue)
        except QueueNotFoundError:
            return
        self._call(f"deleting queue {queue}", self.client.delete_queue, QueueUrl=url)
        self._urls.pop(queue, None)

    def _attributes(self, queue: str, *names: str) -> dict[str, str]:
        response = self._call(
            f"reading attributes of {queue}",
            self.client.get_queue_attributes,
            QueueUrl=self.url(queue),
            AttributeNames=list(names),
        )
        return dict(response.get("Attributes", {}))

    def _cached(self, queue: str, name: str) -> int:
        """A queue attribute that shardq never changes, read once."""
        key = (queue, name)
        if key not in self._attribute_cache:
            self._attribute_cache[key] = int(self._attributes(queue, name)[name])
        return self._attribute_cache[key]

    def queue_settings(self, queue: str) -> QueueSettings | None:
        try:
            attrs = {**_SETTINGS, **self._attributes(queue, *_SETTINGS)}
        except QueueNotFoundError:
            return None
        return QueueSettings(
            fifo=attrs["FifoQueue"] == "true",
            visibility_timeout=int(attrs["VisibilityTimeout"]),
            max_message_bytes=int(attrs["MaximumMessageSize"]),
            content_based_dedup=attrs["ContentBasedDeduplication"] == "true",
            retention_seconds=int(attrs["MessageRetentionPeriod"]),
            redrive_policy=attrs["RedrivePolicy"],
        )

    def retention_seconds(self, queue: str) -> int | None:
        return self._cached(queue, "MessageRetentionPeriod")

    def max_message_bytes(self, queue: str) -> int:
        return self._cached(queue, "MaximumMessageSize")

    def counts(self, queue: str) -> QueueCounts:
        waiting, hidden = "ApproximateNumberOfMessages", "ApproximateNumberOfMessagesNotVisible"
        attrs = self._attributes(queue, waiting, hidden)
        return QueueCounts(int(attrs.get(waiting, 0)), int(attrs.get(hidden, 0)))

    def send_batch(self, queue: str, entries: Sequence[SendEntry]) -> SendResult:
        result = SendResult()
        valid = valid_entries(entries, lambda: self.max_message_bytes(queue), result)
        if not valid:
            return result
        response = self._call(
            f"sending {len(valid)} messages to {queue}",
            self.client.send_message_batch,
            QueueUrl=self.url(queue),
            Entries=[
                {
                    "Id": str(i),
                    "MessageBody": e.body,
                    "MessageGroupId": e.group_id,
                    "MessageDeduplicationId": e.dedup_id,
                }
                for i, e in enumerate(valid)
            ],
        )
        ids = {str(i): e.id for i, e in enumerate(valid)}
        for ok in response.get("Successful", []):
            if ok.get("Id") in ids:  # another Id: reported missing below
                result.message_ids[ids[ok["Id"]]] = ok["MessageId"]
        result.failed.update(_failures([e.id for e in valid], response))
        return result

    def receive(
        self, queue: str, *, max_messages: int, wait_seconds: float, visibility_timeout: float
    ) -> list[Message]:
        check_receive(max_messages, visibility_timeout)
        wait = min(MAX_WAIT_SECONDS, max(0, math.ceil(wait_seconds)))
        # botocore's retries resend the same ReceiveRequestAttemptId
        response = self._call(
            f"receiving from {queue}",
            (self._poll_client if wait > 0 else self.client).receive_message,
            QueueUrl=self.url(queue),
            MaxNumberOfMessages=max_messages,
            WaitTimeSeconds=wait,
            VisibilityTimeout=math.ceil(visibility_timeout),
            MessageSystemAttributeNames=_SYSTEM_ATTRIBUTES,
            ReceiveRequestAttemptId=uuid.uuid4().hex,
        )
        now = time.time()
        return [
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
            for raw in response.get("Messages", [])
            for attrs in [raw.get("Attributes", {})]
        ]

    def delete_batch(self, queue: str, receipts: Sequence[str]) -> BatchResult:
        check_batch(receipts)
        response = self._call(
            f"deleting {len(receipts)} messages from {queue}",
            self.client.delete_message_batch,
            QueueUrl=self.url(queue),
            Entries=[{"Id": str(i), "ReceiptHandle": r} for i, r in enumerate(receipts)],
        )
        return BatchResult(failed=_failures(receipts, response))

    def change_visibility_batch(
        self, queue: str, changes: Sequence[tuple[str, float]]
    ) -> BatchResult:
        receipts = [r for r, _ in changes]
        check_batch(receipts)
        response = self._call(
            f"changing visibility of {len(changes)} messages in {queue}",
            self.client.change_message_visibility_batch,
            QueueUrl=self.url(queue),
            Entries=[
                {"Id": str(i), "ReceiptHandle": r, "VisibilityTimeout": math.ceil(s)}
                for i, (r, s) in enumerate(changes)
            ],
        )
        return BatchResult(failed=_failures(receipts, response))


def _queue_url(what: str, response: dict[str, Any]) -> str:
    url = response.get("QueueUrl")
    if not isinstance(url, str) or not url:
        raise BrokerError(
            f"{what}: the endpoint answered without the queue's URL; is endpoint_url an "
            "SQS endpoint?"
        )
    return url


def _meaning(what: str) -> str:
    """What a failure of the call doing ``what`` means for its jobs (worked out only when
    a call fails)."""
    return _SAFE.get(what.split()[0], "")


def _code(exc: BaseException | None) -> str:
    """The error code of an SQS error answer ("" for any other exception)."""
    if isinstance(exc, botocore.exceptions.ClientError):
        return str(exc.response.get("Error", {}).get("Code", ""))
    return ""


def _failures(keys: Sequence[str], response: dict[str, Any]) -> dict[str, str]:
    """Why SQS did not do each entry of a batch call (its ``Id``: its index), by key."""
    done = {ok["Id"] for ok in response.get("Successful", [])}
    refused = {
        bad["Id"]: f"{bad.get('Code')}: {bad.get('Message')}" for bad in response.get("Failed", [])
    }
    missing = "missing from the batch response"
    return {key: refused.get(str(i), missing) for i, key in enumerate(keys) if str(i) not in done}
