"""A run's notifications as its history shows them: each delivery, its attempts, its outcome."""

from __future__ import annotations

from typing import Any

from ..journal import Journal
from ..timestamps import format_time

__all__ = ["notification_lines", "notifications"]


def notifications(journal: Journal, run_id: str, *, private: bool = True) -> list[dict]:
    """The run's delivery records, oldest first, without the claim's token; without where
    the sender ran (host, pid) unless ``private`` (an export leaves it out)."""
    rows = []
    for key, record in journal.deliveries(run_id).items():
        row = {k: v for k, v in record.items() if k not in ("token", "heartbeat")}
        row["request"] = key.rsplit("/", 1)[0]
        if not private:
            row.pop("by", None)
        rows.append(row)
    rows.sort(key=lambda r: (r.get("claimed_at") or r.get("at") or 0, r.get("channel", "")))
    return rows


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
        line = (f"  {row.get('channel', '?'):<8} {state:<8} request "
                f"{str(row.get('digest', ''))[:12]} {row.get('name')!r}")
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
