"""One way in to decide (durable_nb.approvals.decide), with real parts: a Jupyter server from
tests/harness with the server extension, logging at DEBUG to a file; its REST API called with
the server's token; decision links taken from what a real receiver got (the loopback webhook
and Slack receivers) and opened by an HTTP client with a cookie jar, as the page's script
does, and by headless Chromium where what a person sees is the point.

Each test closes a break found on 953f9b9: a stale decision approving an identical later
request, a decision accepted on a cancelled fork, the starter approving her own run under
four-eyes through a Slack link, the link's secret in the server's log, and anonymous posts of
a used link growing the history without bound.
"""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from pathlib import Path

import pytest

import durable_nb as dn
from durable_nb.journal import Status, open_journal
from durable_nb.journal.index import journal_id
from durable_nb.notify import NotifyConfig, SlackConfig, WebhookConfig
from durable_nb.notify.config import LinksConfig
from durable_nb.notify.loopback import WebhookReceiver
from durable_nb.approvals.links import parse_token
from tests.harness.lab import CHROMIUM, CHROMIUM_ARGS, JupyterLab, require_chromium
from tests.test_decision_links import Browserless, _link_of, _page_of, _token_of

SECRET = "hook-secret"


@pytest.fixture(scope="module")
def lab(tmp_path_factory: pytest.TempPathFactory):
    base = tmp_path_factory.mktemp("decide")
    journal = base / "journal"
    journal.mkdir()
    with JupyterLab(base, env={"DURABLE_NB_DIR": str(journal),
                               "DURABLE_NB_INDEX": str(base / "index")},
                    log_level="DEBUG") as server:
        server.journal = str(journal)
        yield server


