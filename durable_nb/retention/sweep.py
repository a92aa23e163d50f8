"""A prune carried out: each unit of a :class:`~durable_nb.retention.plan.PrunePlan` removed
under its runs' leases (as ``durable-nb delete`` removes a run), what was removed recorded in
the journal's own history, the space given back; and the journal's retention policy applied
by its sweepers (:func:`apply_policy`, called by
:func:`durable_nb.notify.sweeper.sweep_journal` and the Jupyter server's sweeper).

**As safe as a delete.** A unit's lease is taken first (a batch: every item's), so a run
executing now (a DONE run being replayed, a batch item resumed) is kept; under the lease the
unit is read again and judged again (it may have been resumed, or forked, since it was
planned), and its removal is one transaction fenced by the tokens held
(:meth:`~durable_nb.journal.Journal.delete_run`,
:meth:`~durable_nb.journal.Journal.delete_batch`). A unit that cannot be judged (a damaged
record) is kept and says why.

**On a hub.** A journal set up for a JupyterHub (one naming a decider role,
:mod:`durable_nb.hub`) keeps its history out of its users' reach: the database lets only the
service's role delete a run's history and decisions, and write the journal's settings. A
prune by another role is refused at once, in one line naming the role that prunes
(:class:`~durable_nb.errors.PruneRefused`); the service's sweep applies the policy.
"""

from __future__ import annotations

import logging
import os
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field

from ..errors import DurableError, JournalError, RunLeased
from ..journal import Journal, RunRecord, this_host
from ..journal.edits import child_runs
from ..execution.lease import Lease, holder_alive
from ..approvals.policy import approver_name
from ..timestamps import format_time
from .plan import Kept, PrunePlan, Unit, family_reason, plan_prune
from .policy import RetentionPolicy, check_may_prune, claim_due, duration_words, policy_due

__all__ = ["BeforeRemoval", "PruneResult", "apply_policy", "carry_out", "plan_for",
           "policy_due_here", "pruned_note"]

_log = logging.getLogger(__name__)

#: Called with a unit under its leases, just before it is removed (an export of its runs).
BeforeRemoval = Callable[[Journal, Unit], object]


@dataclass
class PruneResult:
    """What a prune removed and kept, and why (``durable-nb prune`` prints it).

    ``removed``: the records of the runs removed, top-level runs and batch items (their
    child runs went with them: ``children``); ``batches``: the batches removed whole;
    ``kept``: every run in the prune's scope it kept, with the reason
    (:class:`~durable_nb.retention.plan.Kept`); ``bytes_before``/``bytes_after``: the
    journal's size around the prune and the space reclaimed (None on a dry run);
    ``reclaim_error``: why the space was not given back (the prune itself stands).
    ``dry_run``: nothing was removed (``removed`` is what would be)."""

    policy: RetentionPolicy
    at: float
    by: str
    dry_run: bool = False
    removed: list[RunRecord] = field(default_factory=list)
    children: list[str] = field(default_factory=list)
    batches: list[str] = field(default_factory=list)
    kept: list[Kept] = field(default_factory=list)
    bytes_before: int | None = None
    bytes_after: int | None = None
    reclaim_error: str | None = None

    @property
    def statuses(self) -> dict[str, int]:
        """How many runs removed were in each status."""
        return dict(Counter(r.status.value for r in self.removed))

    def event(self, via: str) -> dict:
        """The journal's history event recording this prune: how many, which statuses, by
        whom, when (no run ids: an export keeps those). Written before the space is given
        back, so it holds the size before the prune only."""
        return {"kind": "pruned", "at": self.at, "by": self.by, "via": via,
                "runs": len(self.removed), "child_runs": len(self.children),
                "batches": len(self.batches), "statuses": self.statuses,
                "policy": self.policy.to_dict(), "bytes_before": self.bytes_before}


def plan_for(journal: Journal, policy: RetentionPolicy, now: float) -> PrunePlan:
    """The plan of a prune of ``journal`` at ``now``: every run and batch read once."""
    return plan_prune(journal.list_runs(), journal.list_batches(), policy, now)


