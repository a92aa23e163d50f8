"""How ``durable-nb`` and ``%durable`` show runs and batches: the listing of runs, one run
with its steps, what it waits for and its history, and a batch with its items."""

from __future__ import annotations

import argparse
import json
from collections import Counter
from typing import Any, Iterable, Mapping

from .. import registry
from ..execution import attempts
from .answer import question_lines
from ..approvals.request import pending_digest, short
from ..approvals.wording import decision_words
from ..journal import Journal, RunRecord, Status, StepEntry
from ..approvals.history import history_lines
from ..approvals.state import Effective, effective_state
from ..notify.audit import notification_lines
from ..registry import is_interrupted
from ..summary import (cost_of, elapsed, format_cost, format_duration, is_free, one_line, plain,
                      price_sources, shown_value, step_cost)
from ..timestamps import format_time

__all__ = ["INTERRUPTED", "ITEM_STATUSES", "RUN_STATUSES", "effective_json",
           "effective_states", "format_batch", "format_batches", "format_run", "format_runs",
           "list_runs", "more_runs_note", "parse_item_status", "parse_status",
           "statuses_help"]


#: A run that stopped before it finished and that nothing executes now (see
#: :func:`durable_nb.registry.is_interrupted`), as listings show it.
INTERRUPTED = "INTERRUPTED"
#: Every status a run listing shows, which ``--status`` accepts (in any case).
RUN_STATUSES: tuple[str, ...] = (*(s.value for s in Status), INTERRUPTED)
#: Every status a batch's items show: a run's, or PENDING (an item never started).
ITEM_STATUSES: tuple[str, ...] = (*RUN_STATUSES, "PENDING")
# How much of a failed step's message its one line shows.
_FAILURE_MESSAGE = 120


def statuses_help(choices: tuple[str, ...]) -> str:
    """``running, waiting_approval, ... (any case)``, for an option's help."""
    return f"{', '.join(c.lower() for c in choices)} (any case)"


def _parse_choice(text: str, choices: tuple[str, ...]) -> str:
    name = str(text).strip().upper()
    if name not in choices:
        raise argparse.ArgumentTypeError(f"unknown status {str(text)!r}: use one of "
                                         f"{', '.join(choices)} (any case)")
    return name


def parse_status(text: str) -> str:
    """An argparse type: a status a run listing shows (:data:`RUN_STATUSES`), in any case
    (``done``, ``interrupted``) -> its name (``DONE``, ``INTERRUPTED``)."""
    return _parse_choice(text, RUN_STATUSES)


def format_runs(records: list[RunRecord], interrupted: Iterable[str] = (),
                effective: Mapping[str, Effective] | None = None) -> str:
    """The run table shown by ``durable-nb runs`` and ``%durable runs``; runs listed in
    ``interrupted`` show as INTERRUPTED, runs in ``effective`` (waiting runs whose request
    was decided, or passed its deadline: :func:`~durable_nb.approvals.state.effective_state`)
    as what they amount to (``REJECTED``)."""
    if not records:
        return "no runs"
    interrupted = set(interrupted)
    effective = effective or {}
    rows = [("RUN", "STATUS", "ITER", "TOKENS", "COST", "STEPS", "UPDATED", "TITLE")]
    for r in records:
        iters = f"{r.iteration}/{r.max_iterations}" if r.max_iterations else str(r.iteration)
        status = ("INTERRUPTED" if r.run_id in interrupted else
                  effective[r.run_id].status if r.run_id in effective else str(r.status))
        rows.append((r.run_id, status, iters, f"{r.tokens:,}",
                     format_cost(r.cost) if r.cost else "-", str(r.step_count),
                     format_time(r.updated_at), r.title))
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]) - 1)]
    table = "\n".join("  ".join(c.ljust(w) for c, w in zip(row, widths)) + "  " + row[-1]
                      for row in rows)
    lines = [line.rstrip() for line in table.splitlines()]
    if interrupted & {r.run_id for r in records}:
        lines.append("INTERRUPTED: stopped before it finished (its process died, a kernel "
                     "restart or the stop button) and nothing executes it now; re-run its cell "
                     "(or execute it again) to resume it.")
    for run_id, state in effective.items():
        lines.append(f"{run_id}: {state.words}; re-run its cell (or execute it again) to "
                     f"resume it.")
    return "\n".join(lines)


