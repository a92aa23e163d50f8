"""The control plane at scale: listing, the waiting list, the sweep, the REST answers and the
hub's inbox over a journal of many runs, on diskcache and on PostgreSQL.

``python -m benchmarks.control_plane [--runs 100000] [--waiting 1000] [--repeats 7]
[--no-postgres]``: writes a journal of ``--runs`` runs (97 % DONE, 3 % FAILED, the 20 newest
RUNNING, and ``--waiting`` of them WAITING_APPROVAL with a request whose deadline is a day
away), in bulk through :meth:`Journal.publish_runs` (one transaction per 5,000 runs), then
times, in this process, each operation ``--repeats`` times on a journal opened as its caller
opens it:

- ``runs``: the 50 newest, as ``durable-nb runs`` lists them (``registry.runs(limit=50,
  newest_first=True)``);
- ``waiting``: every run waiting for a decision (``registry.runs("waiting_approval")``);
- ``tick``: :func:`durable_nb.approvals.tick.tick` (what the server's sweeper, ``durable-nb
  sweep`` and the hub service run), nothing due;
- ``REST runs`` / ``REST summary``: the server's handlers' functions
  (:func:`durable_nb.server.views.list_runs`, first page of 50, and
  :func:`~durable_nb.server.views.summary`), the first call and the later ones (which may
  reuse what the first read while the journal is unchanged);
- ``hub inbox``: what the hub service's inbox reads (:func:`durable_nb.hub.service.inbox_requests`).

PostgreSQL is a throw-away server started as the tests start theirs (``tests/postgres.py``;
skipped when its binaries or psycopg are missing). Not a test: it prints the medians against
the goal (issue 42: each <= 50 ms at 100,000 runs).
"""

from __future__ import annotations

import argparse
import random
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
GOAL_MS = 50.0
#: The entries each waiting run has (the others have none: listing them reads their records,
#: and the one key past their count, which their steps would not change).
WAITING_STEPS = 1
#: The newest runs are RUNNING (executing, or interrupted: listed with their leases read).
RUNNING = 20
CHUNK = 5_000


