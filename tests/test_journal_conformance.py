"""The journal interface's contract, checked the same way on both backends.

Every test taking ``backend`` or ``store`` runs twice: on a real diskcache journal in a fresh
directory, and on a real PostgreSQL server (started for the session by ``tests/postgres.py``)
in a fresh schema. The tests name what they check: runs, steps, blobs, insert-if-absent,
fencing after a lease moved, leases, requests, whole-run edits, format and schema versions,
read-only journals, passwords, and ``durable_nb.execute`` end to end (replay, a child process
SIGKILLed mid-run and resumed, concurrent asyncio steps). Tests for one backend only say so.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

import durable_nb as dn
from durable_nb import journal as journal_pkg
from durable_nb.errors import (
    IncompatibleJournal,
    JournalError,
    JournalUnavailable,
    RunLeased,
    UnknownRun,
)
from durable_nb.execution.inputs import load_request
from durable_nb.journal import (
    DiskJournal,
    Journal,
    PostgresJournal,
    RunRecord,
    Status,
    StepEntry,
    copy_run,
    open_journal,
    rerun,
    rewind,
)
from durable_nb.journal.base import FENCED_ADVICE
from durable_nb.journal.postgres import MIGRATIONS
from durable_nb.execution.lease import Lease, holder_alive

REPO = Path(__file__).resolve().parents[1]


# --- the two backends ---------------------------------------------------------------------

class Backend:
    """One journal location of either kind, with the raw access the tests need to set up
    situations (an old lease, a newer format) and to look underneath the interface."""

    def __init__(self, kind: str, location: str, server: Any = None, schema: str = "") -> None:
        self.kind = kind
        self.location = location
        self.server = server
        self.schema = schema
        self._opened: list[Journal] = []

    def open(self, *, read_only: bool = False) -> Journal:
        if self.kind == "disk":
            journal: Journal = DiskJournal(self.location, read_only=read_only)
        else:
            journal = PostgresJournal(self.location, read_only=read_only)
        self._opened.append(journal)
        return journal

    def sql(self, query: str, params: tuple = ()) -> list[tuple]:
        """A query as the superuser, in this backend's schema (PostgreSQL only)."""
        with self.server.connect() as conn:
            cursor = conn.execute(query.replace("{s}", f'"{self.schema}"'), params)
            return cursor.fetchall() if cursor.description else []

    def age_lease(self, journal: Journal, run_id: str, seconds: float) -> None:
        """Make the run's lease look as if its last heartbeat was ``seconds`` ago."""
        if self.kind == "disk":
            holder = journal.lease(run_id)
            holder["heartbeat"] -= seconds
            journal._set_json(f"lease:{run_id}", holder)
        else:
            self.sql("UPDATE {s}.leases SET heartbeat_at = now() - make_interval(secs => %s) "
                     "WHERE run_id = %s", (seconds, run_id))

    def set_format(self, journal: Journal, version: int) -> None:
        if self.kind == "disk":
            journal._cache.set("format", json.dumps({"version": version}))
        else:
            self.sql("UPDATE {s}.meta SET value = %s WHERE key = 'format'",
                     (json.dumps({"version": version}),))

    def raw_entry(self, journal: Journal, run_id: str, position: int) -> str | None:
        """The stored text of an entry, read beneath the interface."""
        if self.kind == "disk":
            return journal._get(f"step:{run_id}:{position}")
        rows = self.sql("SELECT entry FROM {s}.steps WHERE run_id = %s AND position = %s",
                        (run_id, position))
        return rows[0][0] if rows else None

    def snapshot(self) -> Any:
        """Everything stored, to compare before and after."""
        if self.kind == "disk":
            root = Path(self.location)
            if not root.exists():
                return None
            # (cache.db-shm is SQLite's shared-memory index, which readers also write)
            return {str(p.relative_to(root)): (p.stat().st_mode, p.read_bytes()
                                               if p.is_file() and p.suffix != ".db-shm" else b"")
                    for p in sorted(root.rglob("*"))}
        if not self.sql("SELECT 1 FROM pg_namespace WHERE nspname = %s", (self.schema,)):
            return None
        return {table: sorted(self.sql(f"SELECT * FROM {{s}}.{table}"), key=repr)
                for table in ("meta", "migrations", "runs", "steps", "blobs", "leases",
                              "requests", "keyed_values")}

    def cleanup(self) -> None:
        for journal in self._opened:
            if isinstance(journal, PostgresJournal):
                journal.dispose()
            else:
                journal.close()
        with journal_pkg._opened_lock:
            for key in [k for k in journal_pkg._opened if k[0] == self.location]:
                shared = journal_pkg._opened.pop(key)
                if isinstance(shared, PostgresJournal):
                    shared.dispose()
        if self.kind == "postgres":
            self.sql(f'DROP SCHEMA IF EXISTS "{self.schema}" CASCADE')


def _postgres_backend(server: Any, schema: str | None = None) -> Backend:
    schema = schema or f"t_{uuid.uuid4().hex[:12]}"
    return Backend("postgres", f"{server.url}?schema={schema}", server, schema)


@pytest.fixture(params=["disk", pytest.param("postgres", marks=pytest.mark.postgres)])
def backend(request: pytest.FixtureRequest, tmp_path: Path):
    if request.param == "disk":
        chosen = Backend("disk", str(tmp_path / "journal"))
    else:
        chosen = _postgres_backend(request.getfixturevalue("postgres_server"))
    yield chosen
    chosen.cleanup()


@pytest.fixture
def pg_backend(postgres_server):
    chosen = _postgres_backend(postgres_server)
    yield chosen
    chosen.cleanup()


@pytest.fixture
def store(backend: Backend) -> Journal:
    return backend.open()


def _record(run_id: str, created_at: float = 1000.0, **fields: Any) -> RunRecord:
    return RunRecord(run_id=run_id, created_at=created_at, updated_at=created_at, **fields)


def _entry(position: int, result: Any = None, **fields: Any) -> StepEntry:
    return StepEntry(position=position, key=str(position), name=f"step-{position}", kind="run",
                     result=result if result is not None else position, started_at=1.0,
                     finished_at=2.0, **fields)


# --- runs ---------------------------------------------------------------------------------

def test_create_find_put_list_and_delete_runs(store: Journal):
    assert store.find_run("a") is None
    assert store.create_run(_record("a", title="first")) is True
    assert store.create_run(_record("a", title="second")) is False  # nothing written
    assert store.find_run("a").title == "first"
    record = store.get_run("a")
    record.title, record.status = "renamed", Status.DONE
    before = time.time()
    store.put_run(record)
    stored = store.get_run("a")
    assert (stored.title, stored.status) == ("renamed", Status.DONE)
    assert stored.updated_at >= before
    store.create_run(_record("b"))
    assert [r.run_id for r in store.list_runs()] == ["a", "b"]
    store.delete_run("a")
    assert store.find_run("a") is None
    assert [r.run_id for r in store.list_runs()] == ["b"]
    with pytest.raises(UnknownRun, match=re.escape(f"no run 'a' in the journal at {store.location}")):
        store.delete_run("a")
    with pytest.raises(UnknownRun):
        store.get_run("a")


def test_list_runs_returns_records_oldest_first(store: Journal):
    for run_id, created in [("m", 3.0), ("z", 1.0), ("b", 2.0), ("a", 2.0), ("é", 2.0)]:
        store.create_run(_record(run_id, created_at=created))
    record = store.get_run("z")
    record.created_at = 5.0  # a record rewritten with another creation time moves
    store.put_run(record)
    assert [r.run_id for r in store.list_runs()] == ["a", "b", "é", "m", "z"]


def test_list_runs_counted_corrects_step_counts_that_lag_the_journal(store: Journal):
    store.create_run(_record("lagging", created_at=1.0, step_count=1))  # as after a crash
    for position in range(3):
        store.append_step("lagging", _entry(position))
    store.create_run(_record("empty", created_at=2.0, step_count=0))
    assert [(r.run_id, r.step_count) for r in store.list_runs()] == [("lagging", 1), ("empty", 0)]
    assert [(r.run_id, r.step_count) for r in store.list_runs_counted()] == \
        [("lagging", 3), ("empty", 0)]


def _statuses(store: Journal) -> None:
    """Runs a1..a6 (created in that order) in various statuses, and b1 under another prefix."""
    for i, status in enumerate([Status.DONE, Status.RUNNING, Status.FAILED, Status.DONE,
                                Status.WAITING_APPROVAL, Status.DONE], start=1):
        store.create_run(_record(f"a{i}", created_at=float(i), status=status, step_count=0))
    store.create_run(_record("b1", created_at=0.5, status=Status.RUNNING))


def test_list_runs_filters_by_status_in_the_listing_order(store: Journal):
    _statuses(store)
    ids = lambda records: [r.run_id for r in records]  # noqa: E731
    assert ids(store.list_runs(status=Status.DONE)) == ["a1", "a4", "a6"]
    assert ids(store.list_runs(status="running")) == ["b1", "a2"]  # names in any case
    assert ids(store.list_runs(status=["waiting_approval", Status.RUNNING])) == ["b1", "a2", "a5"]
    assert ids(store.list_runs("a", status="running")) == ["a2"]
    assert ids(store.list_runs(status=Status.CANCELLED)) == []
    assert ids(store.list_runs_counted(status="done", newest_first=True)) == ["a6", "a4", "a1"]
    with pytest.raises(ValueError, match="unknown status 'finished'"):
        store.list_runs(status="finished")


