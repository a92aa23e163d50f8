"""A quiet server (issue 35): a journal in the server's index that cannot be opened (here a
PostgreSQL journal while psycopg cannot be imported) is reported in the server's log once,
not at every sweep of the notification sweeper; a journal that failed and opened again is
reported again when it next fails."""

from __future__ import annotations

import logging
import sys
import uuid
from pathlib import Path

import pytest

pytest.importorskip("durable_nb.server", reason="durable_nb.server is missing")

from durable_nb.journal.index import record_opened  # noqa: E402
from durable_nb.server.notify import sweep_allowed  # noqa: E402


@pytest.fixture
def index_with(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    """A journal index of its own, listing what the test records, and no journal from the
    environment."""
    monkeypatch.setenv("DURABLE_NB_INDEX", str(tmp_path / "index"))
    monkeypatch.delenv("DURABLE_NB_JOURNAL", raising=False)
    monkeypatch.delenv("DURABLE_NB_DIR", raising=False)
    return record_opened


def _warnings(caplog: pytest.LogCaptureFixture, text: str) -> list[str]:
    return [r.getMessage() for r in caplog.records
            if r.name == "durable_nb.server" and r.levelno == logging.WARNING
            and text in r.getMessage()]


def test_a_journal_that_cannot_be_opened_is_logged_once_over_several_sweeps(
    index_with, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    url = f"postgresql://dnb@127.0.0.1:9/quiet_{uuid.uuid4().hex[:8]}"
    index_with(url)
    monkeypatch.setitem(sys.modules, "psycopg", None)  # `import psycopg` fails: not installed
    caplog.set_level(logging.WARNING, logger="durable_nb.server")

    for _ in range(4):
        sweep_allowed()

    said = _warnings(caplog, "needs psycopg 3")
    assert len(said) == 1, said
    assert url.rpartition("/")[2] in said[0]