def records(n: int, waiting: int) -> list[Any]:
    """The runs, oldest first; ``waiting`` of them, spread evenly, wait for a decision."""
    from durable_nb.journal import RunRecord, Status

    rnd = random.Random(1)
    start = time.time() - n
    every = max(n // max(waiting, 1), 1)
    made = []
    for i in range(n):
        r = rnd.random()
        status = (Status.WAITING_APPROVAL if waiting and i % every == every // 2
                  and i // every < waiting
                  else Status.RUNNING if i >= n - RUNNING  # executing now, or interrupted
                  else Status.DONE if r < 0.97 else Status.FAILED)
        pending = None
        if status is Status.WAITING_APPROVAL:
            pending = {"id": f"{i:032x}", "key": "2", "name": "send_email",
                       "details": {"to": "team@example.com", "subject": f"report {i}"},
                       "asked_at": start + i, "deadline": time.time() + 86_400,
                       "on_timeout": "reject"}
        made.append(RunRecord(
            run_id=f"eval-{i // 1000:03d}/item-{i:06d}", title=f"item {i}", status=status,
            iteration=3, prompt_tokens=1200, completion_tokens=300,
            step_count=WAITING_STEPS if pending else 0,
            created_at=start + i, updated_at=start + i,
            result={"answer": "x" * 40} if status is Status.DONE else None,
            pending_approval=pending))
    return made


def fill(journal: Any, made: list[Any]) -> float:
    """Seconds to write the runs through the journal's bulk write, and the steps of the
    waiting ones (a fetch, before the approval they wait on) one by one."""
    from durable_nb.journal import StepEntry

    began = time.perf_counter()
    for first in range(0, len(made), CHUNK):
        chunk = made[first:first + CHUNK]
        if not journal.publish_runs([(f"bench-staging-{first + i}", record)
                                     for i, record in enumerate(chunk)]):
            raise SystemExit("publish_runs refused: the journal already holds these runs")
    for record in made:
        if record.pending_approval:
            journal.append_step(record.run_id, StepEntry(0, "0", "fetch", "run",
                                                         result={"rows": 3}))
    return time.perf_counter() - began


def operations(location: str, kind: str) -> dict[str, Callable[[], int]]:
    """The operations, each returning how many runs it saw."""
    from durable_nb import registry
    from durable_nb.approvals.tick import tick
    from durable_nb.hub.config import HubConfig
    from durable_nb.journal import open_journal
    from durable_nb.server import views
    from durable_nb.server.journals import KnownJournal

    reader = open_journal(location, read_only=True)  # as the CLI opens it
    writer = open_journal(location)  # as a sweeper opens it
    known = KnownJournal("bench", location, kind)
    journals = [(known, known.open())]
    ops: dict[str, Callable[[], int]] = {
        "runs (50 newest)": lambda: len(registry.runs(journal=reader, limit=50,
                                                      newest_first=True)),
        "waiting list": lambda: len(registry.runs("waiting_approval", journal=reader)),
        "tick": lambda: len(tick(writer).applied),
        "REST runs (page 1)": lambda: len(views.list_runs(
            journals, groups=views.GROUPS, prefix="", q="", page=0, limit=50,
            root_dir=None).runs),
        "REST summary": lambda: len(views.summary(journals)),
    }
    try:
        from durable_nb.hub.service import inbox_requests
    except Exception:  # noqa: BLE001 - the hub extra is not installed: no inbox to time
        pass
    else:
        ops["hub inbox"] = lambda: len(inbox_requests(writer, HubConfig()))
    return ops


def time_all(location: str, kind: str, repeats: int) -> dict[str, dict[str, float]]:
    out = {}
    for name, op in operations(location, kind).items():
        samples = []
        for _ in range(repeats):
            began = time.perf_counter()
            op()
            samples.append((time.perf_counter() - began) * 1e3)
        out[name] = {"first": samples[0], "median": statistics.median(samples[1:] or samples)}
    return out


def table(results: dict[str, dict[str, dict[str, float]]], made_in: dict[str, float],
          n: int, waiting: int) -> str:
    kinds = list(results)
    lines = [f"{n:,} runs, {waiting:,} waiting; written in "
             + ", ".join(f"{k} {s:.0f} s" for k, s in made_in.items()), "",
             "| operation (ms: first / median of the others) | "
             + " | ".join(kinds) + f" | goal |", "|---|" + "---:|" * len(kinds) + "---:|"]
    for name in next(iter(results.values())):
        cells = []
        for kind in kinds:
            r = results[kind].get(name)
            cells.append("" if r is None else f"{r['first']:.1f} / {r['median']:.1f}"
                         + ("" if r["median"] <= GOAL_MS else " **missed**"))
        lines.append(f"| {name} | " + " | ".join(cells) + f" | <= {GOAL_MS:.0f} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=100_000)
    parser.add_argument("--waiting", type=int, default=1_000)
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--no-postgres", action="store_true")
    args = parser.parse_args(argv)
    from durable_nb.journal import open_journal

    made = records(args.runs, args.waiting)
    results: dict[str, dict[str, dict[str, float]]] = {}
    made_in: dict[str, float] = {}
    with tempfile.TemporaryDirectory(prefix="dnb-control-") as tmp:
        location = str(Path(tmp) / "journal")
        journal = open_journal(location)
        made_in["diskcache"] = fill(journal, made)
        journal.close()
        results["diskcache"] = time_all(location, "disk", args.repeats)
    server = None if args.no_postgres else _postgres()
    if server is not None:
        try:
            journal = open_journal(server.url)
            made_in["PostgreSQL"] = fill(journal, made)
            journal.close()
            results["PostgreSQL"] = time_all(server.url, "postgres", args.repeats)
        finally:
            server.stop()
    print(table(results, made_in, args.runs, args.waiting))


def _postgres() -> Any:
    sys.path.insert(0, str(ROOT))
    try:
        from tests.postgres import PostgresServer, postgres_bin
    finally:
        sys.path.remove(str(ROOT))
    bin_dir = postgres_bin()
    try:
        import psycopg  # noqa: F401
    except ImportError:
        bin_dir = None
    if bin_dir is None:
        print("PostgreSQL: skipped (no server binaries or no psycopg)")
        return None
    return PostgresServer(bin_dir).start()


if __name__ == "__main__":
    main()
