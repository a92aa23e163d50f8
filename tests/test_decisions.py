"""A decision is written once, everywhere alike (issue 25, item 2).

Every path that decides an approval (``durable-nb approve/reject``, ``durable_nb.approve``,
a run's panel, a batch's Approve all, the Jupyter server) goes through one atomic write-once
in the journal: a second decision on the same request is refused, naming who decided, how
and when, and the first one stands and is the one the run goes on with. ``--replace`` /
``replace=True`` changes a decision the run has not taken yet, and the run's history keeps
both; one the run took never changes. Real parts: the ``durable-nb`` command in child
processes, a real diskcache journal, a real PostgreSQL server for processes racing, a real
IPython kernel for ``%load_ext``.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

import durable_nb as dn
from durable_nb import Status
from durable_nb.execution import attempts
from durable_nb.approvals.request import find_decision
from durable_nb.export import export_run
from durable_nb.notebook.panel import RunPanel
from tests.test_approvals import _drop

REPO = Path(__file__).resolve().parents[1]
_ENV = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO),
                                                                   os.environ.get("PYTHONPATH")]))}
_WHEN = r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d"


def _cli(location: str, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "durable_nb.cli", "--journal", location,
                           *args], capture_output=True, text=True, timeout=120, env=_ENV)


def _park(journal, run_id: str = "r", db: str = "staging", dropped: list | None = None) -> dict:
    assert dn.execute(run_id, _drop(db, [] if dropped is None else dropped), journal=journal,
                      on_approval="park") is None
    return journal.get_run(run_id).pending_approval


# -- the CLI -------------------------------------------------------------------------------------

def test_a_second_decision_from_the_cli_is_refused_and_the_run_goes_on_with_the_first(journal):
    dropped: list[str] = []
    pending = _park(journal, dropped=dropped)
    where = str(journal.directory)
    first = _cli(where, "approve", "r", "looks fine", "--by", "ana")
    assert first.returncode == 0, first.stderr

    for verb in ("reject", "approve"):
        again = _cli(where, verb, "r", "no!", "--by", "bo")
        assert again.returncode == 1 and again.stdout == ""
        (line,) = again.stderr.strip().splitlines()  # one line
        assert re.fullmatch(
            rf"durable-nb: error: run 'r': 'drop database' was already approved by ana via "
            rf"durable-nb at {_WHEN}; nothing was changed\. To change it before the run takes "
            rf"it, decide again with --replace \(replace=True in Python\)\.", line), line

    decision = find_decision(journal, "r", pending)
    assert (decision["approved"], decision["by"], decision["note"], decision["via"]) == \
        (True, "ana", "looks fine", "durable-nb")
    assert dn.execute("r", _drop("staging", dropped), journal=journal) == "dropped staging"
    assert dropped == ["staging"]


def test_the_runs_history_shows_the_decision_and_the_refused_second_one(journal):
    _park(journal)
    where = str(journal.directory)
    assert _cli(where, "approve", "r", "--by", "ana").returncode == 0
    assert _cli(where, "reject", "r", "--by", "bo").returncode == 1
    kinds = [(e["kind"], e["by"], e["via"]) for e in journal.events("r")]
    assert kinds == [("decided", "ana", "durable-nb"), ("refused", "bo", "durable-nb")]
    shown = _cli(where, "show", "r").stdout
    assert re.search(rf"{_WHEN} decided +approved by ana via durable-nb", shown), shown
    # One sentence: who tried what, refused, and why (issue 41).
    assert re.search(rf"{_WHEN} refused +a decision by bo via durable-nb to reject was "
                     rf"refused: the request was already approved by ana via durable-nb at "
                     rf"{_WHEN}\n", shown), shown
    export = journal.directory.parent / "r.ipynb"
    export_run("r", str(export), journal=journal)
    assert "**refused**: a decision by bo via durable-nb to reject was refused" in \
        export.read_text()


def test_a_decision_from_the_notebook_panel_is_not_replaced_by_the_cli(journal):
    """What the issue saw: approved in the notebook, then `durable-nb reject` flipped it."""
    from durable_nb.notebook.session import NotebookRun
    from durable_nb.options import RunOptions

    dropped: list[str] = []
    pending = _park(journal, dropped=dropped)
    cell = NotebookRun("r", _drop("staging", dropped), RunOptions(on_approval="park"), journal)
    cell.panel.on_record(journal.get_run("r"))
    cell.panel.approve_button.click()  # the panel's own button, through the cell's decide
    assert find_decision(journal, "r", pending)["via"] == "panel"

    refused = _cli(str(journal.directory), "reject", "r", "--by", "bo")
    assert refused.returncode == 1
    assert re.search(rf"'drop database' was already approved by \S+ \(notebook\) via panel at "
                     rf"{_WHEN}; nothing was changed", refused.stderr), refused.stderr
    assert find_decision(journal, "r", pending)["approved"] is True
    assert dn.execute("r", _drop("staging", dropped), journal=journal) == "dropped staging"


def test_another_panel_on_a_decided_request_shows_the_decision_not_live_buttons(journal):
    pending = _park(journal)
    decided: list = []

    def decide(approved: bool, note: str, digest: str | None, request_id: str | None) -> None:
        decided.append(approved)
        (dn.approve if approved else dn.reject)("r", note, expect=digest,
                                                 request_id=request_id, via="panel",
                                                 journal=journal)

    # Drawn before the decision: live buttons. Then the request is decided in a terminal.
    panel = RunPanel(journal.get_run("r"), on_decide=decide)
    assert panel.approval_buttons.layout.display == "flex"
    assert _cli(str(journal.directory), "approve", "r", "--by", "ana").returncode == 0
    panel.reject_button.click()
    assert decided == [False]  # tried, and refused
    assert find_decision(journal, "r", pending)["approved"] is True
    shown = panel.approval_text.value
    assert "<b>Approved</b> by ana via durable-nb at" in shown
    assert panel.approval_buttons.layout.display == "none"
    assert panel.approve_button.disabled and panel.reject_button.disabled
    # A panel drawn with the journal after the decision never offers the buttons at all.
    fresh = RunPanel(journal.get_run("r"), journal=journal)
    assert fresh.approval_buttons.layout.display == "none"
    assert "<b>Approved</b> by ana via durable-nb" in fresh.approval_text.value


# -- replace, and a decision taken ---------------------------------------------------------------

def test_replace_changes_a_decision_not_yet_taken_and_the_history_keeps_both(journal):
    dropped: list[str] = []
    _park(journal, dropped=dropped)
    where = str(journal.directory)
    assert _cli(where, "approve", "r", "--by", "ana").returncode == 0
    replaced = _cli(where, "reject", "r", "not today", "--by", "bo", "--replace")
    assert replaced.returncode == 0, replaced.stderr
    assert "rejected run r (by bo, replacing approved by ana via durable-nb at" in \
        replaced.stdout

    waiting = _cli(where, "show", "r").stdout
    assert re.search(rf"status     WAITING_APPROVAL: rejected by bo via durable-nb at {_WHEN} "
                     rf"\('not today'\) \(replacing approved by ana via durable-nb at {_WHEN}\), "
                     rf"waiting for the run to resume", waiting), waiting

    assert dn.execute("r", _drop("staging", dropped), journal=journal) == "kept"
    assert dropped == []
    step = next(e for e in journal.steps("r") if e.kind == "approval")
    assert (step.result["approved"], step.result["by"], step.result["via"]) == \
        (False, "bo", "durable-nb")
    assert [(d["approved"], d["by"], d["via"]) for d in step.meta["replaced"]] == \
        [(True, "ana", "durable-nb")]
    shown = _cli(where, "show", "r").stdout
    assert re.search(rf"approval drop database .* rejected by bo via durable-nb at {_WHEN} "
                     rf"\('not today'\) \(replacing approved by ana via durable-nb at {_WHEN}\) "
                     r"\(details digest", shown), shown
    assert re.search(rf"took 'drop database' rejected by bo via durable-nb at {_WHEN} "
                     rf"\(replacing approved by ana via durable-nb at {_WHEN}\)", shown), shown
    taken = journal.get_run("r").attempts[-1]["decisions"]
    assert [(d["by"], [r["by"] for r in d["replaced"]]) for d in taken] == [("bo", ["ana"])]
    exported = Path(export_run("r", journal.directory.parent / "r.ipynb", journal=journal))
    text = exported.read_text()
    assert "rejected by bo via durable-nb: not today" in text
    assert "Replacing: approved by ana via durable-nb" in text


def test_a_decision_the_run_took_never_changes(journal):
    def two_approvals(ctx):
        first = ctx.approval("deploy", {"env": "staging"}).approved
        second = ctx.approval("announce", {"to": "all"}).approved
        return [first, second]

    dn.execute("r", two_approvals, journal=journal, on_approval="park")
    deploy = journal.get_run("r").pending_approval
    dn.approve("r", by="ana", journal=journal)
    dn.execute("r", two_approvals, journal=journal, on_approval="park")  # took it, parks again
    assert journal.get_run("r").pending_approval["name"] == "announce"
    where = str(journal.directory)

    late = _cli(where, "reject", "r", "--replace", "--expect", deploy["digest"][:12])
    assert late.returncode == 1
    assert re.fullmatch(
        rf"durable-nb: error: run 'r': 'deploy' was already approved by ana via Python at "
        rf"{_WHEN}; the run has taken that decision and went on, so it can never change\. "
        rf"Nothing was changed\.\n", late.stderr), late.stderr
    with pytest.raises(dn.DecisionExists, match="can never change") as info:
        dn.reject("r", expect=deploy["digest"], replace=True, journal=journal)
    assert info.value.taken and info.value.decision["by"] == "ana"
    assert isinstance(info.value, dn.NoPendingApproval)

    dn.approve("r", by="ana", journal=journal)
    assert dn.execute("r", two_approvals, journal=journal) == [True, True]
    done = _cli(where, "approve", "r", "--replace")
    assert done.returncode == 1 and "'announce' was already approved by ana" in done.stderr
    assert "can never change" in done.stderr


def test_the_python_api_refuses_a_second_decision_and_replace_changes_it(journal):
    pending = _park(journal)
    dn.approve("r", "ok", by="ana", journal=journal)
    with pytest.raises(dn.DecisionExists) as info:
        dn.reject("r", by="bo", journal=journal)
    assert not info.value.taken
    assert info.value.decision["by"] == "ana" and info.value.words == \
        "approved by ana via Python"
    assert dn.reject("r", "changed", by="bo", replace=True, journal=journal).approved is False
    now = find_decision(journal, "r", pending)
    assert (now["by"], [d["by"] for d in now["replaced"]]) == ("bo", ["ana"])


# -- processes racing ------------------------------------------------------------------------------

_RACER = """
import pathlib, sys, time
import durable_nb as dn
url, go, who = sys.argv[1], pathlib.Path(sys.argv[2]), sys.argv[3]
journal = dn.open_journal(url)
journal.get_run("r")  # connected, and the run read: ready to race
print("ready", flush=True)
while not go.exists():
    time.sleep(0.001)
