"""Every notebook in notebooks/ runs headless (nbclient, as CI or papermill would), offline,
shows what its text promises, and keeps it whatever the order: Run All twice in one kernel,
Restart and Run All, Restart and Run All while an approval waits, two notebooks one after the
other in the same folder. Each notebook works in a folder of its own (``work/NAME`` beside
it), so "every tool ran once" stays true."""

from __future__ import annotations

import os
import re
from collections import Counter
from pathlib import Path
from typing import Any

import nbformat
import pytest
from nbclient import NotebookClient
from nbclient.exceptions import CellExecutionError

import durable_nb
from durable_nb import DiskJournal, Status
from durable_nb.testing import LoopbackServer

pytestmark = pytest.mark.kernel

REPO = Path(__file__).resolve().parents[1]
NOTEBOOKS = sorted((REPO / "notebooks").glob("*.ipynb"))
NAMES = [p.stem for p in NOTEBOOKS]
WIDGET_VIEW = "application/vnd.jupyter.widget-view+json"
ALL_TOOLS_ONCE = Counter(read_csv=1, analyse=1, write_report=1, send_email=1)
#: What each notebook's tools did, once each, however often and in whatever order it ran.
EFFECTS = {"quickstart": ALL_TOOLS_ONCE, "crash_and_resume": ALL_TOOLS_ONCE,
           "batch": Counter(send_reply=12), "notifications": ALL_TOOLS_ONCE,
           "openai_agents": Counter(get_weather=1, send_message=1),
           "pydantic_ai": Counter(get_weather=1, send_message=1),
           "mcp": Counter(count_rows=1, delete_rows=1),
           "langgraph": Counter(get_weather=1, send_message=1)}
TICKETS = [f"T-{n}" for n in range(101, 113)]


@pytest.fixture
def offline(monkeypatch: pytest.MonkeyPatch) -> None:
    """The kernel inherits this environment: no API key, so the bundled model server."""
    for name in ("OPENAI_API_KEY", "OPENAI_BASE_URL", "DURABLE_NB_DIR", "DURABLE_NB_JOURNAL",
                 "DURABLE_NB_MODEL", "DURABLE_NB_OFFLINE"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(
        filter(None, [str(REPO), os.environ.get("PYTHONPATH")])))


def _client(nb: nbformat.NotebookNode, folder: Path) -> NotebookClient:
    return NotebookClient(nb, timeout=120, kernel_name="python3", allow_errors=False,
                          resources={"metadata": {"path": str(folder)}})


#: The parameters a headless run gives (papermill's -p), by notebook.
HEADLESS = {"approvals": 'AUTO_DECIDE = "approve"'}


def _read(name: str, headless: bool = True) -> nbformat.NotebookNode:
    """The notebook; ``headless``: with its HEADLESS parameters injected after its
    ``parameters`` cell, as papermill does."""
    nb = nbformat.read(REPO / "notebooks" / f"{name}.ipynb", as_version=4)
    if headless and name in HEADLESS:
        tagged = [i for i, c in enumerate(nb.cells)
                  if "parameters" in c.metadata.get("tags", [])]
        assert len(tagged) == 1, f"{name} has {len(tagged)} parameters cells"
        injected = nbformat.v4.new_code_cell(HEADLESS[name])
        injected.metadata["tags"] = ["injected-parameters"]
        nb.cells.insert(tagged[0] + 1, injected)
    return nb


def _run(name: str, folder: Path) -> nbformat.NotebookNode:
    """Run All in a new kernel (a first run, or Restart and Run All)."""
    nb = _read(name)
    _client(nb, folder).execute()
    return nb


def _run_all_twice(name: str, folder: Path) -> tuple[list[dict], nbformat.NotebookNode]:
    """Run All, then Run All again in the same kernel: (the first pass's outputs by cell,
    the notebook after the second pass)."""
    nb = _read(name)
    client = _client(nb, folder)
    with client.setup_kernel():
        for index, cell in enumerate(nb.cells):
            client.execute_cell(cell, index)
        first = [nbformat.from_dict(dict(c)) for c in nb.cells]
        for index, cell in enumerate(nb.cells):
            client.execute_cell(cell, index)
    return first, nb


def _cell(nb: Any, starts: str, nth: int = 0) -> nbformat.NotebookNode:
    """The ``nth`` code cell whose source starts with ``starts``."""
    cells = nb.cells if hasattr(nb, "cells") else nb
    matches = [c for c in cells if c.cell_type == "code" and c.source.startswith(starts)]
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


