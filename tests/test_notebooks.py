"""Every notebook in notebooks/ runs headless (nbclient, as CI or papermill would) in a fresh
working directory, offline, and shows what its text promises."""

from __future__ import annotations

import os
from collections import Counter
from pathlib import Path

import nbformat
import pytest
from nbclient import NotebookClient

from durable_nb import DiskJournal, Status

pytestmark = pytest.mark.kernel

REPO = Path(__file__).resolve().parents[1]
NOTEBOOKS = sorted((REPO / "notebooks").glob("*.ipynb"))
WIDGET_VIEW = "application/vnd.jupyter.widget-view+json"


@pytest.fixture
def offline(monkeypatch: pytest.MonkeyPatch) -> None:
    """The kernel inherits this environment: the bundled model server, not a real API."""
    for name in ("OPENAI_API_KEY", "OPENAI_BASE_URL", "DURABLE_NB_DIR"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(
        filter(None, [str(REPO), os.environ.get("PYTHONPATH")])))


def _run(name: str, workdir: Path) -> nbformat.NotebookNode:
    nb = nbformat.read(REPO / "notebooks" / name, as_version=4)
    NotebookClient(nb, timeout=120, kernel_name="python3", allow_errors=False,
                   resources={"metadata": {"path": str(workdir)}}).execute()
    return nb


def _cell(nb: nbformat.NotebookNode, starts: str, nth: int = 0) -> nbformat.NotebookNode:
    """The ``nth`` code cell whose source starts with ``starts``."""
    matches = [c for c in nb.cells if c.cell_type == "code" and c.source.startswith(starts)]
    assert len(matches) > nth, f"{len(matches)} cells start with {starts!r}"
    return matches[nth]


def _text(cell: nbformat.NotebookNode) -> str:
    """Everything the cell printed or returned, as text."""
    parts = []
    for out in cell.outputs:
        if out.output_type == "stream":
            parts.append(out.text)
        elif out.output_type in ("execute_result", "display_data"):
            parts.append(out.data.get("text/plain", ""))
    return "".join(parts)


def _has_panel(cell: nbformat.NotebookNode) -> bool:
    return any(WIDGET_VIEW in out.get("data", {}) for out in cell.outputs)


def _effects(workdir: Path) -> Counter:
    return Counter(line.split()[0] for line in
                   (workdir / "side_effects.log").read_text().splitlines())


ALL_TOOLS_ONCE = Counter(read_csv=1, analyse=1, write_report=1, send_email=1)


def test_every_notebook_has_a_test() -> None:
    assert [p.name for p in NOTEBOOKS] == ["approvals.ipynb", "crash_and_resume.ipynb",
                                           "quickstart.ipynb"]


def test_quickstart_runs_the_agent_to_done_after_approval(tmp_path: Path, offline) -> None:
    nb = _run("quickstart.ipynb", tmp_path)
    assert _text(_cell(nb, "%load_ext")) == ""  # no runs left behind in a fresh directory
    assert _text(_cell(nb, "from durable_nb.demo import make_tools")) == \
        "['read_csv', 'analyse', 'write_report', 'send_email']"
    assert _has_panel(_cell(nb, "%%durable_agent quickstart"))
    assert "The Q3 sales report is done" in _text(_cell(nb, "%durable wait quickstart"))
    shown = _text(_cell(nb, "%durable show quickstart"))
    assert "status     DONE" in shown and "iteration  5 / 10" in shown
    assert _effects(tmp_path) == ALL_TOOLS_ONCE
    record = DiskJournal(tmp_path / ".durable_nb").get_run("quickstart")
    assert record.status is Status.DONE and record.title == "Q3 sales report"


def test_crash_and_resume_repeats_no_tool_after_the_sigkill(tmp_path: Path, offline) -> None:
    nb = _run("crash_and_resume.ipynb", tmp_path)
    died = _text(_cell(nb, "import subprocess, sys"))
    assert "exit code: -9" in died and "executed  step 5: run write_report" in died
    assert "status     RUNNING" in _text(_cell(nb, "%durable show sales-report", 0))
    assert _has_panel(_cell(nb, "%%durable_agent sales-report"))
    assert "The Q3 sales report is done" in _text(_cell(nb, "%durable wait sales-report"))
    assert _text(_cell(nb, "from collections import Counter")) == \
        "Counter({'read_csv': 1, 'analyse': 1, 'write_report': 1, 'send_email': 1})"
    assert "status     DONE" in _text(_cell(nb, "%durable show sales-report", 1))
    assert _effects(tmp_path) == ALL_TOOLS_ONCE
    assert len(list((tmp_path / "outbox").iterdir())) == 1


def test_approvals_notebook_shows_approval_rejection_and_timeout(tmp_path: Path,
                                                                 offline) -> None:
    nb = _run("approvals.ipynb", tmp_path)
    assert "approved run refund-42 (by lead)" in _text(_cell(nb, "import subprocess, sys"))
    assert _text(_cell(nb, "%durable wait refund-42")) == "'refunded 180.0 (key refund-42:2)'"
    assert "rejected run delete-table" in _text(_cell(nb, "%durable reject delete-table"))
    assert _text(_cell(nb, "%durable wait delete-table")).startswith(
        "'kept the table: not today (decided by ")
    assert _text(_cell(nb, "%durable wait nobody-home")) == \
        "(False, 'timeout', 'no decision within 1 s')"
    runs = _text(_cell(nb, "%durable runs"))
    for run_id in ("refund-42", "delete-table", "nobody-home"):
        assert any(line.startswith(run_id) and "DONE" in line for line in runs.splitlines())
