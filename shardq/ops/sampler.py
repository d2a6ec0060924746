"""The dashboard's background sample: the stats every ``refresh`` seconds, the fleet alone
every second in between, and throughput (jobs finished per minute, 30 minutes) from the
broker (embedded), the nodes' metrics (``--scrape``) or their reports (SQS)."""

from __future__ import annotations

import threading
import urllib.request
from collections import deque
from collections.abc import Sequence
from typing import Any

import structlog

from shardq.api.app import App
from shardq.core.clock import Clock, monotonic, wall
from shardq.core.outcome import MORGUED, SUCCEEDED
from shardq.ops.fleet_view import FleetView
from shardq.ops.stats import KNOWS_AGES, Stats, collect, current_fleet

log = structlog.get_logger("shardq.dashboard")

WINDOW = 1800.0  # seconds of throughput history kept
FLEET_REFRESH = 1.0  # seconds between reads of the fleet items alone
OUTCOMES = frozenset({SUCCEEDED, MORGUED})  # a job done
NO_THROUGHPUT = (
    "not counted by SQS and no node has reported yet: start a node, or pass "
    "--scrape http://node:port/metrics"
)
PER_WORKER_NOTE = (
    "per worker on SQS: pass --scrape http://node:port/metrics (the total comes from "
    "the nodes' reports)"
)
NOT_ANSWERING = "not answering"

Points = deque[tuple[float, float]]


class SampleUnavailable(Exception):
    """No sample could be taken yet (the message says why)."""


