"""Whole-run edits made of the journal interface's own operations: copying a run with its
child runs (a fork, or a move to another backend) and rewinding it (reset, re-run).

**Copies are all or nothing.** A copy's entries and blobs are written under a *staging id*
(``NEW copying HEX``), whose record says FAILED "incomplete copy"; a staging id has spaces,
so it is never a valid run id and never executes.
:meth:`~durable_nb.journal.base.Journal.publish_runs` then turns the staged runs into the
run and its child runs in one transaction. A copy killed part-way leaves no run ``NEW``, only
the staged run listed with what it is and the command that deletes it; copying again starts
over.

Executing a run that does not exist where a copy of it was cut short is refused
(:func:`staged_copies`), since it would execute every step again; copying again completes
it (and deletes what the cut-short copy left).

**Child runs travel with their parent.** A child run is ``PARENT/NAME-KEY`` with
``parent`` set (:func:`~durable_nb.execution.cursor.child_run_id`); a copy under another id
renames the children and the references to them (the child steps' ``meta.run_id``, a
pending approval's ``run_id``), and a rewind deletes the child runs whose child step it
removes, so the step executes its sub-agent again instead of replaying the old answer.

**Rewinds are fenced.** :func:`rewind` writes the kept entries, the record, the dropped
blobs and requests in one transaction that checks the caller's lease token
(:meth:`~durable_nb.journal.base.Journal.rewrite_steps`): an executor that lost its lease
changes nothing.

**Cuts by key.** :func:`cut_at_key` says which entries a changed step invalidates: its own
scope from that step on, what ran inside them, what completed after it in the scopes
enclosing it, and tasks created after it completed, at any depth (each entry journals when
the tasks it was made in were created). The steps of tasks that existed before it completed
stay (they replay), whatever their completion order, unless a task inside them was created
after it.
"""

from __future__ import annotations

import bisect
import dataclasses
import re
import time
import uuid
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

from ..errors import CorruptEntry, JournalError
from .base import Journal
from .blobs import referenced_blobs
from .records import LLM_KINDS, RunRecord, Status, StepEntry, entry_cost

__all__ = ["StagedCopy", "child_runs", "copy_run", "cut_at_key", "dropped_by_change", "recount",
           "rerun", "rewind", "stage_copy", "staged_copies"]


# -- child runs ----------------------------------------------------------------------------

def child_runs(journal: Journal, run_id: str) -> list[RunRecord]:
    """The run's child runs and theirs (ids ``RUN/...`` whose ``parent`` chain leads to the
    run; a batch's items share the id form but not the parent), parents before children."""
    family = {run_id}
    found = []
    for record in sorted(journal.list_runs(run_id + "/"), key=lambda r: r.run_id.count("/")):
        if record.parent in family:
            family.add(record.run_id)
            found.append(record)
    return found


def _renamed(run_id: str, old: str, new: str) -> str:
    """``run_id`` with the run id ``old`` at its head (itself or a child) replaced by ``new``."""
    if run_id == old or run_id.startswith(old + "/"):
        return new + run_id[len(old):]
    return run_id


def _delete_family(journal: Journal, records: Iterable[RunRecord]) -> None:
    """Delete runs, each with its child runs in the same transaction."""
    for record in records:
        if journal.find_run(record.run_id) is not None:
            journal.delete_run(record.run_id, children=[
                child.run_id for child in child_runs(journal, record.run_id)])


# -- copies --------------------------------------------------------------------------------

@dataclass
class StagedCopy:
    """A copy written under staging ids, not yet a run: :meth:`publish` makes it one."""

    target: Journal
    #: (staging id, the record to publish) of the run, then of each child run.
    runs: list[tuple[str, RunRecord]] = field(default_factory=list)

    @property
    def record(self) -> RunRecord:
        return self.runs[0][1]

    def publish(self) -> bool:
        """Make the copy a run with its children, at once; False (nothing changed, the
        staged runs kept) if the target has a run with one of their ids."""
        return self.target.publish_runs(self.runs)

    def discard(self) -> None:
        for staging, _ in self.runs:
            if self.target.find_run(staging) is not None:
                self.target.delete_run(staging)


def _staging_id(new_id: str) -> str:
    """An id no run can have (it has spaces), unique to this copy."""
    return f"{new_id} copying {uuid.uuid4().hex[:12]}"


