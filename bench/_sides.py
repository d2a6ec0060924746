"""Two checkouts of shardq side by side (not a test module; used by the scripts that
compare a base against the current checkout).

A **side** is a directory holding a ``shardq`` package. Its code runs only in child
processes started with ``PYTHONPATH=<side>:<bench>`` (so ``import shardq`` picks that
side and ``import lane_worker`` the shared workers); the child checks where shardq
came from and refuses to run otherwise. The base is materialised with
``git archive <rev> shardq`` into a temporary directory (removed at the end), or given
as a path. The SQS scripts share one ministack (``tests/emulator.py``) behind the
counting proxy (``bench/peers/proxy.py --latency-ms``), all on 127.0.0.1, stopped by pid.
"""

from __future__ import annotations

import argparse
import contextlib
import itertools
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from _common import ROOT

BENCH = Path(__file__).resolve().parent
CHILD = BENCH / "_side_child.py"
PROXY = BENCH / "peers" / "proxy.py"
DEFAULT_BASE_REV = "197a6ab"


@dataclass(frozen=True)
class Side:
    """One checkout: ``name`` (base or current), ``path`` (holds ``shardq/``), ``label``."""

    name: str
    path: Path
    label: str

    def env(self, **extra: str) -> dict[str, str]:
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join([str(self.path), str(BENCH)])
        env["LANE_CHECKOUT"] = str(self.path)
        env.update(extra)
        return env


def add_side_args(parser: argparse.ArgumentParser, *, base_by_default: bool) -> None:
    default = DEFAULT_BASE_REV if base_by_default else None
    parser.add_argument(
        "--base-rev",
        default=default,
        help=f"git revision of the base side, taken with git archive (default {default})",
    )
    parser.add_argument(
        "--base", metavar="PATH", help="directory holding the base side's shardq/ (not --base-rev)"
    )
    parser.add_argument(
        "--current",
        metavar="PATH",
        default=str(ROOT),
        help=f"directory holding the current side's shardq/ (default {ROOT})",
    )


def _git(path: Path, *args: str) -> str:
    try:
        out = subprocess.run(
            ["git", "-C", str(path), *args], capture_output=True, text=True, check=True
        )
        return out.stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return ""


def describe(path: Path) -> str:
    head = _git(path, "rev-parse", "--short", "HEAD")
    if not head:
        return str(path)
    dirty = _git(path, "status", "--porcelain", "shardq")
    return f"{path} at {head}" + (" + uncommitted changes in shardq/" if dirty else "")


def _check_side(path: Path, what: str) -> Path:
    path = path.resolve()
    if not (path / "shardq" / "__init__.py").is_file():
        sys.exit(f"{what} {path}: no shardq/__init__.py there; give a checkout of shardq")
    return path


@contextlib.contextmanager
def sides(args: argparse.Namespace) -> Iterator[list[Side]]:
    """The sides to compare, base first (no base when neither --base nor --base-rev)."""
    path = _check_side(Path(args.current), "--current")
    current = Side("current", path, describe(path))
    with tempfile.TemporaryDirectory(prefix="shardq-base-") as tmp:
        out = [current]
        if args.base:
            path = _check_side(Path(args.base), "--base")
            out.insert(0, Side("base", path, describe(path)))
        elif args.base_rev:
            commit = _git(ROOT, "rev-parse", "--short", f"{args.base_rev}^{{commit}}")
            if not commit:
                sys.exit(f"--base-rev {args.base_rev}: not a revision of {ROOT}")
            archive = Path(tmp) / "shardq.tar"
            subprocess.run(
                ["git", "-C", str(ROOT), "archive", "-o", str(archive), commit, "shardq"],
                check=True,
            )
            subprocess.run(["tar", "-xf", str(archive), "-C", tmp], check=True)
            # compile now, so the base does not pay for it inside a timed phase
            subprocess.run([sys.executable, "-m", "compileall", "-q", tmp], check=True)
            label = f"git archive {commit} ({args.base_rev})"
            out.insert(0, Side("base", Path(tmp).resolve(), label))
        yield out


def run_child(
    side: Side,
    spec: dict[str, Any],
    log_path: str,
    timeout: float = 1800.0,
    env: dict[str, str] | None = None,
) -> dict[str, Any]:
    """Run ``_side_child.py`` on ``side`` with ``spec`` (and ``env`` added to its
    environment); its stderr goes to ``log_path``. Returns the ``RESULT`` it printed."""
    with open(log_path, "w") as log:
        proc = subprocess.run(
            [sys.executable, str(CHILD), json.dumps(spec)],
            env=side.env(**(env or {})),
            stdout=subprocess.PIPE,
            stderr=log,
            text=True,
            timeout=timeout,
            cwd=tempfile.gettempdir(),
        )
    for line in proc.stdout.splitlines():
        if line.startswith("RESULT "):
            result: dict[str, Any] = json.loads(line[len("RESULT ") :])
            if proc.returncode != 0:
                result["child_exit"] = proc.returncode
            return result
    with open(log_path) as f:
        tail = f.read()[-3000:]
    raise RuntimeError(
        f"{side.name} child exited {proc.returncode} without a result; stdout:\n"
        f"{proc.stdout[-2000:]}\nstderr ({log_path}):\n{tail}"
    )


def origin(side: Side, cwd: str) -> str:
    """Where ``python -m shardq`` run in ``cwd`` with the side's environment imports
    shardq from; exits if that is not the side's checkout."""
    out = subprocess.run(
        [sys.executable, "-c", "import shardq; print(shardq.__file__)"],
        env=side.env(),
        cwd=cwd,
        capture_output=True,
        text=True,
        check=True,
    )
    path = Path(out.stdout.strip()).resolve()
    if not path.is_relative_to(side.path):
        sys.exit(f"{side.name}: shardq imports from {path}, not from {side.path}")
    return str(path.parent)


