"""The pure core: limits, errors, settings, names and the decisions, over plain data.

Nothing here does I/O or imports another layer of shardq.
"""
