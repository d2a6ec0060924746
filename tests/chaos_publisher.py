"""The chaos run's publisher as a process of its own (``Settings.publisher = "process"``).

Run by :mod:`tests.chaos` as ``python -m tests.chaos_publisher SETTINGS_JSON OUT`` with
the nodes' environment (``SHARDQ_*``): it publishes the run's bursts (the same ones,
from the same seed, as the in-process publisher) spread over ``publish_window``
seconds, sending a slice again with the same dedup ids when it fails. Each slice whose
send returned is appended to ``OUT`` as one JSON line ``{"t": time, "jobs": [[entity,
n], ...]}``; the last line is ``{"published": N, "retries": R}``. Exit status 0 when
every job was published.

Being another process, it reads the layout document on its own schedule
(``SHARDQ_LAYOUT_REFRESH_SECONDS``), as a real publisher would during a reshard.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import threading
from pathlib import Path
from typing import Any

from shardq.core.config import Config
from tests.apps import ledger


def main(argv: list[str]) -> int:
    from tests import chaos

    settings_path, out_path = argv
    settings = chaos.Settings.from_json(json.loads(Path(settings_path).read_text()))
    config = Config.load(env={k: v for k, v in os.environ.items() if k.startswith("SHARDQ_")})
    ledger.app.configure(config)
    bursts, _ = chaos.jobs_of(settings)
    out = open(out_path, "a")  # noqa: SIM115 (closed at exit)

    def confirmed(t: float, jobs: list[tuple[str, int]]) -> None:
        out.write(json.dumps({"t": t, "jobs": jobs}) + "\n")
        out.flush()

    publisher = chaos.Publisher(bursts, settings.publish_window, on_sent=confirmed)
    signal.signal(signal.SIGTERM, lambda *_: publisher.stop.set())
    publisher.run()  # in this thread: the process is the publisher
    summary: dict[str, Any] = {"published": publisher.published, "retries": publisher.retries}
    if publisher.error is not None:
        summary["error"] = repr(publisher.error)
    out.write(json.dumps(summary) + "\n")
    out.close()
    ledger.app.broker.close()
    return 0 if publisher.error is None and not publisher.stop.is_set() else 1


if __name__ == "__main__":
    threading.current_thread().name = "chaos-publisher"
    sys.exit(main(sys.argv[1:]))