def test_list_runs_pages_oldest_or_newest_first(store: Journal):
    _statuses(store)
    ids = lambda records: [r.run_id for r in records]  # noqa: E731
    assert ids(store.list_runs(limit=3)) == ["b1", "a1", "a2"]
    assert ids(store.list_runs(limit=3, newest_first=True)) == ["a6", "a5", "a4"]
    assert ids(store.list_runs(newest_first=True)) == ids(store.list_runs())[::-1]
    assert ids(store.list_runs("a", status="done", limit=2, newest_first=True)) == ["a6", "a4"]
    assert ids(store.list_runs_counted(status=Status.DONE, limit=1)) == ["a1"]
    assert store.list_runs(limit=0) == []
    assert len(store.list_runs(limit=100)) == 7


def test_a_run_is_listed_under_its_status_as_it_changes(store: Journal):
    _statuses(store)
    record = store.get_run("a2")
    record.status = Status.DONE
    store.put_run(record)
    assert [r.run_id for r in store.list_runs(status="done")] == ["a1", "a2", "a4", "a6"]
    assert [r.run_id for r in store.list_runs(status="running")] == ["b1"]
    # A record written with a step (tokens, an approval decided) moves with it too.
    record = store.get_run("a5")
    record.status, record.pending_approval = Status.RUNNING, None
    store.append_step("a5", _entry(0), record_json=record.to_json())
    assert [r.run_id for r in store.list_runs(status=["running", "waiting_approval"])] == \
        ["b1", "a5"]
    counted = store.list_runs_counted(status="running")
    assert [(r.run_id, r.step_count) for r in counted] == [("b1", 0), ("a5", 1)]
    # ... and a record rewritten with another creation time moves in the order.
    record = store.get_run("a1")
    record.created_at = 10.0
    store.put_run(record)
    assert [r.run_id for r in store.list_runs(status="done", limit=1, newest_first=True)] == ["a1"]
    store.delete_run("a1")
    assert [r.run_id for r in store.list_runs(status="done")] == ["a2", "a4", "a6"]


def test_count_runs_counts_by_status_under_a_prefix_as_runs_change(store: Journal):
    assert store.count_runs() == {}
    _statuses(store)
    assert store.count_runs() == {Status.DONE: 3, Status.RUNNING: 2, Status.FAILED: 1,
                                  Status.WAITING_APPROVAL: 1}
    assert store.count_runs("a") == {Status.DONE: 3, Status.RUNNING: 1, Status.FAILED: 1,
                                     Status.WAITING_APPROVAL: 1}
    record = store.get_run("a2")
    record.status = Status.DONE
    store.put_run(record)
    store.delete_run("a3")
    assert store.count_runs("a") == {Status.DONE: 4, Status.WAITING_APPROVAL: 1}
    assert store.count_runs() == {Status.DONE: 4, Status.RUNNING: 1, Status.WAITING_APPROVAL: 1}


def test_registry_runs_pass_filters_and_pages_to_the_journal(store: Journal):
    _statuses(store)
    assert [r.run_id for r in dn.runs(("running", "waiting_approval"), journal=store)] == \
        ["b1", "a2", "a5"]
    assert [r.run_id for r in dn.runs(journal=store, limit=2, newest_first=True)] == ["a6", "a5"]
    assert [r.run_id for r in dn.runs("done", journal=store, prefix="a", limit=1)] == ["a1"]


def test_disk_runs_written_without_a_status_tag_are_listed_and_tagged(tmp_path: Path):
    """Disk only: records an older durable_nb wrote (no tag on their row) are found by
    filtered and paged listings, and tagged the next time the journal is opened for
    writing; the index covers run records only."""
    journal = DiskJournal(tmp_path / "j")
    _statuses(journal)
    journal.append_step("a1", _entry(0))
    journal._cache._sql("UPDATE Cache SET tag = NULL WHERE key IN ('run:a2', 'run:a4')")
    assert [r.run_id for r in journal.list_runs(status="running")] == ["b1", "a2"]
    assert [r.run_id for r in journal.list_runs(limit=2, newest_first=True)] == ["a6", "a5"]
    reader = DiskJournal(tmp_path / "j", read_only=True)
    assert [r.run_id for r in reader.list_runs(status="done")] == ["a1", "a4", "a6"]
    assert reader.count_runs() == {Status.DONE: 3, Status.RUNNING: 2, Status.FAILED: 1,
                                   Status.WAITING_APPROVAL: 1}
    DiskJournal(tmp_path / "j")  # opened for writing: the two rows get their tags
    tags = dict(journal._cache._sql("SELECT key, tag FROM Cache WHERE key IN "
                                    "('run:a2', 'run:a4', 'step:a1:0')").fetchall())
    assert tags == {"run:a2": "RUNNING|0000000000002.000000",
                    "run:a4": "DONE|0000000000004.000000", "step:a1:0": None}
    plan = journal._cache._sql(
        "EXPLAIN QUERY PLAN SELECT key FROM Cache WHERE key >= 'run:' AND key < 'run;' "
        "AND tag >= 'DONE|' AND tag < 'DONE}'").fetchall()
    assert "durable_nb_runs" in str(plan)


@pytest.mark.postgres
def test_postgres_keeps_each_runs_status_in_an_indexed_column(pg_backend: Backend):
    """PostgreSQL only: the status column follows the record whoever writes it (a trigger),
    and listings by status go through an index on (status, created_at, run_id)."""
    store = pg_backend.open()
    _statuses(store)
    pg_backend.sql("INSERT INTO {s}.runs (run_id, created_at, record) VALUES "
                   "('raw', 9, '{\"run_id\": \"raw\", \"created_at\": 9}')")
    assert dict(pg_backend.sql("SELECT run_id, status FROM {s}.runs WHERE run_id IN "
                               "('a3', 'raw')")) == {"a3": "FAILED", "raw": "RUNNING"}
    assert [r.run_id for r in store.list_runs(status="running")] == ["b1", "a2", "raw"]
    indexes = pg_backend.sql("SELECT indexdef FROM pg_indexes WHERE schemaname = %s "
                             "AND tablename = 'runs'", (pg_backend.schema,))
    assert any("(status, created_at, run_id)" in row[0] for row in indexes), indexes


@pytest.mark.postgres
def test_postgres_counts_all_runs_from_a_row_its_triggers_keep(pg_backend: Backend):
    """PostgreSQL only: count_runs() reads the run_counts row, which the triggers keep equal
    to a count of the runs (a record that is not JSON not counted) through every write, and
    which the migration fills from the runs a journal already has."""
    store = pg_backend.open()
    scan = ("SELECT status, count(*) FROM {s}.runs WHERE status IS NOT NULL "
            "GROUP BY status ORDER BY status")
    _statuses(store)
    pg_backend.sql("INSERT INTO {s}.runs (run_id, created_at, record) VALUES ('bad', 9, 'x')")
    copied = _record("c1")
    copied.status = Status.FAILED
    store.publish_runs([("staging", copied)])
    record = store.get_run("a2")
    record.status = Status.DONE
    store.put_run(record)
    store.delete_run("a3")
    expected = {Status(name): n for name, n in pg_backend.sql(scan)}
    assert store.count_runs() == expected == {Status.DONE: 4, Status.RUNNING: 1,
                                              Status.FAILED: 1, Status.WAITING_APPROVAL: 1}
    # A journal made before the counts: the migration counts what it has.
    pg_backend.sql("DROP TABLE {s}.run_counts; DROP FUNCTION {s}.count_run() CASCADE; "
                   "DELETE FROM {s}.migrations WHERE name = 'runs counted by status'")
    assert pg_backend.open().count_runs() == expected


def test_delete_run_removes_its_steps_blobs_lease_and_requests_only(store: Journal):
    for run_id in ("gone", "kept"):
        store.create_run(_record(run_id))
        store.append_step(run_id, _entry(0), blobs={"d1": "[1]"})
        store.acquire_lease(run_id, {"token": run_id, "pid": 1, "host": "h",
                                     "heartbeat": time.time()}, lambda holder: True)
        store.put_request("cancel", run_id, {"at": 1})
        store.put_request("decision", run_id, {"approved": True})
    store.delete_run("gone")
    assert (store.find_run("gone"), store.get_step("gone", 0), store.get_blob("gone", "d1"),
            store.lease("gone"), store.get_request("cancel", "gone"),
            store.get_request("decision", "gone")) == (None,) * 6
    assert store.get_step("kept", 0) is not None and store.get_blob("kept", "d1") == "[1]"
    assert store.lease("kept")["token"] == "kept"
    assert store.get_request("cancel", "kept") == {"at": 1}


def test_a_runs_history_is_kept_in_order_apart_from_its_deliveries_and_deleted_with_it(
        store: Journal):
    for run_id in ("gone", "gone:2"):  # a run whose id extends another's keeps its own
        store.create_run(_record(run_id))
        store.add_delivery(run_id, "req/webhook", {"state": "sent"})
        for i in range(3):
            store.add_event(run_id, {"kind": "decided", "i": i, "run": run_id})
    assert [e["i"] for e in store.events("gone")] == [0, 1, 2]
    assert {e["run"] for e in store.events("gone")} == {"gone"}
    assert list(store.deliveries("gone")) == ["req/webhook"]
    store.delete_run("gone")
    assert store.events("gone") == [] and store.deliveries("gone") == {}
    assert len(store.events("gone:2")) == 3


# --- steps and blobs ---------------------------------------------------------------------

def test_append_get_has_and_count_steps(store: Journal):
    store.create_run(_record("r"))
    assert store.get_step("r", 0) is None and not store.has_step("r", 0)
    assert store.count_steps("r") == 0
    for position in range(5):
        store.append_step("r", _entry(position, result={"n": position}))
    assert store.get_step("r", 3) == _entry(3, result={"n": 3})
    assert store.has_step("r", 4) and not store.has_step("r", 5)
    assert store.get_step("r", 5) is None
    assert store.count_steps("r") == 5
    assert store.count_steps("r", hint=2) == 5 and store.count_steps("r", hint=5) == 5
    assert store.count_steps("other") == 0


