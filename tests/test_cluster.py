"""Batches on a Dask cluster (``durable_nb.map(..., executor=client)``): a real LocalCluster of
two worker processes, the test PostgreSQL server, the loopback LLM server.

One cluster serves the whole module (it takes seconds to start). The main test SIGKILLs a
worker process while it holds an item inside a tool, before the tool's side effect; Dask runs
the item again on another worker, which takes the dead worker's lease over, and every
journaled step is executed once: counted at the loopback server (each chat round of each
item) and in the tool's side-effect log.
"""

from __future__ import annotations

import logging
import os
import signal
import threading
import time
from collections import Counter
from pathlib import Path

import pytest

import durable_nb as dn
from durable_nb import Status
from durable_nb.batches.batch import BatchObserver
from durable_nb.batches.cluster import JournalRef, refuse_workers, run_item
from durable_nb.errors import JournalError
from durable_nb.journal import PostgresJournal, open_journal
from durable_nb.execution.lease import Lease
from durable_nb.options import RunOptions
from durable_nb.testing import LoopbackServer
from tests import cluster_agent
from tests.test_journal_conformance import Backend, pg_backend  # noqa: F401 (fixture)

distributed = pytest.importorskip("distributed")

pytestmark = pytest.mark.postgres


@pytest.fixture(scope="module")
def dask_client():
    """A LocalCluster of two worker processes, one thread each, for the module."""
    cluster = distributed.LocalCluster(n_workers=2, processes=True, threads_per_worker=1,
                                       dashboard_address=None, silence_logs=logging.WARNING)
    client = distributed.Client(cluster)
    try:
        yield client
    finally:
        client.close()
        cluster.close()


@pytest.fixture
def server():
    with LoopbackServer(cluster_agent.SCRIPT) as s:
        yield s


class Recorder(BatchObserver):
    """What the notebook's batch view would be told, in order."""

    def __init__(self) -> None:
        self.items: list[tuple[int, str]] = []
        self.steps: list[tuple[int, str, str]] = []
        self.lock = threading.Lock()

    def on_item(self, item) -> None:
        with self.lock:
            self.items.append((item.index, item.state))

    def on_item_step(self, index, entry, replayed) -> None:
        with self.lock:
            self.steps.append((index, entry.kind, entry.name))


def _wait_until(predicate, what: str, timeout: float = 120.0, box: dict | None = None) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if box is not None and "error" in box:
            raise AssertionError(f"map failed while waiting for {what}") from box["error"]
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.05)


def _chat_rounds(server: LoopbackServer) -> Counter:
    """How often each (ticket, round) was asked of the server."""
    asked: Counter = Counter()
    for body in server.requests:
        ticket = int(body["messages"][0]["content"].rsplit(" ", 1)[1])
        rounds = sum(1 for m in body["messages"] if m["role"] == "assistant")
        asked[(ticket, rounds)] += 1
    return asked


def _start_map(box: dict, **kwargs) -> threading.Thread:
    def run() -> None:
        try:
            box["batch"] = dn.map(**kwargs)
        except BaseException as exc:  # noqa: BLE001 - the test reports it
            box["error"] = exc

    thread = threading.Thread(target=run, name="map")
    thread.start()
    return thread


# --- the batch on the cluster, a worker killed mid-item ----------------------------------------

