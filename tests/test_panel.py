"""The panel's content, built from real runs on a real journal (no browser, no kernel): what
each part says, step details, cost and savings, an honest badge, the text summary."""

from __future__ import annotations

import html
import re
import threading
import time

import openai
import pytest

import durable_nb
from durable_nb import DiskJournal, InputChanged, RunRecord, Status, StepEntry
from durable_nb.demo import SALES_CSV, make_tools, sales_agent
from durable_nb.approvals.request import request_digest
from durable_nb.notebook.panel import RunPanel
from durable_nb.registry import get_run
from durable_nb.testing import LoopbackServer


def _text(fragment: str) -> str:
    return html.unescape(re.sub(r"<[^>]+>", "", fragment))


@pytest.fixture(scope="module")
def demo_run(tmp_path_factory):
    """The demo agent's run, DONE after an approval: (journal, RunInfo)."""
    root = tmp_path_factory.mktemp("panel")
    (root / "sales.csv").write_text(SALES_CSV)
    journal = DiskJournal(root / "journal")

    def approve_when_asked() -> None:
        while (r := journal.find_run("sales")) is None or r.status is not Status.WAITING_APPROVAL:
            time.sleep(0.02)
        durable_nb.approve("sales", "fine", by="ana", journal=journal)

    with LoopbackServer() as server:
        client = openai.OpenAI(base_url=server.url, api_key="k", max_retries=0)
        tools = make_tools(root)
        approver = threading.Thread(target=approve_when_asked)
        approver.start()
        durable_nb.execute("sales", lambda ctx: sales_agent(ctx, tools, client=client),
                           title="Q3", journal=journal, poll_interval=0.02)
        approver.join()
    yield journal, get_run("sales", journal=journal)
    journal.close()


def test_step_details_show_new_messages_reply_arguments_result_and_decision(demo_run) -> None:
    journal, info = demo_run
    panel = RunPanel.load(info, journal=journal)
    timeline = panel.timeline.value
    rows = timeline.split("<details><summary><span>")[1:]  # one chunk per step row
    bodies = [row.split("<div class='dnb-step-body'>", 1)[1] for row in rows]
    assert len(bodies) == len(info.steps)
    first_chat = _text(bodies[0])
    assert "Asked loopback-1 with 2 messages and tools read_csv, analyse, write_report, " \
           "send_email; 2 new in this request" in first_chat
    assert "Write the Q3 sales report" in first_chat and "earlier messages" not in first_chat
    second_chat = _text(bodies[2])
    assert "with 4 messages" in second_chat and "2 new in this request" in second_chat
    assert "2 earlier messages (sent before)" in second_chat  # collapsed, not repeated
    assert "calls read_csv" in second_chat  # the assistant message new in this request
    read_csv = _text(bodies[1])
    assert '"path": "sales.csv"' in read_csv and '"rows": 9' in read_csv
    approval = _text(bodies[[e.kind for e in info.steps].index("approval")])
    assert '"to": "team@example.com"' in approval
    assert "Decision: approved by ana: fine" in approval
    step = info.steps[[e.kind for e in info.steps].index("approval")]
    shown = request_digest(step.name, step.meta["details"])
    assert f"(details digest {shown[:12]})" in approval  # which request it was for
    assert "prompt +" in first_chat and "completion tokens" in first_chat


def test_approval_row_shows_the_wait_apart_from_step_time(demo_run) -> None:
    journal, info = demo_run
    row = re.search(r"<summary><span>\d+</span><span>approval</span>.*?</summary>",
                    RunPanel.load(info, journal=journal).timeline.value, re.S).group(0)
    cells = re.findall(r"<span[^>]*>(.*?)</span>", row)
    assert cells[3] == "&ndash;"  # no step time for a person's wait
    assert re.search(r"by ana: fine \u00b7 waited \d+\.\d s", html.unescape(row))


def test_a_done_runs_elapsed_ends_when_it_finished(tmp_path) -> None:
    now = time.time()
    record = RunRecord(run_id="r", status=Status.DONE, created_at=now - 1000,
                       updated_at=now, finished_at=now - 990)
    panel = RunPanel(record)
    assert "took 10.0 s" in panel.stats.value
    assert "took 10.0 s" in panel.summary()


