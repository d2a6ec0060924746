"""The boto3 SQS clients of :class:`shardq.broker.sqs.SqsBroker`: bounded timeouts and
retries, so an endpoint that accepts connections and never answers fails a call with a
clear error in seconds (:func:`worst_call_seconds`), not minutes.

Long polls (``ReceiveMessage`` with a wait) get a client of their own whose read timeout
covers the longest poll; every other call gets :data:`READ_TIMEOUT`.
"""

from __future__ import annotations

import platform
from typing import Any

import boto3
import botocore
import botocore.config
import botocore.exceptions

from shardq.errors import BrokerError
from shardq.limits import MAX_WAIT_SECONDS

#: What botocore raises when an attempt did not connect or was not answered in time.
TIMEOUTS = (botocore.exceptions.ConnectTimeoutError, botocore.exceptions.ReadTimeoutError)
#: Seconds to open a connection to SQS, and to wait for the answer to a call that is
#: not a long poll (SQS answers those in milliseconds; an endpoint that accepts and
#: never answers must not hold a command or a web request for minutes).
CONNECT_TIMEOUT = 2
READ_TIMEOUT = 6
#: Attempts per call, the first included (botocore's adaptive retry mode).
CALL_ATTEMPTS = 2
#: A long poll's wait for its answer: the longest poll plus a margin.
POLL_READ_TIMEOUT = MAX_WAIT_SECONDS + 5


def worst_call_seconds() -> float:
    """The longest one call that is not a long poll can take before it fails (17 s):
    every attempt may take both timeouts in full, and botocore backs off at most
    2^(n-1) s after attempt n."""
    backoff = sum(2 ** (n - 1) for n in range(1, CALL_ATTEMPTS))
    return float(CALL_ATTEMPTS * (CONNECT_TIMEOUT + READ_TIMEOUT) + backoff)


def make_client(region: str | None, endpoint_url: str | None, connections: int, read: float) -> Any:
    """A boto3 SQS client with these timeouts, adaptive retries and no per-request
    validation; BrokerError if no region is known."""
    config = botocore.config.Config(
        # Few quick retries: callers retry on their own terms (the leases back off per
        # message), and a request stuck in long retries holds a thread.
        retries={"mode": "adaptive", "total_max_attempts": CALL_ATTEMPTS},
        max_pool_connections=connections,
        connect_timeout=CONNECT_TIMEOUT,
        read_timeout=read,
        # shardq checks every request before it is made (names, sizes, counts):
        # botocore's own validation of each request is pure overhead.
        parameter_validation=False,
        # A fixed User-Agent: botocore otherwise rebuilds it for every request, a sixth
        # of a node's CPU.
        user_agent=_user_agent(),
    )
    try:
        return boto3.session.Session().client(
            "sqs", region_name=region, endpoint_url=endpoint_url, config=config
        )
    except botocore.exceptions.NoRegionError as exc:
        raise BrokerError(
            "no AWS region for SQS: set `region` in shardq.yaml, SHARDQ_REGION or "
            "AWS_DEFAULT_REGION"
        ) from exc


def timed_out(what: str, exc: Exception, meaning: str = "") -> BrokerError:
    """A call SQS did not answer, every attempt of it; ``meaning``: what that means for
    the jobs it was about."""
    return BrokerError(
        f"{what}: SQS did not answer within {worst_call_seconds():.0f} s ({CALL_ATTEMPTS} "
        f"attempts, {CONNECT_TIMEOUT} s to connect and {READ_TIMEOUT} s to answer each: {exc}); "
        "check endpoint_url, the network and SQS's health" + meaning
    )


def _user_agent() -> str:
    from shardq import __version__

    return (
        f"shardq/{__version__} botocore/{botocore.__version__} Python/{platform.python_version()}"
    )