def staged_copies(journal: Journal, run_id: str, *, children: bool = False
                  ) -> list[RunRecord]:
    """The staged runs of copies of ``run_id`` (and, with ``children``, of its child runs)
    to ``journal`` that were never published: copies cut short, or one being made now. One
    listing of the ids that start with ``RUN copying`` (and ``RUN/``)."""
    staging = re.compile(re.escape(run_id) + r"(/\S+)? copying [0-9a-f]{12}")
    found = journal.list_runs(f"{run_id} copying ")
    if children:
        found += journal.list_runs(f"{run_id}/")
    return [r for r in found if staging.fullmatch(r.run_id)]


def _placeholder(record: RunRecord, staging: str, source: Journal, new_id: str) -> RunRecord:
    """The record a staged run has until it is published: FAILED, saying what it is."""
    now = time.time()
    return RunRecord(
        run_id=staging, title=record.title, status=Status.FAILED, created_at=now,
        updated_at=now,
        error=(f"incomplete copy of run {record.run_id!r} from {source.location} to "
               f"{new_id!r}, cut short: it never executes (its id is no run id), and "
               f"{new_id!r} was not created. Delete it (durable-nb delete '{staging}') and "
               f"copy the run again."))


def _stage_one(source: Journal, record: RunRecord, target: Journal, old_root: str,
               new_root: str, staged: StagedCopy, steps: int | None = None) -> None:
    """Copy one run's entries (its first ``steps``, or all), blobs and keyed values under a
    staging id (its placeholder record first), and add it to ``staged`` with the record to
    publish."""
    run_id = record.run_id
    copy = RunRecord.from_json(record.to_json())
    copy.run_id = _renamed(run_id, old_root, new_root)
    staging = _staging_id(copy.run_id)
    target.create_run(_placeholder(record, staging, source, copy.run_id))
    staged.runs.append((staging, copy))
    copied: set[str] = set()
    count = 0
    for entry in source.steps(run_id):
        if steps is not None and entry.position >= steps:
            break
        blobs = {}
        for digest in referenced_blobs(entry.request, lambda d: source.get_blob(run_id, d),
                                       copied):
            if digest in copied:
                continue
            text = source.get_blob(run_id, digest)
            if text is not None:
                blobs[digest] = text
                copied.add(digest)
        child = (entry.meta or {}).get("run_id")
        if entry.kind == "child" and isinstance(child, str) and old_root != new_root:
            entry.meta = dict(entry.meta or {}, run_id=_renamed(child, old_root, new_root))
        target.append_step(staging, entry, blobs=blobs or None)
        count += 1
    _copy_scope(source, run_id, target, staging)
    if copy.parent is not None:
        copy.parent = _renamed(copy.parent, old_root, new_root)
    pending = copy.pending_approval
    if pending and isinstance(pending.get("run_id"), str):
        copy.pending_approval = dict(pending,
                                     run_id=_renamed(pending["run_id"], old_root, new_root))
    copy.owner = None
    copy.step_count = count


def _copy_scope(source: Journal, run_id: str, target: Journal, staging: str) -> None:
    """Copy the run's keyed values (its LangGraph thread) to the staged run's scope, one
    transaction per space."""
    spaces: dict[str, dict[str, str]] = {}
    for space, key, text in source.scope_values(run_id):
        spaces.setdefault(space, {})[key] = text
    for space, values in spaces.items():
        target.put_values(space, values, scope=staging)


def stage_copy(source: Journal, run_id: str, target: Journal, new_id: str, *,
               changes: dict[str, Any] | None = None, record: RunRecord | None = None,
               steps: int | None = None) -> StagedCopy:
    """Write run ``run_id`` and its child runs to ``target`` under staging ids, as the
    unpublished copy ``new_id`` (its record updated with ``changes``). Leases and pending
    requests are not copied. ``source`` and ``target`` may be journals of different backends.
    The caller holds the run's lease, so that nothing is appended while it is read.

    ``record`` and ``steps``: copy the run as it was earlier (that record, its first
    ``steps`` entries) instead of as the journal holds it now."""
    staged = StagedCopy(target)
    try:
        _stage_one(source, record or source.get_run(run_id), target, run_id, new_id, staged,
                   steps)
        for child in child_runs(source, run_id):
            _stage_one(source, child, target, run_id, new_id, staged)
    except BaseException:
        staged.discard()
        raise
    for name, value in (changes or {}).items():
        setattr(staged.record, name, value)
    return staged