# -- ministack behind the latency proxy -------------------------------------------------
@dataclass(frozen=True)
class Upstream:
    endpoint: str  # what clients use: the proxy
    port: int
    emulator_pid: int | None
    proxy_pid: int

    def counts(self) -> dict[str, int]:
        return proxy_counts(self.port)


def proxy_counts(port: int) -> dict[str, int]:
    url = f"http://127.0.0.1:{port}/__proxy/counts"
    with urllib.request.urlopen(url, timeout=10) as resp:
        counts: dict[str, int] = json.loads(resp.read())
        return counts


@contextlib.contextmanager
def emulator_behind_proxy(
    latency_ms: float, log_dir: str, endpoint_url: str | None = None
) -> Iterator[Upstream]:
    """ministack (started here unless ``endpoint_url``) behind the counting proxy adding
    ``latency_ms`` to every request; both stopped by pid on exit."""
    os.environ.update(
        AWS_ACCESS_KEY_ID="test", AWS_SECRET_ACCESS_KEY="test", AWS_DEFAULT_REGION="us-east-1"
    )
    from tests import emulator as emu

    server = emu.start() if endpoint_url is None else None
    upstream = server.endpoint_url if server is not None else str(endpoint_url)
    proxy = None
    try:
        err = open(os.path.join(log_dir, "proxy.err"), "w")  # noqa: SIM115
        proxy = subprocess.Popen(
            [sys.executable, str(PROXY), "--upstream", upstream, "--latency-ms", str(latency_ms)],
            stdout=subprocess.PIPE,
            stderr=err,
            text=True,
        )
        assert proxy.stdout is not None
        line = proxy.stdout.readline().split()
        if len(line) != 2 or line[0] != "PROXY":
            raise RuntimeError(f"the proxy did not start: {line!r}; see {err.name}")
        port = int(line[1])
        print(
            f"ministack {'pid ' + str(server.pid) if server else 'at ' + upstream} "
            f"behind proxy pid {proxy.pid} on 127.0.0.1:{port} (+{latency_ms:g} ms per request)",
            flush=True,
        )
        yield Upstream(f"http://127.0.0.1:{port}", port, server.pid if server else None, proxy.pid)
    finally:
        if proxy is not None:
            stop_pid(proxy)
        if server is not None:
            emu.stop(server)
        print("proxy and ministack stopped", flush=True)


def stop_pid(proc: subprocess.Popen[str] | subprocess.Popen[bytes], grace: float = 5.0) -> None:
    """SIGTERM, then SIGKILL after ``grace`` s, by this process's own pid."""
    if proc.poll() is None:
        os.kill(proc.pid, signal.SIGTERM)
        try:
            proc.wait(grace)
        except subprocess.TimeoutExpired:
            os.kill(proc.pid, signal.SIGKILL)
            proc.wait()


def in_turn(pair: list[Side], rnd: int) -> list[Side]:
    """The sides in round ``rnd``'s order: base first in even rounds (0, 2, ...), current
    first in odd ones, so an effect of going first or second cancels over two rounds."""
    return pair if rnd % 2 == 0 else pair[::-1]


# -- the ledger of lane_worker.Ledger -------------------------------------------------------
def read_ledger(prefix: str) -> list[tuple[str, int, float]]:
    """Every success recorded in the ``prefix.<pid>`` files, in time order."""
    directory, base = os.path.split(prefix)
    out: list[tuple[str, int, float]] = []
    for name in sorted(os.listdir(directory or ".")):
        if name.startswith(base + "."):
            with open(os.path.join(directory, name)) as f:
                for line in f:
                    entity, seq, t = line.split()
                    out.append((entity, int(seq), float(t)))
    out.sort(key=lambda e: e[2])  # stable: one process's lines keep their order on ties
    return out


def check_ledger(entries: list[tuple[str, int, float]], entities: int, jobs: int) -> dict[str, int]:
    """Count what went wrong, for ``jobs`` published as ``entity-{i % entities}``,
    ``seq = i // entities``:

    * ``out_of_order``: entities whose first successes are not strictly increasing;
    * ``lost``: jobs that never succeeded;
    * ``duplicates``: successes after a job's first.
    """
    seen: dict[str, list[int]] = {}
    duplicates = 0
    done: set[tuple[str, int]] = set()
    for entity, seq, _ in entries:
        if (entity, seq) in done:
            duplicates += 1
            continue
        done.add((entity, seq))
        seen.setdefault(entity, []).append(seq)
    out_of_order = sum(
        1 for seqs in seen.values() if any(b <= a for a, b in itertools.pairwise(seqs))
    )
    expected = {(f"entity-{i % entities}", i // entities) for i in range(jobs)}
    return {
        "out_of_order": out_of_order,
        "lost": len(expected - done),
        "duplicates": duplicates,
        "unexpected": len(done - expected),
    }


# -- figures -------------------------------------------------------------------------------
def median(values: list[float]) -> float:
    return statistics.median(values) if values else float("nan")


def ratio(current: float, base: float) -> str:
    return f"{current / base:.2f}" if base else "-"


def command_line() -> str:
    return " ".join(["python", *[_quote(a) for a in sys.argv]])


def _quote(arg: str) -> str:
    return arg if arg and all(c.isalnum() or c in "-_./=:," for c in arg) else repr(arg)
