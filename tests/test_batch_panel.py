"""The batch panel and the hooks it hangs on, from real batches on a real journal (no kernel,
no browser): what the summary, the table, the filters and the approvals say and do, that
redraws are throttled, and the text summary."""

from __future__ import annotations

import html
import re
import time

import pytest

import durable_nb as dn
from durable_nb import Status
from durable_nb.batches.batch import BatchObserver, prepare
from durable_nb.notebook.batch_panel import BatchPanel
from durable_nb.approvals.request import find_decision, request_digest


def _text(fragment: str) -> str:
    return html.unescape(re.sub(r"<[^>]+>", "", fragment))


class _Recorder(BatchObserver):
    def __init__(self):
        self.starts = []
        self.items = []

    def on_start(self, items, todo):
        self.starts.append(([(i.key, i.state, i.replayed) for i in items], list(todo)))

    def on_item(self, item):
        self.items.append((item.key, item.state))


# -- the hooks in durable_nb.batches.batch -----------------------------------------------------------

def test_the_observer_is_told_the_plan_before_any_item_runs(journal) -> None:
    work = lambda ctx, x: ctx.run("double", lambda: x * 2)  # noqa: E731
    first = _Recorder()
    dn.map(work, [1, 2], batch_id="b", key="index", journal=journal, observer=first)
    assert first.starts == [([("0", "PENDING", False), ("1", "PENDING", False)], [0, 1])]
    again = _Recorder()
    dn.map(work, [1, 2, 3], batch_id="b", key="index", journal=journal, observer=again)
    assert again.starts == [([("0", "DONE", True), ("1", "DONE", True),
                              ("2", "PENDING", False)], [2])]
    assert again.items == [("2", "RUNNING"), ("2", "DONE")]


def test_an_interrupted_item_resumes_even_with_retry_failed_false(journal) -> None:
    ran = []

    def handler(ctx, x):
        ctx.run("first", lambda: ran.append((x, "first")))
        if x == 1 and not ran.count((1, "interrupt")):
            ran.append((1, "interrupt"))
            raise KeyboardInterrupt  # what the stop button raises in the item's flow
        return ctx.run("second", lambda: ran.append((x, "second")) or x)

    stopped = dn.map(handler, [0, 1], batch_id="b", key="index", journal=journal,
                     retry_failed=False)
    assert stopped[1].status is Status.FAILED and stopped[1].error.startswith("interrupted")
    again = dn.map(handler, [0, 1], batch_id="b", key="index", journal=journal,
                   retry_failed=False)
    assert again.results() == [0, 1]
    assert ran.count((1, "first")) == 1  # its journaled step was not run again


def test_prepare_plans_and_execute_runs_what_it_planned(journal) -> None:
    execution, todo = prepare(lambda ctx, x: ctx.approval("go").approved, ["a", "b"],
                              batch_id="b", key=lambda x: x, journal=journal)
    assert todo == [0, 1]
    execution.execute(todo)
    assert [r.status for r in execution.results] == [Status.WAITING_APPROVAL] * 2
    assert execution.decided() == []
    dn.approve("b/a", journal=journal)
    assert execution.decided() == [0]
    execution.execute(execution.decided())
    assert execution.batch().counts == {"DONE": 1, "WAITING_APPROVAL": 1}


# -- the panel -------------------------------------------------------------------------------

def _chat_handler(client):
    def handler(ctx, item):
        reply = ctx.chat(model="gpt-4o-mini", client=client, max_tokens=5,
                         messages=[{"role": "user", "content": f"ticket {item}"}])
        if item == 3:
            raise RuntimeError("the CRM is down")
        return f"{item}: {reply.choices[0].message.content}"
    return handler


@pytest.fixture
def chat_batch(journal):
    """A batch of 6 items with one LLM call each, item 3 FAILED: (journal, panel, batch)."""
    import openai

    from durable_nb.testing import LoopbackServer

    with LoopbackServer(["fine"]) as server:
        client = openai.OpenAI(base_url=server.url, api_key="k", max_retries=0)
        panel = BatchPanel("chats", title="six tickets", journal=journal)
        batch = dn.map(_chat_handler(client), list(range(6)), batch_id="chats", key="index",
                       title="six tickets", journal=journal, observer=panel)
        panel.refresh(force=True)  # the notebook's cell does this when the batch ends
        yield journal, panel, batch, client