def _rest_decision(lab: JupyterLab, body: dict) -> tuple[int, dict]:
    """POST durable-nb/api/run/decision with the server's token, as the inbox does."""
    request = urllib.request.Request(
        f"{lab.url}/durable-nb/api/run/decision", method="POST",
        data=json.dumps({"journal": journal_id(lab.journal), **body}).encode(),
        headers={"Authorization": f"token {lab.token}", "Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=30) as answer:
            return answer.status, json.loads(answer.read() or b"null")
    except urllib.error.HTTPError as exc:
        text = exc.read()
        try:
            return exc.code, json.loads(text)
        except ValueError:
            return exc.code, {"message": text.decode(errors="replace")}


def _view(lab: JupyterLab, run_id: str) -> dict:
    """The run's pending request as the server's run view shows it (id and digest)."""
    request = urllib.request.Request(
        f"{lab.url}/durable-nb/api/run?id={run_id}&journal={journal_id(lab.journal)}",
        headers={"Authorization": f"token {lab.token}"})
    with urllib.request.urlopen(request, timeout=30) as answer:
        return json.loads(answer.read())["record"]["pending_approval"]


charges: list[int] = []


def _two_charges(ctx: dn.Context) -> list[int]:
    """Two requests that show the same thing: a second charge of the same amount."""
    for _ in range(2):
        if ctx.approval("charge", {"card": "4242", "amount": 10}).approved:
            ctx.run("charge", lambda: charges.append(10) or len(charges))
    return list(charges)


# --- a stale decision never decides the next, identical request ----------------------------

def test_a_decision_for_request_1_does_not_approve_an_identical_request_2(lab) -> None:
    """The inbox's card for request #1, posted again after the run took #1 and parked at an
    identical #2 (a retry, a second tab): refused (409), #2 still waits. On 953f9b9 the REST
    decision bound to the digest alone and approved #2: two charges from one card."""
    charges.clear()
    assert dn.execute("stale", _two_charges, journal=lab.journal, on_approval="park") is None
    first = _view(lab, "stale")
    card = {"id": "stale", "approved": True, "digest": first["digest"],
            "request_id": first["id"]}
    assert _rest_decision(lab, card)[0] == 200
    assert dn.execute("stale", _two_charges, journal=lab.journal, on_approval="park") is None
    second = _view(lab, "stale")
    assert second["digest"] == first["digest"] and second["id"] != first["id"]
    status, answer = _rest_decision(lab, card)  # the same card, posted again
    assert status == 409, answer
    assert "has taken that decision" in answer["message"]
    journal = open_journal(lab.journal)
    assert journal.get_request(f"decision.{second['id']}", "stale") is None
    assert journal.get_run("stale").status is Status.WAITING_APPROVAL
    assert charges == [10]
    # A decision that names no request is refused: the digest alone cannot tell #1 from #2.
    status, answer = _rest_decision(lab, {"id": "stale", "approved": True,
                                          "digest": second["digest"]})
    assert status == 400 and "request_id" in answer["message"]
    # Nor does one that saw a request asked before ids ("request_id": null): #2 has one.
    status, answer = _rest_decision(lab, {**card, "request_id": None})
    assert status == 409, answer
    assert journal.get_request(f"decision.{second['id']}", "stale") is None
    assert _rest_decision(lab, {**card, "request_id": second["id"]})[0] == 200
    assert dn.execute("stale", _two_charges, journal=lab.journal) == [10, 10]


# --- a fork asks nobody ----------------------------------------------------------------------

refunds: list[str] = []


def _refund(ctx: dn.Context) -> str:
    ctx.run("look", lambda: "order 7")
    if ctx.approval("refund", {"order": 7}).approved:
        ctx.run("refund", lambda: refunds.append("order 7") or "refunded")
        return "refunded"
    return "kept"


def test_a_cancelled_fork_refuses_a_decision_and_asks_when_it_is_executed(lab) -> None:
    """A fork ``RUN@1`` kept CANCELLED while waiting is a record of the past: a decision on
    it is refused (REST and Python), and executing it asks again instead of refunding. On
    953f9b9 the decision was accepted and executing the fork refunded without asking."""
    refunds.clear()
    assert dn.execute("order", _refund, journal=lab.journal, on_approval="park") is None
    fork_id = dn.rerun_from("order", 0, journal=lab.journal)
    fork = open_journal(lab.journal).get_run(fork_id)
    assert fork.status is Status.CANCELLED and fork.pending_approval
    shown = _view(lab, fork_id)
    status, answer = _rest_decision(lab, {"id": fork_id, "approved": True,
                                          "digest": shown["digest"], "request_id": shown["id"]})
    assert status == 409 and "not waiting for an approval" in answer["message"], answer
    assert "fork" in answer["message"]
    with pytest.raises(dn.NoPendingApproval, match="fork"):
        dn.approve(fork_id, journal=lab.journal)
    assert dn.execute(fork_id, _refund, journal=lab.journal, on_approval="park") is None
    assert refunds == []  # it asked again
    assert open_journal(lab.journal).get_run(fork_id).status is Status.WAITING_APPROVAL


# --- a shared link under four-eyes -----------------------------------------------------------

def test_under_four_eyes_the_starters_click_on_the_slack_approve_is_refused_up_front(
        lab, tmp_path: Path, monkeypatch) -> None:
    """Ana starts a run under four-eyes; the Slack message's Approve… button opens a page
    that says at once that a link shared in a channel cannot decide here (no Approve button
    offered), and a POST is refused too: nothing decided. On 953f9b9 the page offered
    Approve and Ana approved her own run "as slack"."""
    require_chromium()
    from playwright.sync_api import sync_playwright
    monkeypatch.setenv("DURABLE_NB_USER", "ana")
    with WebhookReceiver() as slack:
        config = NotifyConfig(slack=SlackConfig(slack.url),
                              links=LinksConfig(base_url=lab.url + "/"))
        assert dn.execute("own", _refund, journal=lab.journal, on_approval="park",
                          four_eyes=True, notify=config) is None
        payload = slack.wait_for(1)[0]["json"]
    actions = next(b for b in payload["blocks"] if b["type"] == "actions")
    approve = next(b["url"] for b in actions["elements"] if b["text"]["text"] == "Approve…")
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=str(CHROMIUM), headless=True,
                                    args=CHROMIUM_ARGS)
        page = browser.new_page(viewport={"width": 900, "height": 800})
        page.goto(approve)  # Ana's click in Slack
        page.locator("#outcome").wait_for()
        message = page.locator("#outcome").inner_text()
        page.screenshot(path=str(tmp_path / "four-eyes-link.png"), full_page=True)
        assert page.locator("button.approve").count() == 0, page.content()[:2000]
        browser.close()
    assert "cannot decide this request" in message and "Sign in to Jupyter" in message
    assert "four-eyes" in message
    client = Browserless()
    status, text = client.decide(approve, "approve", "mine")
    assert status == 403 and "Sign in to Jupyter" in text
    journal = open_journal(lab.journal)
    pending = journal.get_run("own").pending_approval
    assert journal.get_request(f"decision.{pending['id']}", "own") is None
    # Signed in to Jupyter as someone else (the server's user, not the starter), it decides.
    monkeypatch.setenv("DURABLE_NB_USER", "bo")
    dn.approve("own", journal=lab.journal)
    assert journal.get_request(f"decision.{pending['id']}", "own")["by"] == "bo"


# --- the link's secret stays out of the server's log; anonymous posts are bounded ----------

def _webhook_link(lab: JupyterLab, run_id: str) -> str:
    with WebhookReceiver(SECRET) as hook:
        assert dn.execute(run_id, _refund, journal=lab.journal, on_approval="park",
                          notify=NotifyConfig(webhook=WebhookConfig(hook.url, secret=SECRET),
                                              links=LinksConfig(base_url=lab.url + "/"))) \
            is None
        return _link_of(hook.wait_for(1)[0])


def test_the_links_secret_never_reaches_the_servers_log(lab) -> None:
    """GET the page, view, decide, then a refused POST (the link used) and a refused view of
    a forged token: the server, logging every request at DEBUG, never writes the secret.
    On 953f9b9 the token was the URL's path, logged with every request."""
    link = _webhook_link(lab, "logged")
    secret = parse_token(_token_of(link))[2]
    client = Browserless()
    assert client.view(link)[0] == 200
    assert client.decide(link, "approve", "ok")[0] == 200
    assert client.decide(link, "reject")[0] == 410  # refused: used already
    assert client.open(_page_of(link))[0] == 200  # the page again, a GET
    forged = link[:-8] + "AAAAAAAA"
    assert client.view(forged)[0] == 404
    with urllib.request.urlopen(_page_of(link), timeout=30) as answer:
        assert answer.headers["Referrer-Policy"] == "no-referrer"
    with pytest.raises(urllib.error.HTTPError) as refused:  # no XSRF cookie: refused
        urllib.request.urlopen(urllib.request.Request(_page_of(link), data=b"action=view"),
                               timeout=30)
    assert refused.value.code == 403
    assert refused.value.headers["Referrer-Policy"] == "no-referrer"  # every answer
    log = Path(lab.log_path).read_text(errors="replace")
    assert "/durable-nb/decide" in log  # the requests were logged, at DEBUG and above
    assert secret not in log and secret[:16] not in log
    assert parse_token(_token_of(forged))[2] not in log


def test_two_hundred_anonymous_posts_of_a_used_link_do_not_grow_the_history(lab) -> None:
    """A used link posted 200 times (no login needed) adds one refusal to the run's history,
    not 200. On 953f9b9 each post appended an event."""
    link = _webhook_link(lab, "flood")
    client = Browserless()
    xsrf = client.xsrf(link)
    assert client.decide(link, "approve", xsrf=xsrf)[0] == 200
    journal = open_journal(lab.journal)
    before = len(journal.events("flood"))
    statuses = {client.decide(link, "reject", "again", xsrf=xsrf)[0] for _ in range(200)}
    assert statuses == {410}
    after = journal.events("flood")
    assert len(after) - before == 1, [e["kind"] for e in after[before:]]
    assert after[-1]["kind"] == "link_refused"
