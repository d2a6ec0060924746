"""Publishing many jobs from JSON lines, and what the commands print while they work."""

from __future__ import annotations

import io
import signal
from collections.abc import Iterator, Sequence
from typing import Any

import pytest

import shardq
from shardq.broker import MemoryBroker, SendEntry, SendResult
from shardq.core import envelope
from shardq.core.errors import ConfigError
from shardq.core.terminal import Progress, plural
from shardq.ops import bulk


class RefusingBroker(MemoryBroker):
    """Refuses (per entry, as SQS may) every job whose payload is ``poison``."""

    def __init__(self, poison: object) -> None:
        super().__init__()
        self.poison = poison

    def send_batch(self, queue: str, entries: Sequence[SendEntry]) -> SendResult:
        refused = [e for e in entries if envelope.decode(e.body).payload == self.poison]
        rest = [e for e in entries if e not in refused]
        result = super().send_batch(queue, rest) if rest else SendResult()
        for entry in refused:
            result.failed[entry.id] = "InternalError: simulated refusal"
        return result


@pytest.fixture
def app() -> Iterator[shardq.App]:
    app = shardq.App(broker=RefusingBroker(poison="poison"))

    @app.register
    class Job(shardq.Worker):
        shards = 2

        def perform(self, entity_id: str, payloads: list[object]) -> None: ...

    yield app
    app.broker.close()


def lines(*texts: str) -> list[str]:
    return [t + "\n" for t in texts]


def waiting(app: shardq.App) -> int:
    app.ensure_queues()
    return sum(app.broker.counts(app.shard_queue("Job", s)).waiting for s in range(2))


@pytest.mark.parametrize(
    ("text", "problem"),
    [
        ('{"entity": "e", "payload": 1, "priority": 3}', "unknown key 'priority'"),
        ('{"entity": "e"}', "no 'payload'"),
        ('{"payload": 1}', "no 'entity'"),
        ('{"entity": 5, "payload": 1}', "entity must be a string"),
        ('{"entity": "e", "payload": 1, "dedup_id": 5}', "dedup_id must be a string"),
        ('{"entity": "e", "payload": 1, "meta": []}', "meta must be an object"),
        ('{"entity": "e", "payload": NaN}', "NaN is not a JSON number"),
        ('{"entity": "e", "payload": 1e999}', "1e999 is too large for a JSON number"),
        ("[1, 2]", "expected a JSON object"),
        ("{oops", "not valid JSON"),
        ("[" * 1500 + "]" * 1500, "nested too deeply"),
        # which entity? JSON parsers disagree, Python's took the last silently
        ('{"entity": "a", "payload": 1, "entity": "b"}', "key 'entity' is given twice"),
        ('{"entity": "e", "payload": {"n": 1, "n": 2}}', "key 'n' is given twice"),
    ],
)
def test_a_bad_line_is_refused_saying_why(text: str, problem: str) -> None:
    with pytest.raises(ValueError, match=problem):
        bulk.parse_line(text)


def test_bad_lines_are_named_by_number_and_nothing_is_published(app: shardq.App) -> None:
    # given a file whose lines 2 and 4 are bad (line 3 is blank and skipped)
    text = lines(
        '{"entity": "a", "payload": 1}',
        '{"entity": "a", "payload": 1, "x": 2}',
        "",
        '{"entity": "has space", "payload": 1}',
        '{"entity": "b", "payload": "\\ud800"}',
    )
    # when it is read, then the error names each bad line, and nothing was sent
    with pytest.raises(ConfigError) as raised:
        bulk.read_jobs(app, "Job", text, "jobs.jsonl")
    message = str(raised.value)
    assert "jobs.jsonl: 3 lines cannot be published, so nothing was" in message
    assert "line 2: unknown key 'x'" in message
    assert "line 4: entity id 'has space' contains ' '" in message
    assert "line 5: " in message and "not valid Unicode" in message
    assert "line 1:" not in message and "line 3:" not in message
    assert waiting(app) == 0


def test_a_file_saved_with_a_byte_order_mark_and_crlf_line_ends_is_read(app: shardq.App) -> None:
    # given a file as Windows tools save it: a UTF-8 BOM, CRLF line ends, a blank line
    text = ['\ufeff{"entity": "a", "payload": 1}\r\n', "\r\n", '{"entity": "b", "payload": 2}\r\n']
    # when it is read, then both jobs are taken, numbered by their lines
    jobs = bulk.read_jobs(app, "Job", text, "jobs.jsonl")
    assert [(line.number, line.job.entity_id) for line in jobs] == [(1, "a"), (3, "b")]


def test_good_lines_are_published_in_order_with_their_dedup_ids(app: shardq.App) -> None:
    text = lines(
        *[f'{{"entity": "e{n % 3}", "payload": {n}}}' for n in range(1200)],
        '{"entity": "e0", "payload": 0, "dedup_id": "k", "meta": {"trace": "t"}}',
        '{"entity": "e0", "payload": 0, "dedup_id": "k"}',
    )
    jobs = bulk.read_jobs(app, "Job", text, "stdin")
    assert [line.number for line in jobs[:2]] == [1, 2] and len(jobs) == 1202
    assert bulk.publish_lines(app, "Job", jobs) == 1202
    assert waiting(app) == 1201  # the repeated dedup_id was published once