class Sampler:
    """Samples the app's stats and fleet and derives throughput; ``clock`` schedules the
    samples (:meth:`step`), ``wall_clock`` dates the fleet's reports."""

    def __init__(
        self,
        app: App,
        refresh: float,
        scrape: Sequence[str] = (),
        *,
        clock: Clock = monotonic,
        wall_clock: Clock = wall,
    ) -> None:
        self.app, self.refresh, self.scrape = app, refresh, list(scrape)
        self.clock, self.wall = clock, wall_clock
        self._next_sample: float | None = None  # on the clock; None: at once
        self.fleet_refresh = FLEET_REFRESH
        #: Worker (and all of them) -> (unix time, jobs per minute), oldest first.
        self.points: dict[str, Points] = {}
        self.total: Points = deque()
        self.source: str | None = None
        self.excludes: list[dict[str, Any]] = []
        self._last: dict[str, tuple[float, dict[str, float]]] = {}  # source -> (time, counts)
        self._failing: dict[str, float] = {}  # scrape URL -> since when it fails
        self._stats: Stats | None = None  # the latest full sample
        self._fleet: FleetView | None = None  # the latest good fleet, maybe read alone since
        self._fleet_error: str | None = None
        self._fleet_failing = False  # the last read of the fleet alone failed
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
            self._stop.wait(self.step())

    def step(self) -> float:
        """Take the full sample if due (the first at once), else read the fleet alone;
        returns the seconds until the next step."""
        now = self.clock()
        if self._next_sample is None or now >= self._next_sample:
            self.sample()  # the next one ``refresh`` after this one ended: never back to back
            self._next_sample = self.clock() + self.refresh
        else:
            self.sample_fleet()
        return max(0.0, min(self.fleet_refresh, self._next_sample - self.clock()))

    def sample_fleet(self) -> None:
        """Read the fleet items alone, so that a node gone shows within about a second."""
        try:
            fleet = current_fleet(self.app, self.wall())
        except Exception as exc:  # the store failed: keep the last good fleet
            if not self._fleet_failing:  # once, not every second
                log.warning("dashboard.fleet_sample_failed", error=f"{type(exc).__name__}: {exc}")
            self._fleet_failing = True
            return
        self._fleet_failing = False
        with self._lock:
            self._fleet, self._fleet_error = fleet, None

    def sample(self) -> None:
        """Take one sample (the background thread calls this every ``refresh`` s)."""
        try:
            stats = collect(self.app)
        except Exception as exc:  # keep serving the last good sample
            log.warning("dashboard.sample_failed", error=f"{type(exc).__name__}: {exc}")
            with self._lock:
                self._error = f"cannot read the broker: {type(exc).__name__}: {exc}"
            self._ready.set()
            return
        now, names = stats.time, [w.name for w in stats.workers]
        source: str | None = None
        rates, total, excludes = None, None, []
        if stats.broker in KNOWS_AGES or any(
            s.done is not None for w in stats.workers for s in w.shards
        ):
            source = "broker"  # a queue not created yet has done None
            counts = {  # per queue: one that leaves the count (retired, deleted) is no drop
                f"queue {s.queue}": {w.name: float(s.done)}
                for w in stats.workers
                for s in w.shards
                if s.done is not None
            }
            if (since := self._last.get("broker")) is not None:  # a queue made since then
                for queue in counts.keys() - self._last.keys():  # had done none by then
                    self._last[queue] = (since[0], {})
            rates = self._rates(now, {"broker": dict.fromkeys(names, 0.0), **counts}, names)
        elif self.scrape:
            source, rates = "scrape", self._rates(now, self._scrape_all(now), names)
            excludes = [
                {"node": url, "since": since, "reason": NOT_ANSWERING}
                for url, since in self._failing.items()
            ]
        elif stats.fleet.reported:
            source, total = "reports", stats.fleet.jobs_per_second * 60.0
            excludes = stats.fleet.excludes(now - WINDOW)
        if rates is not None:
            total = sum(rates.values())
        with self._lock:
            self.source, self.excludes = source, excludes
            self._add_points(now, names, rates, total)
            self._stats, self._error = stats, None
            self._fleet_error = stats.fleet_error
            if stats.fleet_error is None:
                self._fleet = stats.fleet
        self._ready.set()

    def _scrape_all(self, now: float) -> dict[str, dict[str, float]]:
        counts: dict[str, dict[str, float]] = {}
        self._failing = {u: t for u, t in self._failing.items() if u in self.scrape}
        for url in self.scrape:
            try:
                with urllib.request.urlopen(url, timeout=max(1.0, min(self.refresh, 5.0))) as r:
                    counts[url] = parse_metrics(r.read().decode("utf-8", "replace"))
            except Exception as exc:
                if url not in self._failing:  # logged once per change, not every refresh
                    error = f"{type(exc).__name__}: {exc}"
                    log.warning("dashboard.scrape_failed", url=url, error=error)
                self._failing.setdefault(url, now)
                continue
            if url in self._failing:
                log.info("dashboard.scrape_recovered", url=url, since=self._failing.pop(url))
        return counts

    def _rates(
        self, now: float, counts: dict[str, dict[str, float]], names: list[str]
    ) -> dict[str, float] | None:
        """Per worker, the sum over sources of their counts' change per minute since each
        source's previous answer; None while a source has no previous answer."""
        rates = dict.fromkeys(names, 0.0)
        complete = bool(counts)
        for source, current in counts.items():
            previous = self._last.get(source)
            self._last[source] = (now, current)
            if previous is None or now <= previous[0]:
                complete = False
                continue
            for name in names:
                before, after = previous[1].get(name, 0.0), current.get(name, 0.0)
                delta = after - before if after >= before else after  # a node restarted
                rates[name] += delta * 60.0 / (now - previous[0])
        return rates if complete else None

    def _add_points(
        self, now: float, names: list[str], rates: dict[str, float] | None, total: float | None
    ) -> None:
        series = [*(self.points.setdefault(n, deque()) for n in names), self.total]
        values = [*(rates.get(n) if rates else None for n in names), total]
        for points, value in zip(series, values, strict=True):
            if value is not None:
                points.append((now, round(value, 2)))
            while points and points[0][0] < now - WINDOW:
                points.popleft()

    def snapshot(self, wait: float = 10.0) -> dict[str, Any]:
        """The latest stats sample as ``/api/v1/stats`` returns it (waits for the first)."""
        self._ready.wait(wait)
        with self._lock:
            if self._stats is None:
                raise SampleUnavailable(self._error or "no stats sampled yet; retry in a moment")
            per_worker = self.source in ("broker", "scrape")
            throughput = {
                w.name: [list(p) for p in self.points.get(w.name, ())] for w in self._stats.workers
            }
            note = {None: NO_THROUGHPUT, "reports": PER_WORKER_NOTE}.get(self.source)
            return {
                **self._stats.to_dict(),
                "throughput": throughput if per_worker else None,
                "throughput_total": None if self.source is None else [list(p) for p in self.total],
                "throughput_source": self.source,
                "throughput_note": note,
                "throughput_excludes": list(self.excludes),
                "refresh": self.refresh,
                "error": self._error,
            }

    def nodes(self, wait: float = 10.0) -> dict[str, Any]:
        """The latest fleet sample as ``/api/v1/nodes``, with the ``reshards`` in progress
        in the same sample (only while there are some)."""
        self._ready.wait(wait)
        with self._lock:
            if self._fleet_error is not None:
                raise SampleUnavailable(f"cannot read the fleet items: {self._fleet_error}")
            if self._fleet is None:
                raise SampleUnavailable(self._error or "no sample taken yet; retry in a moment")
            reshards = self._stats.reshards if self._stats else []
            return self._fleet.to_json([m.to_json() for m in reshards])


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