def _saved_view(cell: nbformat.NotebookNode) -> str:
    """The HTML of the panel's saved view (what a notebook reopened without its kernel shows),
    the output right after the panel's."""
    views = [out.data["text/html"] for out in cell.outputs
             if "dnb-saved" in out.get("data", {}).get("text/html", "")]
    assert len(views) == 1, f"{len(views)} saved views"
    panel = [i for i, out in enumerate(cell.outputs) if WIDGET_VIEW in out.get("data", {})]
    assert cell.outputs[panel[0] + 1].data["text/html"] == views[0]
    return views[0]


def _has_panel(cell: nbformat.NotebookNode) -> bool:
    return any(WIDGET_VIEW in out.get("data", {}) for out in cell.outputs)


def _work(folder: Path, name: str) -> Path:
    return folder / "work" / name


def _effects(workdir: Path) -> Counter:
    return Counter(line.split()[0] for line in
                   (workdir / "side_effects.log").read_text().splitlines())


def test_every_notebook_has_a_test() -> None:
    assert NAMES == ["approvals", "batch", "crash_and_resume", "langgraph", "mcp", "notifications",
                     "openai_agents", "pydantic_ai", "quickstart"]


@pytest.mark.parametrize("name", NAMES)
def test_every_notebook_says_first_how_every_kernel_gets_the_magic(name: str) -> None:
    """Forgetting ``%load_ext durable_nb`` gives IPython's bare "Cell magic not found": the
    first cell says what the magic needs and the one command that puts it in every kernel."""
    first = _read(name, headless=False).cells[0]
    assert first.cell_type == "markdown"
    assert "`%load_ext durable_nb`" in first.source
    assert "`durable-nb enable`" in first.source and "`durable-nb enable --undo`" in first.source


def test_quickstart_runs_the_agent_to_done_after_approval(tmp_path: Path, offline) -> None:
    nb = _run("quickstart", tmp_path)
    work = _work(tmp_path, "quickstart")
    assert _text(_cell(nb, "import os")) == f"model: loopback-1 (offline); working in {work}\n"
    assert _text(_cell(nb, "%load_ext")) == ""  # no runs left behind in a fresh directory
    assert _text(_cell(nb, "from durable_nb.demo import make_tools")) == \
        "['read_csv', 'analyse', 'write_report', 'send_email']"
    agent = _cell(nb, "%%durable_agent quickstart")
    assert _has_panel(agent)
    # The panel's text fallback (what nbconvert and papermill keep) tells how the run ended.
    summary = _text(agent)
    assert summary.startswith("durable run quickstart (Q3 sales report): DONE\n"), summary
    assert "result: The Q3 sales report is done" in summary
    saved = _saved_view(agent)  # what the notebook shows reopened without its kernel
    assert "DONE" in saved and "The Q3 sales report is done" in saved and "approved" in saved
    assert "The Q3 sales report is done" in _text(_cell(nb, "%durable wait quickstart"))
    shown = _text(_cell(nb, "%durable show quickstart"))
    assert "status     DONE" in shown and "iteration  5 / 10" in shown
    assert _effects(work) == ALL_TOOLS_ONCE
    record = DiskJournal(work / ".durable_nb").get_run("quickstart")
    assert record.status is Status.DONE and record.title == "Q3 sales report"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["work"]  # nothing outside work/