def test_summary_shows_progress_by_status_tokens_cost_and_then_what_replay_saved(
        chat_batch) -> None:
    journal, panel, batch, client = chat_batch
    summary = _text(panel.summary_html.value)
    assert "batch chats · six tickets" in summary
    assert "5 / 6 done" in summary and "1 failed" in summary
    assert f"tokens {batch.tokens:,}" in summary and batch.tokens > 0
    assert "cost $0.0000" in summary or "cost $" in summary
    segments = re.findall(r"title='(\d+) (\w+)'", panel.summary_html.value)
    assert segments == [("5", "DONE"), ("1", "FAILED")]

    again = BatchPanel("chats", journal=journal)
    dn.map(_chat_handler(client), list(range(6)), batch_id="chats", key="index",
           journal=journal, observer=again, retry_failed=False)
    again.refresh(force=True)
    saved = _text(again.summary_html.value)
    done_tokens = sum(i.tokens for i in batch if i.status is Status.DONE)
    assert f"replay: 5 items answered from the journal: {done_tokens:,} tokens" in saved


def test_the_table_filters_by_status_and_text_sorts_and_pages(journal) -> None:
    panel = BatchPanel("many", journal=journal)
    batch = dn.map(lambda ctx, x: ctx.run("s", lambda: f"value {x}") if x % 10 else 1 / 0,
                   list(range(45)), batch_id="many", key="index", journal=journal,
                   observer=panel)
    panel.refresh(force=True)
    assert batch.counts == {"DONE": 40, "FAILED": 5}
    rows = lambda: re.findall(r"data-key='([^']+)'", panel.table.value)  # noqa: E731
    assert rows() == [str(i) for i in range(20)]
    assert "rows 1–20 of 45 · page 1 of 3" in _text(panel.table.value)
    panel.next_button.click()
    panel.next_button.click()
    assert rows() == [str(i) for i in range(40, 45)] and panel.next_button.disabled
    panel.status_filter.value = "FAILED"
    assert rows() == ["0", "10", "20", "30", "40"]
    assert "ZeroDivisionError: division by zero" in _text(panel.table.value)
    assert "(filtered from 45)" in _text(panel.table.value)
    panel.status_filter.value = ""
    panel.text_filter.value = "value 3"
    assert rows() == ["3"] + [str(i) for i in range(31, 40)]
    panel.text_filter.value = ""
    panel.sort.value = "status"
    assert rows()[:5] == ["0", "10", "20", "30", "40"]  # problems first


def test_clicking_an_item_opens_its_own_run_panel(chat_batch) -> None:
    journal, panel, batch, _ = chat_batch
    panel.pick.value = "3"  # what a click on the row sends
    (shown,) = panel.detail.children
    text = " ".join(_text(c.value) for c in shown.children if isinstance(getattr(c, "value",
                                                                                None), str))
    assert "chats/3" in text and "FAILED" in text
    assert "class='dnb-picked'" not in panel.table.value and "dnb-row dnb-picked" in \
        panel.table.value
    panel.close_button.click()
    assert panel.detail.children == () and panel.pick.value == ""


def _parked(journal, n=4, observer=None):
    batch = dn.map(lambda ctx, x: ctx.approval("publish", {"n": x}).approved, list(range(n)),
                   batch_id="p", key="index", journal=journal, observer=observer, wait=False)
    if observer is not None:
        observer.refresh(force=True)
    return batch


def test_an_items_approve_button_decides_that_item_only(journal) -> None:
    decided = []
    panel = BatchPanel("p", journal=journal, on_decide=lambda *a: decided.append(a))
    _parked(journal, observer=panel)
    rows = panel.approval_rows.children
    assert len(rows) == 4 and "publish" in rows[1].children[0].value
    assert '{"n": 1}' in _text(rows[1].children[0].value)
    panel.approval_note.value = "ok by me"
    rows[1].children[1].click()
    # The decision is for the request the row shows: its digest and id go with it.
    shown = request_digest("publish", {"n": 1})
    asked = journal.get_run("p/1").pending_approval["id"]
    assert decided == [("p/1", True, "ok by me", shown, asked)]
    assert rows[1].children[1].disabled and rows[1].children[2].disabled
    rows[2].children[2].click()
    assert decided[-1] == ("p/2", False, "ok by me", request_digest("publish", {"n": 2}),
                           journal.get_run("p/2").pending_approval["id"])


