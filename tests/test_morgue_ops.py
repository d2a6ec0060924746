"""Listing, requeueing and purging dead jobs in the store, by worker, entity, error type
and time, through :class:`shardq.morgue.Morgue` and the ``shardq morgue`` commands."""

from __future__ import annotations

import argparse
import io
import json
import os
import signal
import sys
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import boto3
import pytest

import shardq
from shardq import morgue
from shardq.broker import MemoryBroker, Message
from shardq.broker.base import SendEntry, SendResult
from shardq.core import envelope
from shardq.core.config import Config
from shardq.core.errors import BrokerError
from shardq.core.topology import shard_for
from shardq.morgue import COUNTED, Filter, Morgue
from shardq.morgue import record as morgue_record
from shardq.morgue.record import STAMP, id_key, keys_of
from shardq.ops.admin import _stats_table, add_commands
from shardq.ops.dashboard import morgue_page
from shardq.ops.ensure import ensure_state_table
from shardq.ops.stats import collect
from shardq.ops.testing import drain
from shardq.store import SqliteStore
from shardq.store.base import DamagedItem, Item
from tests.apps import ledger
from tests.apps.ledger import Ledgered
from tests.conftest import make_broker
from tests.test_fleet_damaged import damage, damage_version


@pytest.fixture(params=["sqlite", "memory", pytest.param("sqs", marks=pytest.mark.sqs)])
def app(
    request: pytest.FixtureRequest, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> Iterator[shardq.App]:
    """The ledger app with 3 dead jobs of e1 and 2 of e2 in its morgue."""
    monkeypatch.setenv("LEDGER_PATH", str(tmp_path / "ledger.jsonl"))
    broker = make_broker(request.param, tmp_path, request)
    # jobs hidden 10 s per receive: a node stalled on a loaded machine must not see its
    # dead job again (and bury it twice) because its delete came after a 2 s visibility
    config = Config(
        queue_prefix=f"m{tmp_path.name[-8:].replace('_', '')}-",
        idle_wait_seconds=1,
        workers={"Ledgered": {"visibility_timeout": 10}},
    )
    ledger.app.configure(config, broker=broker)
    ensure_state_table(ledger.app)  # DynamoDB's table, as `shardq queues ensure` makes it
    Ledgered.publish_many(
        [("e1", {"n": n, "permanent": True}) for n in range(3)]
        + [("e2", {"n": n, "permanent": True}) for n in range(2)]
    )
    drain(ledger.app)  # each job fails once, in the executor a node runs jobs with
    yield ledger.app
    broker.close()


def numbers(records: list[shardq.morgue.MorgueRecord]) -> list[tuple[str, int]]:
    return [(r.entity_id, envelope.decode(r.body).payload["n"]) for r in records]


def queued(app: shardq.App, entity: str) -> list[int]:
    queue = app.shard_queue("Ledgered", shard_for(entity, 3))
    got = app.broker.receive(queue, max_messages=10, wait_seconds=1, visibility_timeout=30)
    return [envelope.decode(m.body).payload["n"] for m in got if m.group_id == entity]


def bury(app: shardq.App, jobs: list[tuple[str, int]], error: Exception | None = None) -> None:
    """Write dead jobs straight into the morgue, in this order."""
    records = []
    for i, (entity, n) in enumerate(jobs):
        body = envelope.encode(envelope.Envelope("Ledgered", entity, {"n": n}))
        message = Message("shard.fifo", f"id-{entity}-{n}", "", body, entity, 1, 0.0, str(i))
        failure = error or RuntimeError("no")
        records.append(morgue.record_for(message, morgue.REASON_MAX_RETRIES, failure, 4))
    morgue.bury(app.store, "Ledgered", records)


def cli(app: shardq.App, capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    """Run ``shardq morgue ...`` (the real command) against ``app``."""
    parser = argparse.ArgumentParser()
    add_commands(parser.add_subparsers(dest="command"), lambda p: None, lambda args: app)
    args = parser.parse_args(["morgue", *argv])
    code = args.handler(args)
    out = capsys.readouterr()
    return code, out.out, out.err


def test_list_shows_dead_jobs_in_death_order_with_their_record_and_keeps_them(
    app: shardq.App,
) -> None:
    dead = Morgue(app, "Ledgered")
    records = dead.list_jobs()
    assert sorted(numbers(records)) == [("e1", 0), ("e1", 1), ("e1", 2), ("e2", 0), ("e2", 1)]
    assert [n for e, n in numbers(records) if e == "e1"] == [0, 1, 2]
    assert all(r.reason == "permanent_error" and r.attempts == 1 for r in records)
    assert all("PermanentError" in r.traceback and r.first_sent_at > 0 for r in records)
    # listing again shows the same: nothing was removed or hidden
    assert numbers(dead.list_jobs()) == numbers(records)
    assert numbers(dead.list_jobs(entity="e2")) == [("e2", 0), ("e2", 1)]
    assert len(dead.list_jobs(limit=2)) == 2
    assert dead.size() == 5


def test_requeue_by_entity_puts_its_jobs_back_in_order_and_leaves_the_rest(
    app: shardq.App,
) -> None:
    dead = Morgue(app, "Ledgered")
    seen: list[int] = []
    assert dead.requeue(Filter(entity="e1"), progress=seen.append) == 3
    assert seen[-1] == 3
    assert queued(app, "e1") == [0, 1, 2]
    assert numbers(dead.list_jobs()) == [("e2", 0), ("e2", 1)]


def test_purge_by_message_id_removes_only_that_job_and_everything_empties_it(
    app: shardq.App,
) -> None:
    dead = Morgue(app, "Ledgered")
    target = next(r for r in dead.list_jobs() if r.entity_id == "e2")
    assert dead.purge(Filter(message_ids=frozenset([target.message_id]))) == 1
    assert sorted(numbers(dead.list_jobs())) == [("e1", 0), ("e1", 1), ("e1", 2), ("e2", 1)]
    assert queued(app, "e2") == []
    assert dead.purge() == 4
    assert dead.list_jobs() == [] and dead.size() == 0
    assert app.store.query_all("morgue/") == []  # no item left behind


@pytest.mark.parametrize("app", ["memory"], indirect=True)  # the count is the store's
def test_views_of_a_big_morgue_read_one_page_to_count_it_and_say_it_holds_more(
    app: shardq.App, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    # given 2,500 dead jobs (a poison entity's, say), the summaries read counted
    bury(app, [(f"big{n % 3}", n) for n in range(2495)])
    read: list[int] = []
    query = app.store.query

    def counting(prefix: str, **kw: Any) -> list[Item]:
        found = query(prefix, **kw)
        read.append(len(found) if prefix.startswith("morgue/Ledgered/t/") else 0)
        return found

    monkeypatch.setattr(app.store, "query", counting)
    # when stats are collected, the morgue is listed and the dashboard asks for a page
    stats = collect(app)
    _, _, err = cli(app, capsys, "list", "Ledgered", "--limit", "5")
    page = morgue_page(app, "Ledgered", {"limit": ["5"]})
    # then each says the morgue holds 1,000 or more
    assert (stats.workers[0].morgue_length, stats.workers[0].morgue_more) == (COUNTED, True)
    assert stats.to_dict()["total"]["morgue_more"] is True
    assert " 1000+ " in _stats_table(stats)
    assert "5 dead Ledgered jobs shown; the morgue holds 1000+" in err
    assert (page["size"], page["size_more"]) == (COUNTED, True)
    # and each count read one page of summaries, not all 2,500, and each listing of 5
    # read 6 (every 4 KB read is a read unit on AWS)
    assert sum(read) == 3 * COUNTED + 6 + 6
    # and the exact count is there for whoever asks for it
    assert Morgue(app, "Ledgered").size(exact=True) == 2500


def test_list_returns_all_85_dead_jobs_in_one_command_and_all_25_of_one_entity(
    app: shardq.App, capsys: pytest.CaptureFixture[str]
) -> None:
    # given 25 dead jobs of entity "big" and 60 of others, interleaved (plus the 5)
    jobs = [(f"o{i % 12}", 100 + i) for i in range(60)]
    for n in range(25):
        jobs.insert(n * 3, ("big", n))
    bury(app, jobs)
    Morgue(app, "Ledgered").purge(Filter(entity="e1"))
    Morgue(app, "Ledgered").purge(Filter(entity="e2"))
    # when the morgue is listed whole, and for "big"
    code, out, err = cli(app, capsys, "list", "Ledgered", "--json")
    _, big_out, big_err = cli(app, capsys, "list", "Ledgered", "--entity", "big", "--json")
    # then every dead job shows, in death order, and all 25 of "big" in their order
    listed = [json.loads(line) for line in out.splitlines()]
    assert code == 0 and len(listed) == 85
    assert [(d["entity_id"], d["payload"]["n"]) for d in listed] == jobs
    big = [json.loads(line)["payload"]["n"] for line in big_out.splitlines()]
    assert big == list(range(25))
    assert err == "85 dead Ledgered jobs shown; the morgue holds 85\n"
    assert big_err == "25 dead Ledgered jobs of entity big shown; the morgue holds 85\n"


def test_list_pages_with_a_cursor_and_filters_by_error_type_and_time(
    app: shardq.App, capsys: pytest.CaptureFixture[str]
) -> None:
    # given 5 dead jobs of KeyError, after the 5 PermanentError ones
    middle = time.time()
    bury(app, [("k", n) for n in range(5)], KeyError("gone"))
    dead = Morgue(app, "Ledgered")
    # when the morgue is read 4 at a time
    pages, after = [], None
    while True:
        page = dead.page(limit=4, after=after)
        pages.append(len(page.records))
        if page.next is None:
            break
        after = page.next
    # then the pages hold all 10 once each, and filters narrow the listing
    assert pages == [4, 4, 2]
    assert [r.entity_id for r in dead.page(Filter(error_type="KeyError")).records] == ["k"] * 5
    assert len(dead.page(Filter(since=middle)).records) == 5
    assert len(dead.page(Filter(until=middle)).records) == 5
    code, _, err = cli(app, capsys, "list", "Ledgered", "--limit", "3", "--error-type", "KeyError")
    assert code == 0 and "3 dead Ledgered jobs with error type KeyError shown" in err
    cursor = err.rsplit("--after ", 1)[1].strip()
    _, out, err = cli(
        app, capsys, "list", "Ledgered", "--after", cursor, "--error-type", "KeyError", "--json"
    )
    assert [json.loads(line)["payload"]["n"] for line in out.splitlines()] == [3, 4]
    assert "next page" not in err


def test_a_requeue_by_entity_leaves_a_record_whose_burial_is_under_way_or_was_cut_short(
    app: shardq.App,
) -> None:
    # given e1's 3 dead jobs, and a 4th job of e1 whose burial wrote its id item and its
    # record but not yet its summary (its node is writing it, or was killed: the job is
    # still in its queue, to be run or buried again)
    body = envelope.encode(envelope.Envelope("Ledgered", "e1", {"n": 9}))
    message = Message("shard.fifo", "id-e1-9", "", body, "e1", 1, 0.0, "r")
    record = morgue.record_for(message, morgue.REASON_MAX_RETRIES, RuntimeError("no"), 4)
    *writes, _ = morgue_record.items("Ledgered", record, morgue_record.new_stamp())
    for key, value in [writes[-1], *writes[:-1]]:  # the id item first, as a burial does
        app.store.put(key, value, version=None)
    # when e1's dead jobs are requeued, then that job by its id
    done = Morgue(app, "Ledgered").requeue(Filter(entity="e1"))
    seen: set[str] = set()
    only = Filter(entity="e1", message_ids=frozenset({"id-e1-9"}))
    again = Morgue(app, "Ledgered").requeue(only, seen=seen)
    # then its 3 dead jobs are sent, and not the job being buried: it would run twice;
    # asked for by its id, it is not found (it is not dead yet)
    assert done == 3 and queued(app, "e1") == [0, 1, 2]
    assert again == 0 and "id-e1-9" not in seen


def test_requeue_and_purge_take_the_same_filters_and_all_stays_required(
    app: shardq.App, capsys: pytest.CaptureFixture[str]
) -> None:
    bury(app, [("e1", 10), ("e3", 0)], KeyError("gone"))
    # a requeue without a filter or --all is refused and changes nothing
    with pytest.raises(shardq.core.errors.ShardqError, match="say which dead jobs"):
        cli(app, capsys, "requeue", "Ledgered")
    # a requeue of the KeyError ones sends only them
    code, _, err = cli(app, capsys, "requeue", "Ledgered", "--error-type", "KeyError")
    assert code == 0 and "requeued 2 dead Ledgered jobs with error type KeyError" in err
    assert queued(app, "e1") == [10] and queued(app, "e3") == [0]
    assert Morgue(app, "Ledgered").size() == 5
    code, _, err = cli(app, capsys, "purge", "Ledgered", "--since", "1h", "--yes")
    assert code == 0 and "purged 5 dead Ledgered jobs that died since" in err
    assert Morgue(app, "Ledgered").size() == 0


def test_an_entity_id_with_slashes_and_punctuation_is_its_own_entity(app: shardq.App) -> None:
    odd = ["a/b", "a", "a%2Fb", "a/", "!#$&'()*+,/:;=?@[]"]
    bury(app, [(e, i) for i, e in enumerate(odd)])
    dead = Morgue(app, "Ledgered")
    for i, entity in enumerate(odd):
        assert numbers(dead.list_jobs(entity=entity)) == [(entity, i)]


def test_a_damaged_record_lists_as_unreadable_and_requeue_refuses_it_and_its_entitys_later_ones(
    app: shardq.App,
) -> None:
    # given a record whose body was altered, then a later dead job of the same entity
    bury(app, [("f", 0), ("f", 1)])
    dead = Morgue(app, "Ledgered")
    first = next(r for r in dead.list_jobs(entity="f"))
    item = app.store.get(first.key)
    assert item is not None
    app.store.put(first.key, {**item.value, "body": "{}"}, version=item.version)
    # when the morgue is listed and requeued
    listed = {r.message_id: r for r in dead.list_jobs(entity="f")}
    refused: list[tuple[str, str]] = []
    n = dead.requeue(Filter(entity="f"), refused=lambda r, why: refused.append((r.message_id, why)))
    # then the damaged one shows why, neither is sent, and both stay
    assert listed[first.message_id].reason == "unreadable_record"
    assert "SHA-256" in listed[first.message_id].error_message
    assert n == 0 and [m for m, _ in refused] == ["id-f-0", "id-f-1"]
    assert "earlier dead job of its entity" in refused[1][1]
    assert queued(app, "f") == [] and dead.size() == 7


def test_a_requeue_sends_an_entitys_dead_jobs_before_one_it_cannot_read(
    app: shardq.App,
) -> None:
    # given three dead jobs of one entity, the body of the second altered
    bury(app, [("f", 0), ("f", 1), ("f", 2)])
    dead = Morgue(app, "Ledgered")
    second = dead.list_jobs(entity="f")[1]
    item = app.store.get(second.key)
    assert item is not None
    app.store.put(second.key, {**item.value, "body": "{}"}, version=item.version)
    # when the entity is requeued
    refused: list[tuple[str, str]] = []
    n = dead.requeue(Filter(entity="f"), refused=lambda r, why: refused.append((r.message_id, why)))
    # then the first is sent (nothing of its entity comes before it) and the other two stay
    assert n == 1 and queued(app, "f") == [0]
    assert [m for m, _ in refused] == ["id-f-1", "id-f-2"]
    assert "SHA-256" in refused[0][1] and "earlier dead job of its entity" in refused[1][1]
    assert [r.message_id for r in dead.list_jobs(entity="f")] == ["id-f-1", "id-f-2"]


def test_retention_deletes_only_older_dead_jobs(app: shardq.App) -> None:
    dead = Morgue(app, "Ledgered")
    assert dead.expire(1) == 0
    assert dead.expire(1, now=time.time() + 2 * 86400) == 5
    assert dead.size() == 0


@pytest.mark.sqs
@pytest.mark.slow
def test_dead_jobs_are_still_listed_after_the_queues_retention_has_passed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, request: pytest.FixtureRequest
) -> None:
    # given 3 dead jobs on SQS, and a canary job in the old morgue queue (no node polls it,
    # so a poll the finished node abandoned cannot hold it)
    monkeypatch.setenv("LEDGER_PATH", str(tmp_path / "ledger.jsonl"))
    broker = make_broker("sqs", tmp_path, request)
    config = Config(
        queue_prefix=f"ret{time.monotonic_ns() % 10**9}-",
        idle_wait_seconds=1,
        workers={"Ledgered": {"visibility_timeout": 10}},  # as in the fixture above
    )
    ledger.app.configure(config, broker=broker)
    ensure_state_table(ledger.app)
    Ledgered.publish_many([("e", {"n": n, "permanent": True}) for n in range(3)])
    ledger.app.node(ledger.app.plan(threads=1), until_empty=True).run()
    server = request.getfixturevalue("sqs_emulator")
    sqs = boto3.client("sqs", region_name="us-east-1", endpoint_url=server.endpoint_url)
    queues = [ledger.app.shard_queue("Ledgered", shard) for shard in range(3)]
    canary = ledger.app.morgue_queue("Ledgered")
    ledger.app.ensure_queue(canary, "Ledgered")  # the old morgue
    sqs.send_message(
        QueueUrl=sqs.get_queue_url(QueueName=canary)["QueueUrl"],
        MessageBody="{}",
        MessageGroupId="canary",
        MessageDeduplicationId="canary",
    )
    assert broker.counts(canary).waiting == 1
    # when SQS drops every message of those queues, as it does once their retention
    # period has passed (purged here rather than waiting out the 60 s minimum)
    for queue in [*queues, canary]:
        sqs.purge_queue(QueueUrl=sqs.get_queue_url(QueueName=queue)["QueueUrl"])
    assert broker.counts(canary).waiting == 0, "SQS did not drop the canary job"
    # then the dead jobs are all still listed
    assert [r.entity_id for r in Morgue(ledger.app, "Ledgered").list_jobs()] == ["e"] * 3
    broker.close()


def test_a_requeue_stopped_mid_round_leaves_at_most_one_batch_both_sent_and_listed(
    app: shardq.App,
) -> None:
    # given 60 more dead jobs, of 60 entities
    dead = Morgue(app, "Ledgered")
    bury(app, [(f"x{n}", n) for n in range(60)])

    # when a requeue of them is stopped (as by Ctrl-C) as its first record is deleted
    def stop(done: int) -> None:
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        dead.requeue(Filter(error_type="RuntimeError"), progress=stop)

    # then at most the batch being sent (10 jobs) is both queued and still in the morgue,
    # as the command and docs/operations.md say: no round of 100 is sent before deletes
    sent = sum(app.broker.counts(app.shard_queue("Ledgered", s)).waiting for s in range(3))
    listed = len(dead.page(Filter(error_type="RuntimeError"), 1000).records)
    assert 1 <= sent <= 10
    assert listed == 60 - 1


class TermOnSecondSend(MemoryBroker):
    """A memory broker whose process gets SIGTERM once its second batch is sent."""

    sends = 0

    def send_batch(self, queue: str, entries: Sequence[SendEntry]) -> SendResult:
        result = super().send_batch(queue, entries)
        self.sends += 1
        if self.sends == 2:
            os.kill(os.getpid(), signal.SIGTERM)
        return result


def test_sigterm_stops_a_requeue_as_ctrl_c_does_saying_what_was_done(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # given 30 dead jobs of 30 entities
    ledger.app.configure(Config(queue_prefix="term-"), broker=TermOnSecondSend())
    bury(ledger.app, [(f"t{n}", n) for n in range(30)])
    previous = signal.getsignal(signal.SIGTERM)
    # when SIGTERM comes while `shardq morgue requeue --all` sends its second batch
    code, _, err = cli(ledger.app, capsys, "requeue", "Ledgered", "--all")
    # then it stops as on Ctrl-C, saying how many it requeued and that the rest stay,
    # exits 143 (128 + SIGTERM), and puts the SIGTERM handler back
    assert code == 128 + signal.SIGTERM
    assert "interrupted. requeued 10 dead Ledgered jobs before that" in err
    assert "the rest are still in the morgue" in err
    assert Morgue(ledger.app, "Ledgered").size() == 20
    assert signal.getsignal(signal.SIGTERM) == previous


@pytest.mark.parametrize("action", ["list", "requeue", "purge"])
def test_a_filter_given_twice_is_refused_and_nothing_changes(
    app: shardq.App, capsys: pytest.CaptureFixture[str], action: str
) -> None:
    # given dead jobs of e1 and e2
    # when a filter that takes one value is given twice (meaning both, or a typo)
    yes = ["--yes"] if action == "purge" else []
    for twice in (["--entity", "e1", "--entity", "e2"], ["--since", "1h", "--since", "2d"]):
        with pytest.raises(SystemExit) as stopped:
            cli(app, capsys, action, "Ledgered", *twice, *yes)
        # then it is a usage error naming the option, and no dead job was touched
        # (it acted on the last value alone, e2's, saying so only in passing)
        assert stopped.value.code == 2
        assert f"{twice[0]} is given twice" in capsys.readouterr().err
    assert Morgue(app, "Ledgered").size() == 5


@pytest.mark.parametrize("option", ["--entity", "--error-type", "--id"])
def test_list_refuses_an_empty_filter_as_requeue_and_purge_do(
    app: shardq.App, capsys: pytest.CaptureFixture[str], option: str
) -> None:
    # given dead jobs, and a filter given as "" (`--entity "$ENTITY"` with ENTITY unset)
    # when they are listed
    # then the filter is refused naming it, rather than "0 dead jobs of entity  shown"
    with pytest.raises(shardq.core.errors.ShardqError, match=f"{option} must not be empty"):
        cli(app, capsys, "list", "Ledgered", option, "")


class ClosedTerminal(io.StringIO):
    """A terminal whose user pressed Ctrl-D: it reads as end of input."""

    def isatty(self) -> bool:
        return True


def test_ctrl_d_at_the_purge_question_purges_nothing(
    app: shardq.App, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    # given purge asks on a terminal before deleting
    monkeypatch.setattr(sys, "stdin", ClosedTerminal(""))
    # when the answer is Ctrl-D (end of input) instead of y or n
    code, _, err = cli(app, capsys, "purge", "Ledgered", "--all")
    # then nothing is purged, it says so and exits 0, as for "n" (not an EOFError)
    assert code == 0 and "nothing purged" in err
    assert Morgue(app, "Ledgered").size() == 5


def test_dead_jobs_of_a_worker_no_longer_registered_can_be_listed_and_purged_not_requeued(
    app: shardq.App, capsys: pytest.CaptureFixture[str]
) -> None:
    # given the app's dead Ledgered jobs, seen by an app that no longer registers Ledgered
    gone = shardq.App(app.config, broker=app.broker, store=app.store)
    # when they are listed, then all 5 are shown
    code, out, err = cli(gone, capsys, "list", "Ledgered", "--json")
    assert code == 0 and len(out.splitlines()) == 5, err
    # when they are requeued, then that is refused saying why, and all 5 stay
    with pytest.raises(shardq.UnknownWorkerError, match="can be listed and purged, not requeued"):
        cli(gone, capsys, "requeue", "Ledgered", "--all")
    assert Morgue(gone, "Ledgered").size() == 5
    # when e1's are purged, then only e2's are left
    assert cli(gone, capsys, "purge", "Ledgered", "--entity", "e1", "--yes")[0] == 0
    assert numbers(Morgue(gone, "Ledgered").list_jobs()) == [("e2", 0), ("e2", 1)]
    # and a name with no dead jobs is still an unknown worker
    with pytest.raises(shardq.UnknownWorkerError, match="no worker named 'Nobody'"):
        Morgue(gone, "Nobody")


@pytest.mark.parametrize("action", ["requeue", "purge"])
def test_an_id_that_matches_no_dead_job_is_named_and_fails_the_command_after_the_others_act(
    app: shardq.App, capsys: pytest.CaptureFixture[str], action: str
) -> None:
    # given dead jobs of e1 and e2, and one id of them next to two that name no dead job
    target = next(r for r in Morgue(app, "Ledgered").list_jobs() if r.entity_id == "e2")
    yes = ["--yes"] if action == "purge" else []
    ids = ["--id", "typo-1", "--id", target.message_id, "--id", "typo-2"]
    # when they are requeued or purged
    code, _, err = cli(app, capsys, action, "Ledgered", *ids, *yes)
    # then the matching job is acted on and said so, the others are named, and it exits 2
    done = {"requeue": "requeued", "purge": "purged"}[action]
    assert f"{done} 1 dead Ledgered job with ids" in err
    assert f"no dead Ledgered job has id typo-1, typo-2: nothing to {action} for them" in err
    assert code == 2
    assert Morgue(app, "Ledgered").size() == 4
    # and an id matching nothing alone changes nothing and fails too
    code, _, err = cli(app, capsys, action, "Ledgered", "--id", "typo-3", *yes)
    assert code == 2 and "no dead Ledgered job has id typo-3: nothing to" in err
    assert Morgue(app, "Ledgered").size() == 4


class RefusesFirstEntry(MemoryBroker):
    """A memory broker that refuses the first entry of its first ``times`` batches and
    sends the rest, as SQS may refuse one entry of a SendMessageBatch and accept the
    others."""

    def __init__(self, times: float = float("inf")) -> None:
        super().__init__()
        self.times = times

    def send_batch(self, queue: str, entries: Sequence[SendEntry]) -> SendResult:
        if self.times <= 0:
            return super().send_batch(queue, entries)
        self.times -= 1
        result = super().send_batch(queue, entries[1:])
        result.failed[entries[0].id] = "InternalError: try again"
        return result


def three_dead(broker: MemoryBroker, entity: str) -> Morgue:
    """The ledger app's morgue on ``broker``, holding ``entity``'s jobs 0, 1 and 2."""
    ledger.app.configure(Config(queue_prefix=f"{entity}-"), broker=broker)
    bury(ledger.app, [(entity, 0), (entity, 1), (entity, 2)])
    return Morgue(ledger.app, "Ledgered")


def test_a_requeue_that_sqs_accepts_in_part_never_sends_a_dead_job_twice() -> None:
    # given 3 dead jobs of one entity, and SQS refusing the first entry of a batch
    broker = RefusesFirstEntry()
    dead = three_dead(broker, "p")
    # when they are requeued
    refused: list[tuple[int, str]] = []
    note = lambda r, why: refused.append((envelope.decode(r.body).payload["n"], why))  # noqa: E731
    done = dead.requeue(Filter(entity="p"), refused=note)
    # then the refused job stays in the morgue and is named with SQS's reason, and each job
    # SQS did accept left the morgue: requeueing again cannot send it a second time
    queue = ledger.app.shard_queue("Ledgered", shard_for("p", 3))
    sent = [
        envelope.decode(m.body).payload["n"]
        for m in broker.receive(queue, max_messages=10, wait_seconds=0, visibility_timeout=30)
    ]
    assert sent == [1, 2] and done == 2
    assert [n for _, n in numbers(dead.list_jobs())] == [0]
    assert refused and refused[0][0] == 0 and "InternalError: try again" in refused[0][1]
    broker.close()


class LosesFirstAnswer(MemoryBroker):
    """A memory broker that sends its first batch and then fails, as a SendMessageBatch
    whose answer is lost (a timeout, a dropped connection) does."""

    lost = False

    def send_batch(self, queue: str, entries: Sequence[SendEntry]) -> SendResult:
        result = super().send_batch(queue, entries)
        if not self.lost:
            self.lost = True
            raise BrokerError("SQS did not answer within 60 s")
        return result


def test_a_requeue_run_again_after_a_lost_answer_sends_no_dead_job_twice() -> None:
    # given 3 dead jobs of one entity, and SQS sending a batch whose answer is lost
    broker = LosesFirstAnswer()
    dead = three_dead(broker, "r")
    # when they are requeued (the send looks failed: they stay), and requeued again
    refused: list[str] = []
    assert dead.requeue(Filter(entity="r"), refused=lambda r, why: refused.append(why)) == 0
    assert dead.requeue(Filter(entity="r")) == 3
    # then each job is queued once: the second send was deduplicated by SQS
    queue = ledger.app.shard_queue("Ledgered", shard_for("r", 3))
    got = broker.receive(queue, max_messages=10, wait_seconds=0, visibility_timeout=30)
    assert [envelope.decode(m.body).payload["n"] for m in got] == [0, 1, 2]
    assert len(refused) == 3 and "did not answer" in refused[0]
    assert dead.list_jobs(entity="r") == []
    broker.close()


def test_a_requeue_names_every_dead_job_it_leaves_behind_one_sqs_refused() -> None:
    # given 12 dead jobs of one entity (two batches), and SQS refusing the first entry once
    broker = RefusesFirstEntry(times=1)
    ledger.app.configure(Config(queue_prefix="once-"), broker=broker)
    bury(ledger.app, [("q", n) for n in range(12)])
    dead = Morgue(ledger.app, "Ledgered")
    # when they are requeued
    refused: list[tuple[int, str]] = []
    note = lambda r, why: refused.append((envelope.decode(r.body).payload["n"], why))  # noqa: E731
    done = dead.requeue(Filter(entity="q"), refused=note)
    # then the jobs of the second batch are not sent after the refused one, and every job
    # left in the morgue is named with why
    assert done == 9
    assert [n for _, n in numbers(dead.list_jobs())] == [0, 10, 11]
    assert [n for n, _ in refused] == [0, 10, 11]
    assert "earlier dead job of its entity" in refused[2][1]
    broker.close()


@pytest.mark.parametrize("action", ["requeue", "purge"])
def test_an_id_without_an_entity_reads_the_morgue_once(
    app: shardq.App,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    action: str,
) -> None:
    # given dead jobs of e1 and e2, and a store that counts the reads of the death order
    target = next(r for r in Morgue(app, "Ledgered").list_jobs() if r.entity_id == "e2")
    reads: list[str] = []
    query = app.store.query

    def counting(prefix: str, **options: object) -> list[shardq.store.Item]:
        reads.append(prefix)
        return query(prefix, **options)  # type: ignore[arg-type]

    monkeypatch.setattr(app.store, "query", counting)
    yes = ["--yes"] if action == "purge" else []
    # when one of them and an id naming nothing are requeued or purged, without --entity
    ids = ["--id", target.message_id, "--id", "x"]
    code, _, err = cli(app, capsys, action, "Ledgered", *ids, *yes)
    # then the worker's dead jobs are read once, and the id matching nothing is still named
    assert reads.count("morgue/Ledgered/t/") == 1
    assert code == 2 and "no dead Ledgered job has id x: nothing to" in err
    assert Morgue(app, "Ledgered").size() == 4


def test_a_dead_job_whose_store_items_are_damaged_is_listed_unreadable_and_purged_by_its_id(
    app: shardq.App, capsys: pytest.CaptureFixture[str]
) -> None:
    if isinstance(app.store, SqliteStore) and app.store.path == ":memory:":
        pytest.skip("an in-memory store cannot be damaged from outside")
    # given dead jobs of e1 and e2, the summary of e1's first and the record of its
    # second not JSON (a damaged file, a hand edit)
    first, second, _ = [r for r in Morgue(app, "Ledgered").list_jobs() if r.entity_id == "e1"]
    damage(app, keys_of(first.key, 1)[0], "[1, 2")
    damage(app, second.key, "garbage")
    # when the morgue is counted and listed
    size = Morgue(app, "Ledgered").size()
    code, out, err = cli(app, capsys, "list", "Ledgered", "--json")
    listed = [json.loads(line) for line in out.splitlines()]
    # then all five are counted and listed, the one whose record is damaged unreadable
    assert (size, code) == (5, 0) and len(listed) == 5
    damaged = [j for j in listed if j["reason"] == "unreadable_record"]
    assert len(damaged) == 1 and "is damaged" in damaged[0]["error_message"]
    # and a requeue of e1 sends its first (its record is whole) and no later one
    code, _, err = cli(app, capsys, "requeue", "Ledgered", "--entity", "e1")
    assert code == 2 and "requeued 1 dead Ledgered job" in err and queued(app, "e1") == [0]
    # and the damaged one is purged by the id it is listed with
    code, _, err = cli(app, capsys, "purge", "Ledgered", "--id", damaged[0]["message_id"], "--yes")
    assert code == 0 and "purged 1 dead Ledgered job" in err
    assert Morgue(app, "Ledgered").size() == 3


def test_the_purge_a_refused_requeue_names_deletes_a_damaged_record_without_its_entity(
    app: shardq.App, capsys: pytest.CaptureFixture[str]
) -> None:
    if isinstance(app.store, SqliteStore) and app.store.path == ":memory:":
        pytest.skip("an in-memory store cannot be damaged from outside")
    # given dead jobs of e2, the record of its first not JSON
    first = next(r for r in Morgue(app, "Ledgered").list_jobs() if r.entity_id == "e2")
    damage(app, first.key, "garbage")
    # when e2 is requeued, and the purge it names for the damaged one is run as named
    code, _, err = cli(app, capsys, "requeue", "Ledgered", "--entity", "e2")
    named = err.split("delete it with `")[1].split("`")[0].split()
    assert code == 2 and named[:3] == ["shardq", "morgue", "purge"]
    code, _, err = cli(app, capsys, *named[2:])
    # then that one dead job is purged
    assert code == 0 and "purged 1 dead Ledgered job" in err
    assert Morgue(app, "Ledgered").size() == 4


@pytest.mark.parametrize("by", ["error type", "time"])
def test_a_requeue_by_error_type_or_time_refuses_an_unreadable_match_and_its_entitys_later_ones(
    app: shardq.App, by: str
) -> None:
    if isinstance(app.store, SqliteStore) and app.store.path == ":memory:":
        pytest.skip("an in-memory store cannot be damaged from outside")
    # given three dead jobs of f that died of KeyError, both items of the first not JSON
    since = time.time() - 1
    bury(app, [("f", 0), ("f", 1), ("f", 2)], KeyError("k"))
    dead = Morgue(app, "Ledgered")
    first = dead.list_jobs(entity="f")[0]
    for key in keys_of(first.key, 1):
        damage(app, key, "[1, 2")
    where = Filter(error_type="KeyError") if by == "error type" else Filter(since=since)
    # when the dead jobs of that error type, or that died since then, are listed and requeued
    listed = [r.key for r in dead.page(where).records if r.entity_id == "f"]
    refused: list[tuple[str, str]] = []
    dead.requeue(where, refused=lambda r, why: refused.append((r.key, why)))
    # then the unreadable first is listed and refused, and no later job of f overtakes it
    assert listed[0] == first.key and len(listed) == 3
    assert queued(app, "f") == [] and [k for k, _ in refused][:1] == [first.key]
    assert len(refused) == 3 and "earlier dead job of its entity" in refused[2][1]


@pytest.mark.parametrize("by", [["--error-type", "KeyError"], ["--since", "1h"], ["--until", "0s"]])
def test_a_purge_by_error_type_or_time_leaves_an_unreadable_record_a_requeue_still_stops_at(
    app: shardq.App, capsys: pytest.CaptureFixture[str], by: list[str]
) -> None:
    if isinstance(app.store, SqliteStore) and app.store.path == ":memory:":
        pytest.skip("an in-memory store cannot be damaged from outside")
    # given three dead jobs of g that died of KeyError, both items of the first not JSON
    bury(app, [("g", 0), ("g", 1), ("g", 2)], KeyError("k"))
    dead = Morgue(app, "Ledgered")
    first = dead.list_jobs(entity="g")[0]
    for key in keys_of(first.key, 1):
        damage(app, key, "[1, 2")
    # when a requeue, then a purge, of that error type (or time) is run
    code, _, err = cli(app, capsys, "requeue", "Ledgered", "--entity", "g", *by)
    # then the requeue names the unreadable first and leaves g's later jobs behind it
    assert code == 2 and f"dead job {first.key} of entity g" in err and queued(app, "g") == []
    code, _, err = cli(app, capsys, "purge", "Ledgered", "--entity", "g", *by, "--yes")
    # and the purge deletes the two it can read, and not the one whose error type is unknown
    assert code == 0 and "purged 2 dead Ledgered jobs" in err
    assert [r.key for r in dead.list_jobs(entity="g")] == [first.key]


def test_a_job_buried_again_is_not_recorded_twice_when_its_record_item_is_damaged(
    app: shardq.App,
) -> None:
    if isinstance(app.store, SqliteStore) and app.store.path == ":memory:":
        pytest.skip("an in-memory store cannot be damaged from outside")
    # given a dead job of h whose record item (not its summary) is not JSON
    bury(app, [("h", 0)])
    dead = Morgue(app, "Ledgered")
    size, first = dead.size(), dead.list_jobs(entity="h")[0]
    damage(app, first.key, "[1, 2")
    # when the same job (its message delivered again) is buried again
    bury(app, [("h", 0)])
    # then it is not recorded a second time: its summary holds its message id
    assert dead.size() == size and len(dead.list_jobs(entity="h")) == 1
    # and with its summary damaged too, its id item still names it: not recorded twice
    damage(app, keys_of(first.key, 1)[0], "[1, 2")
    bury(app, [("h", 0)])
    assert dead.size() == size
    # and with its id item damaged as well, burying it again fails rather than risk a
    # duplicate (whether the damaged record is this job is not known)
    damage(app, id_key("Ledgered", first.message_id), "[1, 2")
    with pytest.raises(DamagedItem, match="is damaged"):
        bury(app, [("h", 0)])
    assert dead.size() == size


ID_K0 = id_key("Ledgered", "id-k-0")


@pytest.mark.parametrize(
    ("names", "damaged"),
    [
        ("morgue/Ledgered/t/1/k", False),  # a summary never written, under a stamp no node writes
        ("morgue/Ledgered/t/1/k", True),  # the item not JSON
        ("junk", False),  # no key at all
        (ID_K0, False),  # an item that exists (itself), not a summary of the job
    ],
)
def test_a_job_whose_id_item_names_no_record_is_buried_and_listed_once(
    app: shardq.App, names: str, damaged: bool
) -> None:
    if damaged and isinstance(app.store, SqliteStore) and app.store.path == ":memory:":
        pytest.skip("an in-memory store cannot be damaged from outside")
    # given the id item of a job that has no record (a hand edit, a damaged file, a
    # burial of an earlier version cut short)
    key = ID_K0
    app.store.put(key, {"summary": names}, version=None)
    if damaged:
        damage(app, key, "[1, 2")
    # when the job dies and is buried, then is delivered and buried once more
    bury(app, [("k", 0)])
    bury(app, [("k", 0)])
    # then it is recorded once, under a death stamp of its own (not the id item's "1",
    # which would list it after its entity's later jobs), and its id item names it
    (record,) = Morgue(app, "Ledgered").list_jobs(entity="k")
    assert record.message_id == "id-k-0" and STAMP.fullmatch(record.key.rsplit("/", 1)[1])
    named = app.store.get(key)
    assert named is not None and named.value["summary"] == keys_of(record.key, 1)[0]


def test_a_burial_cut_short_whose_record_item_version_is_damaged_is_finished(
    app: shardq.App,
) -> None:
    if isinstance(app.store, SqliteStore) and app.store.path == ":memory:":
        pytest.skip("an in-memory store cannot be damaged from outside")
    # given a burial of job v#0 cut short after its record item, whose version was then
    # damaged (no write can name it)
    body = envelope.encode(envelope.Envelope("Ledgered", "v", {"n": 0}))
    message = Message("shard.fifo", "id-v-0", "", body, "v", 1, 0.0, "r")
    record = morgue.record_for(message, morgue.REASON_MAX_RETRIES, RuntimeError("no"), 4)
    (e, full), ids, _ = morgue_record.items("Ledgered", record, morgue_record.new_stamp())
    app.store.put(*ids, version=None)
    app.store.put(e, full, version=None)
    damage_version(app, e, "x")
    # when the job is delivered again, dies again and is buried
    bury(app, [("v", 0)])
    # then it is recorded once, whole
    (found,) = Morgue(app, "Ledgered").list_jobs(entity="v")
    assert found.message_id == "id-v-0" and found.key == e and found.reason == "max_retries"


def test_purging_one_of_a_job_s_two_records_keeps_the_other_s_id_item(app: shardq.App) -> None:
    # given a job recorded twice: once by an earlier version (no id item), once since
    bury(app, [("q", 0)])
    dead = Morgue(app, "Ledgered")
    (older,) = dead.list_jobs(entity="q")
    app.store.delete(id_key("Ledgered", older.message_id))
    bury(app, [("q", 0)])
    _, newer = dead.list_jobs(entity="q")
    # when the older record is purged, and the job is delivered and buried once more
    assert dead.purge(Filter(entity="q", until=newer.failed_at - 1e-6)) == 1
    bury(app, [("q", 0)])
    # then the newer record still names the job: it is not recorded again
    assert [r.message_id for r in dead.list_jobs(entity="q")] == ["id-q-0"]


def test_a_burial_reads_none_of_its_entity_s_earlier_records(
    app: shardq.App, monkeypatch: pytest.MonkeyPatch
) -> None:
    # given an entity with many dead jobs already (a poison entity)
    bury(app, [("p", n) for n in range(30)])
    # when one more of its jobs dies, and one already buried is delivered again
    reads: list[str] = []
    query = app.store.query
    monkeypatch.setattr(
        app.store, "query", lambda prefix, **kw: (reads.append(prefix), query(prefix, **kw))[1]
    )
    bury(app, [("p", 30), ("p", 3)])
    # then no query of the morgue ran (each burial looks its job's id up), and each job
    # is recorded once
    assert [r for r in reads if r.startswith("morgue/")] == []
    ids = [r.message_id for r in Morgue(app, "Ledgered").list_jobs(entity="p", limit=100)]
    assert ids == [f"id-p-{n}" for n in range(31)]


def test_a_dead_job_with_one_damaged_item_is_listed_and_selected_by_its_message_id(
    app: shardq.App, capsys: pytest.CaptureFixture[str]
) -> None:
    if isinstance(app.store, SqliteStore) and app.store.path == ":memory:":
        pytest.skip("an in-memory store cannot be damaged from outside")
    # given dead jobs of f, the summary of the first and the record of the second not JSON
    bury(app, [("f", 0), ("f", 1), ("f", 2)], KeyError("k"))
    first, second, _ = Morgue(app, "Ledgered").list_jobs(entity="f")
    damage(app, keys_of(first.key, 1)[0], "[1, 2")
    damage(app, second.key, "garbage")
    # when they are listed, with --entity and without
    for entity in (["--entity", "f"], []):
        code, out, _ = cli(app, capsys, "list", "Ledgered", *entity, "--json")
        listed = [json.loads(line) for line in out.splitlines()]
        ids = [j["message_id"] for j in listed if j["entity_id"] == "f"]
        # then each is listed by its message id, the first whole, the second unreadable
        assert code == 0 and ids == ["id-f-0", "id-f-1", "id-f-2"]
        reasons = [j["reason"] for j in listed if j["entity_id"] == "f"]
        assert reasons == ["max_retries", "unreadable_record", "max_retries"]
    # and a requeue by error type sends the first (its record is whole) and stops at the second
    code, _, err = cli(app, capsys, "requeue", "Ledgered", "--error-type", "KeyError")
    assert code == 2 and queued(app, "f") == [0] and "dead job id-f-1 of entity f" in err
    # and the second is purged by its message id
    code, _, err = cli(app, capsys, "purge", "Ledgered", "--id", "id-f-1", "--yes")
    assert code == 0 and "purged 1 dead Ledgered job" in err
    assert [r.message_id for r in Morgue(app, "Ledgered").list_jobs(entity="f")] == ["id-f-2"]


def test_a_purge_of_an_unreadable_dead_job_deletes_every_piece_of_its_body(
    app: shardq.App, capsys: pytest.CaptureFixture[str]
) -> None:
    if isinstance(app.store, SqliteStore) and app.store.path == ":memory:":
        pytest.skip("an in-memory store cannot be damaged from outside")
    # given a dead job whose body takes 3 items more, its summary and record not JSON
    message = Message("shard.fifo", "big-1", "", "x" * 700_000, "g", 1, 0.0, "0")
    record = morgue.record_for(message, morgue.REASON_MAX_RETRIES, RuntimeError("no"), 4)
    morgue.bury(app.store, "Ledgered", [record])
    key = Morgue(app, "Ledgered").list_jobs(entity="g")[0].key
    assert len(app.store.query_all("morgue/Ledgered/p/")) == 3
    for item in keys_of(key, 1):
        damage(app, item, "garbage")
    # when it is purged by the id it is listed with
    code, _, err = cli(app, capsys, "purge", "Ledgered", "--id", key, "--yes")
    # then none of its items is left
    assert code == 0 and "purged 1 dead Ledgered job" in err
    assert app.store.query_all("morgue/Ledgered/p/") == []
    assert Morgue(app, "Ledgered").size() == 5


def test_a_node_buries_a_job_of_an_entity_that_has_a_damaged_dead_job_and_runs_on(
    app: shardq.App,
) -> None:
    if isinstance(app.store, SqliteStore) and app.store.path == ":memory:":
        pytest.skip("an in-memory store cannot be damaged from outside")
    # given e1's first dead job with its record not JSON
    first = next(r for r in Morgue(app, "Ledgered").list_jobs() if r.entity_id == "e1")
    damage(app, first.key, "garbage")
    # when another job of e1 dies on a node
    Ledgered.publish_many([("e1", {"n": 9, "permanent": True})])
    code = app.node(app.plan(threads=1), until_empty=True).run()
    # then the node buries it and ends as usual, and the damaged one is still listed
    assert code == 0
    listed = Morgue(app, "Ledgered").list_jobs(entity="e1")
    assert len(listed) == 4 and listed[0].reason == "unreadable_record"
    assert numbers(listed[-1:]) == [("e1", 9)]


def test_a_removed_workers_dead_jobs_are_listed_when_its_first_record_is_damaged(
    app: shardq.App, capsys: pytest.CaptureFixture[str]
) -> None:
    if isinstance(app.store, SqliteStore) and app.store.path == ":memory:":
        pytest.skip("an in-memory store cannot be damaged from outside")
    # given the dead Ledgered jobs, the summary of the first not JSON, seen by an app that
    # no longer registers Ledgered
    first = Morgue(app, "Ledgered").list_jobs()[0]
    damage(app, keys_of(first.key, 1)[0], "[1, 2")
    gone = shardq.App(app.config, broker=app.broker, store=app.store)
    # when they are listed, then all 5 are shown
    code, out, err = cli(gone, capsys, "list", "Ledgered", "--json")
    assert code == 0 and len(out.splitlines()) == 5, err
