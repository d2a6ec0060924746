"""The ``shardq`` command's exit codes (what each means: docs/operations.md)."""

EXIT_OK, EXIT_ERROR, EXIT_USAGE, EXIT_GRACE_EXPIRED, EXIT_DRIFT = 0, 1, 2, 3, 4
#: Stopped by Ctrl-C (SIGINT): what a shell reports for a tool ended by it.
EXIT_INTERRUPTED = 128 + 2
#: Stopped by SIGTERM (``morgue requeue|purge``, ``publish --file``), having said what it did.
EXIT_TERMINATED = 128 + 15
#: Stdout was closed early (``| head``): what a shell reports for a tool ended by SIGPIPE.
EXIT_PIPE = 128 + 13
