"""docs/envelope.md is enough to publish: plain boto3, the document's example, a node runs it.
And a message that is not an envelope is morgued saying so."""

from __future__ import annotations

import hashlib
import json
import re
import threading
import uuid
from pathlib import Path
from typing import Any

import boto3
import pytest

import shardq
from shardq.broker import MemoryBroker
from shardq.broker.base import SendEntry
from shardq.core import envelope
from shardq.core.config import Config
from shardq.morgue import Morgue
from tests.children import ROOT
from tests.conftest import make_broker

DOC = ROOT / "docs" / "envelope.md"
app = shardq.App()
done: list[tuple[str, Any]] = []


@app.register
class SyncOrder(shardq.Worker):
    shards = 4

    def perform(self, entity_id: str, payloads: list[Any]) -> None:
        done.extend((entity_id, p) for p in payloads)


def json_blocks(section: str) -> list[Any]:
    """The ```json blocks of the section of docs/envelope.md headed ``section``."""
    text = DOC.read_text(encoding="utf-8")
    part = text.split(f"\n## {section}\n", 1)[1].split("\n## ", 1)[0]
    return [json.loads(b) for b in re.findall(r"```json\n(.*?)\n```", part, re.S)]


def doc_shard_for(entity: str, shards: int) -> int:
    """The document's shard rule, written out here as a producer would."""
    digest = hashlib.blake2b(entity.encode("utf-8"), digest_size=8).digest()
    return int.from_bytes(digest, "big") % shards


def run_until_empty() -> None:
    node = app.node(app.plan(threads=1), until_empty=True, seed=1)
    runner = threading.Thread(target=node.run)
    runner.start()
    runner.join(60)
    assert not runner.is_alive(), "the node did not drain in time"


@pytest.mark.sqs
def test_a_message_published_with_plain_boto3_from_the_document_runs(
    tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    # given the queues of an app, and the document's example message and schema
    (example,) = json_blocks("Example message")
    (schema,) = json_blocks("The body: the envelope")
    assert set(schema["required"]) <= set(example) <= set(schema["properties"])
    prefix = f"c{uuid.uuid4().hex[:8]}-"
    broker = make_broker("sqs", tmp_path, request)
    app.configure(Config(queue_prefix=prefix, idle_wait_seconds=1), broker=broker)
    app.ensure_queues()
    done.clear()
    # when another producer sends it with boto3 alone, following the document
    server = request.getfixturevalue("sqs_emulator")
    sqs = boto3.client("sqs", region_name="us-east-1", endpoint_url=server.endpoint_url)
    entity = example["entity"]
    queue = f"{prefix}sync-order-{doc_shard_for(entity, 4)}.fifo"
    url = sqs.get_queue_url(QueueName=queue)["QueueUrl"]
    dedup = hashlib.sha256(f"{entity}\0first".encode()).hexdigest()
    for _ in range(2):  # sent twice with the same dedup id: queued once
        sqs.send_message(
            QueueUrl=url,
            MessageBody=json.dumps(example),
            MessageGroupId=entity,
            MessageDeduplicationId=dedup,
        )
    # then a node runs it once, with the example's entity and payload
    run_until_empty()
    assert done == [(entity, example["payload"])]
    broker.close()


def test_a_message_that_is_not_an_envelope_is_morgued_saying_so() -> None:
    # given bodies some other producer wrote into a shard queue
    app.configure(Config(idle_wait_seconds=1), broker=MemoryBroker())
    app.ensure_queues()
    done.clear()
    queue = app.shard_queue("SyncOrder", doc_shard_for("e", 4))
    bodies = ['{"a": 1}', "not json", "[1, 2]"]
    entries = [SendEntry(str(i), b, "e", f"d{i}") for i, b in enumerate(bodies)]
    assert app.broker.send_batch(queue, entries).failed == {}
    # when a node runs
    run_until_empty()
    # then each is in the morgue, saying it is not a shardq envelope (not "upgrade")
    records = Morgue(app, "SyncOrder").list_jobs()
    assert [r.body for r in records] == bodies
    for record in records:
        assert "not a shardq envelope" in record.error_message, record.error_message
        assert "upgrade" not in record.error_message
    assert done == []


def test_a_body_sent_with_another_entity_as_its_group_is_morgued_not_run_for_it() -> None:
    # given a signed job of entity order-1, replayed by someone without the key as the
    # job of entity order-2 (the signature covers the body, not the MessageGroupId)
    app.configure(Config(idle_wait_seconds=1, signing_key="k"), broker=MemoryBroker())
    app.ensure_queues()
    done.clear()
    body = envelope.encode(envelope.Envelope("SyncOrder", "order-1", {"refund": 5}), b"k")
    queue = app.shard_queue("SyncOrder", doc_shard_for("order-2", 4))
    assert app.broker.send_batch(queue, [SendEntry("0", body, "order-2", "d0")]).failed == {}
    # when a node runs
    run_until_empty()
    # then it runs for no entity: the morgue has it, saying why
    assert done == []
    (record,) = Morgue(app, "SyncOrder").list_jobs()
    assert record.reason == "invalid_message"
    assert "order-1" in record.error_message and "order-2" in record.error_message


def test_a_body_with_a_number_too_large_for_a_float_is_morgued_and_the_node_runs_on() -> None:
    # given a body whose meta holds 1e999 (JSON text that reads as infinity), then a job
    app.configure(Config(idle_wait_seconds=1), broker=MemoryBroker())
    app.ensure_queues()
    done.clear()
    queue = app.shard_queue("SyncOrder", doc_shard_for("e", 4))
    bad = '{"v":1,"worker":"SyncOrder","entity":"e","payload":1,"published_at":1,"meta":{"x":'
    bad += "1e999}}"
    good = envelope.encode(envelope.Envelope("SyncOrder", "e", 2))
    entries = [SendEntry("0", bad, "e", "d0"), SendEntry("1", good, "e", "d1")]
    assert app.broker.send_batch(queue, entries).failed == {}
    # when a node runs
    run_until_empty()
    # then the first is in the morgue saying why (the node did not stop), the job ran
    (record,) = Morgue(app, "SyncOrder").list_jobs()
    assert record.reason == "invalid_message"
    assert record.error_message == "the envelope holds a number too large for a double (1e999)"
    assert done == [("e", 2)]
