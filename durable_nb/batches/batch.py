"""Durable batches: one agent over many items, every item a durable run of its own.

``durable_nb.map(handler, items, batch_id="eval-1")`` calls ``handler(ctx, item)`` for each
item as the run ``eval-1/<key>``, many at once on threads, and returns the items' outcomes in
item order. Calling it again (after a crash, a restart, an interrupt) finishes only what is
unfinished: DONE items are answered from their run records without executing anything,
interrupted ones resume from their first unfinished step, FAILED ones are tried again (or kept,
``retry_failed=False``), new items run, and items no longer in the list are left in the journal
and reported. An item that asks for an approval parks; the others go on.

An item's key is stable across restarts and depends on that item only (:func:`item_keys`):
``key=`` (a function of the item), or by default a digest of the item's full value
(``key="index"`` uses its place in the list, which shifts when the list changes). The batch's
own record keeps the keys in item order.
"""

from __future__ import annotations

import hashlib
import json
import re
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Protocol

from .. import serde
from .cluster import batch_executor
from ..errors import DurableError, SerializationError
from ..execution import canonical
from ..approvals.request import find_decision
from ..journal import BatchRecord, Journal, JournalSpec, RunRecord, Status, StepEntry, open_journal
from .limits import BatchLimits
from ..options import RunOptions
from ..execution.live import live_execution
from ..runner import Runner, validate_run_id
from ..telemetry import workflow

__all__ = ["Batch", "BatchObserver", "ItemResult", "batch", "item_keys", "map"]

_KEY_UNSAFE = re.compile(r"[^A-Za-z0-9._@-]+")
_FINISHED = (Status.DONE, Status.FAILED, Status.CANCELLED)


@dataclass
class ItemResult:
    """One item of a batch: its run and how it stands (``status`` None: not started yet)."""

    index: int
    key: str
    run_id: str
    status: Status | None
    result: Any = None
    error: str | None = None
    iterations: int = 0
    prompt_tokens: int = 0
    completion_tokens: int = 0
    cost: float = 0.0
    replayed: bool = False  # DONE before this execution of the batch began

    @property
    def tokens(self) -> int:
        return self.prompt_tokens + self.completion_tokens

    @property
    def state(self) -> str:
        """The status's name, or PENDING for an item that never started."""
        return self.status.value if self.status is not None else "PENDING"

    def to_dict(self) -> dict[str, Any]:
        return {"index": self.index, "key": self.key, "run_id": self.run_id,
                "status": self.state, "result": self.result, "error": self.error,
                "iterations": self.iterations, "prompt_tokens": self.prompt_tokens,
                "completion_tokens": self.completion_tokens, "cost": self.cost}

    @classmethod
    def of(cls, index: int, key: str, run_id: str, record: RunRecord | None, *,
           result: Any = None, replayed: bool = False) -> "ItemResult":
        if record is None:
            return cls(index, key, run_id, None)
        if result is None and record.status is Status.DONE:
            result = serde.decode(record.result)
        return cls(index, key, run_id, record.status, result, record.error,
                   record.iteration, record.prompt_tokens, record.completion_tokens,
                   record.cost, replayed)


