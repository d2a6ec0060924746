"""``shardq publish WORKER --file PATH``: one job per JSON line (``entity``, ``payload``,
optional ``dedup_id`` and ``meta``). Every line is checked first, so a bad line publishes
nothing; jobs are then published in order, in batches, stopping at the first refused
(later jobs of its entity must not overtake it). Errors, and Ctrl-C or SIGTERM (the first
stops after the batch being sent, a second at once), name the lines not published."""

from __future__ import annotations

import json
import signal
import threading
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from shardq.core.envelope import parse_json
from shardq.core.errors import BrokerError, ConfigError, PublishError, ShardqError
from shardq.core.jobs import Job
from shardq.core.signals import StopSignals
from shardq.core.terminal import Progress, plural

if TYPE_CHECKING:
    from shardq.api.app import App

KEYS = ("entity", "payload", "dedup_id", "meta")
#: Jobs per ``publish_many`` call (it sends them in SendMessageBatch calls of 10).
BATCH = 500
#: Bad lines named in one error; the others are counted.
MAX_REPORTED = 5


class BulkPublishError(BrokerError):
    """Some lines of a file were not published; ``lines`` lists their numbers."""

    def __init__(self, message: str, lines: list[int]) -> None:
        super().__init__(message)
        self.lines = lines


class PublishInterrupted(BulkPublishError):
    """Ctrl-C stopped ``publish --file``; ``lines`` lists those not published."""


class PublishTerminated(PublishInterrupted):
    """SIGTERM stopped ``publish --file``, as Ctrl-C does."""


def _interrupt(_signum: int) -> None:
    raise KeyboardInterrupt  # a second Ctrl-C: stop at once, the batch being sent in doubt


@dataclass(frozen=True)
class Line:
    number: int
    job: Job


def read_jobs(app: App, worker: str, lines: Iterable[str], source: str) -> list[Line]:
    """Every line's job, checked as a publish would; ConfigError names the bad lines."""
    jobs: list[Line] = []
    problems: list[str] = []
    bad = 0
    with Progress("checked") as progress:
        for number, text in enumerate(lines, 1):
            text = text.removeprefix("\ufeff") if number == 1 else text  # a UTF-8 BOM
            if not text.strip():
                continue
            try:
                job = parse_line(text)
                app.publisher.check(worker, job)
            except (ValueError, ShardqError) as exc:
                bad += 1
                if len(problems) < MAX_REPORTED:
                    problems.append(f"  line {number}: {exc}")
                continue
            jobs.append(Line(number, job))
            progress(number)
    if bad:
        more = f"\n  ... and {plural(bad - len(problems), 'more bad line')}" if bad > 5 else ""
        raise ConfigError(
            f"{source}: {plural(bad, 'line')} cannot be published, so nothing was:\n"
            + "\n".join(problems)
            + more
            + '\nexpected one JSON object per line: {"entity": "...", "payload": ..., '
            '"dedup_id": "..." (optional), "meta": {...} (optional)}'
        )
    return jobs


def parse_line(text: str) -> Job:
    """The job of one line; ValueError says what is wrong with it."""
    doc = parse_json(text)
    if not isinstance(doc, dict):
        raise ValueError('expected a JSON object such as {"entity": "...", "payload": ...}')
    unknown = sorted(set(doc) - set(KEYS))
    if unknown:
        raise ValueError(f"unknown key {', '.join(map(repr, unknown))}; known: {', '.join(KEYS)}")
    for key in ("entity", "payload"):
        if key not in doc:
            raise ValueError(f"no {key!r}")
    entity, dedup_id, meta = doc["entity"], doc.get("dedup_id"), doc.get("meta")
    if not isinstance(entity, str):
        raise ValueError(f"entity must be a string, got {json.dumps(entity)[:40]}")
    if dedup_id is not None and not isinstance(dedup_id, str):
        raise ValueError("dedup_id must be a string")
    if meta is not None and not isinstance(meta, dict):
        raise ValueError("meta must be an object")
    return Job(entity, doc["payload"], dedup_id, meta)


