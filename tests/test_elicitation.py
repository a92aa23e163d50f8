"""An MCP server's question (elicitation) answered as a decision (issue 34, section 1): the
answer ``{"action", "content"}`` is decision content, checked inside ``decide`` against the
question's schema, journaled in the decision, the step, the history and the export, bound to
the request, replayed exactly, and a decision for approvers' lists and four-eyes. Against the
real ``mcp`` SDK server of tests/mcp_server.py where a server takes part."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest

import durable_nb as dn
import durable_nb.mcp as dmcp
from durable_nb.approvals.decide import decide
from durable_nb.approvals.history import history
from durable_nb.approvals.request import decision_kind, find_decision, pending_digest
from durable_nb.export import export_data, export_run

SERVER = Path(__file__).with_name("mcp_server.py")


@pytest.fixture
def count_dir(tmp_path: Path) -> Path:
    path = tmp_path / "calls"
    path.mkdir()
    return path


@pytest.fixture(autouse=True)
def closed_connections():
    yield
    dmcp.close()


def books(count_dir: Path) -> list[tuple]:
    """The calls of ``book`` that reached the server: (action, nights)."""
    found = [json.loads(p.read_text()) for p in count_dir.glob("book-*.json")]
    return sorted((c["action"], c["nights"]) for c in found)


def booking_agent(count_dir: Path):
    server = dmcp.stdio(sys.executable, str(SERVER), str(count_dir), "stdio", name="tests")
    calls = {"role": "assistant", "content": None, "tool_calls": [
        {"id": "call_0", "type": "function",
         "function": {"name": "book", "arguments": json.dumps({"city": "Oslo"})}}]}
    return lambda ctx: ctx.call_tools(calls, ctx.mcp_tools(server))


def test_an_answer_is_journaled_in_the_decision_the_step_the_history_and_the_export(
        journal, count_dir):
    agent = booking_agent(count_dir)
    assert dn.execute("q", agent, journal=journal, on_approval="park") is None
    pending = journal.get_run("q").pending_approval
    decision = dmcp.answer("q", "accept", {"nights": 3}, by="ana", request_id=pending["id"],
                           expect=pending_digest(pending), journal=journal)
    assert decision.approved and decision.answer == {"action": "accept",
                                                     "content": {"nights": 3}}
    left = find_decision(journal, "q", pending)
    assert left["answer"] == {"action": "accept", "content": {"nights": 3}}
    assert left["note"] is None  # the answer is content, not a note

    answers = dn.execute("q", agent, journal=journal, on_approval="park")
    assert answers[0]["content"] == "booked 3 nights in Oslo"
    step = next(s for s in journal.steps("q") if s.kind == "approval")
    assert step.result["answer"] == {"action": "accept", "content": {"nights": 3}}
    decided = [e for e in history(journal, "q") if e["kind"] == "decided"]
    assert decided[0]["answer"] == {"action": "accept", "content": {"nights": 3}}
    assert "answered accept by ana" in decided[0]["text"]
    data = export_data(dn.get_run("q", journal=journal), journal=journal)
    assert any(e.get("answer", {}).get("content") == {"nights": 3} for e in data["history"])
    export_run("q", journal.directory / "q.ipynb", journal=journal)
    assert "Answer to the server: accept" in (journal.directory / "q.ipynb").read_text()

    # Replayed: the same answers, the server not called again.
    assert dn.execute("q", agent, journal=journal) == answers
    assert books(count_dir) == [("accept", 3)]


def test_a_call_made_again_gets_the_journaled_answer_and_nobody_is_asked(journal, count_dir):
    agent = booking_agent(count_dir)
    dn.execute("q", agent, journal=journal, on_approval="park")
    dmcp.answer("q", "accept", {"nights": 2}, journal=journal)
    dn.execute("q", agent, journal=journal, on_approval="park")
    # Forget the call's step, keep the answer's (a crash during the call after the answer).
    call = next(s for s in journal.steps("q") if s.kind == "run" and s.name == "book")
    dn.reset("q", call.position, journal=journal)
    answers = dn.execute("q", agent, journal=journal, on_approval="park")
    assert answers[0]["content"] == "booked 2 nights in Oslo"
    assert books(count_dir) == [("accept", 2), ("accept", 2)]


def test_a_journal_written_by_29bcdb7_with_the_answer_in_the_note_still_replays(
        journal, count_dir):
    agent = booking_agent(count_dir)
    dn.execute("q", agent, journal=journal, on_approval="park")
    pending = journal.get_run("q").pending_approval
    # What durable_nb 29bcdb7's mcp.answer left: an approval whose note is the answer's JSON.
    journal.add_request(decision_kind(pending), "q", {
        "key": pending["key"], "digest": pending_digest(pending), "name": pending["name"],
        "approved": True, "note": json.dumps({"action": "accept", "content": {"nights": 6}}),
        "by": "ana", "via": "CLI", "at": 1.0})
    answers = dn.execute("q", agent, journal=journal, on_approval="park")
    assert answers[0]["content"] == "booked 6 nights in Oslo"
    # Its step (no answer field) replays as the same answer when the call is made again.
    call = next(s for s in journal.steps("q") if s.kind == "run" and s.name == "book")
    assert "answer" not in next(s for s in journal.steps("q") if s.kind == "approval").result
    dn.reset("q", call.position, journal=journal)
    dn.execute("q", agent, journal=journal, on_approval="park")
    assert books(count_dir) == [("accept", 6), ("accept", 6)]


# -- decide's checks, on a question asked with ctx.approval -------------------------------------

QUESTION = {"type": "object", "required": ["nights", "email"], "properties": {
    "nights": {"type": "integer", "title": "Nights", "minimum": 1, "maximum": 30},
    "email": {"type": "string", "format": "email"},
    "code": {"type": "string", "minLength": 3, "maxLength": 5, "pattern": "^[A-Z]+$"},
    "arrive": {"type": "string", "format": "date"},
    "room": {"type": "string", "enum": ["single", "double"]},
    "breakfast": {"type": "boolean", "default": False}}}


def _ask(journal, run_id: str = "a", schema: dict | None = None, **options) -> dict:
    details = {"kind": "elicitation", "server": "hotel", "tool": "book",
               "message": "How many nights?", "schema": schema or QUESTION}
    assert dn.execute(run_id, lambda ctx: ctx.approval("book asks", details).approved,
                      journal=journal, on_approval="park", **options) is None
    return journal.get_run(run_id).pending_approval


def _seen(pending: dict, by: str = "ana") -> dict:
    return {"request_id": pending["id"], "digest": pending_digest(pending), "by": by,
            "via": "Python"}


@pytest.mark.parametrize("content, wrong", [
    ({"nights": 0, "email": "a@b.org"}, "field 'nights' must be at least 1, got 0"),
    ({"nights": 31, "email": "a@b.org"}, "field 'nights' must be at most 30, got 31"),
    ({"nights": 2, "email": "not an address"}, "field 'email' must be an e-mail address"),
    ({"nights": 2, "email": "a@b.org", "code": "AB"}, "at least 3 characters, got 2"),
    ({"nights": 2, "email": "a@b.org", "code": "ABCDEF"}, "at most 5 characters, got 6"),
    ({"nights": 2, "email": "a@b.org", "code": "abc"}, "must match the pattern '^[A-Z]+$'"),
    ({"nights": 2, "email": "a@b.org", "arrive": "2026-02-30"}, "must be a date (YYYY-MM-DD)"),
    ({"nights": 2, "email": "a@b.org", "room": "suite"}, 'must be one of "single", "double"'),
])
def test_an_answer_that_breaks_the_questions_constraints_is_refused_and_nothing_written(
        journal, content, wrong):
    pending = _ask(journal)
    with pytest.raises(dn.InvalidAnswer) as raised:
        decide(journal, "a", approved=True, answer={"action": "accept", "content": content},
               **_seen(pending))
    assert wrong in str(raised.value) and "Nothing was decided" in str(raised.value)
    assert "\n" not in str(raised.value)
    assert find_decision(journal, "a", pending) is None


def test_an_answer_that_fits_is_the_decision(journal):
    pending = _ask(journal)
    content = {"nights": 2, "email": "ana@example.org", "code": "ABC", "arrive": "2026-02-28",
               "room": "double", "breakfast": True}
    decision = decide(journal, "a", approved=True,
                      answer={"action": "accept", "content": content}, **_seen(pending))
    assert decision["answer"] == {"action": "accept", "content": content}


@pytest.mark.parametrize("approved, answer, wrong", [
    (False, {"action": "decline", "content": {"nights": 2}}, "only accept carries content"),
    (False, {"action": "accept", "content": {}}, "accept goes with an approval"),
    (True, {"action": "maybe"}, "must be one of accept, decline, cancel"),
    (True, {"action": "accept", "content": [2]}, "must be a JSON object, got array"),
    (True, {"action": "accept", "extra": 1}, 'an answer is {"action": ..., "content": ...}'),
])
def test_an_answer_that_is_not_one_is_refused(journal, approved, answer, wrong):
    pending = _ask(journal)
    with pytest.raises(dn.InvalidAnswer, match=None) as raised:
        decide(journal, "a", approved=approved, answer=answer, **_seen(pending))
    assert wrong in str(raised.value)


def test_an_answer_to_a_request_that_is_no_question_is_refused(journal):
    assert dn.execute("p", lambda ctx: ctx.approval("deploy", {"to": "prod"}).approved,
                      journal=journal, on_approval="park") is None
    pending = journal.get_run("p").pending_approval
    with pytest.raises(dn.InvalidAnswer, match="'deploy' is not a question from an MCP server"):
        decide(journal, "p", approved=False, answer={"action": "decline"}, **_seen(pending))


def test_a_question_whose_ref_names_nothing_is_refused_in_words_not_a_value_error(journal):
    pending = _ask(journal, schema={"type": "object", "properties": {
        "nights": {"$ref": "#/$defs/Gone"}}})
    with pytest.raises(dn.InvalidAnswer) as raised:
        decide(journal, "a", approved=True, answer={"action": "accept", "content": {
            "nights": 2}}, **_seen(pending))
    assert "its $ref '#/$defs/Gone' names nothing in $defs" in str(raised.value)
    # Declining needs no schema.
    decide(journal, "a", approved=False, answer={"action": "decline"}, **_seen(pending))


def test_edited_arguments_on_a_schema_whose_ref_names_nothing_are_refused_in_words(journal):
    def agent(ctx):
        return ctx.approval("query", {"tool": "query", "arguments": {"q": "x"}},
                            schema={"type": "object",
                                    "properties": {"q": {"$ref": "#/$defs/Missing"}}}).approved

    assert dn.execute("e", agent, journal=journal, on_approval="park") is None
    with pytest.raises(dn.InvalidAnswer, match=r"\$ref '#/\$defs/Missing' names nothing"):
        dn.approve("e", args={"q": "y"}, journal=journal)


def test_an_answer_is_a_decision_for_four_eyes_and_the_approvers_list(journal):
    os.environ["DURABLE_NB_USER"] = "bo"  # bo starts the run
    try:
        _ask(journal, four_eyes=True, approvers=["ana", "bo"])
    finally:
        del os.environ["DURABLE_NB_USER"]
    with pytest.raises(dn.NotAllowedToDecide):
        dmcp.answer("a", "accept", {"nights": 2, "email": "b@o.org"}, by="bo", journal=journal)
    with pytest.raises(dn.NotAllowedToDecide):
        dmcp.answer("a", "decline", by="cy", journal=journal)
    dmcp.answer("a", "cancel", by="ana", journal=journal)
    with pytest.raises(dn.DecisionExists):
        dmcp.answer("a", "decline", by="ana", journal=journal)


def test_an_answer_is_bound_to_the_request_seen(journal):
    pending = _ask(journal)
    with pytest.raises(dn.ApprovalChanged):
        dmcp.answer("a", "decline", request_id="another", expect=pending_digest(pending),
                    journal=journal)
    assert find_decision(journal, "a", pending) is None


def test_a_plain_decision_on_a_question_is_written_with_the_answer_it_amounts_to(journal):
    pending = _ask(journal)
    dn.approve("a", journal=journal)  # the schema requires fields: approve alone is cancel
    assert find_decision(journal, "a", pending)["answer"] == {"action": "cancel"}
    pending = _ask(journal, "b", schema={"type": "object", "properties": {}})
    dn.approve("b", journal=journal)
    assert find_decision(journal, "b", pending)["answer"] == {"action": "accept",
                                                             "content": {}}


# -- the command line --------------------------------------------------------------------------

REPO = Path(__file__).resolve().parents[1]


def _cli(journal, *args: str):
    import subprocess

    env = {**os.environ, "PYTHONPATH": str(REPO)}
    return subprocess.run([sys.executable, "-m", "durable_nb.cli", "--journal",
                           str(journal.directory), *args],
                          capture_output=True, text=True, timeout=120, env=env)


def test_the_cli_shows_the_question_and_answers_it(journal, count_dir):
    agent = booking_agent(count_dir)
    dn.execute("q", agent, journal=journal, on_approval="park")
    shown = _cli(journal, "show", "q")
    assert shown.returncode == 0, shown.stderr
    assert "question   tests asks during book: How many nights in Oslo?" in shown.stdout
    assert "nights     Nights (integer, required): How many nights" in shown.stdout
    assert "durable-nb answer q accept --content '{\"nights\": 1}'" in shown.stdout

    bad = _cli(journal, "answer", "q", "accept", "--content", '{"nights": "three"}')
    assert bad.returncode == 1 and "field 'nights' must be an integer" in bad.stderr
    bad = _cli(journal, "answer", "q", "accept")
    assert bad.returncode == 1 and "accept needs --content" in bad.stderr
    bad = _cli(journal, "answer", "q", "accept", "--content", "{nope")
    assert bad.returncode == 1 and "--content is not JSON" in bad.stderr
    done = _cli(journal, "answer", "q", "accept", "--content", '{"nights": 4}', "--by", "bo")
    assert done.returncode == 0, done.stderr
    assert 'answered accept {"nights": 4} to tests\'s question in run q (by bo' in done.stdout
    answers = dn.execute("q", agent, journal=journal, on_approval="park")
    assert answers[0]["content"] == "booked 4 nights in Oslo"


def test_the_cli_declines_and_refuses_an_approval_that_is_no_question(journal, count_dir):
    agent = booking_agent(count_dir)
    dn.execute("q", agent, journal=journal, on_approval="park")
    done = _cli(journal, "answer", "q", "decline")
    assert done.returncode == 0, done.stderr
    assert dn.execute("q", agent, journal=journal, on_approval="park")[0]["content"] == \
        "not booked (decline)"
    assert dn.execute("p", lambda ctx: ctx.approval("deploy", {}).approved, journal=journal,
                      on_approval="park") is None
    refused = _cli(journal, "answer", "p", "cancel")
    assert refused.returncode == 1
    assert "waits for approval of 'deploy': use `durable-nb approve`" in refused.stderr


# -- the forms: every kind of field MCP allows, read back as the schema's types ------------------

KINDS = {"type": "object", "required": ["room"], "properties": {
    "room": {"type": "string", "title": "Room", "oneOf": [
        {"const": "s", "title": "Single"}, {"const": "d", "title": "Double"}]},
    "extras": {"type": "array", "items": {"type": "string", "enum": ["spa", "gym"]},
               "maxItems": 2},
    "breakfast": {"type": "boolean", "default": True},
    "guests": {"type": "integer", "minimum": 1, "default": 2},
    "budget": {"type": "number"},
    "note": {"type": "string"}}}


def test_the_pages_form_reads_every_kind_of_field_as_the_schema_types_it(journal):
    from durable_nb.server.decide import posted_answer, question_form

    pending = _ask(journal, schema=KINDS)
    form = question_form(pending)
    assert '<option value="&quot;d&quot;">Double</option>' in form
    assert 'type="checkbox" name="field.choices.extras" value="&quot;spa&quot;"' in form
    assert 'name="field.boolean.breakfast" value="on" checked' in form
    assert 'name="field.integer.guests" value="2" required' not in form  # optional
    answer = posted_answer("accept", {
        "field.choice.room": ['"d"'], "field.choices.extras": ['"spa"', '"gym"'],
        "field.boolean.breakfast": ["false"], "field.integer.guests": ["3"],
        "field.number.budget": ["120.5"], "field.string.note": [""], "_xsrf": ["x"]})
    assert answer == {"action": "accept", "content": {
        "room": "d", "extras": ["spa", "gym"], "breakfast": False, "guests": 3,
        "budget": 120.5}}
    decision = decide(journal, "a", approved=True, answer=answer, **_seen(pending))
    assert decision["answer"] == answer


def test_the_notebooks_form_reads_every_kind_of_field_as_the_schema_types_it(journal):
    from durable_nb.notebook.answer_form import QuestionForm

    pending = _ask(journal, schema=KINDS)
    clicked: list[str] = []
    form = QuestionForm(clicked.append)
    assert form.show(pending)
    widgets = {name: widget for name, (_, widget) in form.inputs.items()}
    assert widgets["breakfast"].value is True and widgets["guests"].value == "2"
    widgets["room"].value = "s"
    widgets["extras"].value = ("gym",)
    widgets["budget"].value = "99"
    form.accept.click()
    assert clicked == ["accept"]
    answer = form.answer("accept")
    assert answer == {"action": "accept", "content": {
        "room": "s", "extras": ["gym"], "breakfast": True, "guests": 2, "budget": 99}}
    assert decide(journal, "a", approved=True, answer=answer, **_seen(pending))["answer"] \
        == answer
    assert form.answer("cancel") == {"action": "cancel"}
