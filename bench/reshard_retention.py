"""A reshard on queues that keep messages 60 s (the SQS minimum): nothing may depend on
how long a message lives.

ministack serves SQS and DynamoDB; ``MessageRetentionPeriod`` is set to 60 s on every
queue right after it is made (the shard queues before the run, the new generation's
right after ``shardq reshard`` made them). Two static ``shardq run`` nodes serve the
ledger app (``tests/apps/ledger.py``, 3 shards), or with ``--elastic`` ``--nodes``
elastic ones (``shardq run`` without ``--node``, lease 10 s); the driver publishes one numbered job
of each of 20 entities every 2 s for ``--seconds``, and reshards to 5 shards half-way
(trust 10 s), following the move as ``shardq reshard`` does. Then it waits for the
jobs to drain and checks the ledger: every job ran (none lost to retention), in
publish order per entity, never two at once, and every queue of the live layout is
empty. With ``--elastic``, every 2 s it also reads the state store's shard owners and
reports the longest time any live shard went without a node that beats.

    python bench/reshard_retention.py --seconds 300
    python bench/reshard_retention.py --seconds 300 --elastic --nodes 3
"""

from __future__ import annotations

import argparse
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from shardq.core.config import Config  # noqa: E402
from shardq.ops import reshard  # noqa: E402
from shardq.ops.ensure import ensure_state_table  # noqa: E402
from tests import emulator  # noqa: E402
from tests.apps import ledger  # noqa: E402

ENTITIES = 20
RETENTION = 60


def retain(queues: list[str]) -> None:
    """Set the SQS minimum retention on ``queues``."""
    client = ledger.app.broker.client  # type: ignore[attr-defined]
    for queue in queues:
        url = client.get_queue_url(QueueName=queue)["QueueUrl"]
        client.set_queue_attributes(
            QueueUrl=url, Attributes={"MessageRetentionPeriod": str(RETENTION)}
        )


