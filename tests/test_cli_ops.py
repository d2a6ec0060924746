"""The operations commands, as a user runs them, on the embedded broker and on SQS."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from shardq.broker import SendEntry
from shardq.core.topology import shard_for
from tests.apps import ledger
from tests.children import ROOT, Env
from tests.conftest import needs_shared_store
from tests.fleet_items import heartbeat
from tests.test_fleet_damaged import damage

pytestmark = pytest.mark.slow


def stats(env: Env) -> dict:  # type: ignore[type-arg]
    result = env.cli("stats", "--json")
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout)  # type: ignore[no-any-return]


def test_publish_shows_up_in_stats_and_a_node_drains_it(env: Env) -> None:
    # given a job published from the command line
    result = env.cli("publish", "Ledgered", "order-42", '{"n": 0}', "--meta", '{"trace": "t-1"}')
    assert result.returncode == 0, result.stderr
    assert len(result.stdout.strip()) > 10  # the message id
    # then stats show it waiting in the entity's shard
    shard = shard_for("order-42", 3)
    worker = stats(env)["by_worker"]["Ledgered"]
    assert worker["length"] == 1 and worker["shards"][shard]["length"] == 1
    assert stats(env)["total"]["length"] == 1
    # and after a node ran, nothing is left and its summary counts the job per worker
    ran = env.cli("run", "--until-empty")
    assert ran.returncode == 0
    assert "1 job succeeded in" in ran.stderr
    header, row = ran.stderr.splitlines()[-2:]
    assert header.split() == ["worker", "succeeded", "retried", "morgued"]
    assert row.split() == ["Ledgered", "1", "0", "0"]
    assert stats(env)["total"]["length"] == 0
    assert ("end", "order-42", 0) in env.events()


def test_stats_table_is_readable(env: Env) -> None:
    env.cli("publish", "Ledgered", "e", '{"n": 0}')
    result = env.cli("stats")
    assert result.returncode == 0
    lines = result.stdout.splitlines()
    assert lines[0].split() == [
        "worker",
        "length",
        "in",
        "flight",
        "morgue",
        "lag",
        "done",
        "owner",
    ]
    assert lines[1].split()[:2] == ["Ledgered", "1"]
    assert lines[-1].split()[:2] == ["total", "1"]


def test_morgue_list_requeue_and_purge(env: Env) -> None:
    # given dead jobs of two entities (the store's table made as an operator would)
    # (published from code: the publish command is the tests' above and below)
    assert env.cli("queues", "ensure").returncode == 0
    ledger.Ledgered.publish_many(
        [(entity, {"n": n, "permanent": True}) for entity, n in [("e1", 0), ("e1", 1), ("e2", 0)]]
    )
    assert env.cli("run", "--until-empty").returncode == 0
    # when they are listed
    listed = env.cli("morgue", "list", "Ledgered", "--json")
    assert listed.returncode == 0, listed.stderr
    records = [json.loads(line) for line in listed.stdout.splitlines()]
    assert sorted((r["entity_id"], r["payload"]["n"]) for r in records) == [
        ("e1", 0),
        ("e1", 1),
        ("e2", 0),
    ]
    assert {r["reason"] for r in records} == {"permanent_error"}
    # and e1's are requeued
    requeued = env.cli("morgue", "requeue", "Ledgered", "--entity", "e1")
    assert requeued.returncode == 0 and "requeued 2 dead Ledgered jobs" in requeued.stderr
    assert "tail of its entity's jobs" in requeued.stderr
    after = stats(env)["by_worker"]["Ledgered"]
    assert after["shards"][shard_for("e1", 3)]["length"] == 2 and after["morgue_length"] == 1
    # then neither acts on every dead job unless told so with --all
    for action, *confirm in [("requeue",), ("purge", "--yes")]:
        unsaid = env.cli("morgue", action, "Ledgered", *confirm)
        assert unsaid.returncode == 2 and "--all" in unsaid.stderr, unsaid.stderr
        both = env.cli("morgue", action, "Ledgered", "--all", "--entity", "e2", *confirm)
        assert both.returncode == 2 and "alone" in both.stderr, both.stderr
    assert stats(env)["by_worker"]["Ledgered"]["morgue_length"] == 1
    # and purge needs confirmation, and removes the rest with --all --yes
    refused = env.cli("morgue", "purge", "Ledgered", "--all", stdin="")
    assert refused.returncode == 2 and "--yes" in refused.stderr
    purged = env.cli("morgue", "purge", "Ledgered", "--all", "--yes")
    assert purged.returncode == 0 and "purged 1 dead Ledgered job (all of them)" in purged.stderr
    assert stats(env)["by_worker"]["Ledgered"]["morgue_length"] == 0


def test_queues_ensure_creates_then_checks_then_reports_drift(env: Env) -> None:
    first = env.cli("queues", "ensure")
    assert first.returncode == 0, first.stderr
    assert "3 queues created, 0 checked, 0 drifted" in first.stderr  # 3 shards
    second = env.cli("queues", "ensure")
    assert "0 queues created, 3 checked, 0 drifted" in second.stderr
    # given the worker now wants a longer visibility timeout than the queues have
    env.vars["SHARDQ_WORKERS__Ledgered__visibility_timeout"] = "90"
    drifted = env.cli("queues", "ensure")
    assert drifted.returncode == 4
    assert "VisibilityTimeout is 2 s, Ledgered.visibility_timeout is 90 s" in drifted.stdout


# (refused before any broker call: on SQS these would repeat the same checks behind
# the DynamoDB table's setup)
@pytest.mark.parametrize("env", ["sqlite"], indirect=True)
@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["publish", "Ledgered", "e", "{not json"], "PAYLOAD_JSON is not valid JSON"),
        (["publish", "Nope", "e", "{}"], "no worker named 'Nope'"),
        (["publish", "Ledgered", "has space", "{}"], "contains ' '"),
        (["morgue", "list", "Nope"], "no worker named 'Nope'"),
    ],
)
def test_bad_input_exits_2_with_the_reason(env: Env, args: list[str], message: str) -> None:
    result = env.cli(*args)
    assert result.returncode == 2
    assert message in result.stderr


def test_an_unreachable_broker_exits_1() -> None:
    # given an SQS endpoint where nothing listens (one broker kind: no env fixture)
    environment = {k: v for k, v in os.environ.items() if not k.startswith("SHARDQ_")}
    environment.update(
        SHARDQ_APP="tests.apps.ledger",
        SHARDQ_BROKER_URL="sqs://",
        SHARDQ_REGION="us-east-1",
        SHARDQ_ENDPOINT_URL="http://127.0.0.1:9",
        AWS_ACCESS_KEY_ID="x",
        AWS_SECRET_ACCESS_KEY="y",
    )
    # when stats are asked for
    result = subprocess.run(
        [sys.executable, "-m", "shardq", "stats"],
        cwd=ROOT,
        env=environment,
        capture_output=True,
        text=True,
        timeout=120,
    )
    # then the command exits 1 and says the broker is unreachable
    assert result.returncode == 1
    assert "broker error" in result.stderr and "cannot reach SQS" in result.stderr


def test_publish_file_publishes_every_line_in_order_and_the_morgue_lists_them_all(
    env: Env, tmp_path: Path
) -> None:
    # given 60 jobs in a file, the 10 of entity "a" and each 10th of the others failing
    # for good, published in one command
    lines = [
        json.dumps({"entity": "a" if n % 6 == 0 else f"o{n % 7}", "payload": {"n": n}})
        for n in range(60)
    ]
    lines = [
        line.replace("}}", ', "permanent": true}}') if ('"a"' in line or n % 10 == 1) else line
        for n, line in enumerate(lines)
    ]
    jobs = tmp_path / "jobs.jsonl"
    jobs.write_text("\n".join(lines) + "\n")
    assert env.cli("queues", "ensure").returncode == 0  # the store's table, for the morgue
    published = env.cli("publish", "Ledgered", "--file", str(jobs))
    assert published.returncode == 0, published.stderr
    assert "published 60 Ledgered jobs from" in published.stderr
    assert stats(env)["total"]["length"] == 60
    assert env.cli("run", "--until-empty").returncode == 0
    # when the morgue is listed, as a table and as JSON
    table = env.cli("morgue", "list", "Ledgered")
    listed = env.cli("morgue", "list", "Ledgered", "--json")
    # then every dead job shows, the times are labelled UTC, and nothing is said missing
    dead = sorted(n for n, line in enumerate(lines) if '"permanent": true' in line)
    records = [json.loads(line) for line in listed.stdout.splitlines()]
    assert sorted(r["payload"]["n"] for r in records) == dead
    assert [r["payload"]["n"] for r in records if r["entity_id"] == "a"] == list(range(0, 60, 6))
    assert "died (UTC)" in table.stdout.splitlines()[0]
    assert f"{len(dead)} dead Ledgered jobs shown; the morgue holds {len(dead)}\n" in (
        listed.stderr
    )
    # and a listing with a limit says where the next page starts
    limited = env.cli("morgue", "list", "Ledgered", "--json", "--limit", "5")
    assert "more match: the next page is --after " in limited.stderr


def test_requeue_refuses_an_unreadable_record_and_keeps_it(env: Env) -> None:
    # given garbage written straight into an old morgue queue, with the right kind,
    # moved into the store by `queues ensure`
    app = ledger.app
    queue = app.morgue_queue("Ledgered")
    app.ensure_queue(queue, "Ledgered")
    forged = json.dumps({"kind": "shardq.morgue", "v": 1, "body": 7, "entity_id": "f"})
    assert not app.broker.send_batch(queue, [SendEntry("0", forged, "f", "forged-1")]).failed
    ensured = env.cli("queues", "ensure")
    assert "morgue: moved 1 dead Ledgered job from the morgue queue" in ensured.stdout
    # when it is listed, then it shows as unreadable
    listed = env.cli("morgue", "list", "Ledgered")
    assert listed.returncode == 0, listed.stderr
    assert "unreadable_record" in listed.stdout
    # when everything is requeued, then it is refused by name, kept, and the exit code says so
    requeued = env.cli("morgue", "requeue", "Ledgered", "--all")
    assert requeued.returncode == 2, requeued.stderr
    assert "requeued 0 dead Ledgered jobs" in requeued.stderr
    assert "not requeued: dead job" in requeued.stderr and "stays in the morgue" in requeued.stderr
    assert "Traceback" not in requeued.stderr
    assert stats(env)["by_worker"]["Ledgered"]["morgue_length"] == 1


# -- the fleet -----------------------------------------------------------------------
def test_nodes_without_any_report_says_how_to_start_one(env: Env) -> None:
    # given the app's queues, and no node ever ran
    assert env.cli("queues", "ensure").returncode == 0
    # when the nodes are asked for, as a table and as JSON
    table = env.cli("nodes")
    listed = env.cli("nodes", "--json")
    # then both say no node has reported, how to start one, and exit 0
    for result in (table, listed):
        assert result.returncode == 0, result.stderr
        assert "no node has reported yet" in result.stderr and "shardq run" in result.stderr
    assert table.stdout == ""
    doc = json.loads(listed.stdout)
    assert doc["nodes"] == [] and doc["gone"] == [] and doc["time"] > 0


def test_nodes_lists_the_live_nodes_those_gone_and_the_shards_nobody_serves(env: Env) -> None:
    # given a live node, one marked gone 90 s ago holding shard 2, one gone 10 minutes ago
    needs_shared_store(ledger.app)
    now, store = time.time(), ledger.app.store
    lags = {"Ledgered:0": 2.0, "Ledgered:1": 0.0}
    heartbeat(store, "n-live", now - 3, tuple(lags), lags=lags, jobs_per_second=12.5)
    heartbeat(store, "n-dead", now - 90, ("Ledgered:2",), gone="lease expired", gone_at=now - 80)
    item = store.get("shard/Ledgered:2")
    assert item is not None
    store.put("shard/Ledgered:2", {"owner": ""}, version=item.version)  # freed
    heartbeat(store, "n-old", now - 700, (), gone="lease expired", gone_at=now - 600)
    env.cli("publish", "Ledgered", "e", '{"n": 0}')
    waiting = shard_for("e", 3)
    # when the nodes are listed as a table
    table = env.cli("nodes")
    assert table.returncode == 0, table.stderr
    live_part, gone_part, unserved = table.stdout.strip().split("\n\n")
    # then the live node shows with its host, pid, shards, jobs/s and max lag
    header, row = live_part.splitlines()
    assert header.split()[:4] == ["node", "host", "pid", "mode"]
    assert row.split()[:4] == ["n-live", "ip-10-0-1-6", "4106", "elastic"]
    assert row.split()[-9:] == ["ago", "2", "-", "12.5", "0", "0", "0", "2.0", "s"]
    # and the gone ones, the latest first, with why
    gone = gone_part.splitlines()
    assert gone[0] == "gone in the last hour:"
    assert [line.split()[0] for line in gone[2:]] == ["n-dead", "n-old"]
    assert "lease expired" in gone[2]
    # and the shard nobody serves, with its backlog
    backlog = 1 if waiting == 2 else 0
    assert (
        unserved == f"1 shard served by no live node (lag unknown): Ledgered:2 ({backlog} waiting)"
    )
    # when listed as JSON, then the same in the documented shape
    listed = env.cli("nodes", "--json")
    doc = json.loads(listed.stdout)
    assert set(doc) == {"time", "nodes", "gone", "unserved", "no_live_node", "damaged"}
    (node,) = doc["nodes"]
    assert node["node"] == "n-live" and node["held"] == ["Ledgered:0", "Ledgered:1"]
    assert (node["shards"], node["jobs_per_second"], node["max_lag"]) == (2, 12.5, 2.0)
    assert [(g["node"], g["reason"]) for g in doc["gone"]] == [
        ("n-dead", "lease expired"),
        ("n-old", "lease expired"),
    ]
    assert doc["gone"][0]["unserved"] == ["Ledgered:2"]
    assert doc["unserved"] == ["Ledgered:2"] and doc["no_live_node"] is False


def test_stats_show_each_shard_owner_and_lag_from_the_reports(env: Env) -> None:
    # given a waiting job, and a node reporting shards 0 and 1 (not 2) with their lags,
    # beside a node that went silent
    needs_shared_store(ledger.app)
    env.cli("publish", "Ledgered", "e", '{"n": 0}')
    now, store = time.time(), ledger.app.store
    lags = {"Ledgered:0": 42.0, "Ledgered:1": 0.0}
    heartbeat(store, "n-1", now - 2, tuple(lags), lags=lags, jobs_per_second=3.25, done=40)
    heartbeat(store, "n-2", now - 120, (), gone="lease expired", gone_at=now - 110, done=9)
    # when stats are asked for
    result = env.cli("stats", "--json")
    assert result.returncode == 0, result.stderr
    stats = json.loads(result.stdout)
    shards = stats["by_worker"]["Ledgered"]["shards"]
    # then each shard names its owner, on every broker
    assert [s["owner"] for s in shards] == ["n-1", "n-1", None]
    # and the total of the reports leaves the silent node out, and says so
    fleet = stats["fleet"]
    assert (fleet["nodes"], fleet["jobs_per_second"]) == (1, 3.25)
    assert (fleet["done"], fleet["retried"], fleet["failed"]) == (40, 0, 0)
    assert [(e["node"], e["reason"]) for e in fleet["excludes"]] == [("n-2", "lease expired")]
    assert fleet["unserved"] == ["Ledgered:2"]
    waiting = shard_for("e", 3)
    if env.vars["SHARDQ_BROKER_URL"] == "sqs://":
        # and on SQS the lags are the owner's reports (none for the shard nobody holds)
        assert stats["lag_source"] == "reports"
        assert [s["lag"] for s in shards] == [42.0, 0.0, None]
        assert stats["by_worker"]["Ledgered"]["lag"] == 42.0
    else:
        # and the embedded broker keeps the exact lag it knows
        assert stats["lag_source"] == "broker"
        assert shards[waiting]["lag"] < 30
        assert all(s["lag"] is None for i, s in enumerate(shards) if i != waiting)
    # and the table shows the owners and the fleet under it
    table = env.cli("stats")
    rows = {line.split()[0]: line.split() for line in table.stdout.splitlines()}
    assert rows["[0]"][-1] == "n-1" and rows["[2]"][-1] == "-"
    assert "1 node live, 3.2 jobs/s together" in table.stderr
    assert "excludes n-2: lease expired since" in table.stderr
    assert "1 shard served by no live node (lag unknown): Ledgered:2" in table.stderr
    # and on SQS, which counts no jobs done, the live node's reported counts
    counted = "since they started: 40 done, 0 retried, 0 failed" in table.stderr
    assert counted == (env.vars["SHARDQ_BROKER_URL"] == "sqs://"), table.stderr


def test_nodes_and_stats_show_the_fleet_around_a_damaged_item_and_name_it(env: Env) -> None:
    # given a live node, and a heartbeat and an ownership item that are not JSON
    needs_shared_store(ledger.app)
    store = ledger.app.store
    heartbeat(store, "n-live", time.time() - 3, ("Ledgered:0", "Ledgered:2"))
    heartbeat(store, "n-bad", time.time() - 3, ("Ledgered:1",))
    damage(ledger.app, "node/n-bad", "{not json")
    damage(ledger.app, "shard/Ledgered:2", "garbage")
    env.cli("publish", "Ledgered", "e", '{"n": 0}')
    # when the nodes and the stats are listed
    table, listed, stats = env.cli("nodes"), env.cli("nodes", "--json"), env.cli("stats")
    # then the live node shows and each damaged item is named, exit 0
    for result in (table, listed, stats):
        assert result.returncode == 0, result.stderr
        assert "store item 'node/n-bad' is damaged" in result.stderr
        assert "store item 'shard/Ledgered:2' is damaged" in result.stderr
    assert table.stdout.splitlines()[1].split()[0] == "n-live"
    assert [n["node"] for n in json.loads(listed.stdout)["nodes"]] == ["n-live"]
    assert "1 node live" in stats.stderr


def test_when_every_fleet_item_is_damaged_no_node_has_reported_and_each_is_named(
    env: Env,
) -> None:
    # given a heartbeat and an ownership item, both not JSON, and nothing else of the fleet
    needs_shared_store(ledger.app)
    heartbeat(ledger.app.store, "n-bad", time.time() - 3, ("Ledgered:1",))
    damage(ledger.app, "node/n-bad", "{not json")
    damage(ledger.app, "shard/Ledgered:1", "garbage")
    env.cli("publish", "Ledgered", "e", '{"n": 0}')
    # when the nodes and the stats are listed, as tables and as JSON
    table, listed = env.cli("nodes"), env.cli("nodes", "--json")
    stats_table, stats_json = env.cli("stats"), env.cli("stats", "--json")
    # then no node has reported, and each damaged item is named on stderr and in the JSON
    for result in (table, listed, stats_table, stats_json):
        assert result.returncode == 0, result.stderr
        assert "store item 'node/n-bad' is damaged" in result.stderr
        assert "store item 'shard/Ledgered:1' is damaged" in result.stderr
    assert table.stdout == "" and "no node has reported yet" in table.stderr
    assert "no node has reported yet" in stats_table.stderr
    for damaged in (json.loads(listed.stdout)["damaged"], stats(env)["fleet_damaged"]):
        assert len(damaged) == 2 and all("is damaged" in why for why in damaged)
    assert stats(env)["fleet"] is None


@pytest.mark.parametrize("env", [pytest.param("sqs", marks=pytest.mark.sqs)], indirect=True)
def test_stats_with_the_state_store_down_shows_the_counts_and_says_what_is_missing(
    env: Env,
) -> None:
    # given a job waiting on SQS, and a state store (DynamoDB) where nothing listens
    assert env.cli("publish", "Ledgered", "e", '{"n": 0}').returncode == 0
    env.vars["SHARDQ_STORE_URL"] = "dynamodb://?endpoint_url=http://127.0.0.1:9"
    # when the stats are asked for, as a table and as JSON
    table, listed = env.cli("stats"), env.cli("stats", "--json")
    # then both show the queue counts, exit 0 (a partial answer) and say what is missing
    for result in (table, listed):
        assert result.returncode == 0, result.stderr
        assert "cannot read the morgue sizes from the state store" in result.stderr
        assert "Traceback" not in result.stderr
    assert table.stdout.splitlines()[1].split()[:4] == ["Ledgered", "1", "0", "-"]
    data = json.loads(listed.stdout)
    assert data["total"]["length"] == 1 and data["total"]["morgue_length"] is None
    assert data["by_worker"]["Ledgered"]["morgue_length"] is None
    assert "127.0.0.1:9" in data["morgue_error"] and data["fleet_error"]
