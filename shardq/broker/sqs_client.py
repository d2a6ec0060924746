"""The boto3 clients of the SQS broker and the DynamoDB state store: bounded timeouts and
retries, so an endpoint that never answers fails a call in seconds, not minutes."""

from __future__ import annotations

import platform
import threading
from typing import Any, Literal

import boto3
import botocore
import botocore.config
import botocore.exceptions

from shardq.core.clock import Clock, monotonic
from shardq.core.config import CONNECT_TIMEOUT, READ_TIMEOUT
from shardq.core.limits import MAX_WAIT_SECONDS
from shardq.core.version import VERSION

#: What botocore raises when an attempt did not connect or was not answered in time.
TIMEOUTS = (botocore.exceptions.ConnectTimeoutError, botocore.exceptions.ReadTimeoutError)
#: Attempts per call, the first included (botocore's adaptive retry mode).
CALL_ATTEMPTS = 2
#: Connections each client keeps open.
MAX_CONNECTIONS = 50
#: A long poll's wait for its answer: the longest poll plus a margin.
POLL_READ_TIMEOUT = MAX_WAIT_SECONDS + 5
_USER_AGENT = f"shardq/{VERSION} botocore/{botocore.__version__} Python/{platform.python_version()}"


def worst_call_seconds(connect: float = CONNECT_TIMEOUT, read: float = READ_TIMEOUT) -> float:
    """The longest one call that is not a long poll can take before it fails (17 s by
    default): every attempt may take both timeouts, and botocore backs off at most
    2^(n-1) s after attempt n."""
    backoff = sum(2 ** (n - 1) for n in range(1, CALL_ATTEMPTS))
    return float(CALL_ATTEMPTS * (connect + read) + backoff)


class Unanswered:
    """An endpoint that let a whole call time out, remembered for ``hold`` seconds (0: off,
    unless a one-shot command turns it on): later calls to it fail at once with that
    error, so the command fails within one call's ``bound``."""

    def __init__(self, clock: Clock = monotonic, bound: float | None = None) -> None:
        self.hold = 0.0
        self.bound = worst_call_seconds() if bound is None else bound
        self._clock = clock
        self._lock = threading.Lock()
        self._errors: dict[str, tuple[float, str]] = {}

    def fail_fast(self) -> None:
        """Turn it on: for the bound of one call."""
        self.hold = self.bound

    def record(self, endpoint: str, error: str) -> None:
        with self._lock:
            self._errors[endpoint] = (self._clock(), error)

    def earlier(self, endpoint: str) -> str | None:
        """The error of a call to ``endpoint`` that timed out less than ``hold`` ago."""
        if not self.hold:  # off: a node's calls ask no lock
            return None
        with self._lock:
            seen = self._errors.get(endpoint)
        if seen is None or self._clock() - seen[0] >= self.hold:
            return None
        ago = self._clock() - seen[0]
        return f"{seen[1]} (not asked again: that endpoint timed out {ago:.0f} s ago)"


def make_client(
    service: Literal["sqs", "dynamodb"],
    region: str | None,
    endpoint_url: str | None,
    *,
    connect: float = CONNECT_TIMEOUT,
    read: float = READ_TIMEOUT,
) -> Any:
    """A boto3 client of ``service`` (``sqs``, ``dynamodb``) with these timeouts and
    adaptive retries; botocore's NoRegionError if no region is known."""
    config = botocore.config.Config(
        # Few quick retries: callers retry on their own terms (the leases back off per
        # message), and a request stuck in long retries holds a thread.
        retries={"mode": "adaptive", "total_max_attempts": CALL_ATTEMPTS},
        max_pool_connections=MAX_CONNECTIONS,
        connect_timeout=connect,
        read_timeout=read,
        parameter_validation=False,  # shardq checks every request itself
        user_agent=_USER_AGENT,  # fixed: botocore otherwise rebuilds it per request
    )
    return boto3.session.Session().client(
        service, region_name=region, endpoint_url=endpoint_url, config=config
    )


def timed_out(
    what: str,
    exc: Exception,
    meaning: str = "",
    service: str = "SQS",
    *,
    connect: float,
    read: float,
) -> str:
    """Why a call to ``service`` that no attempt of got an answer (within these
    timeouts) failed; ``meaning``: what that means for the jobs it was about."""
    return (
        f"{what}: {service} did not answer within {worst_call_seconds(connect, read):.0f} s "
        f"({CALL_ATTEMPTS} attempts, {connect:g} s to connect and {read:g} s to answer each: "
        f"{exc}); check endpoint_url, the network and {service}'s health" + meaning
    )


def bad_region(service: str, exc: Exception, where: str) -> str:
    """Why a client of ``service`` could not be made: its region (set in ``where``)."""
    return (
        f"cannot make the {service} client: its AWS region is not valid ({exc}); check "
        f"{where} (a region such as us-east-1)"
    )


def unloadable(service: str, exc: Exception) -> str:
    """Why a client of ``service`` could not be made from boto3's settings."""
    return (
        f"cannot make the {service} client: boto3 could not load the AWS settings ({exc}); "
        "check AWS_PROFILE, the AWS_* variables and ~/.aws (credentials go there, never "
        "in shardq.yaml)"
    )


def no_credentials(what: str) -> str:
    return (
        f"{what}: no AWS credentials found; configure them for boto3 (environment, "
        "~/.aws/credentials or an instance role), never in shardq.yaml"
    )