@dataclass
class Batch:
    """A batch's items in item order, as :func:`map` left them or :func:`batch` reads them."""

    batch_id: str
    items: list[ItemResult]
    removed: list[str] = field(default_factory=list)
    title: str = ""

    def __iter__(self) -> Iterator[ItemResult]:
        return iter(self.items)

    def __len__(self) -> int:
        return len(self.items)

    def __getitem__(self, index: int) -> ItemResult:
        return self.items[index]

    @property
    def counts(self) -> dict[str, int]:
        """How many items are in each status (PENDING: not started yet)."""
        return dict(Counter(item.state for item in self.items))

    @property
    def tokens(self) -> int:
        return sum(item.tokens for item in self.items)

    @property
    def cost(self) -> float:
        return sum(item.cost for item in self.items)

    @property
    def done(self) -> bool:
        """Whether every item finished (DONE, FAILED or CANCELLED)."""
        return all(item.status in _FINISHED for item in self.items)

    def results(self) -> list[Any]:
        """Each item's result in item order (None where it is not DONE)."""
        return [item.result if item.status is Status.DONE else None for item in self.items]

    def records(self) -> list[dict[str, Any]]:
        """The items as JSON-ready dicts."""
        return [item.to_dict() for item in self.items]

    def to_pandas(self) -> Any:
        """The items as a pandas DataFrame (``pip install pandas``)."""
        try:
            import pandas
        except ImportError:
            raise ImportError("Batch.to_pandas needs pandas: pip install pandas "
                              "(or use Batch.records() for plain dicts)") from None
        return pandas.DataFrame.from_records(self.records(), index="index")

    def to_jsonl(self, path: str | Path) -> Path:
        """Write one JSON line per item (results as journaled JSON data)."""
        path = Path(path)
        with open(path, "w", encoding="utf-8") as f:
            for item in self.items:
                f.write(json.dumps({**item.to_dict(), "result": serde.encode(item.result)},
                                   ensure_ascii=False) + "\n")
        return path

    def __repr__(self) -> str:
        counts = ", ".join(f"{n} {s}" for s, n in sorted(self.counts.items()))
        return f"<Batch {self.batch_id!r}: {len(self.items)} items ({counts})>"


class BatchObserver:
    """What a batch view is told; all calls come from the items' threads."""

    def on_item(self, item: ItemResult) -> None:
        """An item changed status (started, parked, finished)."""

    def on_item_step(self, index: int, entry: StepEntry, replayed: bool) -> None:
        """A step of an item's run was executed or replayed."""

    def on_start(self, items: list[ItemResult], todo: list[int]) -> None:
        """The batch was planned: every item as the journal holds it before this execution
        (DONE ones are answered from their records, ``replayed``), and the indexes of those
        that will execute. Called once per call of :func:`map`, before any item runs."""


class _ItemObserver:
    """Forwards one item's run events to the batch observer (as an Observer of the run)."""

    def __init__(self, index: int, batch: BatchObserver) -> None:
        self.index = index
        self.batch = batch

    def on_step(self, entry: StepEntry, replayed: bool) -> None:
        self.batch.on_item_step(self.index, entry, replayed)

    def on_record(self, record: RunRecord) -> None:
        pass


def item_keys(items: list[Any], key: Callable[[Any], Any] | str | None = None) -> list[str]:
    """Stable keys for ``items``, each from its own item only, so that inserting, removing or
    reordering items never gives an item another's key (and result).

    By default a digest of the item's full value (JSON data, dataclasses, pydantic models,
    Decimal, dates and every type :func:`~durable_nb.execution.canonical` compares; an item
    of another type is refused, asking for ``key=``). ``key(item)`` gives the key itself,
    cleaned to at most 80 letters, digits and ``._@-``; keys that differ but clean to the same
    text get a digest of what ``key`` gave (``~1a2b3c4d5e6f``) so that they stay apart. An
    exact repeat (equal items, or ``key`` giving the same value twice) gets ``~n``, n-th in
    list order. ``key="index"`` uses the place in the list, which shifts when the list does.
    """
    if not (key is None or key == "index" or callable(key)):
        raise TypeError(f"key must be a function of the item, 'index' or None, not {key!r}")
    raws = [_raw_key(index, item, key) for index, item in enumerate(items)]
    cleaned = [_KEY_UNSAFE.sub("-", raw).strip("-")[:80] or "item" for raw in raws]
    sources: dict[str, set[str]] = {}
    for raw, safe in zip(raws, cleaned):
        sources.setdefault(safe, set()).add(raw)
    keys = []
    seen: Counter[str] = Counter()
    for raw, safe in zip(raws, cleaned):
        if len(sources[safe]) > 1 and raw != safe:  # the cleaning made other keys equal
            safe = f"{safe}~{_digest(raw)}"
        seen[safe] += 1
        keys.append(safe if seen[safe] == 1 else f"{safe}~{seen[safe]}")
    return keys