def test_notifications_notebook_shows_the_signed_webhook_the_email_and_its_link(
        tmp_path: Path, offline, monkeypatch: pytest.MonkeyPatch) -> None:
    """Under the documented install (``durable-nb[lab]``: no aiosmtpd, which the kernel here
    cannot import), with a Jupyter server named for the links as a deployment's config
    would."""
    blocked = tmp_path / "no-aiosmtpd"
    (blocked / "aiosmtpd").mkdir(parents=True)
    (blocked / "aiosmtpd" / "__init__.py").write_text(
        "raise ModuleNotFoundError(\"No module named 'aiosmtpd'\", name='aiosmtpd')\n")
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(blocked), os.environ["PYTHONPATH"]]))
    monkeypatch.setenv("DURABLE_NB_NOTIFY_LINK_BASE_URL", "http://127.0.0.1:8888/")
    (tmp_path / "nb").mkdir()
    nb = _run("notifications", tmp_path / "nb")
    work = _work(tmp_path / "nb", "notifications")
    shown = _text(_cell(nb, "import json"))
    assert shown.startswith("webhook: signature verified, delivery notify-demo/"), shown
    assert '"name": "send_email"' in shown and "team@example.com" in shown
    assert re.search(r"decision link for the webhook: "
                     r"http://127\.0\.0\.1:8888/durable-nb/decide#\S+", shown), shown
    assert "e-mail to oncall@example.org: Approval needed: send_email (run notify-demo)" in shown
    assert "<email.message" not in shown
    assert "Run notify-demo waits for a decision on send_email." in shown
    assert re.search(r"decides once, as oncall@example.org\):\n"
                     r"http://127\.0\.0\.1:8888/durable-nb/decide#\S+", shown), shown
    history = _text(_cell(nb, "%durable show notify-demo"))
    assert "notified   2 deliveries" in history
    assert "webhook  sent" in history and "email    sent" in history
    assert "The Q3 sales report is done" in _text(_cell(nb, "%durable wait notify-demo"))
    assert _effects(work) == ALL_TOOLS_ONCE
    rows = DiskJournal(work / ".durable_nb").deliveries("notify-demo")
    assert sorted(r["state"] for r in rows.values()) == ["sent", "sent"]


def test_crash_and_resume_repeats_no_tool_after_the_sigkill(tmp_path: Path, offline) -> None:
    nb = _run("crash_and_resume", tmp_path)
    work = _work(tmp_path, "crash_and_resume")
    died = _text(_cell(nb, "import subprocess, sys"))
    assert "exit code: -9" in died and "executed  step 5: run write_report" in died
    assert "status     INTERRUPTED" in _text(_cell(nb, "%durable show sales-report", 0))
    assert _has_panel(_cell(nb, "%%durable_agent sales-report"))
    assert "The Q3 sales report is done" in _text(_cell(nb, "%durable wait sales-report"))
    assert _text(_cell(nb, "from collections import Counter")) == \
        "Counter({'read_csv': 1, 'analyse': 1, 'write_report': 1, 'send_email': 1})"
    assert "status     DONE" in _text(_cell(nb, "%durable show sales-report", 1))
    assert _effects(work) == ALL_TOOLS_ONCE
    assert len(list((work / "outbox").iterdir())) == 1


def test_crash_and_resume_panel_counts_the_runs_steps_once_across_its_resumed_attempts(
        tmp_path: Path, offline) -> None:
    """The kernel's execution parks at the email and, approved, resumes in the same kernel,
    replaying every step again: the panel counts each of the run's steps once (replayed: got
    from the journal the killed process left; executed: run in this kernel), and the tokens
    it says were saved are those of the replayed steps, not of every replay added up."""
    nb = _run("crash_and_resume", tmp_path)
    journal = DiskJournal(_work(tmp_path, "crash_and_resume") / ".durable_nb")
    steps = list(journal.steps("sales-report"))
    died = journal.get_run("sales-report").attempts[0]
    assert died["end"] == "died" and len(steps) == 10
    replayed = [e for e in steps if e.position < died["at_step"]]
    executed = len(steps) - len(replayed)
    tokens = sum(e.tokens for e in replayed)
    assert 0 < tokens < sum(e.tokens for e in steps)
    panel = _text(_cell(nb, "%%durable_agent sales-report"))
    assert f"steps {len(replayed)} replayed, {executed} executed" in panel, panel
    assert f"{len(replayed)} steps replayed: {tokens:,} tokens\n" in panel, panel
    saved = _saved_view(_cell(nb, "%%durable_agent sales-report"))
    assert f"steps <b>{len(replayed)}</b> replayed, <b>{executed}</b> executed" in saved
    assert f"{len(replayed)} steps replayed: {tokens:,} tokens" in saved


@pytest.mark.parametrize("name,package", [("openai_agents", "agents"),
                                          ("pydantic_ai", "pydantic_ai")])
