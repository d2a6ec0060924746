"""A node's metrics: Prometheus on ``--metrics-port`` (``/metrics``, each metric with a
``node`` label, gauges computed when scraped), and the ``node.progress`` log line.
"""

from __future__ import annotations

import errno
import threading
from collections.abc import Callable, Iterable
from functools import partial
from typing import Any

import structlog
from prometheus_client import CollectorRegistry, Counter, Histogram, start_http_server
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

from shardq.core.clock import Clock, monotonic, wall
from shardq.core.errors import MetricsServerError
from shardq.core.outcome import KINDS, Tally
from shardq.run.executor import Outcome
from shardq.run.threads import Threads

log = structlog.get_logger("shardq.node")

_BUCKETS = (0.001, 0.005, 0.01, 0.05, 0.1, 0.5, 1, 5, 10, 60, 300, 1800)


class NodeMetrics(Collector):
    """Job outcomes (:attr:`tally`) and metrics of them; gauges read from the node when scraped;
    and ``node.progress`` every ``progress_seconds`` (:meth:`log_progress`, 0: never)."""

    def __init__(
        self,
        lags: Callable[[], Iterable[tuple[str, int, float]]],
        in_flight: Callable[[], int],
        node: str = "",
        slots: Callable[[], tuple[int, int]] = lambda: (0, 0),
        *,
        tally: Callable[[], Tally] | None = None,
        progress_seconds: float = 0.0,
        clock: Clock = monotonic,
    ) -> None:
        """``slots``: (in use, concurrency); ``tally``: the job outcomes ``node.progress``
        reads (default: a copy of :attr:`tally`)."""
        self.node, self.tally = node, Tally()
        self._created = wall()  # when the job counts started (``shardq_jobs_created``)
        self._lags, self._in_flight, self._slots = lags, in_flight, slots
        self._tally = self.tally.copy if tally is None else tally
        self._every, self._clock = progress_seconds, clock
        self._last = clock()
        self._done: dict[str, int] = {}
        self.registry = CollectorRegistry()
        self.duration = Histogram(
            "shardq_job_duration_seconds",
            "perform() duration",
            ["worker", "node"],
            buckets=_BUCKETS,
            registry=self.registry,
        )
        self.broker_errors = Counter(
            "shardq_broker_errors_total",
            "Failed broker calls",
            ["operation", "node"],
            registry=self.registry,
        )
        self.registry.register(self)
        self._durations: dict[str, Any] = {}
        self._server: Any = None
        self._lock = threading.Lock()

    def job_outcome(self, outcome: Outcome) -> None:
        self.tally.job_outcome(outcome)
        if outcome.duration:
            duration = self._durations.get(outcome.worker)
            if duration is None:
                duration = self._durations[outcome.worker] = self.duration.labels(
                    outcome.worker, self.node
                )
            duration.observe(outcome.duration)

    def broker_error(self, operation: str) -> None:
        self.broker_errors.labels(operation, self.node).inc()

    def log_progress(self) -> None:
        """Log ``node.progress`` (jobs/s per worker, the max lag) if a period passed."""
        now = self._clock()
        if not self._every or now - self._last < self._every:
            return
        tally = self._tally()
        rates = {w: round(r, 1) for w, r in tally.rates(self._done, now - self._last).items()}
        done = tally.done()
        lags = [lag for _, _, lag in self._lags()]
        in_use, concurrency = self._slots()
        log.info(
            "node.progress",
            jobs_per_second=rates,
            done=sum(done.values()),
            max_lag=round(max(lags, default=0.0), 3),
            held=self._in_flight(),
            slots_in_use=in_use,
            concurrency=concurrency,
        )
        self._last, self._done = now, done

    def serve(self, port: int, host: str, threads: Threads | None = None) -> int:
        """Serve ``/metrics``; returns the port (useful with port 0). A server thread that
        ends before :meth:`close` fails in ``threads`` (the node's: it stops)."""
        with self._lock:
            try:
                server, thread = start_http_server(port, addr=host, registry=self.registry)
            except OSError as exc:
                raise MetricsServerError(
                    f"cannot serve metrics on {host}:{port}: {exc.strerror or exc}; "
                    + (
                        "another process uses that port: pick a free one with --metrics-port "
                        "(or metrics_port in the config)"
                        if exc.errno == errno.EADDRINUSE
                        else "check --metrics-host and --metrics-port (metrics_host, "
                        "metrics_port in the config)"
                    )
                ) from exc
            self._server = server
            port = int(server.server_address[1])
        watch = partial(self._watch, server, thread, f"{host}:{port}")
        (threads or Threads()).start("shardq-metrics-watch", "the metrics server", watch)
        return port

    def _watch(self, server: Any, thread: threading.Thread, address: str) -> None:
        thread.join()
        if self._server is server:  # not closed: it stopped serving by itself
            raise MetricsServerError(
                f"the metrics server on {address} stopped serving /metrics (its thread ended; "
                "its error, if any, is printed above)"
            )

    def close(self) -> None:
        with self._lock:
            server, self._server = self._server, None  # first: its watch sees it closed
            if server is not None:
                server.shutdown()
                server.server_close()

    def collect(self) -> Iterable[Any]:
        """The job counts and the gauges, read now (called by the registry when scraped)."""
        jobs = CounterMetricFamily(
            "shardq_jobs", "Jobs by outcome", labels=["worker", "outcome", "node"]
        )
        tally = self.tally.copy()
        for kind in KINDS:
            for worker, n in getattr(tally, kind).items():
                jobs.add_metric([worker, kind, self.node], n, created=self._created)
        yield jobs
        lag = GaugeMetricFamily(
            "shardq_shard_lag_seconds",
            "Age of the oldest job believed waiting in a shard",
            labels=["worker", "shard", "node"],
        )
        for worker, shard, seconds in self._lags():
            lag.add_metric([worker, str(shard), self.node], seconds)
        yield lag
        yield self._gauge("shardq_in_flight_jobs", "Jobs held by this node", self._in_flight())
        in_use, concurrency = self._slots()
        yield self._gauge("shardq_slots_in_use", "Jobs running now (execution slots busy)", in_use)
        yield self._gauge("shardq_concurrency", "Most jobs the node runs at once", concurrency)

    def _gauge(self, name: str, documentation: str, value: float) -> GaugeMetricFamily:
        gauge = GaugeMetricFamily(name, documentation, labels=["node"])
        gauge.add_metric([self.node], value)
        return gauge