def _raw_key(index: int, item: Any, key: Callable[[Any], Any] | str | None) -> str:
    if key == "index":
        return str(index)
    if callable(key):
        return str(key(item))
    try:
        data = canonical(item)
    except SerializationError:
        raise SerializationError(
            f"item {index} of the batch is a {type(item).__module__}.{type(item).__qualname__}, "
            f"whose value cannot be digested for its default key. Pass key= (a function "
            f"giving each item a stable, unique id, e.g. key=lambda item: item.id; in a "
            f"batch cell, --key item.id), or make the items data (JSON, dataclasses, "
            f"pydantic models).") from None
    return _digest(json.dumps(data, sort_keys=True, ensure_ascii=False), 6)


def _digest(text: str, size: int = 6) -> str:
    return hashlib.blake2b(text.encode("utf-8", "surrogatepass"), digest_size=size).hexdigest()


class ItemExecutor(Protocol):
    """Runs a batch's items elsewhere than on this process's threads
    (:class:`durable_nb.batches.cluster.DaskExecutor`: a Dask cluster's workers)."""

    def execute(self, execution: "BatchExecution", todo: list[int]) -> None:
        """Run the items ``todo`` and set their ``execution.results``."""


class BatchExecution:
    """One call of :func:`map`: decides what each item needs, runs the rest on a pool (or
    hands them to an :class:`ItemExecutor`)."""

    def __init__(self, handler: Callable[[Any, Any], Any], items: list[Any], keys: list[str],
                 record: BatchRecord, journal: Journal, options: RunOptions, concurrency: int,
                 retry_failed: bool, limits: BatchLimits, observer: BatchObserver,
                 executor: ItemExecutor | None = None) -> None:
        self.handler = handler
        self.items = items
        self.keys = keys
        self.record = record
        self.journal = journal
        self.options = options
        self.concurrency = concurrency
        self.retry_failed = retry_failed
        self.limits = limits
        self.observer = observer
        self.executor = executor
        self.results: list[ItemResult] = []
        self.interrupted = threading.Event()

    def run_id(self, index: int) -> str:
        return f"{self.record.batch_id}/{self.keys[index]}"

    def result_of(self, index: int, record: RunRecord | None) -> ItemResult:
        """Item ``index`` as its run ``record`` (None: not started) has it."""
        return ItemResult.of(index, self.keys[index], self.run_id(index), record)

    def plan(self) -> list[int]:
        """Set ``results`` from the journal; return the indexes of the items to execute."""
        todo = []
        existing = {r.run_id: r for r in self.journal.list_runs(f"{self.record.batch_id}/")}
        for index, key in enumerate(self.keys):
            record = existing.get(self.run_id(index))
            self.results.append(ItemResult.of(index, key, self.run_id(index), record,
                                              replayed=record is not None
                                              and record.status is Status.DONE))
            if record is None or record.status in (Status.RUNNING, Status.CANCELLED) \
                    or (record.status is Status.FAILED
                        and (self.retry_failed or _interrupted(record))) \
                    or (record.status is Status.WAITING_APPROVAL and self._decided(record)):
                todo.append(index)
        return todo

    def decided(self) -> list[int]:
        """The indexes of parked items whose approval has been decided (or timed out)."""
        return [r.index for r in self.results if r.status is Status.WAITING_APPROVAL
                and self._decided(self.journal.get_run(r.run_id))]

    def batch(self) -> Batch:
        """The items as this execution leaves them (the list is this execution's own: items
        resumed later show in it)."""
        return Batch(self.record.batch_id, self.results, self.record.removed, self.record.title)

    def _decided(self, record: RunRecord) -> bool:
        pending = record.pending_approval or {}
        timeout_at = pending.get("timeout_at")
        if timeout_at is not None and time.time() >= timeout_at:
            return True
        return find_decision(self.journal, pending.get("run_id", record.run_id),
                             pending) is not None

    def execute(self, todo: list[int]) -> None:
        """Run the items in ``todo`` on the pool; an interrupt stops them at their next step
        (each left resumable) and is raised again."""
        if not todo:
            return
        with workflow(self.record.title or self.record.batch_id, self.record.batch_id) as carry:
            if self.executor is not None:
                self.executor.execute(self, todo)
                return
            self._execute_here(todo, carry(self.run_item))

    def _execute_here(self, todo: list[int], run_item: Callable[[int], ItemResult]) -> None:
        with ThreadPoolExecutor(max_workers=max(1, min(self.concurrency, len(todo))),
                                thread_name_prefix=f"durable-nb-{self.record.batch_id}") as pool:
            futures: dict[Future, int] = {pool.submit(run_item, i): i for i in todo}
            try:
                pending = set(futures)
                while pending:
                    _, pending = wait(pending, timeout=0.2, return_when=FIRST_COMPLETED)
            except KeyboardInterrupt:
                self.interrupt()
                for future in futures:
                    future.cancel()
                raise

    def interrupt(self) -> None:
        """Stop the items in flight at their next step (FAILED "interrupted", resumable)."""
        self.interrupted.set()
        for index in range(len(self.keys)):
            live = live_execution(self.run_id(index))
            if live is not None:
                live.interrupted = True
                live.cancel_event.set()
                live.wake_event.set()

    def run_item(self, index: int) -> ItemResult:
        if self.interrupted.is_set():
            return self.results[index]
        item = self.items[index]
        runner = Runner(self.run_id(index), lambda ctx: self.handler(ctx, item),
                        journal=self.journal, options=self.options,
                        observer=_ItemObserver(index, self.observer))
        self.observer.on_item(replace(self.results[index], status=Status.RUNNING))
        run_id = self.run_id(index)
        try:
            outcome = runner.run()
            result = ItemResult.of(index, self.keys[index], run_id, outcome.record,
                                   result=outcome.result)
        except BaseException as exc:  # noqa: BLE001 - an item's failure is its outcome
            record = self.journal.find_run(run_id)
            result = ItemResult.of(index, self.keys[index], run_id, record)
            if record is None or record.status is Status.DONE:  # it never ran, or a replay failed
                result.status, result.error = Status.FAILED, f"{type(exc).__name__}: {exc}"
            if not isinstance(exc, Exception):
                self.results[index] = result
                raise
        finally:
            self.limits.release_run(self.run_id(index))
        self.results[index] = result
        self.observer.on_item(result)
        return result