def test_replay_savings_count_tokens_and_cost_of_replayed_steps(tmp_path) -> None:
    record = RunRecord(run_id="r", status=Status.RUNNING, created_at=time.time())
    panel = RunPanel(record)
    for position in range(7):
        meta = {"model": "gpt-4o-mini", "cost": 0.0003, "cached": 0, "estimated": False}
        kind, tokens = ("chat", (200, 4)) if position % 2 == 0 else ("run", (0, 0))
        panel.on_step(StepEntry(position, str(position), "gpt-4o-mini", kind,
                                prompt_tokens=tokens[0], completion_tokens=tokens[1],
                                meta=meta if kind == "chat" else None), True)
    panel.refresh(force=True)
    assert "7 steps replayed: 816 tokens, $0.0012 saved" in panel.stats.value
    assert "7 steps replayed: 816 tokens, $0.0012 saved" in panel.summary()


def test_a_stopped_execution_of_a_done_run_says_so_instead_of_done() -> None:
    record = RunRecord(run_id="r", status=Status.DONE, created_at=time.time())
    panel = RunPanel(record)
    panel.show_result(error=InputChanged("r", 1, "run 'b'", "args[0] changed"))
    header = _text(panel.header.value)
    assert "stopped: input changed" in header and "DONE" not in header.split("The run")[0]
    assert "The run is DONE in the journal (unchanged); this execution of the cell stopped" \
        in header
    assert panel.summary().startswith(
        "durable run r: stopped: input changed (the run is DONE in the journal)")


def test_streamed_text_ends_its_line_before_the_next_print() -> None:
    panel = RunPanel(RunRecord(run_id="r", created_at=time.time()), refresh_interval=3600)
    panel.on_text("The report")
    panel.on_text(" is done.")
    panel.on_step(StepEntry(0, "0", "m", "chat"), False)
    panel.append_log("next print\n")
    assert "".join(panel._log_buffer) == "The report is done.\nnext print\n"


def test_the_text_summary_tells_status_tokens_cost_approval_and_result(demo_run) -> None:
    journal, info = demo_run
    record = RunRecord(run_id="w", title="deploy", status=Status.WAITING_APPROVAL,
                       iteration=2, max_iterations=10, prompt_tokens=1500, completion_tokens=40,
                       cost=0.0021, max_cost=0.5, created_at=time.time(),
                       pending_approval={"key": "3", "name": "send_email",
                                         "details": {"to": "team@example.com"}})
    text = RunPanel(record).summary()
    assert text.splitlines()[0] == "durable run w (deploy): WAITING_APPROVAL"
    assert "iteration 2 / 10, tokens 1,500 prompt + 40 completion, cost $0.0021 of $0.500" \
        in text
    assert 'waiting for approval of \'send_email\': {"to": "team@example.com"}' in text
    done = RunPanel.load(info, journal=journal)
    done.show_result("The Q3 sales report is done.")
    assert done.summary().endswith("result: The Q3 sales report is done.")
    bundle = done._repr_mimebundle_()
    assert "application/vnd.jupyter.widget-view+json" in bundle
    assert bundle["text/plain"] == done.summary()


def test_a_dead_kernel_note_and_button_hint_are_in_the_panel_hidden_until_disconnected() -> None:
    record = RunRecord(run_id="r", status=Status.WAITING_APPROVAL, created_at=time.time(),
                       pending_approval={"key": "1", "name": "go", "details": None})
    panel = RunPanel(record)
    assert "dnb-panel" in panel.widget._dom_classes
    assert ".dnb-panel.jupyter-widgets-disconnected .dnb-dead {display: block" \
        in panel.header.value
    assert "This panel belongs to a kernel that stopped" in panel.header.value
    assert "durable-nb approve r" in panel.approval_text.value
    assert all("dnb-button" in b._dom_classes for b in
               (panel.approve_button, panel.reject_button, panel.cancel_button))


