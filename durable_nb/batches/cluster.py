"""Batches on a Dask cluster: ``durable_nb.map(handler, items, batch_id=..., executor=client)``.

With a ``dask.distributed.Client`` as ``executor``, every item of the batch is a Dask task: a
worker opens the batch's journal by its location and executes the item's run there, exactly
as a thread of the notebook would (lease, heartbeat, replay of what is journaled), and the
task returns only how the run ended. Results, errors, tokens and steps are read back from the
journal. The handler, the item and the run options travel the way Dask ships functions
(cloudpickle, over Dask's own connections); the journal stays JSON.

**The journal must be shared:** a ``postgresql://`` URL every worker reaches, or a directory
only when every worker runs on this machine (a ``LocalCluster``): SQLite over a network file
system is not safe. Before the first item is sent, every worker opens the journal (read-only)
and must find the batch's record there; anything else is refused with what to do.

**Progress:** workers cannot call back into the notebook, so the process that called ``map``
reads the journal: every half second, the records of the items in flight (and their new
entries) feed the batch observer's ``on_item`` and ``on_item_step``.

**A worker that dies mid-item:** Dask runs the task again on another worker. The run's lease
still names the dead worker, so the new attempt waits until the lease may be taken over: at
once when the dead worker was on the same host (its pid is gone), else once its heartbeat,
measured in the database's clock, is ``stale_after`` seconds old. It retries for at most
``stale_after + 10 s``; a holder still alive then executes the item elsewhere, and the item
is reported as the journal has it (RUNNING). Steps the dead worker journaled replay; only the
step in flight at the kill runs again (at least once, as after any crash).

**Batch-wide limits are refused** (``requests_per_minute``, ``tokens_per_minute``,
``max_total_tokens``, ``max_total_cost``): they are kept in the memory of one process and
cannot hold for items running in others. Each item's own budgets (``max_tokens``,
``max_cost``, ``max_iterations``, ``timeout``) hold wherever it runs; ``concurrency`` caps how
many items are on the cluster at once.

**Passwords:** a worker gets the journal's URL inside the task's arguments, wrapped in a
:class:`JournalRef` whose ``repr`` (what Dask prints of arguments when a task fails) is the
location without the password; task keys are ``durable-nb-BATCH/KEY-...``.

``pip install 'durable-nb[cluster]'``; every worker needs durable_nb (and what the handler
imports) installed, as for any Dask task.
"""

from __future__ import annotations

import os
import socket
import threading
import time
import uuid
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from ..errors import JournalError, RunLeased
from ..journal import DiskJournal, Journal, PostgresJournal, Status, open_journal
from ..runner import Runner

if TYPE_CHECKING:
    from .batch import BatchExecution, ItemResult

__all__ = ["DaskExecutor", "JournalRef", "batch_executor", "run_item"]

#: How often the process that called map reads the progress of the items in flight.
PROGRESS_INTERVAL = 0.5
#: How long past ``stale_after`` a new attempt keeps retrying a lease that a holder keeps.
LEASE_SLACK = 10.0

_SHARED_LIMITS = ("requests_per_minute", "tokens_per_minute", "max_total_tokens",
                  "max_total_cost")


class JournalRef:
    """How a worker opens the batch's journal. For a database the URL carries its password,
    which is never shown: ``repr`` and ``str`` give the location without it."""

    def __init__(self, spec: str, location: str, kind: str, durability: str | None = None
                 ) -> None:
        self._spec = spec
        self.location = location
        self.kind = kind  # "postgres" or "directory"
        self.durability = durability

    @classmethod
    def of(cls, journal: Journal) -> "JournalRef":
        if isinstance(journal, PostgresJournal):
            return cls(journal.connection_url(), journal.location, "postgres")
        if isinstance(journal, DiskJournal):
            return cls(journal.location, journal.location, "directory", journal.durability)
        raise TypeError(
            f"executor= needs a journal that other processes can open by its location: a "
            f"postgresql:// URL or a directory, not a {type(journal).__name__}. Pass "
            f"journal='postgresql://...' (or set DURABLE_NB_JOURNAL).")

    def open(self) -> Journal:
        """The journal, opened once per process and shared (as ``open_journal`` does)."""
        return open_journal(self._spec, durability=self.durability)  # type: ignore[arg-type]

    def open_read_only(self) -> Journal:
        """A read-only journal of its own (nothing created where there is none); close it
        with :func:`_close`."""
        if self.kind == "postgres":
            return PostgresJournal(self._spec, read_only=True, pool_size=1)
        return DiskJournal(self.location, read_only=True)

    def __repr__(self) -> str:
        return f"JournalRef({self.location!r})"

    __str__ = __repr__