def test_a_refused_job_stops_the_publish_and_the_error_names_every_line_not_published(
    app: shardq.App,
) -> None:
    # given 1,200 jobs where line 700 is refused by the broker
    text = lines(*[f'{{"entity": "e{n % 5}", "payload": {n}}}' for n in range(1, 1201)])
    text[699] = '{"entity": "e0", "payload": "poison"}\n'
    jobs = bulk.read_jobs(app, "Job", text, "jobs.jsonl")
    # when they are published
    with pytest.raises(bulk.BulkPublishError) as raised:
        bulk.publish_lines(app, "Job", jobs)
    # then the first batch and the rest of line 700's batch are published, except the later
    # lines of its entity; the error names exactly the lines that were not
    error = raised.value
    held_back = [n for n in range(701, 1001) if n % 5 == 0]
    assert error.lines == [700, *held_back, *range(1001, 1201)]
    assert waiting(app) == 1200 - len(error.lines)
    assert f"published {1200 - len(error.lines)} of 1200 jobs" in str(error)
    assert "lines (700, 705, 710" in str(error) and "simulated refusal" in str(error)


def test_lines_not_published_are_named_when_a_middleware_drops_or_reorders_jobs(
    app: shardq.App,
) -> None:
    # given a publish middleware that drops the jobs whose payload is "drop" and reverses
    class DropAndReverse(shardq.Middleware):
        def around_publish(self, call: Any, ctx: shardq.PublishContext) -> Any:
            ctx.jobs[:] = [j.with_meta(t=1) for j in reversed(ctx.jobs) if j.payload != "drop"]
            return call()

    app.add_middleware(DropAndReverse())
    # and a file whose line 3 is refused by the broker, and line 1 of its entity accepted after
    # it in the same batch
    text = lines(
        '{"entity": "a", "payload": 1}',
        '{"entity": "b", "payload": "drop"}',
        '{"entity": "a", "payload": "poison"}',
        '{"entity": "c", "payload": 4}',
    )
    jobs = bulk.read_jobs(app, "Job", text, "jobs.jsonl")
    # when it is published, then the error names line 3 as not published, line 1 as out of
    # order, and neither the dropped line 2 nor line 4
    with pytest.raises(bulk.BulkPublishError) as raised:
        bulk.publish_lines(app, "Job", jobs)
    assert raised.value.lines == [3]
    assert "published 2 of 4 jobs; not published: 1 line (3)" in str(raised.value)
    assert "lines 1 were published although an earlier job" in str(raised.value)
    assert waiting(app) == 2


def test_every_line_of_a_batch_is_named_when_a_job_a_middleware_made_itself_is_refused(
    app: shardq.App,
) -> None:
    # given a publish middleware that replaces line 2's job by two jobs it makes itself, the
    # second of which the broker refuses
    class Split(shardq.Middleware):
        def around_publish(self, call: Any, ctx: shardq.PublishContext) -> Any:
            parts = [shardq.Job("b", "part"), shardq.Job("b", "poison")]
            ctx.jobs[:] = [p for j in ctx.jobs for p in (parts if j.payload == "split" else [j])]
            return call()

    app.add_middleware(Split())
    text = lines(
        '{"entity": "a", "payload": 1}',
        '{"entity": "b", "payload": "split"}',
        '{"entity": "c", "payload": 3}',
    )
    jobs = bulk.read_jobs(app, "Job", text, "jobs.jsonl")
    # when it is published, then the refused job stands for no line of its own: the error
    # names every line of its batch as possibly not published, saying why
    with pytest.raises(bulk.BulkPublishError) as raised:
        bulk.publish_lines(app, "Job", jobs)
    assert raised.value.lines == [1, 2, 3] and waiting(app) == 3
    assert "not published: 3 lines (1-3), first because: a job a middleware made itself" in str(
        raised.value
    )


@pytest.mark.parametrize(("dropped", "last"), [(2, 4), (4, 3)])
def test_an_interrupted_publish_names_the_lines_left_after_a_middleware_dropped_some(
    app: shardq.App, monkeypatch: pytest.MonkeyPatch, dropped: int, last: int
) -> None:
    # given a publish middleware that drops line 2 (or 4), and Ctrl-C during the second batch
    calls = []

    class DropAndInterrupt(shardq.Middleware):
        def around_publish(self, call: Any, ctx: shardq.PublishContext) -> Any:
            ctx.jobs[:] = [j for j in ctx.jobs if j.payload != "drop"]
            calls.append(len(ctx.jobs))
            if len(calls) == 2:
                signal.raise_signal(signal.SIGINT)
            return call()

    app.add_middleware(DropAndInterrupt())
    monkeypatch.setattr(bulk, "BATCH", 2)
    text = lines(*[f'{{"entity": "e{n}", "payload": {n}}}' for n in range(1, 6)])
    text[dropped - 1] = f'{{"entity": "e{dropped}", "payload": "drop"}}\n'
    jobs = bulk.read_jobs(app, "Job", text, "jobs.jsonl")
    # when it is published, then it stops after lines 3 and 4 and names line 5 alone, and
    # the last line published (not the dropped one)
    with pytest.raises(bulk.PublishInterrupted) as raised:
        bulk.publish_lines(app, "Job", jobs)
    assert raised.value.lines == [5] and waiting(app) == 3
    assert f"published 3 of 5 jobs, the last on line {last}; not published: 1 line (5)" in str(
        raised.value
    )


def test_plural_counts() -> None:
    assert [plural(n, "job") for n in (0, 1, 2)] == ["0 jobs", "1 job", "2 jobs"]


class Stream(io.StringIO):
    def __init__(self, tty: bool) -> None:
        super().__init__()
        self.tty = tty

    def isatty(self) -> bool:
        return self.tty


@pytest.mark.parametrize("tty", [True, False])
def test_progress_shows_only_on_a_terminal_and_clears_its_line(tty: bool) -> None:
    stream = Stream(tty)
    with Progress("requeued", 20, stream=stream) as progress:
        progress(10)
    if tty:
        assert stream.getvalue() == "\r  requeued 10 of 20...\033[K\r\033[K"
    else:
        assert stream.getvalue() == ""