def test_approve_all_shown_asks_first_and_approves_only_the_items_shown(journal) -> None:
    decided = []
    panel = BatchPanel("p", journal=journal, on_decide=lambda *a: decided.append(a))
    _parked(journal, n=12, observer=panel)
    panel.text_filter.value = "1"  # shows items 1, 10, 11
    assert panel.approve_all_button.description == "Approve all 3 shown"
    panel.approve_all_button.click()
    assert decided == []  # nothing until confirmed
    assert panel.confirm_box.layout.display == "flex"
    assert "Approve the pending approval of 3 items?" in _text(panel.confirm_text.value)
    assert panel.confirm_button.description == "Yes, approve 3"
    panel.confirm_cancel.click()
    assert decided == [] and panel.confirm_box.layout.display == "none"
    panel.approve_all_button.click()
    panel.confirm_button.click()
    assert sorted(d[0] for d in decided) == ["p/1", "p/10", "p/11"]
    assert all(d[1] is True for d in decided)
    assert all(d[3] == request_digest("publish", {"n": int(d[0][2:])}) for d in decided)
    assert all(d[4] == journal.get_run(d[0]).pending_approval["id"] for d in decided)
    assert "approved 3 items" in _text(panel.summary_html.value)


def test_redraws_are_throttled_whatever_the_number_of_items(journal) -> None:
    panel = BatchPanel("fast", journal=journal, refresh_interval=0.5)
    started = time.monotonic()
    dn.map(lambda ctx, x: ctx.run("s", lambda: x), list(range(1000)), batch_id="fast",
           key="index", journal=journal, observer=panel, concurrency=16)
    took = time.monotonic() - started
    # One redraw per interval, plus the forced ones (the plan) and one trailing redraw.
    assert panel.redraws <= took / 0.5 + 3, (panel.redraws, took)
    time.sleep(0.6)  # the trailing redraw shows the last item
    assert "1,000 / 1,000</b> done" in panel.summary_html.value


def test_the_text_summary_tells_state_counts_failures_and_pending_approvals(journal) -> None:
    panel = BatchPanel("mixed", title="mixed bag", journal=journal)

    def handler(ctx, x):
        if x == 1:
            raise ValueError("bad input")
        if x == 2:
            return ctx.approval("send", {"to": "ana"}).approved
        return x

    dn.map(handler, [0, 1, 2], batch_id="mixed", key="index", journal=journal,
           observer=panel, wait=False)
    panel.refresh(force=True)
    text = panel.summary()
    lines = text.splitlines()
    assert lines[0] == "durable batch mixed (mixed bag): WAITING_APPROVAL"
    assert lines[1] == "3 items: 1 DONE, 1 FAILED, 1 WAITING_APPROVAL"
    assert "  mixed/1: ValueError: bad input" in lines
    assert '  mixed/2: \'send\' {"to": "ana"}' in lines


def test_load_rebuilds_the_panel_from_the_journal(journal) -> None:
    _parked(journal, n=3)
    panel = BatchPanel.load(dn.batch("p", journal=journal), journal=journal)
    assert "0 / 3</b> done" in panel.summary_html.value
    assert len(panel.approval_rows.children) == 3
    assert panel.summary().splitlines()[0] == "durable batch p: WAITING_APPROVAL"


# -- counts that add up ----------------------------------------------------------------------

def _badges(run_panel) -> list[tuple[str, str]]:
    """(step name, how it was got) for each row of an item's run panel."""
    rows = run_panel.timeline.value.split("<details><summary>")[1:]
    return [(re.search(r"class='dnb-name'[^>]*>([^<]*)<", row).group(1),
             re.search(r">(executed|replayed|journaled)<", row).group(1)) for row in rows]