class Unserved:
    """The longest stretch any live shard had no owner with a live heartbeat, counted
    from the first look at which every live shard had one (the nodes' start is not
    judged)."""

    def __init__(self) -> None:
        self.since: dict[str, float] = {}
        self.longest = 0.0
        self.looks = 0
        self.served = False

    def look(self, app: Any) -> None:
        app.layouts.refresh()
        shards = app.live_shards("Ledgered").items()
        live = {f"{name}:{s}" for name, count in shards for s in range(count)}
        beating = {
            i.key.partition("/")[2] for i in app.store.query_all("node/") if not i.value.get("gone")
        }
        owned = {
            i.key.partition("/")[2]
            for i in app.store.query_all("shard/")
            if i.value.get("owner") in beating
        }
        now = time.monotonic()
        self.looks += 1
        self.served = self.served or live <= owned
        if not self.served:
            return
        for key in live:
            if key in owned:
                self.since.pop(key, None)
            else:
                start = self.since.setdefault(key, now)
                self.longest = max(self.longest, now - start)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=300.0)
    parser.add_argument("--elastic", action="store_true", help="an elastic fleet")
    parser.add_argument("--nodes", type=int, default=2, help="node processes (2)")
    args = parser.parse_args()
    server = emulator.start()
    tmp = Path(tempfile.mkdtemp(prefix="shardq-retention-"))
    env = {
        "SHARDQ_BROKER_URL": "sqs://",
        "SHARDQ_ENDPOINT_URL": server.endpoint_url,
        "SHARDQ_REGION": "us-east-1",
        "SHARDQ_QUEUE_PREFIX": f"ret{uuid.uuid4().hex[:6]}-",
        "SHARDQ_RESHARD_TRUST_SECONDS": "10",
        "SHARDQ_LAYOUT_REFRESH_SECONDS": "1",
        "SHARDQ_IDLE_WAIT_SECONDS": "1",
        "SHARDQ_LOG_FORMAT": "json",
        "SHARDQ_APP": "tests.apps.ledger",
        "LEDGER_PATH": str(tmp / "ledger.jsonl"),
    }
    if args.elastic:
        env["SHARDQ_LEASE_SECONDS"] = "10"
    os.environ.update(env)
    for key in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"):
        os.environ.setdefault(key, "test")  # ministack takes any
    app = ledger.app
    app.configure(Config.load(env={k: v for k, v in env.items() if k.startswith("SHARDQ_")}))
    ensure_state_table(app)
    retain(app.ensure_queues())
    static = ["--node", "{i}", "--nodes", str(args.nodes)]
    nodes = [
        subprocess.Popen(
            [sys.executable, "-m", "shardq", "run", *[a.format(i=i) for a in static]]
            if not args.elastic
            else [sys.executable, "-m", "shardq", "run"],
            cwd=ROOT,
            stdout=subprocess.DEVNULL,
            stderr=open(tmp / f"node{i}.log", "wb"),  # noqa: SIM115
        )
        for i in range(args.nodes)
    ]
    entities = [f"r{i}" for i in range(ENTITIES)]
    began, n, resharded, ended = time.monotonic(), 0, None, None
    watch = Unserved()
    clean = False
    try:
        while time.monotonic() - began < args.seconds:
            if args.elastic:
                watch.look(app)
            ledger.Ledgered.publish_many([(e, {"n": n}) for e in entities])
            n += 1
            elapsed = time.monotonic() - began
            if resharded is None and elapsed >= args.seconds / 2:
                layout = reshard.start(app, "Ledgered", 5)
                retain([app.shard_queue("Ledgered", s, layout.gen) for s in range(5)])
                resharded = elapsed
                print(f"{elapsed:6.1f} s: reshard 3 -> 5 announced", flush=True)
            if resharded is not None and ended is None:
                progress = reshard.progress(app, "Ledgered")
                if progress.done:
                    ended = elapsed
                    print(f"{elapsed:6.1f} s: reshard done", flush=True)
            time.sleep(2.0)
        expected = dict.fromkeys(entities, n)
        deadline = time.monotonic() + 120
        while ended is None and resharded is not None and time.monotonic() < deadline:
            if reshard.progress(app, "Ledgered").done:
                ended = time.monotonic() - began
                print(f"{ended:6.1f} s: reshard done (after publishing)", flush=True)
            time.sleep(1.0)
        while time.monotonic() < deadline:
            entries = ledger.read(env["LEDGER_PATH"])
            done = {(e["entity"], e["n"]) for e in entries if e["event"] == "end"}
            if len(done) >= ENTITIES * n:
                break
            time.sleep(1.0)
        problems = ledger.check(ledger.read(env["LEDGER_PATH"]), expected)
        live = app.live_shards("Ledgered")
        left = {
            q: app.broker.counts(q).waiting + app.broker.counts(q).in_flight
            for q in app.ensure_queues()
            if not q.endswith("-morgue.fifo")
        }
        print(f"published {ENTITIES * n} jobs over {args.seconds:.0f} s, retention {RETENTION} s")
        print(f"reshard announced at {resharded} s, done at {ended} s; live shards {live}")
        print({k: len(v) for k, v in problems.items()}, "left in queues:", sum(left.values()))
        if args.elastic:
            print(
                f"{args.nodes} elastic nodes; longest a live shard went without a beating "
                f"owner: {watch.longest:.1f} s ({watch.looks} looks every 2 s; all served "
                f"once: {watch.served})"
            )
        ok = ended is not None and not any(problems.values()) and not any(left.values())
        ok = ok and (watch.served or not args.elastic)
        print("OK" if ok else "FAILED")
        clean = ok
        if not ok:
            print(f"kept the ledger and the node logs: {tmp}")
        return 0 if ok else 1
    finally:
        for node in nodes:
            node.send_signal(signal.SIGTERM)
        for node in nodes:
            try:
                node.wait(30)
            except subprocess.TimeoutExpired:
                node.kill()
        emulator.stop(server)
        if clean:
            shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