def batch_executor(executor: Any, journal: Journal, **limits: Any) -> "DaskExecutor":
    """The item executor for ``map(..., executor=...)``: a ``dask.distributed.Client``
    becomes a :class:`DaskExecutor` on ``journal``. Refuses batch-wide limits (``limits``:
    the values ``map`` was given for them) and journals other processes cannot open."""
    try:
        from distributed import Client
    except ImportError:
        raise ImportError("map(..., executor=client) runs items on a Dask cluster and needs "
                          "dask.distributed: pip install 'durable-nb[cluster]'") from None
    if not isinstance(executor, Client):
        raise TypeError(f"executor= takes a dask.distributed.Client (the cluster to run the "
                        f"items on), not {type(executor).__name__}; leave it out to run the "
                        f"items on threads in this process.")
    given = [name for name in _SHARED_LIMITS if limits.get(name) is not None]
    unknown = set(limits) - set(_SHARED_LIMITS)
    if unknown:
        raise TypeError(f"unknown limits {sorted(unknown)}")
    if given:
        raise ValueError(
            f"{', '.join(given)} cannot be used with executor=: batch-wide limits are kept in "
            f"the memory of the process that calls map, and the items run in the cluster's "
            f"workers. Give every item its own budget instead (max_tokens=, max_cost=, "
            f"max_iterations=: each item's run enforces them wherever it runs) and cap the "
            f"items running at once with concurrency=, or leave executor= out to run the "
            f"batch on threads here with the shared limits.")
    return DaskExecutor(executor, JournalRef.of(journal))


# -- on the worker ------------------------------------------------------------------------------

def _probe(ref: JournalRef, batch_id: str) -> dict:
    """Run on every worker before the first item: can it open the journal, and is it the
    notebook's (it holds the batch's record)? Where is the directory?"""
    report: dict[str, Any] = {"host": socket.gethostname(), "pid": os.getpid(), "error": None,
                              "found": False, "directory": None}
    try:
        journal = ref.open_read_only()
        try:
            report["found"] = journal.find_batch(batch_id) is not None
        finally:
            _close(journal)
        if ref.kind == "directory":
            stat = os.stat(ref.location)
            report["directory"] = [stat.st_dev, stat.st_ino]
    except Exception as exc:  # noqa: BLE001 - reported to the notebook, with what to do
        report["error"] = f"{type(exc).__name__}: {exc}"
    return report


def _close(journal: Journal) -> None:
    if isinstance(journal, PostgresJournal):
        journal.dispose()
    else:
        journal.close()


def _lease_pause(holder: dict, stale_after: float) -> float:
    """How long to wait before trying a held lease again: until the holder may be stale."""
    try:
        age = float(holder.get("heartbeat_age", time.time() - float(holder["heartbeat"])))
    except (KeyError, TypeError, ValueError):
        return 1.0
    return min(2.0, max(0.2, stale_after - age))