def copy_run(source: Journal, run_id: str, target: Journal, new_id: str, *,
             changes: dict[str, Any] | None = None) -> RunRecord | None:
    """Copy run ``run_id`` with its child runs, entries and blobs to ``target`` as ``new_id``
    (see :func:`stage_copy`), all or nothing; None, and nothing left, if ``new_id`` (or one
    of its child ids) exists there."""
    if target.find_run(new_id) is not None:
        return None
    left = staged_copies(target, new_id, children=True)  # copies cut short: replaced now
    staged = stage_copy(source, run_id, target, new_id, changes=changes)
    if not staged.publish():
        staged.discard()
        return None
    _delete_family(target, left)
    return staged.record


# -- rewinds -------------------------------------------------------------------------------

def recount(record: RunRecord, kept: list[StepEntry]) -> None:
    """Set the record's derived totals from the entries that remain."""
    record.prompt_tokens = sum(e.prompt_tokens for e in kept)
    record.completion_tokens = sum(e.completion_tokens for e in kept)
    record.iteration = sum(1 for e in kept if e.kind in LLM_KINDS)
    record.cost = sum(entry_cost(e) for e in kept)
    record.step_count = len(kept)


def _scope_parts(key: str) -> list[str]:
    return key.split(".")


def _task_spawns(entries: list[StepEntry]) -> dict[tuple[str, ...], int]:
    """When each task (by scope path) existed: the highest position its entries journaled for
    its creation (``StepEntry.spawned``), or, for a task whose entries were journaled before
    that was, where it first completed a step (it existed by then). A task's earliest
    possible creation is not trusted: over executions, the latest one counts."""
    recorded: dict[tuple[str, ...], int] = {}
    first_seen: dict[tuple[str, ...], int] = {}
    for entry in entries:
        path = _scope_parts(entry.key)[:-1]
        spawned = iter(entry.spawned or ())
        for depth, part in enumerate(path):
            if "#" not in part:
                continue
            task = tuple(path[:depth + 1])
            at = next(spawned, None)
            if at is None:
                first_seen.setdefault(task, entry.position)
            elif at > recorded.get(task, -1):
                recorded[task] = at
    return {task: max(recorded.get(task, -1), first_seen.get(task, -1))
            for task in recorded.keys() | first_seen.keys()}


def dropped_by_change(entries: list[StepEntry], changed: StepEntry,
                      live_from: int | None = None) -> Callable[[str, float], bool]:
    """Whether a step (key, position; an unfinished one: ``inf``) is invalidated when step
    ``changed`` (key K in scope S at index n, position p) changed - see :func:`cut_at_key`.

    ``live_from``: the first position the execution that found the change wrote. Its
    entries stay whatever their scope: they were made before K was asked for, so without
    its result (K's scope was waiting at K, and a replayed K never returned its old one)."""
    parts = _scope_parts(changed.key)
    scope, index, p = parts[:-1], int(parts[-1]), changed.position
    spawns = _task_spawns(entries)

    def dropped(key: str, position: float) -> bool:
        path = _scope_parts(key)
        if path[:len(scope)] == scope and len(path) > len(scope):
            head = path[len(scope)]
            if head.isdigit() and int(head) >= index:
                return True  # K, S's later steps and everything under them
        if live_from is not None and live_from <= position < float("inf"):
            return False  # made by this execution, without K's result
        own = path[:-1]
        if scope[:len(own)] == own:
            return position > p  # a step of S or of a scope enclosing it: after K, it waits
        common = 0
        while common < min(len(own), len(scope)) and own[common] == scope[common]:
            common += 1
        # The tasks it runs in, apart from K's: it stays only if every one of them existed
        # before K completed. A task created after K by one that existed before it may have
        # been started because of K's result, at any depth, as at the top.
        tasks = [tuple(own[:depth + 1]) for depth in range(common, len(own))
                 if "#" in own[depth]]
        if tasks:
            return any(spawns.get(task, p + 1) > p for task in tasks)
        return position > p  # inside a step of S or of a scope enclosing it

    return dropped


