"""An MCP server's question shown as a form on the pages and in the messages that reach
people (issue 34, section 1): the decision page of a link (HTTP and Chromium, a real Jupyter
server), the webhook's JSON, Slack's Block Kit and the e-mail (loopback receivers, aiosmtpd),
each with the message and the fields, escaped for where they go. The question comes from the
real ``mcp`` SDK server of tests/mcp_server.py."""

from __future__ import annotations

import email
import email.policy
import json
import sys
from pathlib import Path

import pytest

import durable_nb as dn
import durable_nb.mcp as dmcp
from durable_nb.notify import EmailConfig, NotifyConfig, SlackConfig, WebhookConfig
from durable_nb.notify.config import LinksConfig
from durable_nb.notify.loopback import WebhookReceiver
from tests.harness import wait_until
from tests.harness.lab import CHROMIUM, CHROMIUM_ARGS, JupyterLab, require_chromium
from tests.test_decision_links import Browserless, _decision, _page_of, _token_of
from tests.test_notifications import _check_block_kit, smtp_server  # noqa: F401 (fixture)

SERVER = Path(__file__).with_name("mcp_server.py")
SECRET = "hook-secret"
#: A city (it goes into the server's message) that would be markup wherever it went raw.
CITY = "<b>Oslo</b> & <!channel> <https://evil.example|here>"


@pytest.fixture(autouse=True)
def closed_connections():
    yield
    dmcp.close()


@pytest.fixture
def lab(tmp_path: Path):
    journal = tmp_path / "journal"
    journal.mkdir()
    with JupyterLab(tmp_path, env={"DURABLE_NB_DIR": str(journal),
                                   "DURABLE_NB_INDEX": str(tmp_path / "index")}) as server:
        server.journal = str(journal)
        yield server


def booking_agent(count_dir: Path, city: str = "Oslo"):
    count_dir.mkdir(exist_ok=True)
    server = dmcp.stdio(sys.executable, str(SERVER), str(count_dir), "stdio", name="hotel")
    calls = {"role": "assistant", "content": None, "tool_calls": [
        {"id": "call_0", "type": "function",
         "function": {"name": "book", "arguments": json.dumps({"city": city})}}]}
    return lambda ctx: ctx.call_tools(calls, ctx.mcp_tools(server))


def _parked_with_link(lab: JupyterLab, count_dir: Path, run_id: str) -> tuple[str, dict]:
    """The run parked on the server's question; its decision link and the webhook's JSON."""
    with WebhookReceiver(SECRET) as hook:
        config = NotifyConfig(webhook=WebhookConfig(hook.url, secret=SECRET),
                              links=LinksConfig(base_url=lab.url + "/"))
        assert dn.execute(run_id, booking_agent(count_dir), journal=lab.journal,
                          on_approval="park", notify=config) is None
        request = hook.wait_for(1)[0]
    assert request["verified"], request["refused"]
    return request["json"]["links"][0]["url"], request["json"]


def test_the_page_shows_the_question_as_a_form_and_its_answer_is_the_decision(
        lab: JupyterLab, tmp_path: Path) -> None:
    link, notice = _parked_with_link(lab, tmp_path / "calls", "q")
    # The webhook's JSON carries the question: its message and the answer's schema.
    assert notice["question"]["message"] == "How many nights in Oslo?"
    assert notice["question"]["schema"]["required"] == ["nights"]
    assert notice["question"]["server"] == "hotel" and notice["question"]["tool"] == "book"

    client = Browserless()
    status, page = client.view(link)
    assert status == 200
    assert '<p class="question" id="question">How many nights in Oslo?</p>' in page
    assert '<input type="number" id="field.integer.nights" name="field.integer.nights"' in page
    for action in ("accept", "decline", "cancel"):
        assert f'name="action" value="{action}"' in page
    xsrf = client.xsrf(link)
    status, page = client.open(_page_of(link), {
        "_xsrf": xsrf, "action": "accept", "token": _token_of(link),
        "field.integer.nights": "three"})
    # Refused in words, nothing decided, the form shown again (the link still unused).
    assert status == 400 and "field &#x27;nights&#x27; must be an integer" in page
    assert 'name="field.integer.nights"' in page and _decision(lab.journal, "q") is None
    status, page = client.open(_page_of(link), {
        "_xsrf": xsrf, "action": "accept", "token": _token_of(link),
        "field.integer.nights": "3"})
    assert status == 200 and "Answered accept, as webhook." in page
    assert '<th>Answer</th><td>accept {&quot;nights&quot;: 3}</td>' in page
    decision = _decision(lab.journal, "q")
    assert decision["answer"] == {"action": "accept", "content": {"nights": 3}}
    assert decision["via"] == "link" and decision["approved"] is True
    answers = dn.execute("q", booking_agent(tmp_path / "calls"), journal=lab.journal,
                         on_approval="park")
    assert answers[0]["content"] == "booked 3 nights in Oslo"