def test_framework_notebook_resumes_the_agent_with_each_tool_once(
        tmp_path: Path, offline, name: str, package: str) -> None:
    pytest.importorskip(package)
    first, nb = _run_all_twice(name, tmp_path)
    work = _work(tmp_path, name)
    assert "exit code: -9" in _text(_cell(first, "import subprocess, sys"))
    assert "status     INTERRUPTED" in _text(_cell(first, "%durable show weather", 0))
    assert "exit code: 0" in _text(_cell(nb, "import subprocess, sys"))
    for cells in (first, nb):
        assert "sunny in Tokyo" in _text(_cell(cells, "%durable wait weather"))
        assert _text(_cell(cells, "from collections import Counter")) == \
            "Counter({'get_weather': 1, 'send_message': 1})"
    lines = (work / "side_effects.log").read_text().splitlines()
    assert lines == ["get_weather Tokyo", "send_message team: It is sunny in Tokyo."]


def test_langgraph_notebook_resumes_the_react_agent_and_sends_the_edited_message_once(
        tmp_path: Path, offline) -> None:
    pytest.importorskip("langgraph")
    pytest.importorskip("langchain_openai")
    first, nb = _run_all_twice("langgraph", tmp_path)
    assert "exit code: -9" in _text(_cell(first, "import subprocess, sys"))
    assert "status     INTERRUPTED" in _text(_cell(first, "%durable show weather", 0))
    assert "exit code: 0" in _text(_cell(nb, "import subprocess, sys"))
    assert _has_panel(_cell(first, "%%durable_agent weather"))
    for cells in (first, nb):
        assert "sunny in Tokyo" in _text(_cell(cells, "%durable wait weather"))
        assert _text(_cell(cells, "from collections import Counter")) == \
            "Counter({'get_weather': 1, 'send_message': 1})"
    shown = _text(_cell(nb, "%durable show weather", 1))
    assert "status     DONE" in shown and "with edited arguments" in shown
    lines = (_work(tmp_path, "langgraph") / "side_effects.log").read_text().splitlines()
    assert lines == ["get_weather Tokyo",
                     "send_message team: It is sunny in Tokyo. Bring sunglasses."]


def test_mcp_notebook_runs_the_mcp_agent_with_each_tool_once_after_an_edited_approval(
        tmp_path: Path, offline) -> None:
    pytest.importorskip("mcp")
    first, nb = _run_all_twice("mcp", tmp_path)
    work = _work(tmp_path, "mcp")
    for cells in (first, nb):
        assert "orders has 1200 rows; I emptied orders_tmp." in _text(
            _cell(cells, "%durable wait warehouse"))
        assert _text(_cell(cells, "from collections import Counter")) == \
            "Counter({'count_rows': 1, 'delete_rows': 1})"
    assert _has_panel(_cell(first, "%%durable_agent warehouse"))
    shown = _text(_cell(nb, "%durable show warehouse"))
    assert "status     DONE" in shown and "approval delete_rows" in shown
    assert "with edited arguments" in shown
    # the journaled step's id reached the server in the call's _meta
    steps = list(DiskJournal(work / ".durable_nb").steps("warehouse"))
    delete = next(e for e in steps if e.kind == "run" and e.name == "delete_rows")
    # the model asked for orders; the tool ran once, with the table the person gave
    asked = next(e for e in steps if e.kind == "approval")
    assert asked.result["args"] == {"table": "orders_tmp"}
    assert (work / "side_effects.log").read_text().splitlines() == [
        "count_rows orders", f"delete_rows orders_tmp (step warehouse:{delete.key})"]


# A package made unimportable by a sitecustomize on the kernel's PYTHONPATH (the kernel and
# the notebook's child process both inherit it): ``sys.modules[name] = None`` makes every
# import of it fail with ModuleNotFoundError, as in an environment without the extra; with
# ``only_in`` it fails only in a process whose script is that file.
_BLOCK = """\
import sys
class _Blocked:
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] == {package!r} and sys.argv[0].endswith({only_in!r}):
            raise ModuleNotFoundError(f"No module named {{name!r}}", name=name)
        return None
sys.meta_path.insert(0, _Blocked())
"""


def _without(monkeypatch: pytest.MonkeyPatch, folder: Path, package: str,
             only_in: str = "") -> None:
    site = folder / "site"
    site.mkdir()
    (site / "sitecustomize.py").write_text(_BLOCK.format(package=package, only_in=only_in))
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(site), os.environ["PYTHONPATH"]]))


def _error_of(nb: nbformat.NotebookNode) -> tuple[int, dict]:
    """The index of the cell that stopped Run All, and its error output."""
    for index, cell in enumerate(nb.cells):
        errors = [o for o in cell.get("outputs", []) if o.output_type == "error"]
        if errors:
            return index, errors[0]
    raise AssertionError("no cell failed")