def cut_at_key(entries: list[StepEntry], changed: StepEntry,
               live_from: int | None = None) -> list[StepEntry]:
    """The entries that stay when step ``changed`` must execute again (``on_change="rerun"``).

    For a changed step with key K, in scope S at index n, completed at position p, this
    drops: K and S's later steps (index >= n) and everything under them; the entries of
    S's scope and of the scopes enclosing it that completed after p (their flow may have
    waited for K's result), and of steps of those scopes; and every entry of a task created
    after p, and of the tasks inside it, wherever the task was created (at the top, or inside
    a task that existed before K): it may have been started because of K. Its creation is
    journaled with its steps, ``StepEntry.spawned``; for entries journaled before that, a
    task's first entry stands for it. The entries of tasks that already existed when K
    completed, and all the tasks around them too, stay, whatever their completion order and
    wherever they were created (beside K's task, inside it, inside another): they replay
    instead of executing again. So do the entries from
    ``live_from`` on (see :func:`dropped_by_change`)."""
    dropped = dropped_by_change(entries, changed, live_from)
    return [e for e in entries if not dropped(e.key, e.position)]


def _blobs_of(journal: Journal, run_id: str, entries: Iterable[StepEntry]) -> set[str]:
    found: set[str] = set()
    for entry in entries:
        found.update(referenced_blobs(entry.request, lambda d: journal.get_blob(run_id, d), found))
    return found


def _readable(journal: Journal, run_id: str) -> Iterator[StepEntry]:
    """The run's entries that can be read, in order (a damaged one is what a reset
    removes: it is passed over)."""
    start = 0
    while True:
        try:
            for entry in journal.steps(run_id, start):
                start = entry.position + 1
                yield entry
            return
        except CorruptEntry:
            start += 1  # the entry at `start` could not be read


def rewind(journal: Journal, record: RunRecord, kept: list[StepEntry], *,
           token: str | None = None,
           child_dropped: Callable[[str, float], bool] | None = None) -> int:
    """Keep only ``kept`` (entries of the run, in position order), renumbered ``0..n-1``,
    and reopen the run (RUNNING, no result, no pending approval or requests), writing its
    record - all in one transaction fenced by ``token``
    (:class:`~durable_nb.errors.RunLeased`, nothing changed, once the lease moved on).
    Blobs only dropped entries used are deleted; the positions of task creations
    (``StepEntry.spawned``) are renumbered with the entries. Then the child runs of dropped
    child steps are deleted, and, if ``child_dropped(key, inf)`` says so, unfinished child
    runs (no entry yet) of a dropped key. Returns how many entries were removed."""
    run_id = record.run_id
    kept_positions = {e.position for e in kept}
    gone = [e for e in _readable(journal, run_id) if e.position not in kept_positions]
    first = 0
    while first < len(kept) and kept[first].position == first:
        first += 1
    old_positions = [e.position for e in kept]

    def renumbered_spawns(entry: StepEntry) -> list[int] | None:
        # A task's creation stays between the same kept entries.
        return [bisect.bisect_left(old_positions, at) for at in entry.spawned] \
            if entry.spawned else entry.spawned

    tail = [dataclasses.replace(e, position=first + i, spawned=renumbered_spawns(e))
            for i, e in enumerate(kept[first:])]
    drop_blobs = sorted(_blobs_of(journal, run_id, gone) - _blobs_of(journal, run_id, kept)) \
        if gone else []
    renumbered = {e.position: i for i, e in enumerate(kept)}
    recount(record, kept)
    record.retried_steps = sorted(renumbered[p] for p in record.retried_steps or ()
                                  if p in renumbered) or None
    record.status = Status.RUNNING
    record.error = record.result = record.failed_step = record.finished_at = None
    record.pending_approval = None
    record.updated_at = time.time()
    deleted = journal.rewrite_steps(run_id, first, tail, record_json=record.to_json(),
                                    token=token, drop_blobs=drop_blobs, drop_requests=True)
    _delete_dropped_children(journal, run_id, gone, kept, child_dropped)
    return deleted - len(tail)


