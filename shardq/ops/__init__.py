"""The operator's tools: the command line, stats, views, the dashboard, logs, testing."""