def _interrupted(record: RunRecord) -> bool:
    """FAILED by an interrupt (the stop button, ``interrupt()``): resumed whatever
    ``retry_failed`` says, since nothing failed."""
    return (record.error or "").startswith("interrupted at step")


def _batch_record(journal: Journal, batch_id: str, keys: list[str], title: str | None
                  ) -> BatchRecord:
    now = time.time()
    record = journal.find_batch(batch_id) or BatchRecord(batch_id=batch_id, created_at=now)
    current = set(keys)
    record.removed = sorted((set(record.keys) | set(record.removed)) - current)
    record.keys = keys
    if title:
        record.title = title
    journal.put_batch(record)
    return record


def map(handler: Callable[[Any, Any], Any], items: Iterable[Any], *, batch_id: str,
        concurrency: int = 8, key: Callable[[Any], Any] | str | None = None,
        retry_failed: bool = True, wait: bool = True, title: str | None = None,
        journal: JournalSpec = None, observer: BatchObserver | None = None,
        requests_per_minute: float | None = None, tokens_per_minute: float | None = None,
        max_total_tokens: int | None = None, max_total_cost: float | None = None,
        executor: Any = None, **options: Any) -> Batch:
    """Run ``handler(ctx, item)`` for each item as the durable run ``BATCH_ID/KEY`` and return
    the batch, its items in item order.

    ``concurrency`` items run at once (threads; an async handler gets an event loop in its
    thread). Calling ``map`` again with the same ``batch_id`` finishes what is unfinished (see
    the module docstring); ``retry_failed=False`` keeps FAILED items as they are. An item
    that needs an approval parks (WAITING_APPROVAL) and frees its place; with ``wait`` (the
    default) ``map`` then waits for the decisions (``durable-nb approve``, another notebook)
    and resumes those items, else it returns with them parked.

    Shared by all items: ``requests_per_minute`` and ``tokens_per_minute`` for the endpoint
    (a 429's retry-after pauses every item), ``max_total_tokens`` and ``max_total_cost``
    (items stop before an LLM call that would pass them: FAILED, resumable with a higher
    limit). Further keyword options are each item's :class:`RunOptions` (``max_tokens``,
    ``max_cost``, ``timeout``, ``client``, ``model`` ...).

    ``executor``: a ``dask.distributed.Client`` runs the items as tasks on its cluster's
    workers, against the same journal (a ``postgresql://`` URL, or a directory when every
    worker runs on this machine); the shared limits above are refused then, and progress is
    read from the journal. See :mod:`durable_nb.batches.cluster`.
    """
    execution, todo = prepare(
        handler, items, batch_id=batch_id, concurrency=concurrency, key=key,
        retry_failed=retry_failed, title=title, journal=journal, observer=observer,
        requests_per_minute=requests_per_minute, tokens_per_minute=tokens_per_minute,
        max_total_tokens=max_total_tokens, max_total_cost=max_total_cost, executor=executor,
        **options)
    execution.execute(todo)
    while wait and any(r.status is Status.WAITING_APPROVAL for r in execution.results):
        decided = execution.decided()
        if decided:
            execution.execute(decided)
        else:
            time.sleep(execution.options.poll_interval * 2)
    return execution.batch()


