"""Who may approve (issue 27, item 3): a request's approvers' list and the four-eyes rule,
checked where every path decides (:func:`durable_nb.approvals.decide.decide`).

A person the request does not allow is refused with a short reason that says who may
decide, nothing is written, and the refusal is in the run's history. Real parts: the
``durable-nb`` command in child processes, a real diskcache journal, the real ``openai``
client over HTTP to the loopback server, the notebook panel's own buttons. The Jupyter
server's answer is in tests/test_approvers_server.py, JupyterLab's inbox in
tests/test_browser.py.
"""

from __future__ import annotations

import html
import os
import re
import subprocess
import sys
from pathlib import Path

import openai
import pytest

import durable_nb as dn
from durable_nb import NotAllowedToDecide, Status
from durable_nb.approvals.request import find_decision
from durable_nb.testing import LoopbackServer, Reply, ToolCall
from tests.test_approvals import _drop

REPO = Path(__file__).resolve().parents[1]
_WHEN = r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d"


def _cli(journal, *args: str, user: str | None = None) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    env.pop("DURABLE_NB_USER", None)
    if user is not None:
        env["DURABLE_NB_USER"] = user
    return subprocess.run([sys.executable, "-m", "durable_nb.cli", "--journal",
                           str(journal.directory), *args],
                          capture_output=True, text=True, timeout=120, env=env)


def _park(journal, run_id: str = "r", dropped: list | None = None, **options) -> dict:
    assert dn.execute(run_id, _drop("staging", [] if dropped is None else dropped),
                      journal=journal, on_approval="park", **options) is None
    return journal.get_run(run_id).pending_approval


@pytest.fixture(autouse=True)
def _starter(monkeypatch):
    """Runs in this process are started by cy."""
    monkeypatch.setenv("DURABLE_NB_USER", "cy")


# -- the approvers' list -----------------------------------------------------------------

def test_someone_not_on_the_list_is_refused_by_the_cli_with_one_line_and_nothing_written(
        journal):
    dropped: list[str] = []
    pending = _park(journal, dropped=dropped, approvers=["ana"])
    assert (pending["approvers"], pending["four_eyes"], pending["started_by"]) == \
        (["ana"], False, "cy")

    refused = _cli(journal, "approve", "r", "--by", "bo")
    assert refused.returncode == 1 and refused.stdout == ""
    (line,) = refused.stderr.strip().splitlines()
    assert line == ("durable-nb: error: run 'r': 'drop database' was not decided: bo is not on "
                    "its approvers' list; only ana may decide. Nothing was written."), line
    assert find_decision(journal, "r", pending) is None
    assert journal.get_run("r").status is Status.WAITING_APPROVAL

    shown = _cli(journal, "show", "r").stdout
    assert re.search(rf"{_WHEN} refused +a decision by bo via durable-nb to approve was "
                     rf"refused: bo is not on the approvers' list \(ana\)", shown), shown
    (event,) = journal.events("r")
    assert (event["kind"], event["by"], event["approvers"]) == ("refused", "bo", ["ana"])

    # The one on the list decides, named as the CLI names people: case does not matter.
    assert _cli(journal, "approve", "r", "--by", "ANA").returncode == 0
    assert dn.execute("r", _drop("staging", dropped), journal=journal) == "dropped staging"
    assert dropped == ["staging"]


def test_a_listed_name_stands_for_that_user_anywhere_and_an_email_only_for_itself(journal):
    _park(journal, approvers="ana, bo@example.com")
    for by in ("bo", "bo@other.org", "ana.b@example.com", "someone"):
        with pytest.raises(NotAllowedToDecide, match="only ana, bo@example.com may decide"):
            dn.approve("r", by=by, journal=journal)
    # The OS user ana on her laptop, and a panel's "ana (notebook)", are ana.
    for run_id, by in (("r2", "ana@laptop"), ("r3", "Ana (notebook)"),
                       ("r4", "BO@example.com")):
        _park(journal, run_id, approvers="ana, bo@example.com")
        assert dn.approve(run_id, by=by, journal=journal).by == by
    assert [e["kind"] for e in journal.events("r")] == ["refused"] * 4


def test_the_notebook_panels_button_shows_who_may_decide_and_the_refusal(journal, monkeypatch):
    from durable_nb.notebook.session import NotebookRun
    from durable_nb.options import RunOptions

    dropped: list[str] = []
    pending = _park(journal, dropped=dropped, approvers=["ana"])
    monkeypatch.setenv("DURABLE_NB_USER", "bo")  # the person at this notebook
    cell = NotebookRun("r", _drop("staging", dropped),
                       RunOptions(on_approval="park", approvers=["ana"]), journal)
    cell.panel.on_record(journal.get_run("r"))
    assert "Who may decide: ana" in cell.panel.approval_text.value
    cell.panel.approve_button.click()  # the panel's own button, through the cell's decide

    shown = html.unescape(cell.panel.approval_text.value)
    assert ("'drop database' was not decided: bo (notebook) is not on its approvers' list; "
            "only ana may decide. Nothing was written.") in shown, shown
    assert "Traceback" not in shown
    assert find_decision(journal, "r", pending) is None
    assert cell.panel.approval_buttons.layout.display == "flex"  # still ana's to decide
    assert [(e["kind"], e["via"]) for e in journal.events("r")] == [("refused", "panel")]