def run_item(ref: JournalRef, run_id: str, handler: Any, item: Any, options: Any) -> dict:
    """The Dask task of one item: execute its run here and say how it ended (the outcome
    itself is in the journal). A lease held by an executor that may still be alive (a
    worker that died a moment ago, on another host) is retried for up to ``stale_after +
    LEASE_SLACK`` seconds."""
    journal = ref.open()
    runner = Runner(run_id, lambda ctx: handler(ctx, item), journal=journal, options=options)
    give_up = time.monotonic() + options.stale_after + LEASE_SLACK
    waited = 0
    while True:
        try:
            outcome = runner.run()
            return {"status": outcome.status.value, "lease_waits": waited}
        except RunLeased as exc:
            if runner.execution is not None or time.monotonic() >= give_up:
                # fenced out while executing, or a holder that stays alive: it has the item
                return {"leased": str(exc), "lease_waits": waited}
            waited += 1
            time.sleep(_lease_pause(exc.holder, options.stale_after))
        except Exception as exc:  # noqa: BLE001 - the run's record holds the failure
            return {"error": f"{type(exc).__name__}: {exc}", "lease_waits": waited}


# -- in the process that called map -------------------------------------------------------------

class _Progress:
    """Reads the journal for the items in flight and tells the batch observer what changed."""

    def __init__(self, execution: "BatchExecution") -> None:
        self.execution = execution
        self.seen: dict[int, tuple] = {}
        self.steps: dict[int, int] = {}

    def start(self, index: int) -> None:
        record = self.execution.journal.find_run(self.execution.run_id(index))
        self.steps[index] = 0 if record is None else record.step_count

    def poll(self, indexes: list[int]) -> None:
        execution = self.execution
        for index in indexes:
            run_id = execution.run_id(index)
            record = execution.journal.find_run(run_id)
            if record is None:
                continue
            seen = self.steps.get(index, 0)
            if record.step_count > seen:
                for entry in execution.journal.steps(run_id, seen):
                    execution.observer.on_item_step(index, entry, False)
                    seen = entry.position + 1
                self.steps[index] = seen
            signature = (record.status, record.step_count, record.iteration, record.tokens)
            if self.seen.get(index) != signature:
                self.seen[index] = signature
                execution.observer.on_item(execution.result_of(index, record))


def _shippable(what: str, value: Any) -> None:
    import cloudpickle

    try:
        cloudpickle.dumps(value)
    except Exception as exc:  # noqa: BLE001 - any pickling failure
        raise TypeError(
            f"{what} cannot be sent to the cluster's workers ({type(exc).__name__}: {exc}). "
            f"Dask ships it with cloudpickle: make clients and connections inside the handler "
            f"(ctx.chat(client=openai.OpenAI(...)), or leave client= out to use the workers' "
            f"OPENAI_* environment) rather than passing them in.") from None