def prepare(handler: Callable[[Any, Any], Any], items: Iterable[Any], *, batch_id: str,
            concurrency: int = 8, key: Callable[[Any], Any] | str | None = None,
            retry_failed: bool = True, title: str | None = None, journal: JournalSpec = None,
            observer: BatchObserver | None = None, requests_per_minute: float | None = None,
            tokens_per_minute: float | None = None, max_total_tokens: int | None = None,
            max_total_cost: float | None = None, executor: Any = None,
            **options: Any) -> tuple[BatchExecution, list[int]]:
    """:func:`map` up to running anything: the batch keyed, recorded and planned. Returns
    the execution and the indexes of the items it must execute (``execution.execute(todo)``
    runs them; the notebook's batch cell drives it this way, resuming parked items later)."""
    validate_run_id(batch_id)
    if concurrency < 1:
        raise ValueError(f"concurrency must be at least 1, got {concurrency}")
    items = list(items)
    keys = item_keys(items, key)
    for k in keys:
        validate_run_id(f"{batch_id}/{k}")
    opened = open_journal(journal, durability=options.get("durability"))
    if executor is not None:
        executor = batch_executor(executor, opened, requests_per_minute=requests_per_minute,
                                  tokens_per_minute=tokens_per_minute,
                                  max_total_tokens=max_total_tokens,
                                  max_total_cost=max_total_cost)
    limits = BatchLimits(requests_per_minute=requests_per_minute,
                         tokens_per_minute=tokens_per_minute, max_total_tokens=max_total_tokens,
                         max_total_cost=max_total_cost)
    run_options = RunOptions(**{"on_approval": "park", **options}, call_gate=limits)
    record = _batch_record(opened, batch_id, keys, title)
    execution = BatchExecution(handler, items, keys, record, opened, run_options, concurrency,
                                retry_failed, limits, observer or BatchObserver(), executor)
    todo = execution.plan()
    limits.start(sum(r.tokens for r in execution.results), sum(r.cost for r in execution.results))
    execution.observer.on_start(list(execution.results), todo)
    return execution, todo


def batch(batch_id: str, *, journal: JournalSpec = None) -> Batch:
    """The batch ``batch_id`` as the journal holds it: its items in item order with their
    runs' status, results, errors, tokens and cost."""
    opened = open_journal(journal)
    record = opened.find_batch(batch_id)
    if record is None:
        raise DurableError(f"no batch {batch_id!r} in the journal at {opened.location}. List "
                           f"the batches with `durable-nb batches`.")
    runs = {r.run_id: r for r in opened.list_runs_counted(prefix=f"{batch_id}/")}
    items = [ItemResult.of(index, key, f"{batch_id}/{key}", runs.get(f"{batch_id}/{key}"))
             for index, key in enumerate(record.keys)]
    return Batch(batch_id, items, record.removed, record.title)
