"""The live layouts as ``shardq stats`` prints them under its table."""

from __future__ import annotations

from shardq.ops.stats import Stats


def layout_lines(stats: Stats) -> list[str]:
    """The live layout of every worker on one line, then a line per worker whose code
    says another number of shards, per reshard in progress and per retired generation
    with queues left, and why the layouts could not be read, if so."""
    views = [w.layout for w in stats.workers if w.layout is not None]
    lines = []
    if views:
        lines.append(
            "live layouts: "
            + "; ".join(f"{v.worker} {v.shards} shards (generation {v.gen})" for v in views)
        )
    for view in views:
        if view.note:
            lines.append(view.note)
        if view.reshard is not None:
            lines.append(view.reshard.text())
        for gen, shards, left in view.retired:
            lines.append(
                f"{view.worker}: generation {gen} retired ({shards} shards); {left} of its queues "
                "not deleted yet (they relay late jobs; nodes delete them once empty after "
                "twice the trust window, or `shardq queues ensure --prune`)"
            )
    if stats.layout_error:
        lines.append(f"layouts: {stats.layout_error}; shown as last read (else as the code says)")
    return lines