decide = dn.approve if int(who) % 2 else dn.reject
try:
    decide("r", by=f"racer {who}", via="race", journal=journal)
    print("won", flush=True)
except dn.DecisionExists as exc:
    print("refused:", exc, flush=True)
"""


@pytest.mark.postgres
def test_processes_racing_to_decide_on_postgresql_exactly_one_wins(postgres_server, tmp_path):
    url = f"{postgres_server.url}?schema=race_{uuid.uuid4().hex[:10]}"
    journal = dn.open_journal(url)
    dropped: list[str] = []
    pending = _park(journal, dropped=dropped)
    go = tmp_path / "go"
    racers = [subprocess.Popen([sys.executable, "-c", _RACER, url, str(go), str(i)],
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                               env=_ENV) for i in range(6)]
    for racer in racers:
        assert racer.stdout.readline().strip() == "ready", racer.stderr.read()
    go.touch()
    said = [racer.communicate(timeout=120)[0].strip() for racer in racers]
    assert [r.returncode for r in racers] == [0] * 6, said
    winners = [i for i, s in enumerate(said) if s == "won"]
    assert len(winners) == 1, said
    winner = winners[0]
    decision = find_decision(journal, "r", pending)
    assert decision["by"] == f"racer {winner}"
    verdict = "approved" if winner % 2 else "rejected"
    for text in (s for i, s in enumerate(said) if i != winner):
        assert re.search(rf"refused: run 'r': 'drop database' was already {verdict} by racer "
                         rf"{winner} via race at ", text), text
    expected = "dropped staging" if winner % 2 else "kept"
    assert dn.execute("r", _drop("staging", dropped), journal=journal) == expected


# -- what other views show -------------------------------------------------------------------------

def test_the_saved_view_of_a_request_decided_elsewhere_shows_the_decision(journal):
    _park(journal)
    panel = RunPanel(journal.get_run("r"), journal=journal)  # drawn while it was undecided
    assert "dnb-decide-here" in panel.static_html()
    assert _cli(str(journal.directory), "reject", "r", "too risky", "--by", "ana").returncode == 0
    saved = panel.static_html()
    assert "dnb-decide-here" not in saved and "Approve and Reject do nothing here" not in saved
    assert re.search(rf"<b>Rejected</b> by ana via durable-nb at {_WHEN}: &ldquo;too "
                     r"risky&rdquo;\. The run goes on with this decision when it resumes", saved)
    assert "rejected by ana via durable-nb; re-run its cell to continue" in panel.summary()


def test_an_edit_that_replaces_an_undecided_request_says_no_decision_was_given(journal):
    _park(journal, db="staging")
    _park(journal, db="production")  # the cell edited before anyone decided
    shown = _cli(str(journal.directory), "show", "r").stdout
    assert "the request at this step changed since it was shown: it was 'drop database'" \
        in shown and "decision given" not in shown
    html = RunPanel(journal.get_run("r"), journal=journal).approval_text.value
    assert "changed</b> since it was shown" in html and "decision given" not in html
    # ... while one that replaces a decided request says which decision is not applied.
    dn.approve("r", by="ana", journal=journal)
    _park(journal, db="test")
    shown = _cli(str(journal.directory), "show", "r").stdout
    assert re.search(r"the request at this step changed: the decision given for 'drop "
                     r"database' \(db: production, details digest \w+\) \(approved by ana via "
                     r"Python\) "
                     r"is not applied to it", shown), shown


def test_an_attempt_after_a_park_without_a_decision_is_not_resumed_after_the_approval(journal):
    _park(journal)
    _park(journal)  # executed again (the cell re-run), nobody decided: parks again
    record = journal.get_run("r")
    assert attempts.resumed_words(record) == \
        "attempt 2: executed again while its approval waited for a decision at step 0"
    dn.approve("r", by="ana", journal=journal)
    assert dn.execute("r", _drop("staging", []), journal=journal) == "dropped staging"
    assert attempts.resumed_words(journal.get_run("r")) == \
        "attempt 3: resumed after the approval at step 0"


@pytest.mark.kernel
def test_load_ext_lists_a_run_decided_elsewhere_as_decided(tmp_path):
    from tests.harness import start_kernel

    journal = dn.DiskJournal(tmp_path / ".durable_nb")
    _park(journal)
    assert _cli(str(journal.directory), "approve", "r", "--by", "ana").returncode == 0
    with start_kernel(tmp_path, env={"PYTHONPATH": _ENV["PYTHONPATH"]}) as k:
        listed = k.execute("%load_ext durable_nb").raise_for_error().stdout
    assert "r: 'drop database' approved by ana via durable-nb, re-run its cell to continue" \
        in listed, listed
    assert journal.get_run("r").status is Status.WAITING_APPROVAL


def test_a_timeout_decides_once_like_anyone_and_a_late_decision_is_refused(journal):
    def short_wait(ctx):
        return ctx.approval("deploy", {"env": "prod"}, timeout=0.2).approved

    assert dn.execute("t", short_wait, journal=journal) is False  # waited, timed out
    late = _cli(str(journal.directory), "approve", "t", "--by", "ana", "--replace")
    assert late.returncode == 1
    assert re.search(rf"'deploy' was already rejected by timeout via timeout at {_WHEN}; the "
                     rf"run has taken that decision", late.stderr), late.stderr


def test_run_all_stops_for_a_decision_only_until_one_is_given(journal):
    from durable_nb.errors import DecisionNeeded
    from durable_nb.notebook.session import stop_for_decision

    _park(journal)
    with pytest.raises(DecisionNeeded, match="waits for your decision on 'drop database'"):
        stop_for_decision("r", journal=journal)
    assert _cli(str(journal.directory), "approve", "r", "--by", "ana").returncode == 0
    stop_for_decision("r", journal=journal)  # decided: Run All goes on