def test_steps_are_read_in_position_order_across_batches(store: Journal):
    store.create_run(_record("r"))
    for position in range(1203):  # PostgreSQL reads them 500 a query
        store.append_step("r", _entry(position))
    assert [e.position for e in store.steps("r")] == list(range(1203))
    assert [e.result for e in store.steps("r", start=1199)] == [1199, 1200, 1201, 1202]


def test_truncate_deletes_from_a_position_and_says_how_many(store: Journal):
    store.create_run(_record("r"))
    for position in range(6):
        store.append_step("r", _entry(position))
    assert store.truncate("r", 4) == 2
    assert store.count_steps("r") == 4 and store.get_step("r", 4) is None
    assert store.truncate("r", 10) == 0
    store.append_step("r", _entry(4, result="again"))  # a freed position can be written again
    assert store.get_step("r", 4).result == "again"


def test_append_writes_the_record_and_blobs_with_the_entry(store: Journal):
    store.create_run(_record("r"))
    record = store.get_run("r")
    record.prompt_tokens, record.step_count = 42, 1
    store.append_step("r", _entry(0), record_json=record.to_json(),
                      blobs={"d1": '{"role":"user"}', "d2": "[2]"})
    assert store.get_run("r").prompt_tokens == 42
    assert store.get_blob("r", "d1") == '{"role":"user"}' and store.get_blob("r", "d2") == "[2]"
    # A blob is kept once written (same digest, same content by construction).
    store.append_step("r", _entry(1), blobs={"d1": "other"})
    assert store.get_blob("r", "d1") == '{"role":"user"}'
    assert store.get_blob("r", "nope") is None and store.get_blob("other", "d1") is None


def test_append_creates_the_record_when_the_run_has_none(store: Journal):
    store.append_step("r", _entry(0), record_json=_record("r", created_at=7.0).to_json())
    assert store.get_run("r").created_at == 7.0
    assert [r.run_id for r in store.list_runs()] == ["r"]


def test_a_written_position_is_never_overwritten(store: Journal):
    store.create_run(_record("r"))
    store.append_step("r", _entry(0, result="first"))
    record = store.get_run("r")
    record.title = "changed by the refused append"
    with pytest.raises(RunLeased, match="position 0 of its journal was written by another"):
        store.append_step("r", _entry(0, result="second"), record_json=record.to_json(),
                          blobs={"new": "[1]"})
    assert store.get_step("r", 0).result == "first"
    assert store.get_run("r").title == "" and store.get_blob("r", "new") is None