def test_a_batch_resumed_after_its_approvals_counts_no_replay_and_its_items_say_executed(
        journal) -> None:
    panel = BatchPanel("fresh", journal=journal)
    execution, todo = prepare(
        lambda ctx, x: (ctx.run("draft", lambda: f"reply {x}"),
                        ctx.approval("send", {"n": x}).approved)[1],
        [0, 1], batch_id="fresh", key=str, journal=journal, observer=panel)
    execution.execute(todo)
    for key in ("0", "1"):
        dn.approve(f"fresh/{key}", journal=journal)
    execution.execute(execution.decided())  # each item replays its draft, then goes on
    panel.refresh(force=True)
    assert execution.batch().counts == {"DONE": 2}
    summary = _text(panel.summary_html.value)
    assert "replay" not in summary and "took " in summary, summary  # nothing was saved
    panel.pick.value = "1"
    assert _badges(panel._item_panel) == [("draft", "executed"), ("send", "executed")]
    assert "steps 0 replayed, 2 executed" in _text(panel._item_panel.stats.value)

    again = BatchPanel("fresh", journal=journal)  # the cell run again: all from the journal
    dn.map(lambda ctx, x: 1 / 0, [0, 1], batch_id="fresh", key=str, journal=journal,
           observer=again)
    again.refresh(force=True)
    summary = _text(again.summary_html.value)
    assert re.search(r"replayed in \d+\.\d\d s", summary) and "took" not in summary, summary
    assert "replay: 2 items answered from the journal" in summary
    again.pick.value = "0"  # no execution here touched its steps
    assert _badges(again._item_panel) == [("draft", "journaled"), ("send", "journaled")]
    assert "steps 0 replayed, 0 executed, 2 journaled before" in \
        _text(again._item_panel.stats.value)


def test_the_saved_view_lists_the_items_problems_first_without_live_clicks(chat_batch) -> None:
    _, panel, _, _ = chat_batch
    view = panel.static_html()
    assert "dnb-saved" in view and "Saved view of batch chats" in _text(view)
    assert "5 / 6</b> done" in view and "onclick" not in view
    keys = re.findall(r"<tr ><td class='dnb-num'>(\d+)</td>", view)
    assert keys == ["3", "0", "1", "2", "4", "5"]  # the FAILED item first


def _controls(widget) -> list:
    """The controls a person can click or type in, shown (not inside a hidden box)."""
    if getattr(widget.layout, "display", None) == "none":
        return []
    found = [widget] if hasattr(widget, "disabled") else []
    for child in getattr(widget, "children", ()):
        found += _controls(child)
    return found


def test_while_the_batch_runs_in_its_cell_every_control_is_disabled_and_says_why(journal) -> None:
    """A click cannot reach a busy cell's kernel on ipykernel 7.4: while the batch executes
    in its cell no control looks live (disabled, the rows not clickable, approvals decided
    from a terminal) and the note says why and what stops it; after the cell, all work."""
    panel = BatchPanel("p", journal=journal, on_decide=lambda *a: None)
    _parked(journal, n=25, observer=panel)  # two pages, pending approvals with buttons
    live = _controls(panel.widget)
    assert len(live) >= 10 and panel.busy_hint.layout.display == "none"

    panel.executing_in_cell(True)
    shown = _controls(panel.widget)
    assert shown and all(c.disabled for c in shown), [c for c in shown if not c.disabled]
    assert panel.busy_hint.layout.display != "none"
    assert "stop button" in _text(panel.busy_hint.value)
    assert "dnb-busy" in panel.widget._dom_classes and "if(f.disabled)return" in \
        panel.table.value
    rows = panel.approval_rows.children
    assert rows and all(not isinstance(c, type(panel.close_button)) for r in rows
                        for c in r.children)
    assert "durable-nb approve p/0" in _text(rows[0].children[1].value)

    panel.executing_in_cell(False)
    assert panel.busy_hint.layout.display == "none" and "dnb-busy" not in \
        panel.widget._dom_classes
    buttons = [c for r in panel.approval_rows.children for c in r.children[1:]]
    assert buttons and not any(b.disabled for b in buttons)
    assert not panel.next_button.disabled and not panel.sort.disabled


def test_the_saved_view_leaves_out_the_answer_to_the_last_click(journal) -> None:
    panel = BatchPanel("p", journal=journal, on_decide=lambda *a: None)
    _parked(journal, n=2, observer=panel)
    panel.approval_rows.children[0].children[1].click()
    assert "approved p/0" in _text(panel.summary_html.value)
    assert "approved p/0" not in _text(panel.static_html())