def _delete_dropped_children(journal: Journal, run_id: str, gone: list[StepEntry],
                             kept: list[StepEntry],
                             child_dropped: Callable[[str, float], bool] | None) -> None:
    """Delete the child runs (``RUN/NAME-KEY``) of the steps a rewind removed: a child step
    entry that is gone, or, for a child step that never finished (no entry),
    ``child_dropped(KEY, inf)``. Those of kept steps stay (a kept failed child step resumes
    its child run)."""
    kept_keys = {e.key for e in kept}
    gone_keys = {e.key for e in gone}
    kept_ids = {(e.meta or {}).get("run_id") for e in kept if e.kind == "child"}
    gone_ids = {(e.meta or {}).get("run_id") for e in gone if e.kind == "child"}
    doomed = []
    for child in child_runs(journal, run_id):
        if child.parent != run_id:
            continue  # a grandchild goes with its parent
        key = child.run_id.rsplit("-", 1)[-1]
        if child.run_id in kept_ids or key in kept_keys:
            continue
        if child.run_id in gone_ids or key in gone_keys or (
                child_dropped is not None and child_dropped(key, float("inf"))):
            doomed.append(child)
    _delete_family(journal, doomed)


def _fork_id(journal: Journal, run_id: str) -> str:
    number = 1
    while journal.find_run(f"{run_id}@{number}") is not None:
        number += 1
    return f"{run_id}@{number}"


def _asking_nobody(record: RunRecord, run_id: str, from_position: int) -> None:
    """A fork's record that waited for an approval: CANCELLED, its request kept as what it
    waited for. A fork is a record of the past: nobody is asked to decide it, and every
    place that asks (the approvals inbox and its count, notifications, deadlines, the
    listings of waiting runs) selects runs by their status WAITING_APPROVAL. Executing the
    fork again resumes it, as for any cancelled run: then it asks again."""
    if record.status is not Status.WAITING_APPROVAL:
        return
    name = (record.pending_approval or {}).get("name")
    record.status = Status.CANCELLED
    record.error = (f"kept as a fork when run {run_id!r} was executed again from step "
                    f"{from_position}, while it waited for approval of {name!r}: a fork asks "
                    f"nobody (executing it again resumes it)")


def rerun(journal: Journal, record: RunRecord, kept: list[StepEntry], from_position: int, *,
          token: str,
          child_dropped: Callable[[str, float], bool] | None = None,
          as_taken: RunRecord | None = None, taken_steps: int | None = None) -> str:
    """Keep the run as a new run ``RUN@N`` (with its child runs; marked as a fork taken where
    the run goes on from ``from_position``), then :func:`rewind` it to ``kept`` under
    ``token``. The fork is published only once the rewind is written: an executor fenced
    out leaves no fork (its staged copy is deleted). Returns its id.

    An execution that found a changed step passes the run as it took it: ``as_taken``, the
    record before the execution changed it, and ``taken_steps``, how many entries the
    journal held then; without them (``rerun_from``) the fork is the run as the journal
    holds it now. Either way the fork is that run, with its status (DONE with its result,
    FAILED, CANCELLED, RUNNING when an executor died in it), counts and entries; what an
    execution did since stays in the run only. A fork asks nobody: a run (or child run)
    that waited for an approval is kept CANCELLED with its request
    (:func:`_asking_nobody`)."""
    changes: dict[str, Any] = {"forked_from": {"run_id": record.run_id,
                                               "position": from_position, "at": time.time()}}
    if as_taken is not None and as_taken.failed_step is not None \
            and taken_steps is not None and as_taken.failed_step >= taken_steps:
        changes["failed_step"] = None  # removed, to be tried again, before the fork
    fork_id = _fork_id(journal, record.run_id)
    staged = stage_copy(journal, record.run_id, journal, fork_id, changes=changes,
                        record=as_taken, steps=taken_steps)
    for _, kept_record in staged.runs:
        _asking_nobody(kept_record, record.run_id, from_position)
    try:
        rewind(journal, record, kept, token=token, child_dropped=child_dropped)
    except BaseException:
        staged.discard()
        raise
    if not staged.publish():
        # Forks of a run are made under its lease: only a run copied in as RUN@N meanwhile
        # takes the id.
        raise JournalError(
            f"run {record.run_id!r} was rewound, but its fork could not be published: run "
            f"{fork_id!r} was created meanwhile by another process. The run as it was is kept "
            f"as the staged run {staged.runs[0][0]!r}.")
    return fork_id