def test_in_chromium_the_page_answers_accept_and_decline_with_a_required_field_empty(
        lab: JupyterLab, tmp_path: Path) -> None:
    require_chromium()
    from playwright.sync_api import sync_playwright
    accept_link, _ = _parked_with_link(lab, tmp_path / "a", "accept")
    decline_link, _ = _parked_with_link(lab, tmp_path / "d", "decline")
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=str(CHROMIUM), headless=True,
                                    args=CHROMIUM_ARGS)
        page = browser.new_page(viewport={"width": 900, "height": 900})
        page.goto(accept_link)
        page.locator("#question").wait_for()
        assert page.locator("h1").inner_text() == "Question: book asks"
        assert page.locator("#question").inner_text() == "How many nights in Oslo?"
        assert "Nights" in page.locator("label[for='field.integer.nights']").inner_text()
        page.fill("input[name='field.integer.nights']", "2")
        page.screenshot(path=str(tmp_path / "question-page.png"), full_page=True)
        with page.expect_navigation():
            page.click("button[value='accept']")
        assert "Answered accept, as webhook." in page.locator("#outcome").inner_text()
        page.screenshot(path=str(tmp_path / "question-answered.png"), full_page=True)
        # Decline needs no field: the browser does not hold the form back for one required.
        page = browser.new_page()
        page.goto(decline_link)
        page.locator("#question").wait_for()
        with page.expect_navigation():
            page.click("button[value='decline']")
        assert "Answered decline, as webhook." in page.locator("#outcome").inner_text()
        browser.close()
    print("screenshots:", tmp_path)
    assert _decision(lab.journal, "accept")["answer"] == {"action": "accept",
                                                          "content": {"nights": 2}}
    assert _decision(lab.journal, "decline")["answer"] == {"action": "decline"}


def test_slack_and_email_show_the_message_and_the_fields_escaped_with_the_link(
        tmp_path: Path, smtp_server) -> None:  # noqa: F811 (fixture)
    port, received, _ = smtp_server
    with WebhookReceiver() as slack:
        config = NotifyConfig(slack=SlackConfig(slack.url),
                              email=EmailConfig(host="127.0.0.1", port=port,
                                                sender="dnb@example.org",
                                                to=("ana@example.org",)),
                              links=LinksConfig(base_url="http://127.0.0.1:1/"))
        assert dn.execute("q", booking_agent(tmp_path / "calls", CITY),
                          journal=str(tmp_path / "j"), on_approval="park",
                          notify=config) is None
        payload = slack.wait_for(1)[0]["json"]
    _check_block_kit(payload)
    text = json.dumps(payload)
    question = next(b for b in payload["blocks"]
                    if b["type"] == "section" and "Question" in b.get("text", {}).get("text", ""))
    shown = question["text"]["text"]
    assert question["text"]["type"] == "mrkdwn"
    assert "&lt;b&gt;Oslo&lt;/b&gt; &amp; &lt;!channel&gt; &lt;https://evil.example|here&gt;" \
        in shown
    assert "<!channel>" not in text and "<https://evil" not in text
    assert "Nights [nights] (integer, required): How many nights" in shown
    answer = [b for b in payload["blocks"] if b["type"] == "actions"][0]["elements"]
    assert [b["text"]["text"] for b in answer] == ["Answer…"]
    assert answer[0]["url"].startswith("http://127.0.0.1:1/durable-nb/decide#")
    assert payload["blocks"][0]["text"]["text"] == "Answer needed: book asks"

    wait_until(lambda: received, 30, "the e-mail")  # sent by the same delivery, after Slack
    message = email.message_from_bytes(received[0].content, policy=email.policy.default)
    assert message["Subject"] == "Answer needed: book asks (run q)"
    plain = message.get_body(("plain",)).get_content()
    assert f"How many nights in {CITY}?" in plain  # plain text: as the server wrote it
    assert "Nights [nights] (integer, required): How many nights" in plain
    assert "durable-nb answer q accept --content JSON" in plain
    page = message.get_body(("html",)).get_content()
    assert "&lt;b&gt;Oslo&lt;/b&gt; &amp; &lt;!channel&gt;" in page and "<b>Oslo" not in page
    assert "/durable-nb/decide#" in plain and "answer the question" in page