@pytest.mark.parametrize("name,extra,package", [("openai_agents", "agents", "agents"),
                                                ("pydantic_ai", "pydantic-ai", "pydantic_ai"),
                                                ("mcp", "mcp", "mcp"),
                                                ("langgraph", "langgraph", "langgraph")])
def test_a_framework_notebook_without_its_extra_stops_first_saying_what_to_install(
        tmp_path: Path, offline, monkeypatch: pytest.MonkeyPatch, name: str, extra: str,
        package: str) -> None:
    _without(monkeypatch, tmp_path, package)
    nb = _read(name)
    with pytest.raises(CellExecutionError):
        _client(nb, tmp_path).execute()
    index, error = _error_of(nb)
    assert nb.cells[index].source.startswith("import os")  # the set-up cell, before any other
    assert error.ename == "MissingExtra"
    assert f'pip install "durable-nb[{extra}]"' in error.evalue
    assert len(error.traceback) == 1  # one line, no frames
    later = [c for c in nb.cells[index + 1:] if c.cell_type == "code"]
    assert all(not c.get("outputs") and c.get("execution_count") is None for c in later)


@pytest.mark.parametrize("name,package", [("openai_agents", "agents"),
                                          ("pydantic_ai", "pydantic_ai"),
                                          ("crash_and_resume", "durable_nb.demo")])
def test_a_child_process_that_fails_to_import_stops_the_notebook_with_its_error(
        tmp_path: Path, offline, monkeypatch: pytest.MonkeyPatch, name: str,
        package: str) -> None:
    """Never read as "the journal already held this run ... only replayed it"."""
    # crash_and_resume's child is `python -m durable_nb.demo`: its argv[0] is demo.py's path
    # once it runs, and its imports of durable_nb's modules from there fail.
    child = "demo.py" if name == "crash_and_resume" else "weather_agent.py"
    _without(monkeypatch, tmp_path, package.split(".")[0], only_in=child)
    nb = _read(name)
    with pytest.raises(CellExecutionError):
        _client(nb, tmp_path).execute()
    index, error = _error_of(nb)
    cell = nb.cells[index]
    assert cell.source.startswith("import subprocess, sys")
    assert error.ename == "RuntimeError" and "failed with exit code 1" in error.evalue
    assert "ModuleNotFoundError" in error.evalue
    assert "ModuleNotFoundError" in _text(cell)  # the child's own error, printed above
    assert "only replayed" not in _text(cell)


def test_approvals_notebook_shows_approval_rejection_and_timeout(tmp_path: Path,
                                                                 offline) -> None:
    nb = _run("approvals", tmp_path)
    assert "approved run refund-42 (by lead)" in _text(_cell(nb, "import subprocess, sys"))
    assert _text(_cell(nb, "%durable wait refund-42")) == "'refunded 180.0 (key refund-42:2)'"
    assert "rejected run delete-table" in _text(_cell(nb, "import durable_nb\n\nif"))
    assert _text(_cell(nb, "%durable wait delete-table")).startswith(
        "'kept the table: not today (decided by ")
    assert _text(_cell(nb, "%durable wait nobody-home")) == \
        "(False, 'timeout', 'no decision within 1 s')"
    runs = _text(_cell(nb, "%durable runs"))
    for run_id in ("refund-42", "delete-table", "nobody-home"):
        assert any(line.startswith(run_id) and "DONE" in line for line in runs.splitlines())
    assert (_work(tmp_path, "approvals") / ".durable_nb").is_dir()