def test_a_batch_on_two_workers_survives_a_killed_worker_and_runs_every_step_once(
        dask_client, server, pg_backend: Backend, tmp_path: Path):
    items = [{"id": i} for i in range(6)]
    recorder = Recorder()
    handler = cluster_agent.make_handler(server.url, str(tmp_path))
    box: dict = {}
    workers_before = dask_client.run(os.getpid)
    thread = _start_map(box, handler=handler, items=items, batch_id="tickets",
                        key=lambda item: item["id"], executor=dask_client,
                        journal=pg_backend.location, concurrency=4, observer=recorder)
    try:
        # Both workers hold an item inside the tool, before its side effect.
        _wait_until(lambda: len(list(tmp_path.glob("entered-*"))) >= 2, "two items in the tool",
                    box=box)
        entered = {int(p.name.split("-")[2]): int(p.name.split("-")[1])
                   for p in tmp_path.glob("entered-*")}  # pid -> item
        assert set(entered) == set(workers_before.values())  # one on each worker
        victim = sorted(entered)[0]
        victim_item = entered[victim]
        # The notebook saw the item's first step while it still runs: read from the journal.
        _wait_until(lambda: (victim_item, "chat", cluster_agent.MODEL) in recorder.steps,
                    "the item's chat step in the observer", box=box)
        os.kill(victim, signal.SIGKILL)
        _wait_until(lambda: victim not in dask_client.run(os.getpid, on_error="ignore").values(),
                    "the killed worker to be gone")
        (tmp_path / "gate").touch()
        thread.join(300)
    finally:
        (tmp_path / "gate").touch()
        thread.join(300)
    assert "error" not in box, box.get("error")
    batch = box["batch"]
    assert batch.counts == {"DONE": 6}
    assert batch.results() == [{"id": i, "label": f"label-{i}", "answer": "confirmed"}
                               for i in range(6)]
    # Exactly once per journaled step: each chat round of each item reached the server once
    # (the killed item's first round too: it was journaled before the kill and replayed) ...
    assert _chat_rounds(server) == {(i, r): 1 for i in range(6) for r in (0, 1)}
    # ... and each tool ran its side effect once, the killed item's on another process.
    effects = (tmp_path / "effects.log").read_text().split("\n")[:-1]
    step_ids = [line.split()[0] for line in effects]
    assert sorted(step_ids) == sorted(f"tickets/{i}:1" for i in range(6))
    victim_effect = next(line for line in effects if line.startswith(f"tickets/{victim_item}:"))
    assert int(victim_effect.split()[1]) != victim
    # The journal: every item three steps, none twice; the victim's first step from before.
    journal = open_journal(pg_backend.location)
    for i in range(6):
        steps = list(journal.steps(f"tickets/{i}"))
        assert [(e.kind, e.name) for e in steps] == [
            ("chat", cluster_agent.MODEL), ("run", "label"), ("chat", cluster_agent.MODEL)]
    # The notebook saw every item finish, live.
    assert {index for index, state in recorder.items if state == "DONE"} == set(range(6))
    assert {index for index, kind, _ in recorder.steps if kind == "run"} == set(range(6))


def test_a_directory_journal_works_when_every_worker_is_on_this_machine(
        dask_client, tmp_path: Path):
    journal = tmp_path / "journal"
    batch = dn.map(cluster_agent_double, [1, 2, 3], batch_id="d", key="index",
                   executor=dask_client, journal=str(journal))
    assert batch.results() == [2, 4, 6]
    assert {r.run_id for r in dn.runs(journal=journal)} == {"d/0", "d/1", "d/2"}
    again = dn.map(cluster_agent_double, [1, 2, 3], batch_id="d", key="index",
                   executor=dask_client, journal=str(journal))
    assert [item.replayed for item in again] == [True] * 3


def cluster_agent_double(ctx, x):
    return ctx.run("double", lambda: x * 2)


def test_a_parked_item_resumes_on_the_cluster_after_a_decision(dask_client, pg_backend: Backend):
    def handler(ctx, x):
        if x == 1 and not ctx.approval("publish", {"item": x}).approved:
            return "rejected"
        return ctx.run("work", lambda: f"did {x}")

    location = pg_backend.location
    parked = dn.map(handler, [0, 1], batch_id="p", key="index", executor=dask_client,
                    journal=location, wait=False)
    assert [item.status for item in parked] == [Status.DONE, Status.WAITING_APPROVAL]
    dn.approve("p/1", "fine", journal=location)
    resumed = dn.map(handler, [0, 1], batch_id="p", key="index", executor=dask_client,
                     journal=location)
    assert resumed.results() == ["did 0", "did 1"]


# --- refusals ------------------------------------------------------------------------------------

def test_batch_wide_limits_are_refused_with_an_executor(dask_client, pg_backend: Backend):
    with pytest.raises(ValueError, match="max_total_tokens cannot be used with executor=.*"
                                         "max_tokens="):
        dn.map(cluster_agent_double, [1], batch_id="b", executor=dask_client,
               journal=pg_backend.location, max_total_tokens=100)
    assert open_journal(pg_backend.location).find_batch("b") is None  # refused before writing


def test_an_unpicklable_handler_is_refused_saying_what_to_do(dask_client, pg_backend: Backend):
    lock = threading.Lock()
    with pytest.raises(TypeError, match="cannot be sent to the cluster's workers.*inside the "
                                        "handler"):
        dn.map(lambda ctx, x: lock and x, [1], batch_id="b", executor=dask_client,
               journal=pg_backend.location)


def _report(host: str, **fields) -> dict:
    return {"host": host, "pid": 1, "error": None, "found": True, "directory": [1, 2], **fields}


def test_a_directory_journal_is_refused_for_workers_on_other_hosts():
    ref = JournalRef("/data/journal", "/data/journal", "directory")
    with pytest.raises(JournalError, match="tcp://b:1 runs on 'other', not on this machine.*"
                                           "Use a PostgreSQL journal"):
        refuse_workers(ref, {"tcp://a:1": _report("here"), "tcp://b:1": _report("other")},
                       "here", [1, 2])
    with pytest.raises(JournalError, match="sees another directory"):
        refuse_workers(ref, {"tcp://a:1": _report("here", directory=[9, 9])}, "here", [1, 2])
    refuse_workers(ref, {"tcp://a:1": _report("here")}, "here", [1, 2])  # the same: fine


