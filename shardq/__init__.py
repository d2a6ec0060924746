"""shardq: ordered, per-entity, sharded jobs on SQS FIFO."""
