"""LangGraph's own state on a durable_nb journal: :class:`JournalCheckpointer`, a LangGraph
checkpointer (``BaseCheckpointSaver``) on the diskcache or PostgreSQL journal.

::

    from durable_nb.integrations.langgraph.checkpoint import JournalCheckpointer

    saver = JournalCheckpointer.for_run("report-1")          # the run's journal, thread "report-1"
    graph = builder.compile(checkpointer=saver)
    graph.invoke({"topic": "Q3"}, saver.config)
    graph.get_state(saver.config)                             # and get_state_history, update_state

``graph.get_state``, ``get_state_history``, ``update_state`` and time travel (``invoke`` from an
earlier ``checkpoint_id``) work as with LangGraph's own savers; so do ``delete_thread``,
``copy_thread``, ``prune`` and ``delete_for_runs``, sync and async (``aget_tuple`` ...). It
passes LangGraph's checkpointer conformance suite (``langgraph-checkpoint-conformance``) on
both journals.

**Where it is kept.** In the journal's keyed values
(:meth:`~durable_nb.journal.base.Journal.put_values`), space ``langgraph``, each thread in the
scope named by its thread id, keys ``c<US>NS<US>ID`` (a checkpoint: its body without channel
values, its metadata as JSON, its parent, and the run's journal position when it was
written), ``w<US>NS<US>ID<US>TASK<US>IDX`` (a pending write) and
``b<US>NS<US>CHANNEL<US>VERSION`` (a channel's value, stored once per version as PostgreSQL's
saver does). A checkpoint and the channel values it changed are written in one transaction.
Values are JSON text like every journal row: LangGraph's serialized bytes in base64,
``[type, base64]``.

**A run's thread is the run's.** A scope named like a run is the run's: the thread whose id
is a run's id (:meth:`JournalCheckpointer.for_run`'s) is deleted with the run, copied and
moved with it (``durable-nb delete``, ``copy``, the fork a re-run keeps), not exported; on a
hub journal it is written only by the run's creator role, another thread only by the role
that wrote its first checkpoint (the service writes every one). During a pure replay of a
finished run (``verify_replay``) the checkpointer writes nothing.

**The journal is data, not code.** The default serializer is LangGraph's
``JsonPlusSerializer`` without pickle (``pickle_fallback=False``) and with its strict msgpack
allowlist: loading a checkpoint builds only LangGraph's safe types (messages, ``Send``,
``Interrupt``, dates ...) and the types the compiled graph's own state schema names (which
LangGraph adds with ``with_allowlist``); a value naming any other class or function is loaded
as its data (a dict or list), and its module is never imported. Serialized types other than
msgpack, bytes and null (``pickle``, LangChain's ``json`` constructors) are refused with
:class:`~durable_nb.errors.CorruptEntry`. A serializer passed as ``serde=`` is the caller's
choice and is used as it is.

**Secrets stay out.** LangGraph copies the scalar entries of ``config["configurable"]`` and
``config["metadata"]`` into every checkpoint's metadata: entries whose name says they hold a
secret (``api_key``, ``OPENAI_API_KEY``, ``auth_token``, ``password`` ...,
:func:`~durable_nb.redact.names_a_secret`) are left out, and the text of the others goes
through :func:`~durable_nb.redact.redact_source` (keys by their formats, URL passwords,
bearer tokens). The graph's state itself is stored as the graph holds it: keep keys in the
environment, not in state.

**Forks.** A checkpointer made with :meth:`JournalCheckpointer.for_run` notes with each
checkpoint how many steps the run's journal held then. :func:`fork_from_checkpoint` turns time
travel into a durable_nb fork: the run as it is is kept as ``RUN@N`` (listed, shown by the
panel and ``durable-nb show`` as a fork, with its LangGraph thread copied to thread ``RUN@N``),
and the run is rewound to the steps it had at that checkpoint, its thread to that checkpoint,
so that executing it again goes on from there.
"""