def test_a_database_journal_is_refused_when_a_worker_cannot_reach_it_or_sees_another():
    ref = JournalRef("postgresql://u:pw@db/x", "postgresql://u@db/x", "postgres")
    with pytest.raises(JournalError, match="tcp://a:1 cannot open it: JournalUnavailable: down.*"
                                           "tcp://b:1 opens a journal without this batch.*"
                                           "not localhost"):
        refuse_workers(ref, {"tcp://a:1": _report("h1", error="JournalUnavailable: down"),
                             "tcp://b:1": _report("h2", found=False)}, "here", None)


# --- the lease of a worker that died on another host ------------------------------------------

def test_a_new_attempt_waits_for_a_lease_from_another_host_to_go_stale(pg_backend: Backend):
    journal = pg_backend.open()
    ref = JournalRef.of(journal)
    journal.create_run(dn.RunRecord(run_id="b/0", created_at=time.time()))
    # The lease of a worker on another host whose last heartbeat was just now.
    journal.acquire_lease("b/0", {"token": "dead", "pid": 1, "host": "elsewhere",
                                  "heartbeat": time.time()}, lambda holder: True)
    options = RunOptions(stale_after=2.0, heartbeat_interval=0.5)
    report = run_item(ref, "b/0", lambda ctx, x: ctx.run("s", lambda: x + 1), 41, options)
    assert report["status"] == "DONE" and report["lease_waits"] >= 1
    assert journal.get_run("b/0").status is Status.DONE
    assert dn.serde.decode(journal.get_run("b/0").result) == 42


def test_a_lease_kept_alive_elsewhere_is_left_to_its_holder(pg_backend: Backend, monkeypatch):
    import durable_nb.batches.cluster as cluster

    monkeypatch.setattr(cluster, "LEASE_SLACK", 1.0)
    journal = pg_backend.open()
    journal.create_run(dn.RunRecord(run_id="b/0", created_at=time.time()))
    holder = Lease.acquire(journal, "b/0", 2.0)
    stop = threading.Event()

    def heartbeat() -> None:  # the holder is alive: it renews its lease
        while not stop.wait(0.3):
            holder.renew()

    beating = threading.Thread(target=heartbeat)
    beating.start()
    try:
        options = RunOptions(stale_after=2.0, heartbeat_interval=0.5)
        report = run_item(JournalRef.of(journal), "b/0", lambda ctx, x: x, 1, options)
    finally:
        stop.set()
        beating.join()
        holder.release()
    assert "leased" in report and report["lease_waits"] >= 1
    assert journal.get_run("b/0").status is Status.RUNNING  # untouched: its holder has it


# --- passwords -----------------------------------------------------------------------------------

def test_the_password_is_not_in_task_keys_reprs_or_worker_logs(dask_client, postgres_server,
                                                               pg_backend: Backend):
    url = f"{postgres_server.password_url}?schema={pg_backend.schema}"
    journal = PostgresJournal(url)
    try:
        keys: list[str] = []
        submit = dask_client.submit

        def recording_submit(*args, **kwargs):
            future = submit(*args, **kwargs)
            keys.append(future.key)
            return future

        dask_client.submit = recording_submit  # type: ignore[method-assign]
        try:
            batch = dn.map(cluster_agent_double, [5, 6], batch_id="pw", key="index",
                           executor=dask_client, journal=journal)
        finally:
            del dask_client.submit
        assert batch.results() == [10, 12]
        assert keys and all(key.startswith("durable-nb-pw/") for key in keys)
        ref = JournalRef.of(journal)
        # A task that fails outside the run: Dask logs its arguments. A wrong password here.
        bad = JournalRef(url.replace("s3cret", "guess"), ref.location, "postgres")
        failed = dask_client.submit(run_item, bad, "pw/x", cluster_agent_double, 1,
                                    RunOptions(), pure=False)
        with pytest.raises(Exception, match="password authentication failed"):
            failed.result()
        logs = "\n".join(line for lines in dask_client.get_worker_logs().values()
                         for _, line in lines)
        logs += "\n".join(line for _, line in dask_client.get_scheduler_logs())
        assert "Compute Failed" in logs and ref.location in logs
        for text in (logs, repr(ref), str(ref), *keys, repr(batch), str(batch.records())):
            assert "s3cret" not in text and "guess@pw" not in text and "guess%40" not in text
    finally:
        journal.dispose()