def test_approvals_notebook_run_all_stops_at_the_approval_until_a_person_decides(
        tmp_path: Path, offline) -> None:
    """Run All as in JupyterLab (no parameter): it stops after the refund's cell, its panel
    waiting with the buttons, with one line saying what to do; after the click, Run All
    again goes through without an error."""
    nb = _read("approvals", headless=False)
    client = _client(nb, tmp_path)
    stop = nb.cells.index(_cell(nb, "import subprocess, sys"))
    with client.setup_kernel():
        for index, cell in enumerate(nb.cells[:stop]):
            client.execute_cell(cell, index)
        with pytest.raises(CellExecutionError) as stopped:
            client.execute_cell(nb.cells[stop], stop)
        agent = _cell(nb, "%%durable_agent refund-42")
        assert _has_panel(agent) and ": WAITING_APPROVAL\n" in _text(agent)
        saved = _saved_view(agent)
        assert "WAITING_APPROVAL" in saved and "Approval needed:</b> refund" in saved
        assert "durable-nb approve refund-42" in saved
        error = [o for o in nb.cells[stop].outputs if o.output_type == "error"]
        assert [(e.ename, e.traceback) for e in error] == [("DecisionNeeded", [
            "\x1b[0;33mDecisionNeeded\x1b[0m: run 'refund-42' waits for your decision on "
            "'refund': click Approve or Reject above, then run the next cell (or decide from a "
            "terminal: durable-nb approve refund-42)"])], stopped.value
        journal = DiskJournal(_work(tmp_path, "approvals") / ".durable_nb")
        durable_nb.approve("refund-42", "ok", by="ana", journal=journal)  # the click
        journal.close()
        for index, cell in enumerate(nb.cells):  # Run All again: no error, no stop
            client.execute_cell(cell, index)
    assert _text(_cell(nb, "import subprocess, sys")) == ""
    assert _text(_cell(nb, "%durable wait refund-42")) == "'refunded 180.0 (key refund-42:2)'"


def test_batch_notebook_sends_every_reply_once_and_the_refunds_after_approval(
        tmp_path: Path, offline) -> None:
    nb = _run("batch", tmp_path)
    work = _work(tmp_path, "batch")
    assert _text(_cell(nb, "import os")) == f"model: loopback-1 (offline); working in {work}\n"
    batch = _cell(nb, "%%durable_agent support")
    assert _has_panel(batch)
    # The cell ended with the refunds parked; `%durable batch wait` brought its value, its
    # text and its saved view up to date.
    assert batch.outputs[-1].data["text/plain"] == "<Batch 'support': 12 items (12 DONE)>"
    assert "12 / 12</b> done" in _saved_view(batch)
    summary = _text(batch)
    assert summary.startswith("durable batch support (support replies): DONE\n12 items: 12 DONE")
    assert _text(_cell(nb, "%durable batch wait")) == "<Batch 'support': 12 items (12 DONE)>"
    shown = _text(_cell(nb, "%durable batch show"))
    assert "items      12: 12 DONE" in shown and "showing 5 of 12 items" in shown
    assert "('T-103', 'DONE', True)" in _text(_cell(nb, "support = durable_nb.batch"))
    assert _text(_cell(nb, "from collections import Counter")) == "Counter({'send_reply': 12})"
    assert _text(_cell(nb, "%durable batch export")) == "wrote report.ipynb\n"
    nbformat.validate(nbformat.read(work / "report.ipynb", as_version=4))
    sent = (work / "side_effects.log").read_text().splitlines()
    assert sorted(sent) == [f"send_reply {t}" for t in TICKETS]
    journal = DiskJournal(work / ".durable_nb")
    for ticket in ("T-103", "T-108"):
        approval = [e for e in journal.steps(f"support/{ticket}") if e.kind == "approval"]
        assert len(approval) == 1 and approval[0].ok
    assert sorted(p.name for p in tmp_path.iterdir()) == ["work"]  # nothing outside work/


def test_restart_and_run_all_while_refunds_wait_never_hangs(tmp_path: Path, offline) -> None:
    nb = _read("batch")
    client = _client(nb, tmp_path)
    batch_index = nb.cells.index(_cell(nb, "%%durable_agent support"))
    with client.setup_kernel():  # a person ran the notebook up to the batch cell, and left
        for index, cell in enumerate(nb.cells[:batch_index + 1]):
            client.execute_cell(cell, index)
    work = _work(tmp_path, "batch")
    journal = DiskJournal(work / ".durable_nb")
    waiting = sorted(r.run_id for r in journal.list_runs("support/")
                     if r.status is Status.WAITING_APPROVAL)
    assert waiting == ["support/T-103", "support/T-108"]

    again = _run("batch", tmp_path)  # Restart and Run All
    assert _text(_cell(again, "%durable batch wait")) == "<Batch 'support': 12 items (12 DONE)>"
    assert _effects(work) == EFFECTS["batch"]


# -- any order -------------------------------------------------------------------------------