def carry_out(journal: Journal, policy: RetentionPolicy, *, now: float | None = None,
              by: str | None = None, via: str = "python", dry_run: bool = False,
              before_removal: BeforeRemoval | None = None,
              reclaim: bool = True) -> PruneResult:
    """Prune ``journal`` by ``policy`` at ``now`` (default: the clock): plan, then remove
    unit by unit (see the module docstring), record the prune in the journal's history (when
    it removed something), and give the space back (``reclaim``). ``dry_run``: only plan;
    nothing is written, not even a lease."""
    moment = time.time() if now is None else now
    result = PruneResult(policy, moment, by or approver_name(), dry_run)
    if not dry_run:
        check_may_prune(journal)
    plan = plan_for(journal, policy, moment)
    result.kept = list(plan.kept)
    if dry_run:
        for unit in plan.units:
            busy = next((r.run_id for r in unit.runs if _executing(journal, r.run_id)), None)
            if busy is None:
                _removed(result, unit)
            else:
                result.kept += [Kept(r.run_id, f"{busy!r} is executing now (its lease is "
                                               f"held)", "executing") for r in unit.runs]
        return result
    result.bytes_before = journal.size_on_disk()
    try:
        for unit in plan.units:
            kept = _remove(journal, unit, policy, moment, before_removal)
            if kept:
                result.kept += kept
            else:
                _removed(result, unit)
    finally:  # what was removed is recorded, even when an export or a removal failed
        if result.removed:
            journal.add_journal_event(result.event(via))
            if reclaim:
                _reclaim(journal, result)
            result.bytes_after = journal.size_on_disk()
        else:
            result.bytes_after = result.bytes_before
    return result


def _reclaim(journal: Journal, result: PruneResult) -> None:
    """Give the space back, after the prune was recorded: a failure (VACUUM refused, the
    disk full) is logged and said in ``result``, never raised over the prune (or over the
    error that ended it); the next prune's VACUUM gives the space back."""
    try:
        journal.reclaim_space()
    except Exception as exc:  # any driver's error: the runs are gone and recorded anyway
        result.reclaim_error = f"{type(exc).__name__}: {exc}"
        _log.warning("durable_nb: runs pruned from %s, but the space was not given back: %s",
                     journal.location, result.reclaim_error)


def _executing(journal: Journal, run_id: str) -> bool:
    """Whether a live process holds the run's lease (read only: a dry run's look)."""
    holder = journal.lease(run_id)
    return holder is not None and holder_alive(holder)


def _removed(result: PruneResult, unit: Unit) -> None:
    result.removed += unit.runs
    result.children += [child.run_id for child in unit.children]
    if unit.batch_id is not None:
        result.batches.append(unit.batch_id)


def _remove(journal: Journal, unit: Unit, policy: RetentionPolicy, now: float,
            before_removal: BeforeRemoval | None) -> list[Kept]:
    """Remove ``unit`` under its leases; the runs kept (and why) when it must stay."""
    leases: list[Lease] = []
    try:
        for record in unit.runs:
            try:
                leases.append(Lease.acquire(journal, record.run_id))
            except RunLeased:
                return [Kept(r.run_id, f"{record.run_id!r} is executing now (its lease is "
                                       f"held)", "executing") for r in unit.runs]
        why = _judged_again(journal, unit, policy, now)
        if why is not None:
            return [Kept(r.run_id, why[1], why[0]) for r in unit.runs]
        if before_removal is not None:
            before_removal(journal, unit)
        children = [child.run_id for child in unit.children]
        if unit.batch_id is None:
            journal.delete_run(unit.runs[0].run_id, token=leases[0].token, children=children)
        else:
            journal.delete_batch(unit.batch_id, {lease.run_id: lease.token for lease in leases},
                                 children=children)
        return []
    except RunLeased:
        return [Kept(r.run_id, "taken over by an executor while it was pruned", "executing")
                for r in unit.runs]
    finally:
        for lease in leases:
            try:
                lease.release()
            except (OSError, JournalError):
                pass  # a dead lease is taken over by the next executor anyway


def _judged_again(journal: Journal, unit: Unit, policy: RetentionPolicy,
                  now: float) -> tuple[str, str] | None:
    """Under the unit's leases: why it must stay now, read afresh (its runs and child runs
    as they are, forks made since it was planned), or None. The unit then holds its runs
    and child runs as found now."""
    if unit.batch_id is not None:
        why = _batch_changed(journal, unit, policy.cutoff(now))
        if why is not None:
            return why
    fresh_runs: list[RunRecord] = []
    fresh_children: list[RunRecord] = []
    for record in unit.runs:
        current = journal.find_run(record.run_id)
        if current is None:
            return "gone", f"{record.run_id!r} is gone (removed by someone else)"
        kids = child_runs(journal, record.run_id)
        why = family_reason(current, kids, policy, now)
        if why is not None:
            return why
        for fork in journal.list_runs(record.run_id + "@"):
            source = (fork.forked_from or {}).get("run_id", "")
            if source == record.run_id or source.startswith(record.run_id + "/"):
                if fork.run_id not in unit.run_ids:
                    return "fork", f"the source of fork {fork.run_id!r}, which is kept"
        fresh_runs.append(current)
        fresh_children += kids
    unit.runs, unit.children = fresh_runs, fresh_children
    return None


