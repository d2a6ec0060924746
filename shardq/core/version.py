"""shardq's version, sent in user agents and node heartbeats."""

VERSION = "0.1.0"