from __future__ import annotations

import asyncio
import base64
import functools
import itertools
import json
import random
from collections.abc import AsyncIterator, Callable, Iterable, Iterator, Sequence
from typing import Any

from langchain_core.runnables import RunnableConfig
from langgraph.checkpoint.base import (
    WRITES_IDX_MAP,
    BaseCheckpointSaver,
    ChannelVersions,
    Checkpoint,
    CheckpointMetadata,
    CheckpointTuple,
    get_serializable_checkpoint_metadata,
    writes_sort_key,
)
from langgraph.checkpoint.serde.base import SerializerProtocol
from langgraph.checkpoint.serde.jsonplus import JsonPlusSerializer

from ...errors import CorruptEntry, JournalError, RunLeased
from ...execution.lease import Lease
from ...execution.scope import current_scope
from ...journal import Journal, JournalSpec, open_journal, rerun
from ...redact import names_a_secret, redact_source

__all__ = ["SPACE", "JournalCheckpointer", "checkpoint_position", "fork_from_checkpoint",
           "strict_serializer"]

#: The journal's keyed values space LangGraph's checkpoints are kept in.
SPACE = "langgraph"
_SEP = "\x1f"
#: The serialized types a strict checkpointer loads (what JsonPlusSerializer writes).
_DATA_TYPES = frozenset({"msgpack", "null", "bytes", "bytearray"})


def strict_serializer() -> JsonPlusSerializer:
    """LangGraph's serializer as :class:`JournalCheckpointer` uses it by default: no pickle,
    msgpack restricted to LangGraph's safe types (plus those a graph adds with
    ``with_allowlist``), no LangChain ``json`` constructors."""
    return JsonPlusSerializer(pickle_fallback=False, allowed_json_modules=None,
                              allowed_msgpack_modules=None)


def _part(name: str, value: Any) -> str:
    text = str(value)
    if _SEP in text or "\x00" in text:
        raise ValueError(f"a checkpoint's {name} must not contain \\x1f or NUL: {text!r}")
    return text


def _key(*parts: str) -> str:
    return _SEP.join(parts)


def _encode(typed: tuple[str, bytes]) -> list[str]:
    return [typed[0], base64.b64encode(typed[1]).decode("ascii")]


def _clean_metadata(metadata: dict[str, Any]) -> dict[str, Any]:
    """The metadata without entries named as secrets, its texts redacted (see the module
    docstring): what LangGraph copied from ``config`` may hold keys."""
    def clean(value: Any) -> Any:
        if isinstance(value, str):
            return redact_source(value)
        if isinstance(value, dict):
            return {k: clean(v) for k, v in value.items()
                    if not (isinstance(k, str) and names_a_secret(k))}
        if isinstance(value, (list, tuple)):
            return [clean(v) for v in value]
        return value
    return clean(metadata)


