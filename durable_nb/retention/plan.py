"""Which runs a prune removes and which it keeps, and why: pure Python over the records a
journal lists (no reads, no writes), so that a dry run and the prune itself decide alike.

What is removed comes in **units**, each removed whole or kept whole:

- a run with its child runs (``RUN/...`` whose ``parent`` chain leads to it), as
  ``durable-nb delete`` removes it;
- a batch (:func:`durable_nb.map`) with all its items and their child runs: **a batch is
  pruned whole or not at all**. Its items are never removed apart from it, and it is kept
  while one item is kept or was never started.

Never removed, whatever the age and statuses asked for (a unit with one such run is kept):

- a run that waits (WAITING_APPROVAL) or runs (RUNNING: executing, or interrupted);
- a run FAILED by an interrupt (Kernel > Restart, the stop button, Ctrl-C): executing it
  again resumes it;
- a run whose record holds a request nobody decided (a run cancelled, or a fork kept, while
  it waited);
- the source of a fork (``RUN@N``, the panel's *Re-run from here*) while the fork is kept;
- a run executing now (its lease held by a live process: checked when it is removed,
  :mod:`durable_nb.retention.sweep`).

Age is the time a unit last changed: the latest of its runs' ``created_at``, ``updated_at``
and ``finished_at`` (and a batch record's ``updated_at``).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass, field

from ..journal import BatchRecord, RunRecord, Status
from ..execution.attempts import stopped_by_interrupt
from .policy import RetentionPolicy, duration_words

__all__ = ["Kept", "PrunePlan", "Unit", "family_reason", "last_change", "plan_prune"]


@dataclass(frozen=True)
class Kept:
    """A run a prune kept, and why. ``rule``: ``newer`` (changed within the policy's age),
    ``status`` (not among the statuses pruned), ``running``, ``waiting``, ``interrupted``,
    ``undecided`` (a request nobody decided), ``fork`` (the source of a fork kept),
    ``batch`` (an item of a batch that is kept, or a batch changed since the plan),
    ``not started`` (an item of a batch some of whose items never started), ``executing``
    (its lease held now), ``gone`` (removed by someone else meanwhile)."""

    run_id: str
    reason: str
    rule: str


@dataclass
class Unit:
    """What a prune removes as one: a run and its child runs, or a batch (``batch_id``)
    with its items (``runs``) and their child runs; ``batch_keys``: the batch's keys (listed
    and removed) when it was planned, to find it unchanged when it is removed."""

    runs: list[RunRecord]
    children: list[RunRecord] = field(default_factory=list)
    batch_id: str | None = None
    batch_keys: list[str] = field(default_factory=list)

    @property
    def run_ids(self) -> list[str]:
        return [r.run_id for r in self.runs]


@dataclass
class PrunePlan:
    """The units a prune removes, and the runs in its scope it keeps, with why."""

    units: list[Unit] = field(default_factory=list)
    kept: list[Kept] = field(default_factory=list)


def last_change(records: Iterable[RunRecord]) -> float:
    """When the latest of ``records`` last changed (created, written, finished)."""
    moments = [0.0]
    for record in records:
        for value in (record.created_at, record.updated_at, record.finished_at):
            if isinstance(value, (int, float)) and not isinstance(value, bool):
                moments.append(float(value))
    return max(moments)


def _guard(member: RunRecord, root: RunRecord) -> tuple[str, str] | None:
    """Why ``member`` (the unit's run ``root`` or one of its child runs) must stay, as
    (rule, words), or None."""
    who = "it" if member is root else f"its child run {member.run_id!r}"
    if member.status is Status.RUNNING:
        return "running", f"{who} is RUNNING: executing, or interrupted (executing it " \
                          f"again resumes it)"
    if member.status is Status.WAITING_APPROVAL:
        return "waiting", f"{who} waits for a decision"
    if member.status is Status.FAILED and stopped_by_interrupt(member):
        return "interrupted", f"{who} was interrupted: executing it again resumes it"
    if member.pending_approval and member.status is not Status.DONE:
        name = member.pending_approval.get("name")
        return "undecided", f"{who} holds a request nobody decided ({name!r}): executing " \
                            f"it again asks it; delete it by hand if it is not wanted"
    return None


def family_reason(root: RunRecord, children: list[RunRecord], policy: RetentionPolicy,
                  now: float) -> tuple[str, str] | None:
    """Why the run ``root`` with its ``children`` is kept at ``now`` under ``policy``, as
    (rule, words); None when it may be removed."""
    for member in (root, *children):
        guarded = _guard(member, root)
        if guarded is not None:
            return guarded
    if root.status not in policy.statuses:
        return "status", f"it is {root.status.value}, not among the statuses pruned " \
                         f"({', '.join(s.value for s in policy.statuses)})"
    if last_change((root, *children)) >= policy.cutoff(now):
        return "newer", f"it changed within the last {duration_words(policy.older_than)}"
    return None


def _roots(records: list[RunRecord]) -> tuple[list[RunRecord], dict[str, list[RunRecord]],
                                               dict[str, str]]:
    """The top-level runs, each one's child runs, and each run's top-level run."""
    by_id = {r.run_id: r for r in records}
    root_of: dict[str, str] = {}

    def find(record: RunRecord) -> str:
        seen = set()
        while record.parent in by_id and record.run_id not in seen:
            seen.add(record.run_id)
            record = by_id[record.parent]  # type: ignore[index]
        return record.run_id

    children: dict[str, list[RunRecord]] = defaultdict(list)
    roots = []
    for record in records:
        top = root_of[record.run_id] = find(record)
        if top == record.run_id:
            roots.append(record)
        else:
            children[top].append(record)
    return roots, children, root_of


def plan_prune(records: list[RunRecord], batches: list[BatchRecord],
               policy: RetentionPolicy, now: float) -> PrunePlan:
    """The plan for a prune at ``now`` under ``policy`` of a journal holding ``records``
    (all its runs) and ``batches`` (see the module docstring for what stays)."""
    roots, children, root_of = _roots(records)
    by_id = {r.run_id: r for r in roots}
    plan = PrunePlan()
    item_of = {f"{b.batch_id}/{key}": b for b in batches for key in (*b.keys, *b.removed)}
    for batch in batches:
        if batch.batch_id.startswith(policy.prefix):
            _plan_batch(batch, by_id, children, policy, now, plan)
    for root in roots:
        if not root.run_id.startswith(policy.prefix):
            continue
        batch = item_of.get(root.run_id)
        if batch is not None:
            if not batch.batch_id.startswith(policy.prefix):
                plan.kept.append(Kept(root.run_id, f"an item of batch {batch.batch_id!r}, "
                                      f"which is pruned whole or not at all (prefix "
                                      f"{batch.batch_id!r} or none)", "batch"))
            continue
        kids = children.get(root.run_id, [])
        why = family_reason(root, kids, policy, now)
        if why is None:
            plan.units.append(Unit([root], kids))
        else:
            plan.kept.append(Kept(root.run_id, why[1], why[0]))
    _keep_sources_of_kept_forks(plan, records, root_of)
    # Forks before their sources: a source is judged again under its lease when it is
    # removed, and must find its forks gone by then.
    depth = _fork_depths(records, root_of)
    plan.units.sort(key=lambda unit: -max(depth.get(run_id, 0) for run_id in unit.run_ids))
    return plan


def _fork_depths(records: list[RunRecord], root_of: dict[str, str]) -> dict[str, int]:
    """For each top-level run that is a fork, how many forks lead back from it to a run
    that is none (a fork of a fork: 2)."""
    source_of = {}
    for record in records:
        source = (record.forked_from or {}).get("run_id")
        is_root = root_of[record.run_id] == record.run_id
        if isinstance(source, str) and source in root_of and is_root:
            source_of[record.run_id] = root_of[source]
    depths: dict[str, int] = {}
    for run_id in source_of:
        chain, at = [], run_id
        while at in source_of and at not in chain:
            chain.append(at)
            at = source_of[at]
        depths[run_id] = len(chain)
    return depths


def _plan_batch(batch: BatchRecord, by_id: dict[str, RunRecord],
                children: dict[str, list[RunRecord]], policy: RetentionPolicy, now: float,
                plan: PrunePlan) -> None:
    keys = (*batch.keys, *batch.removed)
    items = [by_id.get(f"{batch.batch_id}/{key}") for key in keys]
    present = [item for item in items if item is not None]
    blocking: tuple[str, str] | None = None
    if any(by_id.get(f"{batch.batch_id}/{key}") is None for key in batch.keys):
        blocking = ("not started", "some of its items never started")
    for item in present:
        if blocking is not None:
            break
        why = family_reason(item, children.get(item.run_id, []), policy, now)
        if why is not None:
            blocking = (why[0], f"its item {item.run_id!r}: {why[1]}")
    if blocking is None and last_change(present) < policy.cutoff(now) \
            and batch.updated_at < policy.cutoff(now):
        plan.units.append(Unit(present, [c for item in present
                                         for c in children.get(item.run_id, [])],
                               batch.batch_id, list(keys)))
        return
    if blocking is None:
        blocking = ("newer", f"it changed within the last {duration_words(policy.older_than)}")
    for item in present:
        plan.kept.append(Kept(item.run_id, f"an item of batch {batch.batch_id!r}, which is "
                              f"pruned whole or not at all and is kept: {blocking[1]}",
                              blocking[0]))


def _keep_sources_of_kept_forks(plan: PrunePlan, records: list[RunRecord],
                                root_of: dict[str, str]) -> None:
    """Keep every unit holding the source of a fork that is not removed (until nothing
    changes: a unit kept may hold a fork whose own source must then stay)."""
    forks: dict[str, set[str]] = defaultdict(set)
    for record in records:
        source = (record.forked_from or {}).get("run_id")
        if isinstance(source, str) and source in root_of:
            forks[root_of[source]].add(root_of[record.run_id])
    changed = True
    while changed:
        changed = False
        removed = {run_id for unit in plan.units for run_id in unit.run_ids}
        for unit in list(plan.units):
            kept_fork = next((fork for run_id in unit.run_ids for fork in sorted(forks[run_id])
                              if fork not in removed), None)
            if kept_fork is None:
                continue
            plan.units.remove(unit)
            for run_id in unit.run_ids:
                plan.kept.append(Kept(run_id, f"the source of fork {kept_fork!r}, which is "
                                      f"kept", "fork"))
            changed = True
            break