def _status_line(info: registry.RunInfo, interrupted: bool, decision: dict | None,
                 effective: Effective | None = None) -> str:
    if interrupted and info.status is Status.FAILED:  # by an interrupt: see is_interrupted
        last = attempts.current(info) or {}
        how = attempts.END_WORDS.get(str(last.get("end")), "interrupted")
        return (f"INTERRUPTED: {how} at step {last.get('at_step', info.step_count)} (FAILED "
                f"in the journal, no step failed); re-run its cell or execute it again to "
                f"resume")
    if interrupted:
        owner = info.owner or {}
        who = f" (pid {owner.get('pid')} on {owner.get('host')})" if owner else ""
        return (f"INTERRUPTED: RUNNING in the journal, but its process{who} is gone; "
                f"re-run its cell or execute it again to resume")
    status = str(info.status) + ("  [executing now]" if info.executing else "")
    reset = attempts.last_reset(info)
    if reset is not None and info.status is Status.RUNNING and not info.executing:
        status += (f": reset to step {reset['to_step']} at {format_time(reset['at'])}, "
                   f"{reset['forgot']} step{'' if reset['forgot'] == 1 else 's'} forgotten; "
                   f"re-run its cell (or execute it again) to execute from there")
    if effective is not None and not info.executing and (
            decision is None or decision.get("via") == "timeout"):
        status += (f" in the journal, {effective.status} in effect: {effective.words}: re-run "
                   f"its cell (or execute it again)")
    elif decision is not None and not info.executing:
        status += (f": {decision_words(decision, timed=True, note=80)}, waiting for the run "
                   f"to resume: re-run its cell (or execute it again)")
    return status


def _step_line(entry: StepEntry) -> str:
    if entry.kind == "approval":
        decided = plain(entry.result) if entry.ok else None
        if isinstance(decided, dict) and (entry.meta or {}).get("replaced"):
            decided = dict(decided, replaced=entry.meta["replaced"])
        outcome = (decision_words(decided, timed=True, note=80) if isinstance(decided, dict) else
                   _failed(entry))
        if isinstance(decided, dict) and decided.get("digest"):
            outcome += f" (details digest {short(decided['digest'])})"
        when = f"waited {format_duration(entry.duration)}"
        return f"  {entry.position:>4}  {entry.kind:<8} {entry.name:<28} {when:>11}  {outcome}"
    outcome = "ok" if entry.ok else _failed(entry)
    extra = ""
    if entry.prompt_tokens or entry.completion_tokens:
        extra = f"  {entry.prompt_tokens:,}+{entry.completion_tokens:,} tok"
        money = step_cost(entry)
        if money:
            extra += f"  {money}"
    return (f"  {entry.position:>4}  {entry.kind:<8} {entry.name:<28} "
            f"{entry.duration * 1000:8.1f} ms  {outcome}{extra}")


def _failed(entry: StepEntry) -> str:
    """A failed step's outcome on its line: the exception's type and its message, shortened
    (``FAILED builtins.RuntimeError: quota exceeded``). The message is the tool's or the
    server's text: a terminal's control characters in it are shown as ``?``."""
    error = entry.error or {}
    message = "".join(c if c.isprintable() else "?"
                      for c in one_line(error.get("message") or "", _FAILURE_MESSAGE))
    return f"FAILED {error.get('type', '')}" + (f": {message}" if message else "")


def _replay_line(info: registry.RunInfo) -> str | None:
    """What executing the run again takes from the journal: every journaled step but the
    failed one, which is tried again."""
    kept = [e for e in info.steps if e.position != info.failed_step]
    if not kept:
        return None
    line = (f"replay     executing it again replays its {len(kept):,} journaled "
            f"step{'s' if len(kept) != 1 else ''}")
    tokens = sum(e.tokens for e in kept)
    if not tokens:
        return line
    dollars, estimated, _ = cost_of(kept)
    money = f" and {format_cost(dollars, estimated=estimated)}" if dollars else ""
    return f"{line}: {tokens:,} tokens{money} not spent again"


