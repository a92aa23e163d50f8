"""Dates are written one way everywhere (issue 26): ``2026-12-03 09:41:07``, local time, to the
second, never relative. A run with known timestamps in a real directory journal is shown by the
CLI (``durable-nb runs`` and ``show``, in a child process), exported as a notebook and drawn in
the panel and its saved view: each shows the moments it shows in that format, and nothing
date-like in any other (no "3m ago", no ISO ``T...+00:00``, no time without its date).

The time zone is Asia/Kathmandu (UTC+05:45, no daylight saving) in this process and the child,
so the expected texts below are worked out by hand, not by the formatter under test.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Iterator

import pytest

import durable_nb as dn
from durable_nb.export import export_run
from durable_nb.journal import DiskJournal
from durable_nb.notebook.panel import RunPanel
from durable_nb.registry import get_run

ZONE = "Asia/Kathmandu"
# 2026-12-01 03:00:07 UTC and later, each with its Kathmandu wall clock (+05:45).
CREATED, CREATED_TEXT = 1796094007, "2026-12-01 08:45:07"
FIRST_ATTEMPT, FIRST_ATTEMPT_TEXT = 1796094009, "2026-12-01 08:45:09"
ASKED, ASKED_TEXT = 1796094011, "2026-12-01 08:45:11"
SECOND_ATTEMPT, SECOND_ATTEMPT_TEXT = 1796180412, "2026-12-02 08:45:12"

CANONICAL = re.compile(r"\d{4}-\d{2}-\d{2} \d{2}:\d{2}:\d{2}")
# Anything a person reads as a date or a time of day, or a relative time.
DATE_LIKE = re.compile(
    r"\d{4}-\d{2}-\d{2}(?:[ T]\d{2}:\d{2}(?::\d{2})?(?:[+-]\d{2}:\d{2}|Z)?)?"
    r"|\b\d{1,2}:\d{2}(?::\d{2})?\b"
    r"|\b\d+\s?(?:s|m|min|h|d) ago\b|\bjust now\b"
    r"|\b(?:Mon|Tue|Wed|Thu|Fri|Sat|Sun) (?:Jan|Feb|Mar|Apr|May|Jun|Jul|Aug|Sep|Oct|Nov|Dec)\b")


@pytest.fixture
def kathmandu() -> Iterator[None]:
    before = os.environ.get("TZ")
    os.environ["TZ"] = ZONE
    time.tzset()
    try:
        yield
    finally:
        if before is None:
            os.environ.pop("TZ", None)
        else:
            os.environ["TZ"] = before
        time.tzset()


@pytest.fixture
def journal_dir(tmp_path: Path, kathmandu: None) -> Path:
    """A run parked for approval twice (two attempts), its moments set to known ones."""
    location = tmp_path / "journal"
    journal = DiskJournal(location)

    def handler(ctx: Any) -> None:
        if ctx.approval("send_email", {"to": "ana@example.com"}).approved:
            ctx.run("send", lambda: "sent")

    for _ in range(2):
        assert dn.execute("weather", handler, title="Weather report", journal=journal,
                          on_approval="park") is None
    record = journal.get_run("weather")
    assert len(record.attempts) == 2
    record.created_at = CREATED
    record.attempts[0]["started_at"] = FIRST_ATTEMPT
    record.attempts[0]["ended_at"] = FIRST_ATTEMPT + 1
    record.attempts[1]["started_at"] = SECOND_ATTEMPT
    record.pending_approval["requested_at"] = ASKED
    journal.put_run(record)
    journal.close()
    return location


def _updated(journal_dir: Path) -> str:
    """When the run was last written (the journal stamps it: not one of the known moments)."""
    journal = DiskJournal(journal_dir, read_only=True)
    try:
        updated = journal.get_run("weather").updated_at
        return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(updated))
    finally:
        journal.close()


def _dates(text: str) -> list[str]:
    return DATE_LIKE.findall(text)


def _assert_one_format(text: str, expected: list[str], where: str) -> None:
    """``text`` shows each of ``expected`` and every date-like part of it is canonical."""
    for moment in expected:
        assert moment in text, f"{where} does not show {moment}:\n{text}"
    odd = [found for found in _dates(text) if not CANONICAL.fullmatch(found)]
    assert not odd, f"{where} writes dates in another format: {odd}\n{text}"


def _cli(journal_dir: Path, *args: str) -> str:
    env = {**os.environ, "TZ": ZONE, "PYTHONPATH": str(Path(__file__).resolve().parents[1])}
    done = subprocess.run([sys.executable, "-m", "durable_nb.cli", "--journal", str(journal_dir),
                           *args], capture_output=True, text=True, env=env, timeout=120)
    assert done.returncode == 0, done.stderr
    return done.stdout


def test_the_cli_lists_and_shows_a_run_with_full_local_dates(journal_dir: Path) -> None:
    _assert_one_format(_cli(journal_dir, "runs"), [_updated(journal_dir)], "durable-nb runs")
    _assert_one_format(_cli(journal_dir, "show", "weather"),
                       [CREATED_TEXT, FIRST_ATTEMPT_TEXT, SECOND_ATTEMPT_TEXT], "durable-nb show")


def test_the_export_writes_local_dates_and_says_the_zone_once(journal_dir: Path,
                                                               tmp_path: Path) -> None:
    path = export_run("weather", tmp_path / "weather.ipynb", journal=str(journal_dir))
    cells = json.loads(path.read_text())["cells"]
    text = "\n".join("".join(cell["source"]) for cell in cells if cell["cell_type"] == "markdown")
    assert "(local time, UTC+05:45)" in text
    text = text.replace("UTC+05:45", "")  # the zone's offset is not a time of day
    _assert_one_format(text, [CREATED_TEXT, _updated(journal_dir), FIRST_ATTEMPT_TEXT,
                                              SECOND_ATTEMPT_TEXT], "the export")


def test_the_panel_and_its_saved_view_write_full_local_dates(journal_dir: Path) -> None:
    journal = DiskJournal(journal_dir, read_only=True)
    try:
        panel = RunPanel.load(get_run("weather", journal=journal), journal=journal)
        live = "\n".join([panel.header.value, panel.attempts.value, panel.stats.value,
                          panel.approval_text.value])
        saved = panel.static_html()
    finally:
        journal.close()
    expected = [ASKED_TEXT, FIRST_ATTEMPT_TEXT, SECOND_ATTEMPT_TEXT]
    _assert_one_format(live, expected, "the panel")
    # The saved view says when it was saved: today, in the same format.
    _assert_one_format(saved, [*expected, time.strftime("%Y-%m-%d")], "the saved view")