class JournalCheckpointer(BaseCheckpointSaver[str]):
    """A LangGraph checkpointer keeping checkpoints, pending writes and channel values in a
    durable_nb journal (see the module docstring for where, and what it guarantees).

    ``journal``: a :class:`~durable_nb.journal.Journal`, or what
    :func:`~durable_nb.journal.open_journal` takes (a directory, a ``postgresql://`` URL, None
    for the default). ``serde``: LangGraph's
    serializer (default :func:`strict_serializer`). ``thread_id``: the thread of a config
    that names none (and of :attr:`config`). ``position``: called when a checkpoint is
    written, the journal position noted with it (:meth:`for_run` sets it).

    Every method is one journal call or a few (a ``get_tuple``: three queries), safe from
    several threads and processes; the async ones run the same calls in a worker thread.
    """

    def __init__(self, journal: JournalSpec = None, *, serde: SerializerProtocol | None = None,
                 thread_id: str | None = None,
                 position: Callable[[], int] | None = None) -> None:
        super().__init__(serde=serde or strict_serializer())
        self.journal: Journal = open_journal(journal)
        self.thread_id = thread_id
        self._position = position
        self._strict = serde is None
        self._values = _ThreadValues(self.journal)

    @classmethod
    def for_run(cls, run_id: str, journal: JournalSpec = None, *,
                serde: SerializerProtocol | None = None,
                thread_id: str | None = None) -> JournalCheckpointer:
        """A checkpointer on run ``run_id``'s journal, its thread the run id (or
        ``thread_id``), noting with each checkpoint how many steps the run's journal holds
        (what :func:`fork_from_checkpoint` cuts the run at). The thread named by the run id
        is the run's: deleted, copied and moved with it. Pass :attr:`config` to the
        graph's ``invoke``; for a fork to cut exactly between supersteps, run the graph with
        ``durability="sync"`` (with LangGraph's default, ``"async"``, the next superstep may
        have begun when a checkpoint is written)."""
        opened = open_journal(journal)
        hint = [0]

        def steps_now() -> int:
            hint[0] = opened.count_steps(run_id, hint[0])
            return hint[0]
        return cls(opened, serde=serde, thread_id=thread_id or run_id, position=steps_now)

    @property
    def config(self) -> RunnableConfig:
        """``{"configurable": {"thread_id": ...}}`` for the graph's ``invoke``/``get_state``."""
        if self.thread_id is None:
            raise ValueError("this checkpointer has no thread of its own: pass "
                             "{'configurable': {'thread_id': ...}} to the graph")
        return {"configurable": {"thread_id": self.thread_id}}

    # -- keys and values ----------------------------------------------------------------

    def _thread(self, config: RunnableConfig) -> str:
        thread = (config.get("configurable") or {}).get("thread_id", self.thread_id)
        if thread is None:
            raise ValueError("a checkpoint's config names no thread: pass {'configurable': "
                             "{'thread_id': ...}} (or make the checkpointer with thread_id=)")
        return _part("thread_id", thread)

    @staticmethod
    def _ns(config: RunnableConfig) -> str:
        return _part("checkpoint_ns", (config.get("configurable") or {}).get("checkpoint_ns") or "")

    def _dumps(self, value: Any) -> list[str]:
        return _encode(self.serde.dumps_typed(value))

    def _loads(self, key: str, stored: Any) -> Any:
        """A stored ``[type, base64]`` loaded with the serializer; a type a strict
        checkpointer does not load (pickle, json constructors) is a CorruptEntry."""
        try:
            kind, text = stored
            data = base64.b64decode(text, validate=True)
        except (TypeError, ValueError) as exc:
            raise CorruptEntry(key, f"not a serialized value ({exc})") from None
        if self._strict and kind not in _DATA_TYPES:
            raise CorruptEntry(key, f"a value serialized as {kind!r}, which a checkpointer "
                                    f"on a journal never loads (it could run code): only "
                                    f"msgpack, bytes and null")
        return self.serde.loads_typed((kind, data))

    def _read(self, key: str, text: str) -> Any:
        try:
            return json.loads(text)
        except (ValueError, RecursionError) as exc:
            raise CorruptEntry(key, f"not JSON ({exc})") from None

    # -- reading --------------------------------------------------------------------------

    def _tuple(self, thread: str, ns: str, checkpoint_id: str, key: str,
               text: str) -> CheckpointTuple:
        """The checkpoint stored under ``key`` with its channel values and pending writes."""
        record = self._read(key, text)
        checkpoint = self._loads(key, record["checkpoint"])
        versions = checkpoint.get("channel_versions", {})
        blob_keys = {_key(thread, "b", ns, _part("channel", ch), _part("version", v)): ch
                     for ch, v in versions.items()}
        values = {}
        for blob_key, blob_text in self._values.get(blob_keys).items():
            stored = self._read(blob_key, blob_text)
            if stored[0] != "empty":
                values[blob_keys[blob_key]] = self._loads(blob_key, stored)
        writes = []
        for write_key, write_text in self._values.scan(
                _key(thread, "w", ns, checkpoint_id, "")):
            stored = self._read(write_key, write_text)
            task_id, idx = write_key.rsplit(_SEP, 2)[-2:]
            writes.append((writes_sort_key(stored.get("task_path", ""), task_id, int(idx)),
                           (task_id, stored["channel"], self._loads(write_key, stored["value"]))))
        writes.sort(key=lambda w: w[0])
        parent = record.get("parent")
        return CheckpointTuple(
            config=_config(thread, ns, checkpoint_id),
            checkpoint={**checkpoint, "channel_values": values},
            metadata=record.get("metadata") or {},
            parent_config=_config(thread, ns, parent) if parent else None,
            pending_writes=[w for _, w in writes])

    def get_tuple(self, config: RunnableConfig) -> CheckpointTuple | None:
        """The checkpoint ``config`` names (``checkpoint_id``), or its thread and namespace's
        latest; None if there is none."""
        thread, ns = self._thread(config), self._ns(config)
        checkpoint_id = (config.get("configurable") or {}).get("checkpoint_id")
        if checkpoint_id:
            key = _key(thread, "c", ns, _part("checkpoint_id", checkpoint_id))
            found = self._values.get([key]).items()
        else:
            found = self._values.scan(_key(thread, "c", ns, ""), reverse=True,
                                             limit=1)
        for key, text in found:
            return self._tuple(thread, ns, key.rsplit(_SEP, 1)[1], key, text)
        return None

    def list(self, config: RunnableConfig | None, *, filter: dict[str, Any] | None = None,
             before: RunnableConfig | None = None,
             limit: int | None = None) -> Iterator[CheckpointTuple]:
        """The checkpoints of ``config``'s thread (and namespace, if it names one; every
        thread for None), newest first, those whose metadata has every entry of ``filter``,
        older than ``before``'s, at most ``limit``."""
        configurable = (config or {}).get("configurable") or {}
        before_id = ((before or {}).get("configurable") or {}).get("checkpoint_id")
        wanted_id = configurable.get("checkpoint_id")
        if config is None:
            candidates = [(key, text) for key, text in self._values.scan("")
                          if key.split(_SEP, 2)[1] == "c"]
        elif configurable.get("checkpoint_ns") is not None:
            thread, ns = self._thread(config), self._ns(config)
            prefix = _key(thread, "c", ns, "")
            exact = not filter and not wanted_id
            candidates = self._values.scan(
                prefix, below=prefix + before_id if before_id else None, reverse=True,
                limit=limit if exact else None)
        else:
            candidates = self._values.scan(_key(self._thread(config), "c", ""))
        rows = sorted(((key.split(_SEP), key, text) for key, text in candidates),
                      key=lambda row: row[0][3], reverse=True)
        count = 0
        for (thread, _, ns, checkpoint_id), key, text in rows:
            if limit is not None and count >= limit:
                return
            if (wanted_id and checkpoint_id != wanted_id) or \
                    (before_id and checkpoint_id >= before_id):
                continue
            if filter:
                metadata = self._read(key, text).get("metadata") or {}
                if any(metadata.get(k) != v for k, v in filter.items()):
                    continue
            count += 1
            yield self._tuple(thread, ns, checkpoint_id, key, text)

    # -- writing --------------------------------------------------------------------------

    def put(self, config: RunnableConfig, checkpoint: Checkpoint, metadata: CheckpointMetadata,
            new_versions: ChannelVersions) -> RunnableConfig:
        """Store the checkpoint and the channel values of ``new_versions``, in one
        transaction; the config naming it."""
        thread, ns = self._thread(config), self._ns(config)
        checkpoint_id = _part("checkpoint_id", checkpoint["id"])
        body = {k: v for k, v in checkpoint.items() if k != "channel_values"}
        values = checkpoint.get("channel_values", {})
        rows = {}
        for channel, version in new_versions.items():
            stored = self._dumps(values[channel]) if channel in values else ["empty", ""]
            rows[_key(thread, "b", ns, _part("channel", channel), _part("version", version))] = \
                json.dumps(stored)
        record = {
            "checkpoint": self._dumps(body),
            "metadata": _clean_metadata(get_serializable_checkpoint_metadata(config, metadata)),
            "parent": (config.get("configurable") or {}).get("checkpoint_id"),
            "position": self._position() if self._position is not None else None,
        }
        rows[_key(thread, "c", ns, checkpoint_id)] = json.dumps(record, default=repr)
        if _in_pure_replay():
            return _config(thread, ns, checkpoint_id)
        self._values.put(rows)
        return _config(thread, ns, checkpoint_id)

    def put_writes(self, config: RunnableConfig, writes: Sequence[tuple[str, Any]],
                   task_id: str, task_path: str = "") -> None:
        """Store a task's writes for the checkpoint ``config`` names: a write made again
        (the task retried) keeps the first; errors, interrupts and resumes replace theirs."""
        if _in_pure_replay():
            return
        thread, ns = self._thread(config), self._ns(config)
        checkpoint_id = _part("checkpoint_id", config["configurable"]["checkpoint_id"])
        task = _part("task_id", task_id)
        kept: dict[str, str] = {}
        replaced: dict[str, str] = {}
        for idx, (channel, value) in enumerate(writes):
            index = WRITES_IDX_MAP.get(channel, idx)
            text = json.dumps({"channel": channel, "value": self._dumps(value),
                               "task_path": task_path})
            (replaced if index < 0 else kept)[_key(thread, "w", ns, checkpoint_id, task,
                                                   str(index))] = text
        if kept:
            self._values.put(kept, replace=False)
        if replaced:
            self._values.put(replaced)

    def delete_thread(self, thread_id: str) -> None:
        """Delete the thread's checkpoints, writes and channel values, in one transaction."""
        self._values.delete(prefix=_key(_part("thread_id", thread_id), ""))

    def copy_thread(self, source_thread_id: str, target_thread_id: str) -> None:
        """Copy every checkpoint, write and channel value of a thread to another (whose own
        keys of the same names are replaced), in one transaction."""
        source = _key(_part("thread_id", source_thread_id), "")
        target = _key(_part("thread_id", target_thread_id), "")
        rows = {target + key[len(source):]: text
                for key, text in self._values.scan(source)}
        if rows:
            self._values.put(rows)

    def prune(self, thread_ids: Sequence[str], *, strategy: str = "keep_latest") -> None:
        """``"keep_latest"``: keep each namespace's latest checkpoint of the threads, with its
        writes and the channel values it names; ``"delete"``: delete the threads."""
        if strategy not in ("keep_latest", "delete"):
            raise ValueError(f"unknown prune strategy {strategy!r}: 'keep_latest' or 'delete'")
        for thread_id in thread_ids:
            if strategy == "delete":
                self.delete_thread(thread_id)
                continue
            thread = _part("thread_id", thread_id)
            rows = self._values.scan(_key(thread, ""))
            latest: dict[str, str] = {}
            for key, _ in rows:
                _, kind, ns, checkpoint_id = key.split(_SEP)[:4]
                if kind == "c" and checkpoint_id > latest.get(ns, ""):
                    latest[ns] = checkpoint_id
            keep_blobs = set()
            for key, text in rows:
                parts = key.split(_SEP)
                if parts[1] == "c" and latest.get(parts[2]) == parts[3]:
                    body = self._loads(key, self._read(key, text)["checkpoint"])
                    keep_blobs.update(_key(thread, "b", parts[2], ch, str(v))
                                      for ch, v in body.get("channel_versions", {}).items())
            doomed = [key for key, _ in rows if _pruned(key.split(_SEP), latest, keep_blobs, key)]
            self._values.delete(keys=doomed)

    def delete_for_runs(self, run_ids: Sequence[str]) -> None:
        """Delete the checkpoints (and their writes) whose metadata names one of the
        LangGraph runs ``run_ids``."""
        wanted = set(run_ids)
        if not wanted:
            return
        doomed = []
        for key, text in self._values.scan(""):
            parts = key.split(_SEP)
            if parts[1] == "c" and (self._read(key, text).get("metadata") or {}).get(
                    "run_id") in wanted:
                doomed.append(key)
                doomed += [k for k, _ in self._values.scan(
                    _key(parts[0], "w", parts[2], parts[3], ""))]
        self._values.delete(keys=doomed)

    def get_next_version(self, current: str | None, channel: None) -> str:
        """Versions as LangGraph's in-memory and PostgreSQL savers make them: a zero-padded
        counter and a random fraction, so that they sort as text."""
        number = 0 if current is None else current if isinstance(current, int) else \
            int(str(current).split(".")[0])
        return f"{number + 1:032}.{random.random():016}"

    # -- async: the same calls in a worker thread -----------------------------------------

    async def _in_thread(self, method: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        return await asyncio.get_running_loop().run_in_executor(
            None, functools.partial(method, *args, **kwargs))

    async def aget_tuple(self, config: RunnableConfig) -> CheckpointTuple | None:
        return await self._in_thread(self.get_tuple, config)

    async def alist(self, config: RunnableConfig | None, *, filter: dict[str, Any] | None = None,
                    before: RunnableConfig | None = None,
                    limit: int | None = None) -> AsyncIterator[CheckpointTuple]:
        found = await self._in_thread(lambda: list(self.list(config, filter=filter,
                                                             before=before, limit=limit)))
        for item in found:
            yield item

    async def aput(self, config: RunnableConfig, checkpoint: Checkpoint,
                   metadata: CheckpointMetadata, new_versions: ChannelVersions) -> RunnableConfig:
        return await self._in_thread(self.put, config, checkpoint, metadata, new_versions)

    async def aput_writes(self, config: RunnableConfig, writes: Sequence[tuple[str, Any]],
                          task_id: str, task_path: str = "") -> None:
        await self._in_thread(self.put_writes, config, writes, task_id, task_path)

    async def adelete_thread(self, thread_id: str) -> None:
        await self._in_thread(self.delete_thread, thread_id)

    async def acopy_thread(self, source_thread_id: str, target_thread_id: str) -> None:
        await self._in_thread(self.copy_thread, source_thread_id, target_thread_id)

    async def aprune(self, thread_ids: Sequence[str], *, strategy: str = "keep_latest") -> None:
        await self._in_thread(self.prune, thread_ids, strategy=strategy)

    async def adelete_for_runs(self, run_ids: Sequence[str]) -> None:
        await self._in_thread(self.delete_for_runs, run_ids)


class _ThreadValues:
    """The journal's keyed values (space :data:`SPACE`) as the checkpointer addresses them,
    by keys ``THREAD<US>REST``: a thread's values are kept in the journal's scope named by
    the thread id, under the keys ``REST``, so that a run's thread (thread id = run id) is the
    run's: deleted, copied and renamed with the run, and on a hub written only by its
    creator's role."""

    def __init__(self, journal: Journal) -> None:
        self.journal = journal

    @staticmethod
    def _by_thread(keys: Iterable[str]) -> dict[str, list[str]]:
        threads: dict[str, list[str]] = {}
        for key in keys:
            thread, rest = key.split(_SEP, 1)
            threads.setdefault(thread, []).append(rest)
        return threads

    def put(self, rows: dict[str, str], *, replace: bool = True) -> None:
        """Store the rows of one thread, in one transaction."""
        for thread, rests in self._by_thread(rows).items():
            head = thread + _SEP
            self.journal.put_values(SPACE, {rest: rows[head + rest] for rest in rests},
                                    scope=thread, replace=replace)

    def get(self, keys: Iterable[str]) -> dict[str, str]:
        found = {}
        for thread, rests in self._by_thread(keys).items():
            found.update((thread + _SEP + rest, text) for rest, text in
                         self.journal.get_values(SPACE, rests, scope=thread).items())
        return found

    def scan(self, prefix: str, *, below: str | None = None, reverse: bool = False,
             limit: int | None = None) -> list[tuple[str, str]]:
        """The rows whose key starts with ``prefix`` (a thread's, or ``""``: every
        thread's, thread by thread), as :meth:`Journal.scan_values`."""
        if not prefix:
            return [row for thread in self.journal.value_scopes(SPACE)
                    for row in self.scan(thread + _SEP)]
        thread, rest = prefix.split(_SEP, 1)
        head = thread + _SEP
        return [(head + key, text) for key, text in self.journal.scan_values(
            SPACE, rest, scope=thread, below=None if below is None else below[len(head):],
            reverse=reverse, limit=limit)]

    def delete(self, *, keys: Iterable[str] = (), prefix: str | None = None) -> None:
        """Delete ``keys`` (of any threads) and the keys of a thread starting with
        ``prefix``, in one transaction per thread."""
        threads = self._by_thread(keys)
        thread, rest = prefix.split(_SEP, 1) if prefix is not None else (None, None)
        if thread is not None:
            threads.setdefault(thread, [])
        for name, rests in threads.items():
            self.journal.delete_values(SPACE, scope=name, keys=rests,
                                       prefix=rest if name == thread else None)


def _in_pure_replay() -> bool:
    """Whether this runs inside a pure replay of a finished run (``verify_replay``): the
    handler executes again only to be compared, and must leave the journal as it was."""
    scope = current_scope()
    return scope is not None and scope.execution.strict


def _config(thread: str, ns: str, checkpoint_id: str) -> RunnableConfig:
    return {"configurable": {"thread_id": thread, "checkpoint_ns": ns,
                             "checkpoint_id": checkpoint_id}}


def _pruned(parts: list[str], latest: dict[str, str], keep_blobs: set[str], key: str) -> bool:
    """Whether ``prune(strategy="keep_latest")`` deletes the key split into ``parts``."""
    kind, ns = parts[1], parts[2]
    if kind in ("c", "w"):
        return latest.get(ns) != parts[3]
    return key not in keep_blobs


# -- forks -----------------------------------------------------------------------------------

def checkpoint_position(journal: JournalSpec, thread_id: str, checkpoint_id: str,
                        checkpoint_ns: str = "") -> int | None:
    """How many steps the run's journal held when the checkpoint was written (by a
    checkpointer made with :meth:`JournalCheckpointer.for_run`); None when it noted none.
    :class:`~durable_nb.errors.JournalError` when there is no such checkpoint."""
    opened = open_journal(journal)
    key = _key(_part("thread_id", thread_id), "c", _part("checkpoint_ns", checkpoint_ns),
               _part("checkpoint_id", checkpoint_id))
    text = _ThreadValues(opened).get([key]).get(key)
    if text is None:
        raise JournalError(f"there is no LangGraph checkpoint {checkpoint_id!r} in thread "
                           f"{thread_id!r} (namespace {checkpoint_ns!r}) of the journal at "
                           f"{opened.location}: list them with graph.get_state_history(config)")
    try:
        position = json.loads(text).get("position")
    except (ValueError, AttributeError, RecursionError) as exc:
        raise CorruptEntry(key, f"not a checkpoint record ({exc})") from None
    return position if isinstance(position, int) else None


def fork_from_checkpoint(run_id: str, checkpoint_id: str, *, journal: JournalSpec = None,
                         thread_id: str | None = None, checkpoint_ns: str = "") -> str:
    """Time travel as a durable_nb fork: keep run ``run_id`` as it is now as the fork
    ``RUN@N`` (the panel, ``durable-nb show`` and exports show it as forked from the run at
    that step, its record's ``forked_from`` naming the checkpoint) with a copy of the run's
    LangGraph thread (``thread_id``, default the run id) as thread ``RUN@N`` (the run's own
    thread goes with the fork as a run's keyed values do), then rewind the run to
    the steps its journal held when checkpoint ``checkpoint_id`` was written, and the thread
    to that checkpoint (its later checkpoints deleted, and the writes of the tasks that ran
    from it), so that executing the run again (``invoke(None, saver.config)``) runs those
    tasks again from that checkpoint. Returns the fork's id.

    Between executions, as :func:`durable_nb.rerun_from`, holding the run's lease: refused
    with :class:`~durable_nb.errors.RunLeased` while the run executes. The checkpoint must
    have been written by :meth:`JournalCheckpointer.for_run` (else
    :class:`~durable_nb.errors.JournalError`: no step to fork the run at). Killed part-way,
    it leaves the run rewound with its thread not yet cut back (or, for a thread that is not
    the run's, the fork without its thread): calling it again makes a new fork and completes
    the cut."""
    opened = open_journal(journal)
    thread = thread_id or run_id
    position = checkpoint_position(opened, thread, checkpoint_id, checkpoint_ns)
    if position is None:
        raise JournalError(
            f"LangGraph checkpoint {checkpoint_id!r} of thread {thread!r} noted no step of "
            f"run {run_id!r}: it was written by a checkpointer not made with "
            f"JournalCheckpointer.for_run({run_id!r}), so there is no step to fork the run at")
    opened.get_run(run_id)
    lease = _fork_lease(opened, run_id)
    try:
        record = opened.get_run(run_id)
        kept = list(itertools.islice(opened.steps(run_id), position))
        # A checkpoint after the run's last step forks too: every step is kept, and the
        # run reopens.
        made = rerun(opened, record, kept, position, token=lease.token,
                     child_dropped=lambda key, at: at >= position)
        if thread != run_id:  # the run's own thread was copied with it
            JournalCheckpointer(opened).copy_thread(thread, made)
        _cut_thread_after(opened, thread, checkpoint_ns, checkpoint_id)
    finally:
        try:
            lease.release()
        except (OSError, JournalError):
            pass  # a dead lease is taken over by the next executor anyway
    fork = opened.get_run(made)
    fork.forked_from = dict(fork.forked_from or {}, langgraph_checkpoint=checkpoint_id,
                            langgraph_thread=thread)
    opened.put_run(fork)
    return made


def _fork_lease(journal: Journal, run_id: str) -> Lease:
    """The run's lease, held while it is forked; RunLeased saying what to do while it runs."""
    try:
        return Lease.acquire(journal, run_id)
    except RunLeased as exc:
        raise RunLeased(run_id, exc.holder, advice=(
            f"cancel it first (`durable-nb cancel {run_id}` or the panel's Cancel button), "
            f"then fork it from the checkpoint once it has stopped.")) from None


def _cut_thread_after(journal: Journal, thread: str, ns: str, checkpoint_id: str) -> None:
    """Delete what the thread's namespace ``ns`` (and those nested in it) holds from after
    checkpoint ``checkpoint_id``: later checkpoints, their writes, and the writes of the
    tasks that ran from that checkpoint (whose steps the rewound run no longer has)."""
    doomed: list[str] = []
    for key, _ in _ThreadValues(journal).scan(_key(thread, "")):
        parts = key.split(_SEP)
        if not parts[2].startswith(ns):
            continue
        if (parts[1] == "c" and parts[3] > checkpoint_id) or \
                (parts[1] == "w" and parts[3] >= checkpoint_id):
            doomed.append(key)
    _ThreadValues(journal).delete(keys=doomed)
