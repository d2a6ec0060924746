"""A worker's dead jobs, from the store: ``shardq morgue list | requeue | purge`` (the
same filters; ``requeue`` and ``purge`` need one or ``--all``)."""

from __future__ import annotations

import argparse
import json
import signal
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import asdict
from typing import Any

from shardq.api.app import App
from shardq.core.errors import ConfigError, ShardqError, UnknownWorkerError
from shardq.core.exits import EXIT_ERROR, EXIT_INTERRUPTED, EXIT_OK, EXIT_TERMINATED, EXIT_USAGE
from shardq.core.tables import table, utc
from shardq.core.terminal import Progress, plural
from shardq.morgue import NOT_REGISTERED, Filter, Morgue, MorgueRecord, counted, payload_of
from shardq.ops import selection
from shardq.ops.selection import DONE, MAX_LIST, TIME_FORMS, act, parse_range, unmatched

EXAMPLES = {
    "list": "  shardq morgue list SyncOrder\n"
    "  shardq morgue list SyncOrder --entity order-42 --json\n"
    "  shardq morgue list SyncOrder --error-type KeyError --since 6h\n"
    "  shardq morgue list SyncOrder --limit 500 --after CURSOR   # the next page\n",
    "requeue": "  shardq morgue requeue SyncOrder --entity order-42\n"
    "  shardq morgue requeue SyncOrder --error-type Timeout --since 2026-11-25T08:00\n"
    "  shardq morgue requeue SyncOrder --all      # every dead SyncOrder job\n",
    "purge": "  shardq morgue purge SyncOrder --entity order-42 --yes\n"
    "  shardq morgue purge SyncOrder --until 30d --yes   # died more than 30 days ago\n"
    "  shardq morgue purge SyncOrder --all --yes\n",
}
HELP = {
    "list": "list dead jobs in the order they died",
    "requeue": "send dead jobs back to the tail of their entity's jobs, oldest first",
    "purge": "delete dead jobs for good",
}
#: The filters after ``--entity`` and ``--id``: flag, metavar, help.
FILTERS = (
    ("--error-type", "T", "only jobs that died of this exception type"),
    ("--since", "TIME", f"only jobs that died at or after: {TIME_FORMS}"),
    ("--until", "TIME", "only jobs that died at or before TIME"),
)


class Once(argparse.Action):
    """An option that takes one value: given twice, it is a usage error (which value, or
    both, is meant is unknown), not the last value silently."""

    def __call__(
        self,
        parser: argparse.ArgumentParser,
        namespace: argparse.Namespace,
        values: Any,
        option_string: str | None = None,
    ) -> None:
        if getattr(namespace, self.dest, None) is not None:
            parser.error(f"{option_string} is given twice: it takes one value")
        setattr(namespace, self.dest, values)


def add_morgue(commands: Any, command: Callable[..., argparse.ArgumentParser]) -> None:
    """Register ``shardq morgue``; ``command`` adds one subcommand (see :mod:`.admin`)."""
    morgue = commands.add_parser("morgue", help="list, requeue or purge dead jobs")
    actions = morgue.add_subparsers(dest="action", metavar="ACTION", required=True)
    for name in ("list", "requeue", "purge"):
        p = command(name, HELP[name], EXAMPLES[name], _list if name == "list" else _change, actions)
        p.add_argument("worker", metavar="WORKER", help="worker class name")
        p.add_argument("--entity", action=Once, help="only this entity's dead jobs")
        p.add_argument(
            "--id",
            action="append",
            dest="ids",
            metavar="MESSAGE_ID",
            help="only this job (repeatable)",
        )
        for flag, metavar, text in FILTERS:
            p.add_argument(flag, action=Once, metavar=metavar, help=text)
        if name == "list":
            p.add_argument("--limit", type=int, default=100, help="most jobs to show (100)")
            p.add_argument("--after", metavar="CURSOR", help="the page after this cursor")
            p.add_argument("--json", action="store_true", help="one JSON object per line")
        else:
            p.add_argument(
                "--all",
                action="store_true",
                dest="everything",
                help="every dead job of the worker (required when no filter is given)",
            )
        if name == "purge":
            p.add_argument("--yes", action="store_true", help="do not ask for confirmation")