def format_run(info: registry.RunInfo, interrupted: bool = False,
               decision: dict | None = None, notified: list[dict] | None = None,
               events: list[dict] | None = None, effective: Effective | None = None) -> str:
    """The detail view shown by ``durable-nb show`` and ``%durable show``: words and local
    times, no raw records. ``decision``: one given but not taken yet
    (:func:`recorded_decision`); ``notified``: the run's notifications
    (:func:`~durable_nb.notify.audit.notifications`)."""
    budget = f" of {info.max_tokens:,}" if info.max_tokens else ""
    lines = [f"run        {info.run_id}" + (f"  ({info.title})" if info.title else ""),
             f"status     {_status_line(info, interrupted, decision, effective)}",
             f"iteration  {info.iteration}" + (f" / {info.max_iterations}"
                                               if info.max_iterations else ""),
             f"tokens     {info.prompt_tokens:,} prompt + {info.completion_tokens:,} completion"
             + budget]
    dollars, estimated, unpriced = cost_of(info.steps)
    cost = format_cost(info.cost or dollars, estimated=estimated)
    if unpriced and not (info.cost or dollars):
        cost = "unknown"
    if is_free(info.steps):
        cost = "free"
    if info.max_cost:
        cost += f" of {format_cost(info.max_cost)}"
    if unpriced:
        cost += f" (no price known for {', '.join(sorted(set(unpriced)))})"
    sources = price_sources(info.steps)
    if sources:
        cost += f" (prices: {'; '.join(sources)})"
    lines.append(f"cost       {cost}")
    lines.append(f"created    {format_time(info.created_at)}; "
                 f"{'took' if info.status is Status.DONE else 'elapsed'} "
                 f"{format_duration(elapsed(info))}")
    if info.deadline:
        lines.append(f"deadline   {format_time(info.deadline)}")
    if info.forked_from:
        fork = info.forked_from
        source, step = fork.get("run_id"), fork.get("position")
        when = f" at {format_time(fork['at'])}" if fork.get("at") else ""
        lines.append(f"forked     from {source}{when} (step {step}): the run as it was when "
                     f"{source} was executed again from step {step}")
    if info.pending_approval:
        lines.extend(_pending_lines(info.pending_approval))
        lines += question_lines(info.pending_approval, info.run_id)
    lines += notification_lines(notified or [])
    lines += history_lines(events or [])
    if info.error:
        lines.append(f"error      {info.error}")
    if info.status is Status.DONE:
        lines.append(f"result     {shown_value(info.result, 500)}")
    if info.context_summary:
        lines.append(f"summary    {info.context_summary[:500]}")
    replay = _replay_line(info)
    if replay:
        lines.append(replay)
    lines += _attempt_lines(info)
    lines.append(f"steps      {len(info.steps)}")
    lines += [_step_line(e) for e in info.steps]
    return "\n".join(lines)


def _pending_lines(pending: dict) -> list[str]:
    details = pending.get("details")
    lines = [f"waiting    approval {pending.get('name')!r} (step {pending.get('key')}, details "
             f"digest {short(pending_digest(pending))})"
             + (f": {shown_value(details, 300)}" if plain(details) else "")]
    if pending.get("id"):
        lines.append(f"           request id {pending['id']} (`approve`/`reject --request "
                     f"{pending['id']}` decide this request only)")
    earlier = pending.get("replaces")
    if earlier:
        was = (f"{earlier.get('name')!r} ({shown_value(earlier.get('details'), 200)}, "
               f"details digest {short(earlier.get('digest'))})")
        lines.append(f"           the request at this step changed: the decision given for "
                     f"{was} ({earlier['decided']}) is not applied to it"
                     if earlier.get("decided") else
                     f"           the request at this step changed since it was shown: it "
                     f"was {was}")
    return lines


def _attempt_lines(info: RunRecord) -> list[str]:
    """The run's history: each execution, where it ran, what it did, how it ended."""
    history = attempts.history_lines(info)
    if not history:
        return []
    total = len(info.attempts or ()) + info.attempts_dropped
    return [f"attempts   {total}"] + [f"  {line}" for line in history]


def effective_states(journal: Journal, records: Iterable[RunRecord]) -> dict[str, Effective]:
    """The effective state of each waiting run of ``records`` that has one (read only)."""
    return {r.run_id: state for r in records
            if (state := effective_state(journal, r)) is not None}


def effective_json(state: Effective | None) -> dict | None:
    return None if state is None else {"status": state.status, "words": state.words}


def list_runs(journal: Journal, *, status: str | None = None, prefix: str | None = None,
              limit: int | None = 50) -> tuple[list[RunRecord], bool]:
    """The runs a listing shows, newest first: the first ``limit`` of them (all with
    ``limit`` None or 0), and whether more match. Reads ``limit + 1`` records from the
    journal's index, not every run; for ``status`` INTERRUPTED, the RUNNING and FAILED
    runs."""
    if status == INTERRUPTED:  # RUNNING or FAILED in the journal, and stopped
        page = [r for r in registry.runs((Status.RUNNING.value, Status.FAILED.value),
                                         journal=journal, prefix=prefix or "",
                                         newest_first=True)
                if is_interrupted(r, journal)]
    else:
        page = registry.runs(status, journal=journal, prefix=prefix or "",
                             limit=limit + 1 if limit else None, newest_first=True)
    more = bool(limit) and len(page) > limit
    return (page[:limit] if more else page), more


def more_runs_note(shown: int, more: bool, command: str) -> str:
    """The line under a listing cut at ``--limit``."""
    if not more:
        return ""
    return (f"showing the newest {shown:,} runs; there are more: `{command} --limit N` "
            f"(0: all), --status S or --prefix P for others")