def _batch_changed(journal: Journal, unit: Unit, cutoff: float) -> tuple[str, str] | None:
    """Why the batch ``unit`` stands for must stay, read again under its items' leases (an
    item added or started since the plan is not among them), or None: kept unless its
    keys are those planned, every item that exists is in the unit, and it is old enough."""
    batch_id = unit.batch_id or ""
    batch = journal.find_batch(batch_id)
    if batch is None:
        return "gone", f"batch {batch_id!r} is gone (removed by someone else)"
    if [*batch.keys, *batch.removed] != unit.batch_keys:
        return "batch", f"batch {batch_id!r} changed since the prune was planned"
    for key in unit.batch_keys:
        run_id = f"{batch_id}/{key}"
        if run_id not in unit.run_ids and journal.find_run(run_id) is not None:
            return "batch", f"batch {batch_id!r}'s item {run_id!r} started since the " \
                            f"prune was planned"
    if batch.updated_at >= cutoff:
        return "newer", f"batch {batch_id!r} changed since the prune was planned"
    return None


def policy_due_here(journal: Journal, now: float | None = None) -> bool:
    """Whether this process should apply the journal's policy at ``now``: one is due
    (:func:`~durable_nb.retention.policy.policy_due`) and this process's role prunes (on a
    hub's journal only the service's does: a user's server never opens it for writing to
    prune). Read only: a sweeper asks it through a read-only handle before it opens the
    journal for writing. False when the journal cannot be read."""
    try:
        return _due_here(journal, time.time() if now is None else now) is not None
    except (DurableError, OSError):
        return False


def _due_here(journal: Journal, now: float) -> RetentionPolicy | None:
    policy = policy_due(journal, now)
    if policy is None:
        return None
    decider, is_decider, _ = journal.decision_authority()
    return policy if decider is None or is_decider else None  # a hub's: the service's


def apply_policy(journal: Journal, now: float | None = None) -> PruneResult | None:
    """The journal's retention policy applied by a sweep, when it has one and it is due
    (:func:`policy_due_here`); None otherwise, and on a journal this process may not
    prune (read-only; a hub's, but for its service). Never raises for the journal's
    trouble: the next due sweep tries again."""
    if journal.read_only:
        return None
    moment = time.time() if now is None else now
    try:
        if _due_here(journal, moment) is None:
            return None
        # Claimed first, by one conditional write: of two sweepers of the journal (a second
        # server) one prunes, the other waits for the next period.
        policy = claim_due(journal, moment, {"at": moment, "pid": os.getpid(),
                                             "host": this_host()})
        if policy is None:
            return None
        return carry_out(journal, policy, now=moment, by=f"retention policy "
                         f"({approver_name()})", via="policy")
    except (DurableError, OSError) as exc:
        _log.warning("durable_nb: the retention policy of %s was not applied: %s",
                     journal.location, exc)
        return None


def pruned_note(journal: Journal) -> str | None:
    """One line on what prunes removed from the journal (``312 runs pruned on 2026-12-06
    09:41 by ana@host (DONE 300, FAILED 12; older than 30 days)``, with the totals when
    there were several), or None when nothing was ever pruned."""
    prunes = [e for e in journal.journal_events() if e.get("kind") == "pruned"]
    if not prunes:
        return None
    last = prunes[-1]
    statuses = ", ".join(f"{k} {v}" for k, v in sorted((last.get("statuses") or {}).items()))
    policy = last.get("policy") or {}
    age = policy.get("older_than")
    older = f"; unchanged for {duration_words(age)}" if isinstance(age, (int, float)) else ""
    runs = last.get("runs", 0)
    note = (f"{runs} run{'' if runs == 1 else 's'} pruned on {format_time(last.get('at'))} "
            f"by {last.get('by', '?')} ({statuses or 'none'}{older})")
    if len(prunes) > 1:
        total = sum(int(e.get("runs") or 0) for e in prunes)
        note += f"; {total} in {len(prunes)} prunes since {format_time(prunes[0].get('at'))}"
    return note