def test_a_batchs_approve_all_says_which_items_were_refused(journal):
    from durable_nb.notebook.batch_panel import BatchPanel
    from tests.test_batch_panel import _text

    def decide(run_id, approved, note, digest, request_id, via="panel"):
        (dn.approve if approved else dn.reject)(run_id, note or None, by="bo", expect=digest,
                                                request_id=request_id, via=via, journal=journal)

    panel = BatchPanel("p", journal=journal, on_decide=decide)
    dn.map(lambda ctx, x: ctx.approval("publish", {"n": x},
                                       approvers=["ana"] if x else None).approved,
           [0, 1, 2], batch_id="p", key="index", journal=journal, observer=panel, wait=False)
    panel.refresh(force=True)
    panel.approve_all_button.click()
    panel.confirm_button.click()
    assert ("approved 1 item; 2 refused, not yours to decide: p/1 (bo is not on the approvers' "
            "list (ana)); p/2 (bo is not on the approvers' list (ana))"
            ) in _text(panel.summary_html.value)
    decided = {r: find_decision(journal, r, journal.get_run(r).pending_approval)
               for r in ("p/0", "p/1", "p/2")}
    assert decided["p/0"]["by"] == "bo" and decided["p/1"] is None and decided["p/2"] is None


# -- four-eyes ---------------------------------------------------------------------------

def test_four_eyes_refuses_the_person_who_started_the_run(journal):
    dropped: list[str] = []
    pending = _park(journal, dropped=dropped, four_eyes=True)
    assert (pending["four_eyes"], pending["started_by"]) == (True, "cy")
    assert journal.get_run("r").started_by == "cy"

    for by in ("cy", "CY@laptop", "cy (notebook)"):
        refused = _cli(journal, "reject", "r", "--by", by)
        assert refused.returncode == 1
        (line,) = refused.stderr.strip().splitlines()
        assert line == (f"durable-nb: error: run 'r': 'drop database' was not decided: {by} "
                        f"started the run, and under four-eyes nobody decides a request of a "
                        f"run they started: ask someone else to decide. Nothing was "
                        f"written."), line
    # DURABLE_NB_USER names who decides when --by does not.
    assert _cli(journal, "approve", "r", user="cy").returncode == 1
    assert find_decision(journal, "r", pending) is None
    assert [e["text"].split(" was refused: ")[1] for e in journal.events("r")] == \
        ["cy started the run (four-eyes)", "CY@laptop started the run (four-eyes)",
         "cy (notebook) started the run (four-eyes)", "cy started the run (four-eyes)"]

    assert _cli(journal, "approve", "r", user="bo").returncode == 0
    assert dn.execute("r", _drop("staging", dropped), journal=journal) == "dropped staging"


def test_on_jupyterhub_the_hub_user_starts_and_decides_when_nobody_is_named(journal,
                                                                             monkeypatch):
    monkeypatch.delenv("DURABLE_NB_USER")
    monkeypatch.setenv("JUPYTERHUB_USER", "ana")
    assert _park(journal, four_eyes=True)["started_by"] == "ana"
    with pytest.raises(NotAllowedToDecide, match="ana started the run"):
        dn.approve("r", journal=journal)  # by: the hub user, as the run's starter was
    monkeypatch.setenv("JUPYTERHUB_USER", "bo")
    assert dn.approve("r", journal=journal).by == "bo"


def test_four_eyes_with_a_list_names_the_others_who_may_decide(journal):
    _park(journal, approvers=["cy", "ana"], four_eyes=True)
    with pytest.raises(NotAllowedToDecide, match="four-eyes .* ask ana. Nothing") as refused:
        dn.approve("r", by="cy", journal=journal)
    assert (refused.value.reason, refused.value.approvers) == ("four-eyes", ["ana"])
    dn.approve("r", by="ana", journal=journal)


# -- where it is set: request > tool > run --------------------------------------------------