def publish_lines(app: App, worker: str, lines: Sequence[Line]) -> int:
    """Publish the jobs in order; returns how many. Raises :class:`BulkPublishError`
    naming the lines not published if the broker refused some."""
    # jobs published; lines handled (some a middleware dropped); the last line published
    done = at = sending = last = 0
    try:
        # Ctrl-C or SIGTERM: publishing stops after the batch being sent (main thread only)
        stops = (signal.SIGINT, signal.SIGTERM)
        ctrl_c = StopSignals(threading.Event(), stops, again=_interrupt)
        with ctrl_c.installed(), Progress("published", len(lines)) as progress:
            for start in range(0, len(lines), BATCH):
                if ctrl_c.stopping.is_set():
                    raise _interrupted(lines, done, last, at, 0, ctrl_c.name)
                chunk = lines[start : start + BATCH]
                sending = len(chunk)
                try:
                    report = app.publisher.publish_many(worker, [line.job for line in chunk])
                except PublishError as exc:
                    failed = sorted({chunk[i].number for i, _, _ in exc.failed if i < len(chunk)})
                    gaps = sorted(chunk[i].number for i, _ in exc.gaps if i < len(chunk))
                    reason = exc.failed[0][2] if exc.failed else str(exc)
                    if any(i >= len(chunk) for i, _, _ in exc.failed):  # a job on no line
                        failed = [line.number for line in chunk]  # any of them may be missing
                        reason = f"a job a middleware made itself in their place: {reason}"
                    raise _not_published(
                        lines, done + exc.sent, failed, start + len(chunk), reason, gaps
                    ) from exc
                except ShardqError as exc:  # refused before sending (e.g. a middleware's)
                    raise _not_published(lines, done, [], start, str(exc), []) from exc
                sent = [chunk[i].number for i, m in enumerate(report.message_ids[:sending]) if m]
                last = max(sent, default=last)
                done, at, sending = done + report.sent, start + len(chunk), 0
                progress(done)
    except KeyboardInterrupt:  # a second Ctrl-C: the batch being sent is in doubt
        raise _interrupted(lines, done, last, at, sending) from None
    return done


def _not_published(
    lines: Sequence[Line], sent: int, failed: list[int], rest: int, reason: str, gaps: list[int]
) -> BulkPublishError:
    missing = failed + [line.number for line in lines[rest:]]
    text = (
        f"published {sent} of {plural(len(lines), 'job')}; not published: "
        f"{plural(len(missing), 'line')} ({ranges(missing)}), first because: {reason}. "
        "Publish those lines again (a dedup_id keeps a job from being published twice)"
    )
    if gaps:
        text += (
            f"; lines {ranges(gaps)} were published although an earlier job of their "
            "entity was not: those entities are out of order"
        )
    return BulkPublishError(text, missing)


def _interrupted(
    lines: Sequence[Line],
    done: int,
    last_line: int,
    at: int,
    in_doubt: int,
    signal_name: str | None = None,
) -> PublishInterrupted:
    """Ctrl-C (or ``signal_name``) after ``done`` jobs of the first ``at`` lines were
    published, the last of ``last_line`` (0: none); the ``in_doubt`` lines after them were
    being sent when a second Ctrl-C came."""
    last = f", the last on line {last_line}" if last_line else ""
    doubt = [line.number for line in lines[at : at + in_doubt]]
    missing = [line.number for line in lines[at + in_doubt :]]
    text = f"interrupted: published {done} of {plural(len(lines), 'job')}{last}"
    if doubt:
        text += (
            f"; lines {ranges(doubt)} were being sent and may or may not have been "
            "published (publish them again with a dedup_id to be sure)"
        )
    if missing:
        text += (
            f"; not published: {plural(len(missing), 'line')} ({ranges(missing)}), the first "
            f"on line {missing[0]}. Publish those lines again"
        )
    kind = PublishTerminated if signal_name == "SIGTERM" else PublishInterrupted
    return kind(text, doubt + missing)


def ranges(numbers: Sequence[int], most: int = 20) -> str:
    """``1-3, 7, 9-12``, at most ``most`` runs then a count of the rest."""
    runs: list[list[int]] = []
    for n in numbers:
        if runs and n == runs[-1][1] + 1:
            runs[-1][1] = n
        else:
            runs.append([n, n])
    shown = [str(a) if a == b else f"{a}-{b}" for a, b in runs[:most]]
    if len(runs) > most:
        shown.append(f"and {len(runs) - most} more runs")
    return ", ".join(shown)