def _list(app: App, args: argparse.Namespace) -> int:
    if not 1 <= args.limit <= MAX_LIST:
        raise ConfigError(f"--limit must be from 1 to {MAX_LIST}, got {args.limit}")
    given = [("--entity", args.entity), ("--error-type", args.error_type)]
    for option, value in given + [("--id", i) for i in args.ids or []]:
        if value == "":  # `--entity "$ENTITY"` with ENTITY unset matches no job
            raise ConfigError(f"{option} must not be empty")
    ids = None if args.ids is None else frozenset(args.ids)
    where = Filter(args.entity, args.error_type, *parse_range(args.since, args.until, "--"), ids)
    morgue = Morgue(app, args.worker)
    page = morgue.page(where, args.limit, selection.cursor(args.after))
    rows = [("entity", "message id", "reason", "attempts", "died (UTC)", "error")]
    for r in page.records:
        if args.json:
            print(json.dumps(record_dict(r, app.signing_key), default=str))
        error = f"{r.error_type}: {r.error_message}"[:60]
        rows.append((r.entity_id, r.message_id, r.reason, str(r.attempts), utc(r.failed_at), error))
    if not args.json:
        print(table(rows))
    shown = plural(len(page.records), f"dead {morgue.worker} job")
    text = f"{shown}{where.describe()} shown; the morgue holds {counted(morgue.size())}"
    if page.next is not None:
        text += f"; more match: the next page is --after {page.next}"
    print(text, file=sys.stderr)
    return EXIT_OK


def _change(app: App, args: argparse.Namespace) -> int:
    """``requeue`` or ``purge`` (``args.action``) the selected dead jobs, with a progress
    line; an interrupted one says what it did and what is left."""
    where = selection.from_args(
        args.entity, args.ids, args.everything, args.error_type, args.since, args.until
    )
    morgue = Morgue(app, args.worker)
    action, worker = args.action, morgue.worker
    if action == "requeue" and not morgue.registered:
        raise UnknownWorkerError(NOT_REGISTERED.format(worker))
    if action == "purge" and not args.yes:
        if not sys.stdin.isatty():
            raise ConfigError("purge deletes jobs for good: pass --yes to confirm")
        try:
            answer = input(f"delete dead {worker} jobs{selection.scope(where)} for good? [y/N] ")
        except EOFError:  # Ctrl-D: no answer is no
            answer = ""
            print(file=sys.stderr)
        if answer.strip().lower() not in {"y", "yes"}:
            print("nothing purged", file=sys.stderr)
            return EXIT_OK
    seen: set[str] = set()  # an --id that names no dead job must not pass for done
    refused: list[tuple[MorgueRecord, str]] = []
    done = [0]
    with Progress(DONE[action]) as progress, _sigterm_interrupts():

        def tell(n: int) -> None:
            done[0] = n
            progress(n)

        try:
            act(app, worker, action, where, tell, lambda *dead: refused.append(dead), seen)
        except (KeyboardInterrupt, ShardqError) as exc:
            why = "interrupted" if isinstance(exc, KeyboardInterrupt) else f"stopped: {exc}"
            last = (
                " (up to 10 jobs of the last batch may have been sent and still be listed: "
                "check them with `shardq morgue list` first)"
                if action == "requeue"
                else ""
            )
            print(
                f"{why}. {DONE[action]} {plural(done[0], f'dead {worker} job')} before that, "
                "each one's record deleted; the rest are still in the morgue: run the same "
                f"command again to {action} them{last}",
                file=sys.stderr,
            )
            if isinstance(exc, Terminated):
                return EXIT_TERMINATED
            return EXIT_INTERRUPTED if isinstance(exc, KeyboardInterrupt) else EXIT_ERROR
    tail = ", each at the tail of its entity's jobs" if action == "requeue" else ""
    jobs = plural(done[0], f"dead {worker} job")
    print(f"{DONE[action]} {jobs}{selection.scope(where)}{tail}", file=sys.stderr)
    for record, why in refused:
        print(
            f"not requeued: dead job {record.message_id} of entity {record.entity_id}: {why}. "
            "It stays in the morgue: see it with "
            f"`shardq morgue list {worker} --id {record.message_id} --json`, delete it with "
            f"`shardq morgue purge {worker} --id {record.message_id} --yes`",
            file=sys.stderr,
        )
    if missing := unmatched(where, seen):
        them = "them" if len(missing) > 1 else "it"
        print(
            f"no dead {worker} job has id {', '.join(missing)}: nothing to {action} for {them}; "
            f"see the dead jobs with `shardq morgue list {worker}`",
            file=sys.stderr,
        )
    return EXIT_USAGE if refused or missing else EXIT_OK


class Terminated(KeyboardInterrupt):
    """SIGTERM came during a requeue or purge: it stops as on Ctrl-C."""


@contextmanager
def _sigterm_interrupts() -> Iterator[None]:
    """SIGTERM stops a requeue or purge as Ctrl-C does, so it says what it did."""

    def stop(_signum: int, _frame: object) -> None:
        raise Terminated

    previous = signal.signal(signal.SIGTERM, stop)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def record_dict(record: MorgueRecord, signing_key: bytes | None) -> dict[str, Any]:
    """A dead job as ``--json`` prints it: its record's fields and its payload."""
    return {**asdict(record), "payload": payload_of(record, signing_key)}
