"""How durable_nb writes a moment for people: one format, wherever a time is shown.

``2026-12-03 09:41:07``: the local date and time to the second. The CLI, the panel and its
saved view, the attempts' lines and the Markdown export all call :func:`format_time`; the
JupyterLab extension's ``clock`` (labextension/src/dom.ts) writes the same format in the
browser's time zone.

Why this one: a saved view or an export is read days later and a listing is compared across
days, so the date is always there (never "today" left out) and nothing is relative ("3 min
ago" is wrong as soon as the page stops being redrawn, which an idle sidebar and every saved
view are). Seconds, because steps and attempts of one run are seconds apart. Year first, so
the text sorts as the time does and reads the same in every locale.
"""

from __future__ import annotations

import time
from typing import Any

__all__ = ["TIME_FORMAT", "format_time", "utc_offset"]

#: The one format (for :func:`time.strftime`).
TIME_FORMAT = "%Y-%m-%d %H:%M:%S"


def format_time(ts: Any, missing: str = "-") -> str:
    """The moment ``ts`` (seconds since the epoch) in local time as ``2026-12-03 09:41:07``;
    ``missing`` when ``ts`` is not a number (a record written by someone else may hold
    anything)."""
    if not isinstance(ts, (int, float)) or isinstance(ts, bool):
        return missing
    try:
        return time.strftime(TIME_FORMAT, time.localtime(ts))
    except (OverflowError, OSError, ValueError):
        return missing


def utc_offset(ts: Any = None) -> str:
    """The local time zone's offset at ``ts`` (now when not a number) as ``UTC+05:45``: what
    a reader elsewhere needs to place the times of an export."""
    moment = time.localtime(ts if isinstance(ts, (int, float)) and not isinstance(ts, bool)
                            else None)
    minutes = (moment.tm_gmtoff or 0) // 60
    sign = "+" if minutes >= 0 else "-"
    return f"UTC{sign}{abs(minutes) // 60:02d}:{abs(minutes) % 60:02d}"
