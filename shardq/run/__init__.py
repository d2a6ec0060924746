"""Running jobs: the node, its lanes, execution slots, held jobs and time limits.

Imports the core, the brokers, the store, publishing and the morgue; never the fleet,
resharding, the API or the operator's tools (those plug in through the protocols in
:mod:`shardq.run.parts`). See docs/design/run.md.
"""