def test_the_approve_button_decides_the_request_the_panel_shows(journal) -> None:
    for db in ("staging", "production"):  # the cell edited between two executions
        durable_nb.execute("w", lambda ctx: ctx.approval("drop database", {"db": db}).approved,
                           journal=journal, on_approval="park")
    record = journal.get_run("w")
    decided = []
    panel = RunPanel(record, on_decide=lambda *args: decided.append(args))
    panel.refresh(force=True)
    shown = _text(panel.approval_text.value)
    production = request_digest("drop database", {"db": "production"})
    assert f"details digest {production[:12]}" in shown and '"db": "production"' in shown
    staging = request_digest("drop database", {"db": "staging"})
    assert "The request at this step changed" in shown and staging[:12] in shown
    panel.approve_button.click()
    assert decided == [(True, "", production, record.pending_approval["id"])]


def test_the_saved_view_holds_status_timeline_decision_log_and_result(demo_run) -> None:
    journal, info = demo_run
    panel = RunPanel.load(info, journal=journal)
    panel.append_log("printed in the background\n")
    panel.show_result("The Q3 sales report is done.")
    view = panel.static_html()
    body = re.sub(r"<style>.*?</style>", "", view, flags=re.S)
    text = _text(body)
    assert body.count("class='dnb-panel dnb-saved'") == 1
    assert "dnb-live" not in body  # the live panel's class is only in the CSS that hides it
    assert text.startswith("Saved view of run sales as of ")
    assert "sales · Q3 DONE" in text and "approved" in text and "by ana: fine" in text
    assert "printed in the background" in text
    assert "Result:The Q3 sales report is done." in text
    assert view.count("<details><summary><span>") == len(info.steps)  # steps still open
    assert "dnb-live" in panel.widget._dom_classes


def test_a_result_the_cell_shows_below_is_only_pointed_to() -> None:
    panel = RunPanel(RunRecord(run_id="r", status=Status.DONE, created_at=time.time()))
    # A value no clock can print: the saved view's time has seconds, which may read "42".
    panel.show_result({"answer": "forty-two"}, shown_below=True)
    assert _text(panel.result.value) == "Result: the cell's value, shown below"
    assert "forty-two" not in panel.summary() and "forty-two" not in panel.static_html()
    panel.show_result(None, shown_below=True)  # a cell with no value: nothing to point to
    assert panel.result.value == ""


# --- buttons that work, or are not there ---------------------------------------------------


def _shown(panel: RunPanel) -> dict[str, bool]:
    return {"cancel": panel.cancel_button.layout.display != "none",
            "stop hint": panel.stop_hint.layout.display != "none"}


def test_cancel_is_replaced_by_the_stop_hint_in_the_cell_and_shown_when_parked_or_resumed(
        journal) -> None:
    """A click on a busy cell's widget never reaches ipykernel 7.4 (6.x: only after the cell):
    in the foreground the panel says what stops the run; parked or resumed in the background
    (the kernel idle, every click arrives) it has a Cancel button that says it acts."""
    from durable_nb.notebook.session import NotebookRun
    from durable_nb.runner import RunOptions

    seen: dict[str, dict] = {}

    def look(phase: str, click: bool = False) -> None:
        panel = session.panel
        seen[phase] = _shown(panel)
        if click:
            panel.cancel_button.click()
            seen["clicked"] = {"description": panel.cancel_button.description,
                               "disabled": panel.cancel_button.disabled}

    def agent(ctx):
        ctx.run("in the cell", look, "foreground")
        ctx.approval("send", {"to": "team@example.com"})
        ctx.run("resumed", look, "background", True)
        ctx.run("after the cancel", look, "never")

    session = NotebookRun("mail", agent, RunOptions(on_approval="park", poll_interval=0.02),
                          journal)
    try:
        assert session.start().status is Status.WAITING_APPROVAL
        parked = _shown(session.panel)
        assert "Running in this cell: stop it with the kernel's stop button" in \
            _text(session.panel.stop_hint.value)
        session.panel.approve_button.click()
        assert session.wait(60)
    finally:
        session.stop()
    assert seen["foreground"] == {"cancel": False, "stop hint": True}
    assert parked == {"cancel": True, "stop hint": False}
    assert seen["background"] == {"cancel": True, "stop hint": False}
    assert seen["clicked"] == {"description": "Cancelling...", "disabled": True}
    assert "never" not in seen  # stopped at the next step
    assert journal.get_run("mail").status is Status.CANCELLED
    assert _shown(session.panel) == {"cancel": False, "stop hint": False}


