"""LangGraph's state of a run, on the run's journal: :class:`ExecutionSaver`, the checkpointer
a graph runs with in one execution of a run (:func:`.run.checkpointer_for`), and
:func:`state`, a graph's state of a run read back from the journal (in any process).

**Why an in-memory saver mirrored to the journal.** Within an execution, the graph must run
on a saver that starts from its state as of the execution's start and is rebuilt by the
replay: if LangGraph went on from the journal's latest checkpoint, it would skip the node
calls the replay must hand out in order, and given the input again it would take it as a
new turn. So each execution's graph runs on its own in-memory saver, and its checkpoints are
copied to the run's thread on the journal (:class:`~.checkpoint.JournalCheckpointer`,
thread = run id) only once the execution is live: the journal holds exactly one history for
the thread, the one of the last execution that went live.

- While the execution replays journaled steps, nothing is written (the journal already holds
  that history, from the execution that made those steps).
- At its first checkpoint or write once it is live (every journaled step replayed and a step
  made live, or a run that had no step), the run's thread on the journal is replaced by the
  execution's whole history so far; after that, each checkpoint and write is also written to
  the journal as LangGraph makes it. A history rebuilt by replay gets new checkpoint ids: the
  ids on the journal are those of the last execution that went live.
- An execution that only replays (a DONE run executed again, a parked run without its
  decision, a pure replay with ``verify_replay``, the dry replay of ``durable_nb.check``)
  writes nothing, so the journal keeps the history it had.

Each checkpoint notes how many steps the execution had handed out when LangGraph wrote it
(replayed or made), which :func:`~.checkpoint.fork_from_checkpoint` cuts the run at; the
integration runs graphs with ``durability="sync"`` (unless told otherwise) so that a
checkpoint is written before the next superstep makes a step. Only the run's own thread is
kept on the journal; a graph invoked on another ``thread_id`` keeps it in memory.
"""

from __future__ import annotations

import functools
import threading
import weakref
from collections import defaultdict
from typing import Any

from langgraph.checkpoint.memory import InMemorySaver

from ...journal import JournalSpec
from .checkpoint import JournalCheckpointer

__all__ = ["ExecutionSaver", "state"]


class ExecutionSaver(InMemorySaver):
    """The checkpointer of one execution of a run (see the module docstring): LangGraph's
    in-memory saver, rebuilt by the replay, whose history of the run's thread is kept on the
    run's journal from the moment the execution is live. ``execution`` is the run's
    :class:`~durable_nb.execution.Execution`."""

    def __init__(self, execution: Any) -> None:
        super().__init__()
        # Weak: run.checkpointer_for keeps savers by execution in a WeakKeyDictionary, whose
        # entries a strong reference from the value would keep forever.
        self._execution = weakref.proxy(execution)
        self._thread = execution.run_id
        self._positions: dict[str, int] = {}
        self._noted = [0]
        self._mirrored = False
        self._lock = threading.RLock()

    @functools.cached_property
    def _journal(self) -> JournalCheckpointer:
        """The run's thread on the journal, opened when the execution first goes live: a
        replay (pure, or ``durable_nb.check``'s dry one on a read-only journal) never opens
        it."""
        return JournalCheckpointer(self._execution.journal, thread_id=self._thread,
                                   position=lambda: self._noted[0])

    def _position(self) -> int:
        """How many steps the execution has handed out: the next live position once it has
        journaled one, else one past the highest step it replayed."""
        ex = self._execution
        made = ex.writer.next_position
        return made if made > ex.replay_log.size else ex.replay_log.reached

    def _live(self) -> bool:
        ex = self._execution
        return not ex.strict and not ex.replaying and (
            ex.live_steps > 0 or ex.replay_log.size == 0)

    def put(self, config: Any, checkpoint: Any, metadata: Any, new_versions: Any) -> Any:
        with self._lock:
            self._positions[checkpoint["id"]] = self._position()
            saved = super().put(config, checkpoint, metadata, new_versions)
            if self._mirrors(config):
                self._noted[0] = self._positions[checkpoint["id"]]
                self._journal.put(config, checkpoint, metadata, new_versions)
        return saved

    def put_writes(self, config: Any, writes: Any, task_id: str, task_path: str = "") -> None:
        with self._lock:
            super().put_writes(config, writes, task_id, task_path)
            if self._mirrors(config):
                self._journal.put_writes(config, writes, task_id, task_path)

    def _mirrors(self, config: Any) -> bool:
        """Whether what LangGraph just wrote for ``config`` goes to the journal as well (it
        was written to memory first: the first time, the whole history is copied)."""
        if (config.get("configurable") or {}).get("thread_id") != self._thread or \
                not self._live():
            return False
        if not self._mirrored:
            self._replace_journal_thread()
            self._mirrored = True
            return False  # the copy included it
        return True

    def _replace_journal_thread(self) -> None:
        """The run's thread on the journal made the execution's: its history deleted, then
        every checkpoint (oldest first, with its noted position) and write in memory."""
        saver = self._journal
        saver.delete_thread(self._thread)
        for ns, checkpoints in self.storage.get(self._thread, {}).items():
            for checkpoint_id in sorted(checkpoints):
                _, _, parent = checkpoints[checkpoint_id]
                stored = self.get_tuple({"configurable": {
                    "thread_id": self._thread, "checkpoint_ns": ns,
                    "checkpoint_id": checkpoint_id}})
                parent_config = {"configurable": {"thread_id": self._thread,
                                                  "checkpoint_ns": ns}}
                if parent:
                    parent_config["configurable"]["checkpoint_id"] = parent
                self._noted[0] = self._positions.get(checkpoint_id, 0)
                checkpoint = stored.checkpoint
                saver.put(parent_config, checkpoint, stored.metadata,
                          dict(checkpoint.get("channel_versions", {})))
                self._copy_writes(ns, checkpoint_id, stored.config)

    def _copy_writes(self, ns: str, checkpoint_id: str, config: Any) -> None:
        by_task: dict[tuple[str, str], list[tuple[int, str, Any]]] = defaultdict(list)
        for (task_id, index), (_, channel, typed, task_path) in \
                self.writes.get((self._thread, ns, checkpoint_id), {}).items():
            by_task[(task_id, task_path)].append((index, channel, self.serde.loads_typed(typed)))
        for (task_id, task_path), writes in by_task.items():
            # Special channels keep their negative indexes; the others are numbered again
            # in their order, as they were.
            ordered = sorted(writes, key=lambda w: (w[0] < 0, w[0]))
            self._journal.put_writes(config, [(c, v) for _, c, v in ordered], task_id,
                                     task_path)


def state(run_id: str, graph: Any, *, journal: JournalSpec = None,
          checkpoint_id: str | None = None) -> Any:
    """Run ``run_id``'s LangGraph state (``graph.get_state``'s ``StateSnapshot``: values, next
    nodes, interrupts, config), read from the run's journal (default journal if None), the
    latest checkpoint or ``checkpoint_id``. ``graph`` is the compiled graph the run invokes
    (its own checkpointer is not used). For the history, ``update_state`` and time travel, run
    the graph on ``JournalCheckpointer.for_run(run_id)`` (see the guide)."""
    saver = JournalCheckpointer.for_run(run_id, journal)
    config = saver.config
    if checkpoint_id is not None:
        config["configurable"]["checkpoint_id"] = checkpoint_id
    return graph.copy(update={"checkpointer": saver}).get_state(config)
