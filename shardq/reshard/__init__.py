"""A node's part in a reshard: route, relay and close old shards, prune retired queues."""