def test_a_done_run_has_neither_the_cancel_button_nor_the_stop_hint(journal) -> None:
    from durable_nb.notebook.session import NotebookRun
    from durable_nb.runner import RunOptions

    seen = []
    session = NotebookRun("quick", lambda ctx: ctx.run("one", lambda: seen.append(
        _shown(session.panel)) or 1), RunOptions(), journal)
    assert session.start().status is Status.DONE
    assert seen == [{"cancel": False, "stop hint": True}]
    assert _shown(session.panel) == {"cancel": False, "stop hint": False}


def test_a_cell_waiting_for_a_decision_from_outside_shows_how_to_decide_not_buttons(
        journal) -> None:
    """``--wait``: the cell stays busy while the approval is pending, so Approve and Reject
    would be dead there; the panel says how to decide from outside instead."""
    from durable_nb.notebook.session import NotebookRun
    from durable_nb.runner import RunOptions

    seen = {}

    def decide_from_outside() -> None:
        while (r := journal.find_run("w")) is None or not r.pending_approval \
                or session.panel.approval_box.layout.display != "flex":
            time.sleep(0.02)
        try:
            panel = session.panel
            seen["buttons"] = panel.approval_buttons.layout.display != "none"
            seen["text"] = _text(panel.approval_text.value)
            seen["cancel"] = _shown(panel)
        finally:  # whatever was seen, the cell must not wait forever
            durable_nb.approve("w", by="ana", journal=journal)

    session = NotebookRun("w", lambda ctx: ctx.approval("send", {"to": "x"}).approved,
                          RunOptions(on_approval="wait", poll_interval=0.02), journal)
    decider = threading.Thread(target=decide_from_outside)
    decider.start()
    try:
        assert session.start().result is True
    finally:
        decider.join()
        session.stop()
    assert seen["buttons"] is False
    assert "This cell waits for a decision from outside; a click cannot reach the busy " \
           "kernel. Decide with durable-nb approve w (or reject) in a terminal" in seen["text"]
    assert seen["cancel"] == {"cancel": False, "stop hint": True}


def _widget_texts(panel: RunPanel) -> str:
    parts = [panel.header.value, panel.attempts.value, panel.stats.value, panel.timeline.value,
             panel.result.value]
    return "\n".join(_text(re.sub(r"<style>.*?</style>", "", p, flags=re.S)) for p in parts)


@pytest.mark.parametrize("foreground", [False, True])
def test_a_cancelled_runs_panel_says_its_message_once(journal, foreground: bool) -> None:
    """Cancelled in the background (resumed after an approval) the panel shows the message
    once; in the foreground the cell shows it below the panel, which only points to it."""
    from durable_nb.errors import RunCancelled
    from durable_nb.notebook.session import NotebookRun
    from durable_nb.runner import RunOptions

    def handler(ctx):
        ctx.run("ask to cancel", lambda: run.cancel())
        ctx.run("never", lambda: 1)

    run = NotebookRun("c", handler, RunOptions(), journal)
    with pytest.raises(RunCancelled) as raised:
        run._execute(foreground=foreground)
    message = str(raised.value)
    assert journal.get_run("c").status is Status.CANCELLED
    shown = _widget_texts(run.panel)
    assert "CANCELLED" in shown
    assert shown.count(message) == (0 if foreground else 1), shown
    if foreground:
        assert "RunCancelled (the message is below)" in shown