@pytest.mark.parametrize("name", NAMES)
def test_run_all_twice_in_one_kernel_replays_and_keeps_every_promise(tmp_path: Path, offline,
                                                                      name: str) -> None:
    first, nb = _run_all_twice(name, tmp_path)
    # The second pass changed nothing: the same results, the model chosen before the notebook
    # ran (not the key the first pass set), every tool still run once.
    for before, after in zip(first, nb.cells):
        if after.cell_type == "code" and after.source.startswith(("%durable wait", "Counter",
                                                                  "[t.name", "from collections")):
            assert _text(after) == _text(before), after.source
    if name != "approvals":
        assert "model: loopback-1 (offline)" in _text(_cell(nb, "import os"))
        assert _effects(_work(tmp_path, name)) == EFFECTS[name]
    agent = nb.cells[[i for i, c in enumerate(nb.cells)
                      if c.cell_type == "code" and c.source.startswith("%%durable_agent")][0]]
    assert ": DONE\n" in _text(agent)
    if name == "batch":  # every item answered from its record: nothing executed
        assert "replay: 12 items answered from the journal" in _text(agent)
    else:
        assert "replayed, 0 executed" in _text(agent)


@pytest.mark.parametrize("name", NAMES)
def test_restart_and_run_all_replays(tmp_path: Path, offline, name: str) -> None:
    _run(name, tmp_path)
    again = _run(name, tmp_path)  # a new kernel, the same folder
    if name != "approvals":
        assert _effects(_work(tmp_path, name)) == EFFECTS[name]
    if name == "crash_and_resume":
        assert "only replayed it" in _text(_cell(again, "import subprocess, sys"))
        assert _text(_cell(again, "from collections import Counter")) == \
            "Counter({'read_csv': 1, 'analyse': 1, 'write_report': 1, 'send_email': 1})"


def test_restart_and_run_all_while_the_email_waits_never_hangs(tmp_path: Path, offline) -> None:
    nb = _read("crash_and_resume")
    client = _client(nb, tmp_path)
    agent_index = nb.cells.index(_cell(nb, "%%durable_agent sales-report"))
    with client.setup_kernel():  # a person ran the notebook up to the agent cell, and left
        for index, cell in enumerate(nb.cells[:agent_index + 1]):
            client.execute_cell(cell, index)
    work = _work(tmp_path, "crash_and_resume")
    assert DiskJournal(work / ".durable_nb").get_run("sales-report").status \
        is Status.WAITING_APPROVAL

    again = _run("crash_and_resume", tmp_path)  # Restart and Run All
    assert "parked: the run waits for approval of 'send_email'" in \
        _text(_cell(again, "import subprocess, sys"))
    assert _text(_cell(again, "from collections import Counter")) == \
        "Counter({'read_csv': 1, 'analyse': 1, 'write_report': 1, 'send_email': 1})"


def test_two_notebooks_in_one_folder_keep_their_own_journal_and_effects(tmp_path: Path,
                                                                        offline) -> None:
    _run("quickstart", tmp_path)
    nb = _run("crash_and_resume", tmp_path)
    assert "exit code: -9" in _text(_cell(nb, "import subprocess, sys"))
    assert _text(_cell(nb, "from collections import Counter")) == \
        "Counter({'read_csv': 1, 'analyse': 1, 'write_report': 1, 'send_email': 1})"
    assert _effects(_work(tmp_path, "quickstart")) == ALL_TOOLS_ONCE
    assert DiskJournal(_work(tmp_path, "quickstart") / ".durable_nb").find_run(
        "sales-report") is None


def test_with_an_api_key_the_notebooks_use_the_configured_endpoint_on_every_pass(
        tmp_path: Path, offline, monkeypatch: pytest.MonkeyPatch) -> None:
    # "Real model" mode, with a local server standing in for the API: the key and endpoint
    # the environment had before the notebook ran decide it, on the second pass too.
    with LoopbackServer() as api:
        monkeypatch.setenv("OPENAI_API_KEY", "sk-test-not-a-real-key")
        monkeypatch.setenv("OPENAI_BASE_URL", api.url)
        monkeypatch.setenv("DURABLE_NB_MODEL", "loopback-1")
        _, nb = _run_all_twice("crash_and_resume", tmp_path)
        served = api.stats()["total"]
    assert "model: loopback-1 (real)" in _text(_cell(nb, "import os"))
    assert served > 0  # the notebook and its crashing child talked to that endpoint
    assert _effects(_work(tmp_path, "crash_and_resume")) == ALL_TOOLS_ONCE
