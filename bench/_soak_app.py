"""The worker ``bench/soak.py`` runs: blank jobs, some retried once, a few dead."""

from __future__ import annotations

from typing import Any

import shardq

app = shardq.App()


@app.register
class Soak(shardq.Worker):
    shards = 8
    max_retries = 2

    def perform(self, entity_id: str, payloads: list[dict[str, Any]]) -> None:
        (payload,) = payloads
        if payload.get("dead"):
            raise shardq.PermanentError("a job that always fails")
        if payload.get("retry") and self.attempt == 1:
            raise shardq.Retry(delay=0.05)