def parse_item_status(text: str) -> str:
    """An argparse type: a status a batch's items show (:data:`ITEM_STATUSES`), in any
    case."""
    return _parse_choice(text, ITEM_STATUSES)


def format_batches(rows: list[dict[str, Any]]) -> str:
    """The batch table shown by ``durable-nb batches`` and ``%durable batches``."""
    if not rows:
        return "no batches"
    table = [("BATCH", "ITEMS", "DONE", "FAILED", "WAITING", "RUNNING", "PENDING", "TOKENS",
              "COST", "UPDATED", "TITLE")]
    for row in rows:
        c = row["counts"]
        table.append((row["batch_id"], f"{row['items']:,}", f"{c.get('DONE', 0):,}",
                      f"{c.get('FAILED', 0) + c.get('CANCELLED', 0):,}",
                      f"{c.get('WAITING_APPROVAL', 0):,}", f"{c.get('RUNNING', 0):,}",
                      f"{c.get('PENDING', 0):,}", f"{row['tokens']:,}",
                      format_cost(row["cost"]) if row["cost"] else "-",
                      format_time(row["updated_at"]), row["title"]))
    widths = [max(len(r[i]) for r in table) for i in range(len(table[0]) - 1)]
    lines = ["  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip() + "  " + r[-1]
             for r in table]
    return "\n".join(line.rstrip() for line in lines) + (
        "\nFAILED counts CANCELLED items too. `durable-nb batch show BATCH` lists the items.")


def format_batch(batch: Any, *, status: str | None = None, limit: int | None = 50,
                 interrupted: Iterable[str] = ()) -> str:
    """The detail view of a batch (:class:`durable_nb.batches.batch.Batch`) shown by ``durable-nb
    batch show`` and ``%durable batch show``: totals, then its items (those in ``status``,
    the first ``limit``), items whose process died as INTERRUPTED."""
    interrupted = set(interrupted)
    items = list(batch)
    counts = Counter(INTERRUPTED if i.run_id in interrupted else i.state for i in items)
    order = ["DONE", "FAILED", "CANCELLED", "WAITING_APPROVAL", "RUNNING", "INTERRUPTED",
             "PENDING"]
    by_status = ", ".join(f"{counts[s]:,} {s}" for s in order if counts[s])
    prompt = sum(i.prompt_tokens for i in items)
    completion = sum(i.completion_tokens for i in items)
    cost = sum(i.cost for i in items)
    lines = [f"batch      {batch.batch_id}" + (f"  ({batch.title})" if batch.title else ""),
             f"items      {len(items):,}" + (f": {by_status}" if by_status else ""),
             f"tokens     {prompt + completion:,} ({prompt:,} prompt + {completion:,} "
             f"completion)",
             f"cost       {format_cost(cost) if cost else '- (no LLM call with a known price)'}"]
    if batch.removed:
        shown = ", ".join(batch.removed[:5]) + (" ..." if len(batch.removed) > 5 else "")
        lines.append(f"removed    {len(batch.removed):,} items no longer in the list, their "
                     f"runs kept: {shown}")
    if counts["INTERRUPTED"]:
        lines.append("INTERRUPTED: RUNNING in the journal, but the process executing it is "
                     "gone; re-run the batch's cell (or map) to resume them.")
    chosen = [i for i in items if status is None or i.state == status
              or (status in ("RUNNING", INTERRUPTED) and i.run_id in interrupted)]
    shown_items = chosen[:limit] if limit else chosen
    table = [("#", "KEY", "STATUS", "ITER", "TOKENS", "COST", "RESULT / ERROR")]
    for item in shown_items:
        state = "INTERRUPTED" if item.run_id in interrupted else item.state
        outcome = item.error or ""
        if item.status is Status.DONE:
            outcome = one_line(item.result if isinstance(item.result, str)
                                else json.dumps(item.result, ensure_ascii=False, default=str),
                                70)
        table.append((str(item.index), item.key, state, str(item.iterations),
                      f"{item.tokens:,}", format_cost(item.cost) if item.cost else "-",
                      one_line(outcome, 90)))
    if shown_items:
        widths = [max(len(r[i]) for r in table) for i in range(len(table[0]) - 1)]
        lines.append("")
        lines += ["  ".join(c.ljust(w) for c, w in zip(r, widths)) + "  " + r[-1]
                  for r in table]
    else:
        lines.append(f"no items{f' in status {status}' if status else ''}")
    if len(shown_items) < len(chosen):
        lines.append(f"showing {len(shown_items):,} of {len(chosen):,} items: --limit N (0: all)"
                     f" or --status S for others")
    return "\n".join(line.rstrip() for line in lines)