def test_a_loop_of_fast_steps_redraws_the_timeline_once_a_second_and_the_last_redraw_whole() -> None:
    """The browser re-renders the timeline's rows whole at each redraw (benchmarks section 12):
    with steps arriving without pause, the counts follow at the refresh interval, the timeline
    at most once a second, and a forced redraw (as at the run's end) shows the last step."""
    from durable_nb.notebook.panel import _TICK

    panel = RunPanel(RunRecord(run_id="r", status=Status.RUNNING, created_at=time.time()))
    drawn = {"timeline": 0, "stats": 0}
    panel.timeline.observe(lambda _: drawn.__setitem__("timeline", drawn["timeline"] + 1), "value")
    panel.stats.observe(lambda _: drawn.__setitem__("stats", drawn["stats"] + 1), "value")
    started, position = time.monotonic(), 0
    while time.monotonic() - started < 2.5 * _TICK:
        panel.on_step(StepEntry(position, str(position), f"step {position}", "run"), False)
        position += 1
    seconds = time.monotonic() - started
    assert drawn["timeline"] <= seconds / _TICK + 1
    assert drawn["stats"] > drawn["timeline"]

    panel.refresh(force=True)
    assert f"step {position - 1}<" in panel.timeline.value
    assert f"0</b> replayed, <b>{position:,}</b> executed" in panel.stats.value


def test_a_redraw_with_no_new_step_does_not_build_the_timeline_again() -> None:
    """The elapsed time's tick redraws the counts; the timeline, the costly part, only when a
    step came since it was drawn."""
    panel = RunPanel(RunRecord(run_id="r", status=Status.RUNNING, created_at=time.time()))
    panel.on_step(StepEntry(0, "0", "step 0", "run"), False)
    panel.refresh(force=True)
    built = []
    timeline_html = panel._timeline_html
    panel._timeline_html = lambda: built.append(1) or timeline_html()
    panel._last_refresh = panel._last_timeline = 0.0  # as if a second had passed
    panel.refresh()
    assert built == []
    panel.on_step(StepEntry(1, "1", "step 1", "run"), False)
    panel._last_refresh = panel._last_timeline = 0.0
    panel.refresh()
    assert built == [1] and "step 1<" in panel.timeline.value


def test_the_status_badge_is_sent_after_the_counts_it_ends() -> None:
    """Each widget's change reaches the page as a message of its own: at the end the stats
    go first, so the page never shows DONE over the counts of before the end."""
    panel = RunPanel(RunRecord(run_id="r", status=Status.RUNNING, created_at=time.time()))
    order: list[str] = []
    panel.header.observe(lambda _: order.append("header"), "value")
    panel.stats.observe(lambda _: order.append("stats"), "value")
    panel.on_step(StepEntry(0, "0", "step 0", "run"), False)
    order.clear()
    panel.on_record(RunRecord(run_id="r", status=Status.DONE, created_at=time.time()))
    assert "DONE" in panel.header.value and order[-1] == "header" and "stats" in order


def test_an_approvals_deadline_says_by_when_and_what_its_policy_does_then() -> None:
    from durable_nb.approvals.policy import ApprovalPolicy
    from durable_nb.notebook.approval_view import deadline_words

    now = time.mktime((2026, 12, 4, 10, 18, 0, 0, 0, -1))
    asked = now - 60

    def pending(**policy) -> dict:
        return {"requested_at": asked, **ApprovalPolicy.of(**policy).pending_fields(asked)}

    assert deadline_words({"requested_at": asked, "timeout_at": None}, now) is None
    assert deadline_words(pending(timeout="15m"), now) == \
        "decide by 10:32 (in 14 min), then rejected"
    assert deadline_words(pending(timeout="2h", on_timeout="approve"), now) == \
        "decide by 12:17 (in 1 h 59 min), then approved"
    escalating = pending(timeout="15m", on_timeout="escalate", escalate_to="lead@example.com")
    assert deadline_words(escalating, now) == \
        "decide by 10:32 (in 14 min), then escalated to lead@example.com"
    escalated = dict(escalating, escalation={"at": now, "approvers": ["lead@example.com"],
                                             "timeout_at": now + 30})
    assert deadline_words(escalated, now) == "decide by 10:18 (in 30 s), then rejected"
    assert deadline_words(pending(timeout="15m"), now + 3600) == \
        "its deadline 10:32 passed: rejected at the next look"
    tomorrow = pending(timeout="1d")
    assert deadline_words(tomorrow, now).startswith("decide by 2026-12-05 10:17 (in 23 h 59")