def test_the_narrowest_list_wins_request_then_tool_then_run(journal):
    @dn.tool(needs_approval=True, approvers=["tina"])
    def pay(amount: int) -> str:
        """Pay."""
        return f"paid {amount}"

    with LoopbackServer([Reply(tool_calls=[ToolCall("pay", {"amount": 5})]), "done"]) as srv:
        client = openai.OpenAI(base_url=srv.url, api_key="test", max_retries=0)

        def agent(ctx):
            first = ctx.approval("plan", {"n": 1}, approvers=["rita"])  # the request's
            second = ctx.approval("plan", {"n": 2})  # the run's
            message = ctx.chat(client=client, model="gpt-4", messages=[
                {"role": "user", "content": "pay"}], tools=[pay.schema]).choices[0].message
            answers = ctx.call_tools(message, [pay])  # the tool's
            return [first.by, second.by, answers[0]["content"]]

        asked: list[tuple[str, list[str]]] = []
        deciders = {"rita": "run-only", "run-only": "rita", "tina": "rita"}
        while True:
            result = dn.execute("p", agent, journal=journal, on_approval="park",
                                approvers=["run-only"])
            if result is not None:
                break
            pending = journal.get_run("p").pending_approval
            allowed = pending["approvers"]
            asked.append((pending["name"], allowed))
            with pytest.raises(NotAllowedToDecide):  # the wider lists do not count
                dn.approve("p", by=deciders[allowed[0]], journal=journal)
            dn.approve("p", by=allowed[0], journal=journal)
    assert asked == [("plan", ["rita"]), ("plan", ["run-only"]), ("pay", ["tina"])]
    assert result == ["rita", "run-only", "paid 5"]


def test_bad_lists_are_refused_where_they_are_given():
    with pytest.raises(ValueError, match="names nobody"):
        dn.RunOptions(approvers=[])
    with pytest.raises(ValueError, match="names nobody"):
        dn.RunOptions(approvers="ana,,bo")
    with pytest.raises(ValueError, match="add needs_approval=True"):
        dn.tool(approvers=["ana"])(lambda x: x)


def test_the_magic_takes_approvers_and_four_eyes():
    from IPython.core.error import UsageError
    from durable_nb.notebook.magics import DurableMagics, _parse

    parser = DurableMagics.durable_agent.parser
    args = _parse(parser, "r --approvers ana,bo@example.com --four-eyes")
    assert (args.approvers, args.four_eyes) == (["ana", "bo@example.com"], True)
    assert _parse(parser, "r").approvers is None
    with pytest.raises(UsageError, match="--approvers=' ' names nobody"):
        _parse(parser, "r --approvers ' '")


# -- what is never refused ------------------------------------------------------------------

def test_a_deadline_decides_whatever_the_list(journal):
    def agent(ctx):
        return ctx.approval("deploy", {}, timeout=0.2, approvers=["ana"]).by

    assert dn.execute("t", agent, journal=journal, four_eyes=True) == "timeout"


def test_an_escalated_request_is_decided_by_the_escalations_approvers(journal):
    pending = _park(journal, approvers=["ana"])
    record = journal.get_run("r")
    record.pending_approval = dict(pending, escalation={"at": 1.0, "approvers": ["dora"],
                                                        "timeout_at": None})
    journal.put_run(record)
    with pytest.raises(NotAllowedToDecide, match="only dora may decide"):
        dn.approve("r", by="ana", journal=journal)
    assert dn.approve("r", by="dora", journal=journal).by == "dora"


def test_a_request_written_before_approvers_existed_is_decided_by_anyone(journal):
    pending = _park(journal, approvers=["ana"], four_eyes=True)
    record = journal.get_run("r")
    record.pending_approval = {k: v for k, v in pending.items()
                               if k not in ("approvers", "four_eyes", "started_by")}
    record.started_by = None
    journal.put_run(record)
    assert dn.approve("r", by="cy", journal=journal).by == "cy"


# -- in a notebook ----------------------------------------------------------------------------

@pytest.mark.kernel
def test_the_magics_list_and_four_eyes_hold_in_a_real_kernel(tmp_path: Path) -> None:
    """``%%durable_agent --approvers --four-eyes`` in a kernel whose user is cy: the
    starter's ``%durable approve`` is one line, no traceback; the panel says who may decide."""
    from tests.harness import start_kernel
    from tests.test_notebook_kernel import _env, _journal, _load, _one_line, _panel_html

    with start_kernel(tmp_path, env={**_env(), "DURABLE_NB_USER": "cy"}) as k:
        _load(k)
        k.execute("%%durable_agent g --approvers ana,cy --four-eyes\n"
                  "ctx.approval('deploy', {'env': 'prod'})").raise_for_error()
        pending = _journal(tmp_path).get_run("g").pending_approval
        assert (pending["approvers"], pending["four_eyes"], pending["started_by"]) == \
            (["ana", "cy"], True, "cy")
        assert "Who may decide: ana, cy but cy, who started the run (four-eyes)" in \
            html.unescape(_panel_html(k, "Who may decide"))
        assert _one_line(k.execute("%durable approve g")) == (
            "NotAllowedToDecide: run 'g': 'deploy' was not decided: cy started the run, and "
            "under four-eyes nobody decides a request of a run they started: ask ana. Nothing "
            "was written.")
        assert find_decision(_journal(tmp_path), "g", pending) is None