class DaskExecutor:
    """Runs a batch's items as tasks on a Dask cluster (see the module docstring)."""

    def __init__(self, client: Any, ref: JournalRef) -> None:
        self.client = client
        self.ref = ref
        self._checked = False

    def check_workers(self, batch_id: str) -> None:
        """Every worker must open the journal and find the batch there; a directory only on
        this machine."""
        reports = self.client.run(_probe, self.ref, batch_id)
        here = None
        if self.ref.kind == "directory":
            stat = os.stat(self.ref.location)
            here = [stat.st_dev, stat.st_ino]
        refuse_workers(self.ref, reports, socket.gethostname(), here)
        self._checked = True

    def execute(self, execution: "BatchExecution", todo: list[int]) -> None:
        """Run the items in ``todo`` on the cluster, at most ``execution.concurrency`` at
        once; their outcomes land in ``execution.results``. An interrupt cancels the items
        not started and asks those running to stop (CANCELLED, resumable), then is raised
        again."""
        if not todo:
            return
        if not self._checked:
            self.check_workers(execution.record.batch_id)
        options = replace(execution.options, call_gate=None)
        _shippable("the batch's handler", execution.handler)
        _shippable("the run options", options)
        waiting = list(todo)
        running: dict[Any, int] = {}
        progress = _Progress(execution)
        finished = threading.Event()
        try:
            while waiting or running:
                while waiting and len(running) < execution.concurrency \
                        and not execution.interrupted.is_set():
                    index = waiting.pop(0)
                    progress.start(index)
                    future = self._submit(execution, index, options)
                    future.add_done_callback(lambda _: finished.set())
                    running[future] = index
                    execution.observer.on_item(replace(execution.results[index],
                                                       status=Status.RUNNING))
                if execution.interrupted.is_set() and not running:
                    break
                finished.wait(PROGRESS_INTERVAL)
                finished.clear()
                done = [future for future in running if future.done()]
                progress.poll(sorted(running.values()))
                for future in done:
                    index = running.pop(future)
                    execution.results[index] = self._outcome(execution, index, future)
                    execution.observer.on_item(execution.results[index])
        except KeyboardInterrupt:
            self._interrupt(execution, running)
            raise

    def _submit(self, execution: "BatchExecution", index: int, options: Any) -> Any:
        run_id = execution.run_id(index)
        item = execution.items[index]
        _shippable(f"item {index} of the batch", item)
        return self.client.submit(run_item, self.ref, run_id, execution.handler, item, options,
                                  key=f"durable-nb-{run_id}-{uuid.uuid4().hex[:8]}",
                                  pure=False)

    @staticmethod
    def _outcome(execution: "BatchExecution", index: int, future: Any) -> "ItemResult":
        run_id = execution.run_id(index)
        try:
            report = future.result()
        except Exception as exc:  # noqa: BLE001 - the task failed, not the handler
            report = {"task_error": f"{type(exc).__name__}: {exc}"}
        finally:
            future.release()
        record = execution.journal.find_run(run_id)
        result = execution.result_of(index, record)
        if "task_error" in report:
            result.status = Status.FAILED
            result.error = (f"its task failed on the cluster ({report['task_error']}); the "
                            f"run is kept as the journal has it: run the batch again to "
                            f"resume it")
        elif "leased" in report:
            result.error = f"executing elsewhere: {report['leased']}"
        elif "error" in report and (record is None or record.status is Status.DONE):
            result.status, result.error = Status.FAILED, report["error"]
        return result

    def _interrupt(self, execution: "BatchExecution", running: dict[Any, int]) -> None:
        execution.interrupted.set()
        if running:
            self.client.cancel(list(running))
        for index in running.values():
            try:
                execution.journal.put_request("cancel", execution.run_id(index),
                                              {"at": time.time(), "by": "interrupt"})
            except (JournalError, OSError):
                pass


def refuse_workers(ref: JournalRef, reports: dict[str, dict], host: str,
                   directory: list[int] | None) -> None:
    """Raise JournalError unless every worker's probe (:func:`_probe`) found the batch in
    the journal, and, for a directory, runs on ``host`` and sees the same directory."""
    if not reports:
        raise JournalError("the Dask cluster has no workers yet: start some (or wait for "
                           "them: client.wait_for_workers(n)) before map(..., executor=client).")
    problems = []
    for worker, report in sorted(reports.items()):
        if ref.kind == "directory" and report["host"] != host:
            problems.append(f"{worker} runs on {report['host']!r}, not on this machine "
                            f"({host!r})")
        elif report["error"] is not None:
            problems.append(f"{worker} cannot open it: {report['error']}")
        elif not report["found"]:
            problems.append(f"{worker} opens a journal without this batch (another database "
                            f"or directory under the same name)")
        elif ref.kind == "directory" and report["directory"] != directory:
            problems.append(f"{worker} sees another directory at that path")
    if not problems:
        return
    if ref.kind == "directory":
        advice = ("A directory journal works with executor= only when every worker runs on "
                  "this machine and shares its file system (a LocalCluster): SQLite over a "
                  "network file system is not safe. Use a PostgreSQL journal that every worker "
                  "reaches: journal='postgresql://USER@HOST/DB' (or DURABLE_NB_JOURNAL).")
    else:
        advice = ("Every worker must reach the same database: use a host name the workers "
                  "resolve to the server (not localhost, unless they run on its machine), "
                  "and check the role's grants (see the docs: PostgreSQL and Dask, Grants).")
    raise JournalError(f"the batch's journal at {ref.location} is not shared with the Dask "
                       f"cluster's workers: {'; '.join(problems)}. {advice}")

