"""A LangGraph checkpoint put and get through JournalCheckpointer against LangGraph's own
SqliteSaver.

``python -m benchmarks.langgraph_checkpoint [--checkpoints N] [--messages M] [--postgres URL]``:
writes N checkpoints of one thread, each a chat of M messages (a ``messages`` channel of
``HumanMessage``/``AIMessage``, a counter, the versions a graph's superstep makes), each the
child of the one before, then reads the thread's latest checkpoint N times, with:

- **sqlite**: ``SqliteSaver`` (langgraph-checkpoint-sqlite) on a database file, its
  connection opened with ``check_same_thread=False`` as its docs show (SQLite's defaults: a
  rollback journal, ``synchronous=FULL``, an fsync per commit);
- **sqlite-wal**: the same in WAL mode with ``synchronous=NORMAL``, the durability of the
  journal's default (a killed process loses nothing, a power cut may lose the last commits);
- **journal**: ``JournalCheckpointer`` on a diskcache journal (durability ``"process"``, the
  default: SQLite in WAL mode with ``synchronous=NORMAL``);
- **postgres** (with ``--postgres``): ``JournalCheckpointer`` on a PostgreSQL journal, in a
  schema of its own that is dropped at the end.

The savers take turns call by call, so load on the machine falls on all alike. It prints the
median and 90th percentile of ``put`` and of ``get_tuple`` (the latest checkpoint, with its
channel values and pending writes) for each, in milliseconds. Not a test: the figures depend
on the machine, and are reported, not asserted.
"""

from __future__ import annotations

import argparse
import sqlite3
import statistics
import tempfile
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

from langchain_core.messages import AIMessage, HumanMessage
from langgraph.checkpoint.base import BaseCheckpointSaver, empty_checkpoint
from langgraph.checkpoint.base.id import uuid6
from langgraph.checkpoint.sqlite import SqliteSaver

from durable_nb.integrations.langgraph.checkpoint import JournalCheckpointer
from durable_nb.journal import DiskJournal, PostgresJournal


def _chat(messages: int) -> list[Any]:
    return [HumanMessage(f"Question {i}: where is parcel {i}?") if i % 2 == 0 else
            AIMessage(f"Answer {i}: parcel {i} left the depot at 07:{i % 60:02d}.")
            for i in range(messages)]


class Timed:
    """One saver writing one thread, timing each call."""

    def __init__(self, name: str, saver: BaseCheckpointSaver, chat: list[Any]) -> None:
        self.name = name
        self.saver = saver
        self.chat = chat
        self.thread = f"bench-{uuid.uuid4().hex[:8]}"
        self.config: dict = {"configurable": {"thread_id": self.thread, "checkpoint_ns": ""}}
        self.versions: dict[str, Any] = {}
        self.puts: list[float] = []
        self.gets: list[float] = []

    def put(self, step: int) -> None:
        checkpoint = empty_checkpoint()
        checkpoint["id"] = str(uuid6(clock_seq=step))
        new_versions = {}
        for channel in ("messages", "count"):
            self.versions[channel] = self.saver.get_next_version(self.versions.get(channel),
                                                                 None)
            new_versions[channel] = self.versions[channel]
        checkpoint["channel_versions"] = dict(self.versions)
        checkpoint["channel_values"] = {"messages": self.chat, "count": step}
        checkpoint["versions_seen"] = {"agent": dict(self.versions)}
        metadata = {"source": "loop", "step": step, "parents": {}}
        began = time.perf_counter()
        self.config = self.saver.put(self.config, checkpoint, metadata, new_versions)
        self.puts.append(time.perf_counter() - began)

    def get(self) -> None:
        latest = {"configurable": {"thread_id": self.thread, "checkpoint_ns": ""}}
        began = time.perf_counter()
        found = self.saver.get_tuple(latest)
        self.gets.append(time.perf_counter() - began)
        assert found is not None and len(found.checkpoint["channel_values"]["messages"]) == \
            len(self.chat)


def _ms(samples: list[float], q: float) -> float:
    ordered = sorted(samples)
    return 1000 * ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def measure(savers: list[Timed], checkpoints: int) -> None:
    for step in range(checkpoints):
        for timed in savers:
            timed.put(step)
    for _ in range(checkpoints):
        for timed in savers:
            timed.get()


def report(savers: list[Timed], checkpoints: int, messages: int) -> None:
    print(f"{checkpoints} checkpoints of a {messages}-message chat, then {checkpoints} reads "
          f"of the latest (ms)")
    print(f"{'saver':<11} {'put median':>11} {'put p90':>9} {'get median':>11} {'get p90':>9}")
    for timed in savers:
        print(f"{timed.name:<11} {statistics.median(timed.puts) * 1000:11.3f} "
              f"{_ms(timed.puts, 0.9):9.3f} {statistics.median(timed.gets) * 1000:11.3f} "
              f"{_ms(timed.gets, 0.9):9.3f}")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--checkpoints", type=int, default=300)
    parser.add_argument("--messages", type=int, default=10)
    parser.add_argument("--postgres", metavar="URL", help="also a PostgreSQL journal here")
    args = parser.parse_args(argv)
    chat = _chat(args.messages)
    closing: list[Callable[[], None]] = []
    with tempfile.TemporaryDirectory(prefix="dnb-lg-bench-") as tmp:
        connection = sqlite3.connect(str(Path(tmp) / "sqlite.db"), check_same_thread=False)
        closing.append(connection.close)
        wal = sqlite3.connect(str(Path(tmp) / "sqlite-wal.db"), check_same_thread=False)
        wal.execute("PRAGMA journal_mode=WAL")
        wal.execute("PRAGMA synchronous=NORMAL")
        closing.append(wal.close)
        disk = DiskJournal(Path(tmp) / "journal")
        closing.append(disk.close)
        savers = [Timed("sqlite", SqliteSaver(connection), chat),
                  Timed("sqlite-wal", SqliteSaver(wal), chat),
                  Timed("journal", JournalCheckpointer(disk), chat)]
        if args.postgres:
            schema = f"bench_{uuid.uuid4().hex[:8]}"
            url = f"{args.postgres}{'&' if '?' in args.postgres else '?'}schema={schema}"
            pg = PostgresJournal(url)
            closing.append(lambda: _drop(pg, schema))
            savers.append(Timed("postgres", JournalCheckpointer(pg), chat))
        try:
            measure(savers, args.checkpoints)
        finally:
            for close in reversed(closing):
                close()
    report(savers, args.checkpoints, args.messages)


def _drop(journal: PostgresJournal, schema: str) -> None:
    import psycopg

    with psycopg.connect(journal.connection_url().split("?")[0], autocommit=True) as conn:
        conn.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')
    journal.dispose()


if __name__ == "__main__":
    main()
