"""A run's notifications as its history shows them: each delivery, its attempts, its outcome."""

from __future__ import annotations

from typing import Any

from ..journal import Journal
from ..timestamps import format_time

__all__ = ["delivery_outcome", "notification_lines", "notifications", "request_deliveries"]


def notifications(journal: Journal, run_id: str, *, private: bool = True) -> list[dict]:
    """The run's delivery records, oldest first, without the claim's token and the notice
    a claim keeps to send again; ``to`` the recipient of an e-mail's delivery (one each);
    without where the sender ran (host, pid) unless ``private`` (an export leaves it
    out)."""
    rows = []
    for key, record in journal.deliveries(run_id).items():
        if "channel" not in record:
            continue  # an escalation's claim (durable_nb.approvals.tick), not a delivery
        row = {k: v for k, v in record.items() if k not in ("token", "heartbeat", "notice")}
        row["request"] = key.split("/", 1)[0]
        if not private:
            row.pop("by", None)
        rows.append(row)
    rows.sort(key=lambda r: (r.get("claimed_at") or r.get("at") or 0, r.get("channel", "")))
    return rows


def delivery_outcome(row: dict) -> str:
    """Where a delivery record stands: ``sent``, ``failed`` (its attempts used up),
    ``skipped`` (the run's ``notify=`` left its channel out), ``retrying`` (claimed, its last
    attempt failed: the next one is due after a backoff, or after the lease when its sender
    stopped) or ``sending`` (claimed, no attempt finished yet)."""
    state = row.get("state")
    if state in ("sent", "failed", "skipped"):
        return state
    attempts = row.get("attempts") or []
    return "retrying" if attempts and not attempts[-1].get("ok") else "sending"


def request_deliveries(rows: dict[str, dict], request_id: str) -> dict:
    """What a listing says of the deliveries of one request (``request_id``), from its run's
    delivery records ``rows`` (:meth:`~durable_nb.journal.Journal.deliveries`): how many of
    its channels are in each :func:`delivery_outcome` (none: ``{}``) and, when one failed or
    is retrying, ``problem``: which channel and why, in one line."""
    counts: dict[str, Any] = {}
    problems = []
    prefix = f"{request_id}/"
    for key, row in sorted(rows.items()):
        if not key.startswith(prefix):
            continue
        outcome = delivery_outcome(row)
        counts[outcome] = counts.get(outcome, 0) + 1
        attempts = row.get("attempts") or []
        if outcome in ("failed", "retrying"):
            why = attempts[-1].get("error") if attempts else None
            tried = f"{len(attempts)} attempt{'' if len(attempts) == 1 else 's'}"
            where = row.get("channel", key[len(prefix):])
            if row.get("to"):
                where = f"{where} to {row['to']}"
            problems.append(f"{where} {outcome} after "
                            f"{tried}: {why or 'no reason recorded'}")
    if problems:
        counts["problem"] = "; ".join(problems)
    return counts


def notification_lines(rows: list[dict]) -> list[str]:
    """``durable-nb show``'s lines for :func:`notifications`."""
    if not rows:
        return []
    lines = [f"notified   {len(rows)} deliver{'y' if len(rows) == 1 else 'ies'}"]
    for row in rows:
        attempts: list[dict[str, Any]] = row.get("attempts") or []
        state = row.get("state", "?")
        if state == "claimed":
            state = "sending" if attempts else "claimed"
        what = {"approval.reminder": "reminder of ",
                "approval.escalated": "escalation of "}.get(row.get("event", ""), "")
        line = (f"  {row.get('channel', '?'):<8} {state:<8} {what}"
                f"{row.get('name')!r} (details digest {str(row.get('digest', ''))[:12]})")
        if row.get("to"):
            line += f" to {row['to']}"
        if attempts:
            line += f", {len(attempts)} attempt{'' if len(attempts) == 1 else 's'}"
        if row.get("takeovers"):
            line += f", taken over {row['takeovers']}x from a sender that stopped"
        lines.append(line)
        links = row.get("links")
        if links:
            lines.append(f"    decision links to {', '.join(links.get('to') or [])}, valid "
                         f"until {format_time(links.get('expires_at'), '?')}")
        elif row.get("links_missing"):
            lines.append(f"    {row['links_missing']}")
        for attempt in attempts:
            when = format_time(attempt.get("at"), "?")
            outcome = "ok" if attempt.get("ok") else f"failed: {attempt.get('error')}"
            lines.append(f"    {when} {outcome} ({attempt.get('took', 0):.2f} s)")
    return lines