def test_concurrent_appends_at_one_position_exactly_one_wins(backend: Backend):
    journals = [backend.open() for _ in range(4)]
    journals[0].create_run(_record("r"))
    barrier = threading.Barrier(len(journals))
    outcomes: list[str] = []

    def append(index: int, journal: Journal) -> None:
        barrier.wait()
        try:
            journal.append_step("r", _entry(0, result=f"writer {index}"))
            outcomes.append(f"writer {index}")
        except RunLeased:
            outcomes.append("refused")

    threads = [threading.Thread(target=append, args=(i, j)) for i, j in enumerate(journals)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    winners = [o for o in outcomes if o != "refused"]
    assert len(winners) == 1 and outcomes.count("refused") == 3
    assert journals[1].get_step("r", 0).result == winners[0]


@pytest.mark.parametrize("value", [
    "plain", "ünïcödé ✓ 日本語 🦜", "quote \" backslash \\ newline \n tab \t nul \x00",
    "lone surrogate \udc80 here", {"nested": [1, 2.5, None, True, {"deep": "x" * 50}]},
    "x" * 100_000,  # past diskcache's 32 KiB: a value file on disk, TOAST in PostgreSQL
])
def test_entries_round_trip_byte_for_byte(backend: Backend, value: Any):
    store = backend.open()
    entry = _entry(0, result=value, meta={"cost": 0.25}, prompt_tokens=3, completion_tokens=4)
    text = entry.to_json()
    store.create_run(_record("r"))
    store.append_step("r", entry)
    assert backend.raw_entry(store, "r", 0) == text
    assert store.get_step("r", 0).to_json() == text
    assert backend.open().get_step("r", 0) == entry  # a fresh connection reads it the same



def test_an_entry_keeps_when_its_tasks_were_created(backend: Backend):
    """``StepEntry.spawned`` is part of the entry's JSON text (no schema change): kept as
    written, absent from an entry made outside tasks (as entries were before it existed)."""
    store = backend.open()
    store.create_run(_record("r"))
    in_tasks = _entry(0)
    in_tasks.key, in_tasks.spawned = "fetch#0.sub#1.0", [0, 3]
    outside = _entry(1)
    store.append_step("r", in_tasks)
    store.append_step("r", outside)
    assert '"sp":[0,3]' in backend.raw_entry(store, "r", 0)
    assert '"sp"' not in backend.raw_entry(store, "r", 1)
    assert [e.spawned for e in backend.open().steps("r")] == [[0, 3], None]
    with pytest.raises(ValueError, match="wrong types"):
        StepEntry.from_json(2, in_tasks.to_json().replace("[0,3]", '"0"'))

# --- fencing -------------------------------------------------------------------------------

def test_fenced_executor_writes_nothing_after_its_lease_moved(backend: Backend):
    first, second = backend.open(), backend.open()  # two executors, each its own journal object
    first.create_run(_record("r"))
    mine = Lease.acquire(first, "r")
    first.append_step("r", _entry(0), token=mine.token)
    # The first executor stalls; its heartbeat gets old, and a second executor takes over.
    backend.age_lease(first, "r", 3600)
    theirs = Lease.acquire(second, "r")
    assert second.lease("r")["token"] == theirs.token != mine.token
    record = first.get_run("r")
    record.title = "written by the fenced executor"
    with pytest.raises(RunLeased) as refused:
        first.append_step("r", _entry(1), token=mine.token, record_json=record.to_json(),
                          blobs={"fenced": "[1]"})
    assert FENCED_ADVICE in str(refused.value) and str(os.getpid()) in str(refused.value)
    with pytest.raises(RunLeased, match="fenced out"):
        first.put_run(record, token=mine.token)
    assert not mine.renew()
    assert first.get_step("r", 1) is None and first.get_blob("r", "fenced") is None
    assert first.get_run("r").title == ""
    second.append_step("r", _entry(1, result="theirs"), token=theirs.token)
    assert first.get_step("r", 1).result == "theirs"
    mine.release()  # releasing a lease that moved on leaves the new holder's lease
    assert second.lease("r")["token"] == theirs.token
    theirs.release()


def test_a_token_without_a_lease_is_refused(store: Journal):
    store.create_run(_record("r"))
    with pytest.raises(RunLeased, match="fenced out"):
        store.append_step("r", _entry(0), token="never-held")
    with pytest.raises(RunLeased, match="fenced out"):
        store.put_run(store.get_run("r"), token="never-held")
    assert store.get_step("r", 0) is None


# --- leases --------------------------------------------------------------------------------

def _holder(token: str, host: str = "elsewhere", pid: int = 1) -> dict:
    return {"token": token, "pid": pid, "host": host, "started": None, "heartbeat": time.time()}


def test_acquire_renew_and_release_a_lease(store: Journal):
    store.acquire_lease("r", _holder("one"), lambda holder: False)
    with pytest.raises(RunLeased, match="pid 1 on 'elsewhere'") as held:
        store.acquire_lease("r", _holder("two"), lambda holder: True)
    assert held.value.holder["token"] == "one"
    assert store.renew_lease("r", "one", time.time())
    assert not store.renew_lease("r", "two", time.time())
    store.release_lease("r", "two")  # not the holder: nothing happens
    assert store.lease("r")["token"] == "one"
    store.acquire_lease("r", _holder("two"), lambda holder: False)  # a dead holder is replaced
    assert store.lease("r")["token"] == "two" and not store.renew_lease("r", "one", time.time())
    store.release_lease("r", "two")
    assert store.lease("r") is None
    assert store.lease("never") is None


def test_a_stale_lease_from_another_host_is_taken_over_and_a_fresh_one_is_not(backend: Backend):
    store = backend.open()
    store.acquire_lease("old", _holder("x"), lambda holder: False)
    backend.age_lease(store, "old", 3600)
    assert not holder_alive(store.lease("old"))
    assert dn.execute("old", lambda ctx: "mine", journal=store) == "mine"
    store.acquire_lease("fresh", _holder("y"), lambda holder: False)
    assert holder_alive(store.lease("fresh"))
    with pytest.raises(dn.RunLeased, match="elsewhere"):
        dn.execute("fresh", lambda ctx: "mine", journal=store)


def test_two_executors_racing_for_a_new_lease_exactly_one_wins(backend: Backend):
    journals = [backend.open() for _ in range(4)]
    barrier = threading.Barrier(len(journals))
    won: list[str] = []

    def take(index: int, journal: Journal) -> None:
        barrier.wait()
        try:
            journal.acquire_lease("r", _holder(f"t{index}"), lambda holder: True)
            won.append(f"t{index}")
        except RunLeased:
            pass

    threads = [threading.Thread(target=take, args=(i, j)) for i, j in enumerate(journals)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert len(won) == 1 and journals[0].lease("r")["token"] == won[0]


@pytest.mark.postgres
def test_postgres_heartbeats_are_aged_by_the_database_clock(pg_backend: Backend,
                                                            monkeypatch: pytest.MonkeyPatch):
    """PostgreSQL only: a holder on another host that just renewed stays alive for a reader
    whose own clock is an hour ahead; its heartbeat argument is not used."""
    store = pg_backend.open()
    store.acquire_lease("r", {**_holder("x"), "heartbeat": 0.0}, lambda holder: False)
    assert store.renew_lease("r", "x", heartbeat=0.0)
    real_time = time.time
    monkeypatch.setattr(time, "time", lambda: real_time() + 3600)
    holder = store.lease("r")
    assert holder["heartbeat_age"] < 30 and holder_alive(holder)
    with pytest.raises(RunLeased, match="elsewhere"):
        store.acquire_lease("r", _holder("y"), holder_alive)
    monkeypatch.setattr(time, "time", real_time)
    pg_backend.age_lease(store, "r", 3600)
    assert store.lease("r")["heartbeat_age"] >= 3600 and not holder_alive(store.lease("r"))


# --- requests ------------------------------------------------------------------------------

def test_requests_put_get_and_delete(store: Journal):
    assert store.get_request("decision", "r") is None
    store.put_request("decision", "r", {"approved": True, "note": "ok"})
    store.put_request("decision", "r", {"approved": False, "note": "no"})  # replaces
    store.put_request("cancel", "r", {"at": 1.5})
    assert store.get_request("decision", "r") == {"approved": False, "note": "no"}
    assert store.get_request("cancel", "r") == {"at": 1.5}
    store.delete_request("decision", "r")
    assert store.get_request("decision", "r") is None and store.get_request("cancel", "r")
    with pytest.raises(ValueError, match="unknown request kind"):
        store.put_request("launch", "r", {})


def test_decisions_on_different_approvals_are_kept_apart_and_deleted_with_their_run(
        store: Journal):
    a, b = "decision." + "a" * 32, "decision." + "b" * 32
    for run_id in ("job", "job:2"):
        store.create_run(_record(run_id))
        store.put_request(a, run_id, {"note": f"a of {run_id}"})
        store.put_request(b, run_id, {"note": f"b of {run_id}"})
    store.delete_request(a, "job")  # one approval's decision taken: the other's stays
    assert store.get_request(a, "job") is None
    assert store.get_request(b, "job") == {"note": "b of job"}
    store.delete_run("job")
    assert store.get_request(b, "job") is None
    assert store.get_request(a, "job:2") == {"note": "a of job:2"}
    assert store.get_request(b, "job:2") == {"note": "b of job:2"}
    with pytest.raises(ValueError, match="unknown request kind"):
        store.put_request("decision.not-an-id", "job:2", {})


def test_reads_for_many_runs_answer_as_one_read_per_run(store: Journal):
    """requests_of, leases_of, deliveries_of and writers_of (one query each on PostgreSQL,
    for the server's listing and the hub's inbox) give what the reads run by run give."""
    a = "decision." + "a" * 32
    runs = ["job", "job:2", "quiet", "never"]
    for run_id in runs[:3]:
        store.create_run(_record(run_id))
    store.put_request(a, "job", {"note": "a of job"})
    store.put_request("cancel", "job:2", {"at": 1.5})
    store.acquire_lease("job", _holder("one"), lambda holder: False)
    store.add_delivery("job", "req/webhook", {"state": "sent"})
    store.add_delivery("job:2", "req/slack", {"state": "failed"})
    store.add_event("job", {"kind": "decided"})  # history: not a delivery

    wanted = [(kind, run_id) for kind in (a, "cancel", "decision") for run_id in runs]
    assert store.requests_of(wanted) == {
        (kind, run_id): store.get_request(kind, run_id) for kind, run_id in wanted
        if store.get_request(kind, run_id) is not None}
    assert set(store.requests_of(wanted)) == {(a, "job"), ("cancel", "job:2")}
    leases = store.leases_of(runs)
    assert set(leases) == {"job"} and leases["job"]["token"] == store.lease("job")["token"]
    assert store.deliveries_of(runs) == {run_id: store.deliveries(run_id) for run_id in runs}
    assert list(store.deliveries_of(["job"])["job"]) == ["req/webhook"]
    assert store.writers_of(runs) == {run_id: store.decision_authority(run_id)[2]
                                      for run_id in runs}
    assert store.requests_of([]) == {} and store.leases_of([]) == {}
    assert store.deliveries_of([]) == {} and store.writers_of([]) == {}


def test_add_request_writes_once_and_answers_with_what_is_there(store: Journal):
    kind = "decision." + "c" * 32
    assert store.add_request(kind, "r", {"approved": True, "by": "ana"}) is None
    assert store.add_request(kind, "r", {"approved": False, "by": "bo"}) == \
        {"approved": True, "by": "ana"}
    # The same value again (a call made again after a lost connection) is not a refusal.
    assert store.add_request(kind, "r", {"approved": True, "by": "ana"}) is None
    assert store.get_request(kind, "r") == {"approved": True, "by": "ana"}
    store.delete_request(kind, "r")
    assert store.add_request(kind, "r", {"approved": False, "by": "bo"}) is None


def test_swap_request_replaces_only_the_value_it_was_given(store: Journal):
    kind = "decision." + "d" * 32
    assert not store.swap_request(kind, "r", {"v": 1}, {"v": 2})  # nothing there
    assert store.get_request(kind, "r") is None
    store.add_request(kind, "r", {"v": 1, "at": 1.5})
    assert not store.swap_request(kind, "r", {"v": 9}, {"v": 2})
    assert store.swap_request(kind, "r", {"at": 1.5, "v": 1}, {"v": 2})  # equal as JSON data
    assert store.swap_request(kind, "r", {"v": 1, "at": 1.5}, {"v": 2})  # is {"v": 2} already
    assert store.get_request(kind, "r") == {"v": 2}


def test_writers_racing_to_add_one_request_exactly_one_wins(backend: Backend):
    journals = [backend.open() for _ in range(4)]
    kind = "decision." + "e" * 32
    barrier = threading.Barrier(len(journals))
    won: list[int] = []

    def add(index: int, journal: Journal) -> None:
        barrier.wait()
        if journal.add_request(kind, "r", {"by": index}) is None:
            won.append(index)

    threads = [threading.Thread(target=add, args=(i, j)) for i, j in enumerate(journals)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert len(won) == 1 and journals[0].get_request(kind, "r") == {"by": won[0]}


def test_swappers_racing_from_one_value_exactly_one_wins(backend: Backend):
    journals = [backend.open() for _ in range(4)]
    kind = "decision." + "f" * 32
    journals[0].add_request(kind, "r", {"v": 0})
    barrier = threading.Barrier(len(journals))
    won: list[int] = []

    def swap(index: int, journal: Journal) -> None:
        barrier.wait()
        if journal.swap_request(kind, "r", {"v": 0}, {"v": index + 1}):
            won.append(index)

    threads = [threading.Thread(target=swap, args=(i, j)) for i, j in enumerate(journals)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert len(won) == 1 and journals[0].get_request(kind, "r") == {"v": won[0] + 1}


# --- whole-run edits ----------------------------------------------------------------------

# --- keyed values -----------------------------------------------------------------------------

def test_keyed_values_are_stored_read_and_scanned_in_key_order(store: Journal):
    store.put_values("space", {"b/2": '"two"', "a/1": '"one"', "b/10": '"ten"', "c": "null"})
    assert store.get_values("space", ["a/1", "b/10", "missing"]) == {"a/1": '"one"',
                                                                   "b/10": '"ten"'}
    assert [k for k, _ in store.scan_values("space")] == ["a/1", "b/10", "b/2", "c"]
    assert store.scan_values("space", "b/") == [("b/10", '"ten"'), ("b/2", '"two"')]
    assert store.scan_values("space", "b/", reverse=True, limit=1) == [("b/2", '"two"')]
    assert [k for k, _ in store.scan_values("space", "b/", below="b/2")] == ["b/10"]
    assert [k for k, _ in store.scan_values("space", below="b")] == ["a/1"]
    assert store.scan_values("space", "z") == [] and store.get_values("space", []) == {}


def test_keyed_values_sort_by_code_point_on_both_backends(store: Journal):
    keys = ["a", "B", "é", "~", "a\x1fz", "日本", "\U0001F600", "Z"]
    store.put_values("order", {key: "0" for key in keys})
    assert [k for k, _ in store.scan_values("order")] == sorted(keys)
    assert [k for k, _ in store.scan_values("order", reverse=True)] == sorted(keys, reverse=True)


def test_keyed_values_spaces_are_apart_even_when_one_name_starts_another(store: Journal):
    store.put_values("a", {"k": "1"})
    store.put_values("ab", {"k": "2"})
    assert store.scan_values("a") == [("k", "1")] and store.scan_values("ab") == [("k", "2")]
    assert store.delete_values("a", prefix="") == 1
    assert store.scan_values("a") == [] and store.get_values("ab", ["k"]) == {"k": "2"}


def test_keyed_values_replace_or_keep_what_is_there(store: Journal):
    store.put_values("s", {"k": '"first"'})
    store.put_values("s", {"k": '"second"', "new": "1"}, replace=False)
    assert store.get_values("s", ["k", "new"]) == {"k": '"first"', "new": "1"}
    store.put_values("s", {"k": '"third"'})
    assert store.get_values("s", ["k"]) == {"k": '"third"'}


def test_keyed_values_large_ones_round_trip_and_are_deleted_by_key_or_prefix(store: Journal):
    big = json.dumps("x" * 50_000)  # a value file of its own on disk
    store.put_values("s", {"p/1": big, "p/2": "2", "q": "3"})
    store.put_values("s", {"p/1": big})
    assert store.get_values("s", ["p/1"]) == {"p/1": big}
    assert store.scan_values("s", "p/", limit=1) == [("p/1", big)]
    assert store.delete_values("s", keys=["q", "absent"]) == 1
    assert store.delete_values("s", prefix="p/") == 2
    assert store.scan_values("s") == []


def test_keyed_values_refuse_names_a_backend_cannot_store(store: Journal):
    for space in ("", "a\x00", "a\x1fb"):
        with pytest.raises(ValueError, match="space must be"):
            store.put_values(space, {"k": "1"})
    with pytest.raises(ValueError, match="key must be"):
        store.put_values("s", {"k\x00": "1"})


def test_keyed_values_scopes_are_apart(store: Journal):
    store.put_values("s", {"k": "1"})
    store.put_values("s", {"k": "2"}, scope="t")
    store.put_values("other", {"k": "3"}, scope="t")
    assert store.get_values("s", ["k"]) == {"k": "1"}
    assert store.scan_values("s", scope="t") == [("k", "2")]
    assert store.value_scopes("s") == ["", "t"] and store.value_scopes("other") == ["t"]
    assert store.scope_values("t") == [("other", "k", "3"), ("s", "k", "2")]
    assert store.delete_values("s", scope="t", prefix="") == 1
    assert store.get_values("s", ["k"]) == {"k": "1"}
    with pytest.raises(ValueError, match="scope must be"):
        store.put_values("s", {"k": "1"}, scope="a\x1fb")


def test_a_runs_keyed_values_are_deleted_with_the_run_and_no_others(store: Journal):
    for run_id in ("r", "r/child", "r-2", "r:2"):
        _fill(store, run_id, steps=1)
        store.put_values("s", {"k": run_id}, scope=run_id)
    store.put_values("s", {"k": "free"})
    store.delete_run("r", children=["r/child"])
    assert store.value_scopes("s") == ["", "r-2", "r:2"]
    assert store.get_values("s", ["k"]) == {"k": "free"}


def test_a_copy_of_a_run_copies_its_keyed_values_under_its_id(store: Journal):
    _fill(store, "src", steps=2)
    store.put_values("s", {"a": "1", "b": "2"}, scope="src")
    store.put_values("s", {"stale": "0"}, scope="dst")  # left by no run: the copy replaces it
    assert copy_run(store, "src", store, "dst") is not None
    assert store.scope_values("dst") == [("s", "a", "1"), ("s", "b", "2")]
    assert store.scope_values("src") == [("s", "a", "1"), ("s", "b", "2")]
    assert store.value_scopes("s") == ["dst", "src"]  # no staged copy's scope is left


def _fill(journal: Journal, run_id: str, steps: int = 4) -> RunRecord:
    record = _record(run_id, title="source", status=Status.DONE, result={"$t": "ok"})
    journal.create_run(record)
    for position in range(steps):
        entry = _entry(position, request={"args": {"$blob": f"b{position}"}},
                       prompt_tokens=10, completion_tokens=5)
        entry.kind = "chat" if position % 2 == 0 else "run"
        journal.append_step(run_id, entry, blobs={f"b{position}": json.dumps([position] * 3)})
    record.step_count = steps
    journal.put_run(record)
    journal.acquire_lease(run_id, _holder("t"), lambda holder: False)
    journal.put_request("cancel", run_id, {"at": 1})
    return record


def test_copy_run_copies_entries_blobs_and_record_but_not_lease_or_requests(store: Journal):
    _fill(store, "src")
    copied = copy_run(store, "src", store, "dst", changes={"title": "copy"})
    assert copied.run_id == "dst" and store.get_run("dst").title == "copy"
    assert store.get_run("dst").status is Status.DONE and store.get_run("dst").step_count == 4
    assert [e.to_json() for e in store.steps("dst")] == [e.to_json() for e in store.steps("src")]
    assert [store.get_blob("dst", f"b{i}") for i in range(4)] == \
        [store.get_blob("src", f"b{i}") for i in range(4)]
    assert store.lease("dst") is None and store.get_request("cancel", "dst") is None
    assert copy_run(store, "src", store, "dst") is None  # the target id exists: nothing written


def test_rerun_keeps_a_fork_and_rewind_forgets_the_tail_under_the_lease(store: Journal):
    record = _fill(store, "r")  # its lease is held by token "t"
    record.status = Status.RUNNING
    store.put_run(record)
    entries = list(store.steps("r"))
    assert rerun(store, store.get_run("r"), entries, 4, token="t") == "r@1"
    assert rerun(store, store.get_run("r"), entries, 4, token="t") == "r@2"
    fork = store.get_run("r@1")
    assert fork.status is Status.RUNNING and fork.forked_from["run_id"] == "r"  # as it was
    record = store.get_run("r")
    assert rewind(store, record, entries[:2], token="t") == 2
    assert store.get_run("r").to_json() == record.to_json()  # written with the entries
    assert store.count_steps("r") == 2 and store.count_steps("r@1") == 4
    assert (record.status, record.step_count, record.prompt_tokens, record.iteration) == \
        (Status.RUNNING, 2, 20, 1)
    assert store.get_request("cancel", "r") is None
    # the blobs only the forgotten entries used are reclaimed; the fork keeps its own
    assert [store.get_blob("r", f"b{i}") for i in range(4)] == ["[0, 0, 0]", "[1, 1, 1]", None,
                                                                None]
    assert store.get_blob("r@1", "b3") == "[3, 3, 3]"


def test_rewrite_steps_renumbers_kept_entries_in_one_fenced_write(store: Journal):
    record = _fill(store, "r")  # lease token "t"
    entries = list(store.steps("r"))
    record.title = "rewritten"
    kept = [entries[0], entries[2]]  # entry 1 dropped: entry 2 moves to position 1
    with pytest.raises(RunLeased, match="fenced out"):
        store.rewrite_steps("r", 1, kept[1:], record_json=record.to_json(), token="other",
                            drop_blobs=["b1"], drop_requests=True)
    assert [e.to_json() for e in store.steps("r")] == [e.to_json() for e in entries]
    assert store.get_blob("r", "b1") is not None and store.get_request("cancel", "r")
    assert store.get_run("r").title == "source"
    assert store.rewrite_steps("r", 1, kept[1:], record_json=record.to_json(), token="t",
                               drop_blobs=["b1", "b3"], drop_requests=True) == 3
    assert [(e.position, e.key) for e in store.steps("r")] == [(0, "0"), (1, "2")]
    assert store.count_steps("r") == 2 and store.get_step("r", 2) is None
    assert (store.get_blob("r", "b1"), store.get_blob("r", "b3")) == (None, None)
    assert store.get_blob("r", "b2") is not None and store.get_request("cancel", "r") is None
    assert store.get_run("r").title == "rewritten"
    with pytest.raises(RunLeased, match="fenced out"):
        store.truncate("r", 0, token="other")
    assert store.truncate("r", 1, token="t") == 1 and store.count_steps("r") == 1


def test_a_staged_copy_is_no_run_until_published_at_once(store: Journal):
    _fill(store, "src")
    store.create_run(_record("dst copying 1", status=Status.FAILED, error="incomplete copy"))
    for position, entry in enumerate(store.steps("src")):
        store.append_step("dst copying 1", entry, blobs={f"b{position}": "[9]"})
    assert store.find_run("dst") is None and store.count_steps("dst") == 0
    record = store.get_run("src")
    record.run_id = "dst"
    assert store.publish_runs([("dst copying 1", record)]) is True
    assert store.get_run("dst").title == "source" and store.count_steps("dst") == 4
    assert store.get_blob("dst", "b3") == "[9]" and store.count_steps("dst copying 1") == 0
    assert [r.run_id for r in store.list_runs()] == ["dst", "src"]
    store.create_run(_record("dst copying 2"))
    store.append_step("dst copying 2", _entry(0))
    assert store.publish_runs([("dst copying 2", record)]) is False  # dst exists: nothing moved
    assert store.count_steps("dst") == 4 and store.count_steps("dst copying 2") == 1
    assert store.find_run("dst copying 2") is not None


def test_delete_run_matches_exact_run_ids_with_its_children_and_is_fenced(store: Journal):
    for run_id in ("job", "job:2", "job/child-0", "jobs"):
        store.create_run(_record(run_id))
        store.append_step(run_id, _entry(0), blobs={"abc": json.dumps(run_id)})
    store.acquire_lease("job", _holder("t"), lambda holder: False)
    with pytest.raises(RunLeased, match="fenced out"):
        store.delete_run("job", token="other", children=["job/child-0"])
    assert store.get_step("job", 0) is not None and store.find_run("job/child-0") is not None
    store.delete_run("job", token="t", children=["job/child-0"])
    for run_id in ("job", "job/child-0"):
        assert store.find_run(run_id) is None and store.get_blob(run_id, "abc") is None
        assert store.get_step(run_id, 0) is None
    for run_id in ("job:2", "jobs"):
        assert store.get_blob(run_id, "abc") == json.dumps(run_id)
        assert store.get_step(run_id, 0) is not None


@pytest.mark.postgres
def test_copy_run_moves_runs_between_disk_and_postgresql_with_their_blobs(tmp_path,
                                                                           pg_backend: Backend):
    """Both backends at once: a run executed on disk is copied to PostgreSQL, replayed
    there without executing a step, and copied back."""
    disk = DiskJournal(tmp_path / "journal")
    postgres = pg_backend.open()
    calls: list[str] = []
    long_text = "the quarterly figures " * 100  # past the inline limit: stored as a blob

    def agent(ctx):
        first = ctx.run("summarise", lambda text: calls.append("summarise") or len(text),
                        long_text)
        second = ctx.run("double", lambda n: calls.append("double") or n * 2, first)
        return [first, second]

    expected = dn.execute("moved", agent, journal=disk)
    assert calls == ["summarise", "double"]
    source_entries = [e.to_json() for e in disk.steps("moved")]
    assert any(isinstance(e.request, dict) and "$blob" in json.dumps(e.request)
               for e in disk.steps("moved")), "the test needs a step with a blob"

    assert copy_run(disk, "moved", postgres, "moved") is not None
    assert [e.to_json() for e in postgres.steps("moved")] == source_entries
    for entry in postgres.steps("moved"):
        assert load_request(entry.request, lambda d: postgres.get_blob("moved", d)) == \
            load_request(entry.request, lambda d: disk.get_blob("moved", d))
    assert dn.execute("moved", agent, journal=postgres) == expected
    assert calls == ["summarise", "double"]  # replayed from PostgreSQL: nothing ran again

    back = DiskJournal(tmp_path / "back")
    assert copy_run(postgres, "moved", back, "moved") is not None
    assert [e.to_json() for e in back.steps("moved")] == source_entries
    assert back.get_run("moved").status is Status.DONE
    assert dn.execute("moved", agent, journal=back) == expected and len(calls) == 2
    back.close()
    disk.close()


# --- format and schema versions ------------------------------------------------------------

def test_a_newer_format_version_is_refused(backend: Backend):
    store = backend.open()
    store.create_run(_record("r"))
    backend.set_format(store, 99)
    with pytest.raises(IncompatibleJournal, match="format version 99, newer than"):
        backend.open()
    with pytest.raises(IncompatibleJournal, match="format version 99"):
        backend.open(read_only=True)


@pytest.mark.postgres
def test_postgres_a_newer_schema_migration_is_refused(pg_backend: Backend):
    pg_backend.open()
    pg_backend.sql("INSERT INTO {s}.migrations (version, name) VALUES (%s, 'from the future')",
                   (len(MIGRATIONS) + 1,))
    with pytest.raises(IncompatibleJournal, match=f"schema version {len(MIGRATIONS) + 1}, newer"):
        pg_backend.open()


@pytest.mark.postgres
def test_postgres_migrations_are_applied_once_in_order(pg_backend: Backend):
    pg_backend.open()
    pg_backend.open()
    rows = pg_backend.sql("SELECT version, name FROM {s}.migrations ORDER BY version")
    assert rows == [(i + 1, name) for i, name in enumerate(MIGRATIONS)]
    functions = pg_backend.sql(
        "SELECT proname FROM pg_proc WHERE pronamespace = %s::regnamespace ORDER BY proname",
        (f'"{pg_backend.schema}"',))
    assert functions == [("append_step",), ("count_run",), ("guard_approval_step",),
                         ("guard_decision",),
                         ("guard_delivery",), ("guard_keyed_value",), ("guard_run_steps",),
                         ("put_run",), ("run_status",),
                         ("run_writer",)]


@pytest.mark.postgres
def test_postgres_processes_opening_a_fresh_database_at_once_all_succeed(pg_backend: Backend):
    """Four processes open the same fresh schema at the same moment: the migrations run
    once, under the advisory lock, and every process gets a working journal."""
    code = (
        "import sys\n"
        "from durable_nb.journal import PostgresJournal, RunRecord\n"
        "sys.stdout.write('ready\\n'); sys.stdout.flush()\n"
        "sys.stdin.readline()\n"
        "j = PostgresJournal(sys.argv[1])\n"
        "print(j.create_run(RunRecord(sys.argv[2])))\n"
    )
    children = [subprocess.Popen([sys.executable, "-c", code, pg_backend.location, f"run{i}"],
                                 stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                 stderr=subprocess.PIPE, text=True, cwd=REPO)
                for i in range(4)]
    for child in children:
        assert child.stdout.readline() == "ready\n"  # imported, about to open
    for child in children:
        child.stdin.write("go\n")
        child.stdin.flush()
    outputs = [child.communicate(timeout=120) for child in children]
    assert [child.returncode for child in children] == [0] * 4, outputs
    assert [out.strip() for out, _ in outputs] == ["True"] * 4
    rows = pg_backend.sql("SELECT version FROM {s}.migrations ORDER BY version")
    assert rows == [(i + 1,) for i in range(len(MIGRATIONS))]
    assert sorted(r.run_id for r in pg_backend.open().list_runs()) == [f"run{i}" for i in range(4)]


# --- read-only journals ---------------------------------------------------------------------

def test_read_only_on_a_missing_journal_is_an_error_and_creates_nothing(backend: Backend):
    with pytest.raises(JournalError, match="there is no journal at"):
        backend.open(read_only=True)
    assert backend.snapshot() is None  # no directory, no schema


def test_read_only_reads_everything_and_writes_nothing(backend: Backend):
    writer = backend.open()
    _fill(writer, "r")
    writer.append_step("r", _entry(4, result="x" * 40_000))  # a value file on disk
    writer.put_values("s", {"k": "1", "big": json.dumps("y" * 40_000)})
    before = backend.snapshot()
    reader = backend.open(read_only=True)
    assert reader.read_only and not writer.read_only
    assert [r.run_id for r in reader.list_runs()] == ["r"]
    assert [e.to_json() for e in reader.steps("r")] == [e.to_json() for e in writer.steps("r")]
    assert reader.count_steps("r") == 5 and reader.has_step("r", 4)
    assert reader.get_blob("r", "b1") == writer.get_blob("r", "b1")
    assert reader.scan_values("s") == writer.scan_values("s") and \
        reader.get_values("s", ["k"]) == {"k": "1"}
    assert reader.lease("r")["token"] == "t" and reader.get_request("cancel", "r") == {"at": 1}
    record = reader.get_run("r")
    writes = {
        "create_run": lambda: reader.create_run(_record("new")),
        "put_run": lambda: reader.put_run(record),
        "delete_run": lambda: reader.delete_run("r"),
        "append_step": lambda: reader.append_step("r", _entry(5)),
        "truncate": lambda: reader.truncate("r", 0),
        "acquire_lease": lambda: reader.acquire_lease("r", _holder("z"), lambda h: False),
        "renew_lease": lambda: reader.renew_lease("r", "t", time.time()),
        "release_lease": lambda: reader.release_lease("r", "t"),
        "put_request": lambda: reader.put_request("decision", "r", {}),
        "add_request": lambda: reader.add_request("decision", "r", {}),
        "swap_request": lambda: reader.swap_request("cancel", "r", {"at": 1}, {"at": 2}),
        "delete_request": lambda: reader.delete_request("cancel", "r"),
        "put_values": lambda: reader.put_values("s", {"k": "2"}),
        "delete_values": lambda: reader.delete_values("s", prefix=""),
    }
    for name, write in writes.items():
        with pytest.raises(JournalError, match="was opened read-only"):
            write()
    with pytest.raises(JournalError, match="was opened read-only"):
        dn.execute("r", lambda ctx: None, journal=reader)
    assert backend.snapshot() == before


@pytest.mark.postgres
def test_postgres_read_only_sessions_refuse_writes_in_the_database_too(pg_backend: Backend):
    pg_backend.open().create_run(_record("r"))
    reader = pg_backend.open(read_only=True)
    with reader._conn() as conn:
        with pytest.raises(Exception, match="read-only transaction"):
            conn.execute(f'DELETE FROM "{pg_backend.schema}".runs')
    assert reader.find_run("r") is not None


# Values in files only among the first 50 entries: a `cp -r` of a live journal may copy a
# row (in the WAL) without a value file written after cp passed its folder, which is a
# torn copy, reported as CorruptEntry; SQLite's own files tolerate being copied mid-write.
_WRITER = """
import sys, time
from durable_nb.journal import DiskJournal, StepEntry
journal = DiskJournal(sys.argv[1])
position = 0
while True:
    result = "x" * 40_000 if position % 7 == 0 and position < 50 else position
    journal.append_step("r", StepEntry(position, str(position), "s", "run", result=result))
    position += 1
    if position == 50:
        print("50 written", flush=True)
"""

_READER = """
import json, sys
from durable_nb.journal import DiskJournal
journal = DiskJournal(sys.argv[1], read_only=True)
entries = list(journal.steps("r"))
assert all(e.result == ("x" * 40_000 if e.position % 7 == 0 and e.position < 50 else e.position)
           for e in entries)
try:
    open(sys.argv[1] + "/cache.db", "a")
    print("WRITABLE")
except PermissionError:
    pass
print(json.dumps({"count": journal.count_steps("r"), "listed": len(entries)}))
"""


def _without_write_permission(command: list[str]) -> list[str]:
    """Run ``command`` so that file permissions bind: as root, without the capabilities
    that let root write read-only files."""
    if os.geteuid() != 0:
        return command
    setpriv = shutil.which("setpriv")
    if setpriv is None:
        if os.environ.get("CI") == "true":
            pytest.fail("CI=true but setpriv (util-linux) is missing")
        pytest.skip("setpriv (util-linux) is needed to drop root's file permission override")
    return [setpriv, "--bounding-set=-dac_override,-dac_read_search", *command]


def _tree(root: Path) -> dict[str, tuple[int, bytes]]:
    return {str(p.relative_to(root)): (p.stat().st_mode, p.read_bytes() if p.is_file() else b"")
            for p in sorted(root.rglob("*"))}


def test_disk_read_only_copy_of_a_journal_being_written_is_read_as_it_is(tmp_path: Path):
    """Disk only: ``cp -r`` of a journal while another process writes it, ``chmod -R a-w``,
    then read with read_only=True by a process that cannot write those files: every entry
    copied is read (from the WAL too) and nothing in the copy changes."""
    original, copy = tmp_path / "journal", tmp_path / "copy"
    writer = subprocess.Popen([sys.executable, "-c", _WRITER, str(original)], cwd=REPO,
                              stdout=subprocess.PIPE, text=True)
    try:
        assert writer.stdout.readline() == "50 written\n"
        subprocess.run(["cp", "-r", str(original), str(copy)], check=True)
    finally:
        writer.kill()
        writer.wait()
    assert (copy / "cache.db-wal").exists()  # the copy holds entries not yet checkpointed
    subprocess.run(["chmod", "-R", "a-w", str(copy)], check=True)
    before = _tree(copy)
    try:
        out = subprocess.run(_without_write_permission([sys.executable, "-c", _READER, str(copy)]),
                             capture_output=True, text=True, cwd=REPO, timeout=120)
    finally:
        after = _tree(copy)
        subprocess.run(["chmod", "-R", "u+w", str(copy)], check=True)
    assert out.returncode == 0, out.stderr
    counts = json.loads(out.stdout.splitlines()[-1])
    assert "WRITABLE" not in out.stdout
    assert counts["count"] == counts["listed"] >= 50
    assert after == before


def test_disk_read_only_copy_without_a_write_ahead_log_is_read(tmp_path: Path):
    """Disk only: a journal closed cleanly has no -wal file; its read-only copy opens (as
    immutable, since there is no log to miss) and nothing is created beside it."""
    original, copy = tmp_path / "journal", tmp_path / "copy"
    journal = DiskJournal(original)
    for position in range(60):
        journal.append_step("r", _entry(position))
    journal.close()
    shutil.copytree(original, copy)
    assert not (copy / "cache.db-wal").exists()
    subprocess.run(["chmod", "-R", "a-w", str(copy)], check=True)
    before = _tree(copy)
    reader = (_READER.replace('("x" * 40_000 if e.position % 7 == 0 and e.position < 50 else e.position)',
                              "e.position"))
    try:
        out = subprocess.run(_without_write_permission([sys.executable, "-c", reader, str(copy)]),
                             capture_output=True, text=True, cwd=REPO, timeout=120)
    finally:
        after = _tree(copy)
        subprocess.run(["chmod", "-R", "u+w", str(copy)], check=True)
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout.splitlines()[-1]) == {"count": 60, "listed": 60}
    assert after == before


def test_disk_read_only_refuses_pickled_values(tmp_path: Path):
    import sqlite3

    journal = DiskJournal(tmp_path / "journal")
    journal.append_step("r", _entry(0))
    journal.close()
    with sqlite3.connect(tmp_path / "journal" / "cache.db") as db:
        db.execute("UPDATE Cache SET mode = 4, value = ? WHERE key = 'step:r:0'",
                   (b"cos\nsystem\n(S'true'\ntR.",))
    reader = DiskJournal(tmp_path / "journal", read_only=True)
    with pytest.raises(dn.CorruptEntry, match="pickled value; refusing"):
        reader.get_step("r", 0)


def test_open_journal_takes_urls_and_read_only_and_shares_one_object(backend: Backend,
                                                                      monkeypatch):
    backend.open()  # the journal exists
    first = open_journal(backend.location)
    assert open_journal(backend.location) is first
    assert type(first) is (DiskJournal if backend.kind == "disk" else PostgresJournal)
    reader = open_journal(backend.location, read_only=True)
    assert reader is not first and reader.read_only and not first.read_only
    assert open_journal(backend.location, read_only=True) is reader
    monkeypatch.setenv("DURABLE_NB_JOURNAL", backend.location)
    assert open_journal() is first
    assert open_journal(first, read_only=True) is first  # a Journal is taken as it is


# --- passwords -------------------------------------------------------------------------------

def _everything_stored(backend: Backend) -> str:
    return json.dumps(backend.snapshot(), default=str)


@pytest.mark.postgres
def test_postgres_password_never_in_location_repr_errors_logs_or_journal(
        postgres_server, caplog: pytest.LogCaptureFixture):
    from tests.postgres import PASSWORD

    schema = f"t_{uuid.uuid4().hex[:12]}"
    url = f"{postgres_server.password_url}?schema={schema}"
    secret_forms = {PASSWORD, url.split("@")[0].split(":")[-1]}  # as typed and as encoded
    backend = Backend("postgres", url, postgres_server, schema)
    caplog.set_level(logging.DEBUG)
    try:
        journal = backend.open()
        assert journal.location == f"postgresql://agent@127.0.0.1:{postgres_server.port}" \
                                   f"/dnb_test?schema={schema}"
        assert dn.execute("r", lambda ctx: ctx.run("a", lambda: "done"), journal=journal) == "done"
        texts = [journal.location, repr(journal), _everything_stored(backend)]
        with pytest.raises(UnknownRun) as unknown:
            journal.get_run("nope")
        texts.append(str(unknown.value))
        wrong = url.replace(url.split("@")[0].split(":")[-1], "wrong%40pw")
        with pytest.raises(JournalUnavailable, match="password authentication failed") as bad:
            PostgresJournal(wrong)
        texts.append(str(bad.value))
        unreachable = url.replace(f":{postgres_server.port}/", ":1/")
        with pytest.raises(JournalUnavailable) as down:
            PostgresJournal(unreachable)
        assert down.value.__cause__ is None and down.value.__suppress_context__
        texts.append(str(down.value))
        query_form = (f"postgresql://agent@127.0.0.1:{postgres_server.port}/dnb_test"
                      f"?password={url.split('@')[0].split(':')[-1]}&schema={schema}")
        by_query = PostgresJournal(query_form)
        assert by_query.find_run("r") is not None  # the password in the query works too
        texts += [by_query.location, repr(by_query)]
        by_query.dispose()
        texts += [record.getMessage() for record in caplog.records]
        for text in texts:
            for secret in secret_forms:
                assert secret not in text, text
        assert "wrong%40pw" not in str(bad.value) and "wrong@pw" not in str(bad.value)
    finally:
        backend.cleanup()


@pytest.mark.parametrize("url, location, conninfo", [
    ("postgresql://ana:p%40ss@db.example:5433/agents",
     "postgresql://ana@db.example:5433/agents", "postgresql://ana:p%40ss@db.example:5433/agents"),
    ("postgres://ana@[::1]/agents?password=p%26ss&sslmode=require&schema=team_a",
     "postgres://ana@[::1]/agents?sslmode=require&schema=team_a",
     "postgres://ana@[::1]/agents?password=p%26ss&sslmode=require"),
    ("postgresql:///agents?host=/run/pg&options=-c%20lock_timeout%3D100&sslpassword=k3y-s3cret",
     "postgresql:///agents?host=/run/pg&options=-c%20lock_timeout%3D100",
     "postgresql:///agents?host=/run/pg&options=-c%20lock_timeout%3D100&sslpassword=k3y-s3cret"),
])
def test_journal_urls_lose_their_passwords_and_schema_only(url: str, location: str,
                                                             conninfo: str):
    from durable_nb.journal.pg_connection import PostgresUrl

    parsed = PostgresUrl(url)
    assert (parsed.location, parsed.conninfo) == (location, conninfo)
    assert parsed.schema == ("team_a" if "team_a" in url else "durable_nb")
    assert all(secret not in parsed.location for secret in parsed.secrets)
    assert parsed.scrub(f"failed for {unquote_all(url)}").count("***") >= 1


def unquote_all(text: str) -> str:
    from urllib.parse import unquote

    return unquote(text)


@pytest.mark.postgres
def test_postgres_a_malformed_url_does_not_echo_the_password(postgres_server):
    url = f"postgresql://agent:hunter2%zz@127.0.0.1:{postgres_server.port}/dnb_test"
    with pytest.raises(JournalError) as info:
        PostgresJournal(url)
    assert "hunter2" not in str(info.value) and "%zz" not in str(info.value)


# --- durable_nb.execute end to end ------------------------------------------------------------

def test_execute_replays_journaled_steps_without_running_them(store: Journal):
    calls: list[int] = []

    def agent(ctx):
        values = [ctx.run(f"step {i}", lambda i=i: calls.append(i) or i * i) for i in range(5)]
        ctx.state["total"] = sum(values)
        return {"values": values, "id": ctx.uuid()}

    first = dn.execute("e2e", agent, journal=store)
    assert calls == [0, 1, 2, 3, 4]
    assert dn.execute("e2e", agent, journal=store) == first
    assert calls == [0, 1, 2, 3, 4]
    info = dn.get_run("e2e", journal=store)
    assert info.status is Status.DONE and info.state == {"total": 30}
    assert [r.run_id for r in dn.runs(journal=store)] == ["e2e"]


def test_approval_from_the_cli_reaches_a_waiting_run(backend: Backend):
    store = backend.open()

    def agent(ctx):
        return ctx.approval("send", {"to": "team"}).approved

    result: dict[str, Any] = {}
    worker = threading.Thread(target=lambda: result.update(
        value=dn.execute("waits", agent, journal=store)), daemon=True)
    worker.start()
    try:
        while (store.find_run("waits") is None
               or store.get_run("waits").status is not Status.WAITING_APPROVAL):
            assert worker.is_alive()
            time.sleep(0.02)
        proc = subprocess.run([sys.executable, "-m", "durable_nb.cli", "--journal",
                               backend.location, "approve", "waits", "--by", "ana"],
                              capture_output=True, text=True, timeout=120, cwd=REPO)
        assert proc.returncode == 0, proc.stderr
    finally:
        worker.join(60)
    assert result == {"value": True}


_CRASHING_AGENT = """
import os, signal, sys
import durable_nb as dn
location, log, marker, kill_at = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])

def agent(ctx):
    total = 0
    for i in range(8):
        def effect(i=i, step_id=ctx.step_id):
            with open(log, "a") as f:
                f.write(f"{i}\\n")
            if i == kill_at and not os.path.exists(marker):
                open(marker, "w").close()
                os.kill(os.getpid(), signal.SIGKILL)  # after the side effect, before the entry
            return i * i
        total += ctx.run(f"square {i}", effect)
    return total

print(dn.execute("crash", agent, journal=location))
"""


def test_sigkilled_child_resumes_and_runs_every_journaled_step_once(backend: Backend,
                                                                      tmp_path: Path):
    backend.open()  # create the journal (schema) before the children use it
    log, marker = tmp_path / "effects.log", tmp_path / "killed"
    command = [sys.executable, "-c", _CRASHING_AGENT, backend.location, str(log), str(marker), "5"]
    crashed = subprocess.run(command, capture_output=True, text=True, cwd=REPO, timeout=120)
    assert crashed.returncode == -signal.SIGKILL, crashed.stderr
    store = backend.open()
    assert store.count_steps("crash") == 5  # steps 0-4 journaled; step 5 was in flight
    resumed = subprocess.run(command, capture_output=True, text=True, cwd=REPO, timeout=120)
    assert resumed.returncode == 0, resumed.stderr
    assert resumed.stdout.strip() == str(sum(i * i for i in range(8)))
    runs = Counter(int(line) for line in log.read_text().split())
    assert runs == {0: 1, 1: 1, 2: 1, 3: 1, 4: 1, 5: 2, 6: 1, 7: 1}
    assert store.get_run("crash").status is Status.DONE and store.count_steps("crash") == 8
    assert store.lease("crash") is None


def test_concurrent_asyncio_steps_are_journaled_and_replayed(store: Journal):
    calls: list[int] = []

    async def agent(ctx):
        done = [asyncio.Event() for _ in range(3)]

        async def fetch(n: int) -> int:
            if n < 2:
                await done[n + 1].wait()  # finish in reverse order: 2, 1, 0
            calls.append(n)
            done[n].set()
            return n * 10

        return await asyncio.gather(*(ctx.run_async(f"fetch {n}", fetch, n) for n in range(3)))

    assert dn.execute("async", agent, journal=store) == [0, 10, 20]
    assert calls == [2, 1, 0]
    entries = list(store.steps("async"))
    assert [e.name for e in entries] == ["fetch 2", "fetch 1", "fetch 0"]  # completion order
    assert len({e.key for e in entries}) == 3
    assert dn.execute("async", agent, journal=store) == [0, 10, 20]
    assert calls == [2, 1, 0]


@pytest.mark.postgres
def test_postgres_lists_a_hundred_thousand_runs_oldest_first_with_step_counts(pg_backend: Backend):
    """PostgreSQL only: the runs table has an index in listing order (creation time, id),
    and a listing of 100k runs comes back whole and in that order."""
    store = pg_backend.open()
    pg_backend.sql(
        "INSERT INTO {s}.runs (run_id, created_at, record) "
        "SELECT 'run-' || i, 100000 - i, "
        "       json_build_object('run_id', 'run-' || i, 'created_at', 100000 - i)::text "
        "FROM generate_series(1, 100000) AS i")
    indexes = pg_backend.sql("SELECT indexdef FROM pg_indexes WHERE schemaname = %s "
                             "AND tablename = 'runs'", (pg_backend.schema,))
    assert any("(created_at, run_id)" in row[0] for row in indexes), indexes
    pg_backend.sql("INSERT INTO {s}.steps (run_id, position, entry) "
                   "SELECT 'run-7', p, '{\"id\":\"' || p || '\",\"n\":\"s\",\"k\":\"run\"}' "
                   "FROM generate_series(0, 4) AS p")
    counted = store.list_runs_counted()
    assert [r.step_count for r in counted if r.run_id in ("run-7", "run-8")] == [0, 5]
    listed = store.list_runs()
    assert len(listed) == 100000
    assert [r.run_id for r in listed[:2]] == ["run-100000", "run-99999"]
    assert all(a.created_at < b.created_at for a, b in zip(listed, listed[1:]))


@pytest.mark.postgres
def test_postgres_a_failed_write_degrades_the_run_then_catches_up(pg_backend: Backend):
    """PostgreSQL only: while another session holds the steps table locked, the journal's
    writes fail (lock_timeout, a real server error); as with a full disk, the run goes on
    with a loud warning and the held-back entries are written, in order, once the lock is
    gone (on_journal_error="continue"); by default ("stop") the run stops before passing the
    unwritten step. A lock timeout is not a lost connection: it is not retried."""
    import psycopg

    pg_backend.open()  # the schema exists
    journal = PostgresJournal(f"{pg_backend.location}&options=-c%20lock_timeout%3D100")
    pg_backend._opened.append(journal)
    locker = psycopg.connect(pg_backend.server.url)  # a transaction, held open
    calls: list[str] = []

    def lock_steps() -> None:
        locker.execute(f'LOCK TABLE "{pg_backend.schema}".steps IN ACCESS EXCLUSIVE MODE')

    def agent(ctx):
        ctx.run("before", lambda: calls.append("before") or 1)
        ctx.run("lock the journal", lock_steps)
        ctx.run("paid llm call", lambda: calls.append("paid") or "y" * 100)
        ctx.run("unlock", locker.rollback)
        ctx.run("after", lambda: calls.append("after") or 2)
        return "done"

    try:
        with pytest.warns(RuntimeWarning, match="DEGRADED from step 1") as caught:
            assert dn.execute("degraded", agent, journal=journal,
                              on_journal_error="continue") == "done"
        assert "lock timeout" in str(caught[0].message)
        info = dn.get_run("degraded", journal=journal)
        assert [s.name for s in info.steps] == ["before", "lock the journal", "paid llm call",
                                                "unlock", "after"]
        assert info.status is Status.DONE and info.journal_degraded_from is None
        assert dn.execute("degraded", agent, journal=journal) == "done"
        assert calls == ["before", "paid", "after"]

        calls.clear()
        with pytest.raises(dn.JournalWriteError, match="writing step 1 to the journal failed"):
            dn.execute("strict", agent, journal=journal)  # "stop" is the default
        assert calls == ["before"]  # stopped before the paid call
        locker.rollback()
        assert [s.name for s in journal.steps("strict")] == ["before"]
    finally:
        locker.close()


@pytest.mark.postgres
def test_postgres_a_forked_child_uses_connections_of_its_own(pg_backend: Backend):
    """PostgreSQL only: a process forked after the journal was opened (multiprocessing's
    fork start method) gets new connections; the parent's keep working after the child
    wrote through the journal and exited."""
    store = pg_backend.open()
    store.create_run(_record("r"))
    store.append_step("r", _entry(0))
    parent_sessions = {pid for pid, in pg_backend.sql(
        "SELECT pid FROM pg_stat_activity WHERE application_name = 'durable_nb'")}
    pid = os.fork()
    if pid == 0:  # the child: write through the journal, then exit
        code = 1
        try:
            with store._conn() as conn:
                session = conn.info.backend_pid
            store.append_step("r", _entry(1, result=session))
            code = 0 if store.count_steps("r") == 2 else 1
        finally:
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    store.append_step("r", _entry(2, result="from the parent"))
    results = [e.result for e in store.steps("r")]
    assert results[0] == 0 and results[2] == "from the parent"
    assert results[1] not in parent_sessions  # the child's own session wrote its step


@pytest.mark.postgres
def test_postgres_an_append_retried_after_a_lost_reply_counts_as_written(pg_backend: Backend):
    """PostgreSQL only: a writer whose connection dropped after the commit does not know
    the step was written and tries again; finding its own entry there, byte for byte, is
    success; any other entry at that position is still refused."""
    store = pg_backend.open()
    store.acquire_lease("r", _holder("t"), lambda holder: False)
    entry = _entry(0, result="paid answer")
    record = _record("r", title="with the step")
    store.append_step("r", entry, token="t", record_json=record.to_json(), blobs={"d": "[1]"})
    store.append_step("r", entry, token="t", record_json=record.to_json(), blobs={"d": "[1]"})
    assert store.count_steps("r") == 1 and store.get_run("r").title == "with the step"
    with pytest.raises(RunLeased, match="position 0 of its journal was written by another"):
        store.append_step("r", _entry(0, result="another answer"), token="t")
    with pytest.raises(RunLeased, match="fenced out"):
        store.append_step("r", entry, token="not the holder")


def test_a_run_record_leaves_out_its_defaults_and_reads_as_the_complete_record():
    """A record is written once per run and again at every step: fields at their default are
    left out. Any reader, this one or an older durable_nb's (whose from_json gives a missing
    field its default), reads the same record as from the complete text."""
    from dataclasses import fields

    record = RunRecord("r", status=Status.WAITING_APPROVAL, created_at=12.5, step_count=2,
                       result=0, pending_approval={"name": "send"}, cost=0.0, title="")
    compact, complete = json.loads(record.to_json()), json.loads(record.to_json(complete=True))
    assert list(compact)[:2] == ["status", "created_at"]  # the listing tag's prefix
    assert set(compact) == {"status", "created_at", "run_id", "step_count", "result",
                            "pending_approval"}
    defaults = {f.name: f.default for f in fields(RunRecord) if f.name != "run_id"}
    assert {**defaults, **compact, "status": compact["status"]} == complete
    assert RunRecord.from_json(record.to_json()) == record
    assert len(record.to_json()) < len(record.to_json(complete=True)) / 2