def test_approve_all_leaves_items_decided_elsewhere_as_they_are_and_says_so(journal) -> None:
    from durable_nb.notebook.batch import NotebookBatch

    cell = NotebookBatch("p", lambda ctx, x: None, [], journal=journal, concurrency=1,
                         retry_failed=False, wait=False, title=None, limits={}, options={})
    _parked(journal, n=3, observer=cell.panel)
    dn.reject("p/1", "not this one", by="bo", via="durable-nb", journal=journal)
    cell.panel.approve_all_button.click()
    cell.panel.confirm_button.click()
    told = _text(cell.panel.summary_html.value)
    assert ("approved 2 items; 1 had been decided already, left as they were (p/1: rejected "
            "by bo via durable-nb)") in told, told
    decisions = {}
    for key in ("0", "1", "2"):
        pending = journal.get_run(f"p/{key}").pending_approval
        decisions[key] = find_decision(journal, f"p/{key}", pending)
    assert {k: (d["approved"], d["via"]) for k, d in decisions.items()} == {
        "0": (True, "Approve all"), "1": (False, "durable-nb"), "2": (True, "Approve all")}


def test_approve_all_leaves_questions_for_their_form_and_says_how_many(journal) -> None:
    """An MCP server's question is no plain approval: Approve all leaves it waiting for its
    form's answer, and says so."""
    decided = []
    panel = BatchPanel("q", journal=journal, on_decide=lambda *a: decided.append(a))

    def ask(ctx, x):
        if x == 1:
            return ctx.approval("book asks", {"kind": "elicitation", "server": "hotels",
                                              "tool": "book", "message": "Nights?",
                                              "schema": {"type": "object", "properties": {}}})
        return ctx.approval("publish", {"n": x})

    dn.map(ask, [0, 1, 2], batch_id="q", key="index", journal=journal, observer=panel,
           wait=False)
    panel.refresh(force=True)
    panel.approve_all_button.click()
    asked = _text(panel.confirm_text.value)
    assert "Approve the pending approval of 2 items?" in asked
    assert "1 question of an MCP server left for its form" in asked
    panel.confirm_button.click()
    assert sorted(d[0] for d in decided) == ["q/0", "q/2"]
    assert ("approved 2 items; 1 question of an MCP server left for its form"
            in _text(panel.summary_html.value))


def test_a_question_in_the_batch_is_answered_in_its_form_never_by_a_plain_approve(
        journal) -> None:
    """A question's row offers no Approve (which would cancel it: the server asks for a
    field) but Answer, which opens the item's run panel with the question's form; the head
    counts it as a question, not as an approval."""
    from durable_nb.notebook.batch import NotebookBatch

    schema = {"type": "object", "properties": {"nights": {"type": "integer"}},
              "required": ["nights"]}

    def ask(ctx, x):
        if x == 1:
            return ctx.approval("book asks", {"kind": "elicitation", "server": "hotels",
                                              "tool": "book", "message": "Nights?",
                                              "schema": schema})
        return ctx.approval("publish", {"n": x})

    cell = NotebookBatch("q", ask, [], journal=journal, concurrency=1, retry_failed=False,
                         wait=False, title=None, limits={}, options={})
    panel = cell.panel
    dn.map(ask, [0, 1], batch_id="q", key="index", journal=journal, observer=panel,
           wait=False)
    panel.refresh(force=True)
    head = _text(panel.approval_head.value)
    assert "1 item waiting for approval and 1 question waiting for its answer" in head, head
    assert "durable-nb answer q/1" in head and "%durable inbox" in head
    assert panel.approve_all_button.description == "Approve all 1 shown"
    assert "q/1 (a question: durable-nb answer): 'book asks'" in panel.summary()
    assert "1 question waiting for its answer" in _text(panel.static_html())

    plain, question = panel.approval_rows.children
    assert [b.description for b in plain.children[1:]] == ["Approve", "Reject"]
    buttons = [c for c in question.children if hasattr(c, "on_click")]
    assert [b.description for b in buttons] == ["Answer", "Decline"]
    assert "durable-nb answer q/1" in _text(question.children[0].value)

    buttons[0].click()
    form = panel._item_panel.question_form
    assert panel.pick.value == "1" and form.box.layout.display == "flex"
    form.inputs["nights"][1].value = "3"
    form.accept.click()
    pending = journal.get_run("q/1").pending_approval
    decision = find_decision(journal, "q/1", pending)
    assert decision["answer"] == {"action": "accept", "content": {"nights": 3}}, decision
