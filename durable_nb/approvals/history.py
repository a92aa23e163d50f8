"""A run's history: what people and policies did about its approvals, in the journal.

Each event is JSON data appended once (:meth:`~durable_nb.journal.Journal.add_event`) and
never changed: a decision, a decision refused (someone not on the approvers' list, the
run's starter under four-eyes, a second decision), a reminder or an escalation sent, a
deadline's policy applied, a decision link issued or used. Notification deliveries have
records of their own (:mod:`durable_nb.notify.audit`); ``durable-nb show``, the run view and
the export show both.

An event has ``kind``, ``at`` (Unix time), ``text`` (one sentence, written when it happened,
so that no reader needs to know every kind) and, where they apply, ``request`` (the pending
approval's id), ``digest``, ``name``, ``by`` and ``via``.
"""

from __future__ import annotations

import time
from typing import Any

from ..journal import Journal
from ..timestamps import format_time

__all__ = ["history", "history_lines", "record_event"]


def record_event(journal: Journal, run_id: str, kind: str, text: str, *,
                 pending: dict | None = None, **fields: Any) -> dict:
    """Append an event of ``kind`` to the history of run ``run_id`` (the run that asked, for
    an approval): the event as written. ``pending`` (a pending approval) fills ``request``,
    ``digest`` and ``name``; ``fields`` (JSON data, None left out) are kept as given."""
    event: dict[str, Any] = {"kind": kind, "at": time.time(), "text": text}
    if pending is not None:
        event.update(request=pending.get("id"), digest=pending.get("digest"),
                     name=pending.get("name"))
    event.update(fields)
    event = {k: v for k, v in event.items() if v is not None}
    journal.add_event(run_id, event)
    return event


def history(journal: Journal, run_id: str, *, private: bool = True) -> list[dict]:
    """The history of run ``run_id``, oldest first; without where a person acted from
    (``host``) unless ``private`` (an export leaves it out)."""
    events = journal.events(run_id)
    if not private:
        events = [{k: v for k, v in e.items() if k != "host"} for e in events]
    return events


def history_lines(events: list[dict]) -> list[str]:
    """``durable-nb show``'s lines for :func:`history`."""
    if not events:
        return []
    lines = [f"history    {len(events)} event{'' if len(events) == 1 else 's'}"]
    for event in events:
        # On a hub the database stamps a user role's events with it (``writer``).
        writer = f" (written by database role {event['writer']})" if event.get("writer") \
            else ""
        lines.append(f"  {format_time(event.get('at'), '?')} {event.get('kind', '?'):<10} "
                     f"{event.get('text', '')}{writer}")
    return lines
