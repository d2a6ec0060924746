"""The ``shardq`` command's exit codes: 0 done; 1 broker unreachable or unexpected error;
2 bad usage, config or input (also ``stats`` and ``nodes`` finding none of the app's
queues); 3 a node stopped with jobs still running after the grace period; 4 ``queues
ensure`` found queues whose settings drifted; 130 interrupted by Ctrl-C (``publish
--file`` then names the last line published and the first not published); 141 stdout
closed early."""

EXIT_OK, EXIT_ERROR, EXIT_USAGE, EXIT_GRACE_EXPIRED, EXIT_DRIFT = 0, 1, 2, 3, 4
#: Stopped by Ctrl-C (SIGINT): what a shell reports for a tool ended by it.
EXIT_INTERRUPTED = 128 + 2
#: Stdout was closed early (``| head``): what a shell reports for a tool ended by SIGPIPE.
EXIT_PIPE = 128 + 13
