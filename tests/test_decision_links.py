"""Decision links (durable_nb.approvals.links, durable_nb.server.decide), with real parts: a
Jupyter server from tests/harness with the server extension, runs parked on a disk journal
(and a PostgreSQL one for racing servers), the link taken from what a real receiver got (the
signed-webhook receiver, aiosmtpd), Chromium opening the page and clicking Approve.

Expiry is tested with a link issued in the past (the delivery's injectable clock), never by
waiting out a deadline.
"""

from __future__ import annotations

import http.cookiejar
import os
import re
import subprocess
import sys
import textwrap
import time
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path

import pytest

import durable_nb as dn
from durable_nb.journal import Status, open_journal
from durable_nb.notify import EmailConfig, NotifyConfig, WebhookConfig
from durable_nb.notify.config import LinksConfig
from durable_nb.notify.delivery import deliver
from durable_nb.approvals.links import issue_links, parse_token, use_link
from durable_nb.notify.loopback import WebhookReceiver
from durable_nb.cli import main as cli
from tests.harness.kernel import wait_until
from tests.harness.lab import CHROMIUM, CHROMIUM_ARGS, JupyterLab, require_chromium
from tests.test_journal_conformance import Backend, pg_backend  # noqa: F401 (fixture)
from tests.test_notifications import smtp_server  # noqa: F401 (fixture)

REPO = Path(__file__).resolve().parents[1]
SECRET = "hook-secret"
DETAILS = {"table": "users", "rows": 1200}


def _ask(ctx: dn.Context, details: dict = DETAILS) -> dict:
    decision = ctx.approval("drop_table", details)
    return {"approved": decision.approved, "note": decision.note, "by": decision.by}


def _ask_other(ctx: dn.Context) -> dict:  # the cell edited: the request at step 0 differs
    return _ask(ctx, {"table": "orders", "rows": 3})


def _config(hook: WebhookReceiver, base: str) -> NotifyConfig:
    return NotifyConfig(webhook=WebhookConfig(hook.url, secret=SECRET),
                        links=LinksConfig(base_url=base + "/"))


def _link_of(request: dict) -> str:
    assert request["verified"], request["refused"]
    links = request["json"]["links"]
    assert len(links) == 1 and links[0]["to"] == "webhook"
    return links[0]["url"]


def _page_of(link: str) -> str:
    """The page's URL: the link without its fragment (the token), as a server sees it."""
    return link.split("#", 1)[0]


def _token_of(link: str) -> str:
    """The token a link carries in its fragment (before a ``?choice=`` a button adds)."""
    return link.split("#", 1)[1].split("?", 1)[0]


class Browserless:
    """An HTTP client with a cookie jar that does what the page's script does: GET the page
    (the XSRF cookie and field), POST the fragment's token to view the request, POST it with
    a choice to decide."""

    def __init__(self) -> None:
        self.opener = urllib.request.build_opener(
            urllib.request.HTTPCookieProcessor(http.cookiejar.CookieJar()),
            urllib.request.ProxyHandler({}))

    def open(self, url: str, form: dict | None = None) -> tuple[int, str]:
        data = None if form is None else urllib.parse.urlencode(form).encode()
        try:
            with self.opener.open(url, data=data, timeout=30) as answer:
                return answer.status, answer.read().decode()
        except urllib.error.HTTPError as exc:
            return exc.code, exc.read().decode()

    def xsrf(self, link: str) -> str:
        """The form's XSRF value (and its cookie, kept) from a GET of the page."""
        status, page = self.open(_page_of(link))
        found = re.search(r'name="_xsrf" value="([^"]+)"', page)
        assert found, (status, page[:500])
        return found.group(1)

    def view(self, link: str, xsrf: str | None = None) -> tuple[int, str]:
        """What the page shows for the link (its script's first POST)."""
        return self.open(_page_of(link), {"_xsrf": xsrf or self.xsrf(link), "action": "view",
                                          "token": _token_of(link)})

    def decide(self, link: str, choice: str, note: str = "", xsrf: str | None = None
               ) -> tuple[int, str]:
        return self.open(_page_of(link), {"_xsrf": xsrf or self.xsrf(link), "action": choice,
                                          "token": _token_of(link), "note": note})


def _link_records(journal_dir: str, run_id: str) -> list[dict]:
    """The run's links (without the marks of refusals recorded once per link)."""
    return [r for r in open_journal(journal_dir).link_records(run_id).values()
            if r.get("kind") == "link"]


def _decision(journal_dir: str, run_id: str) -> dict | None:
    journal = open_journal(journal_dir)
    pending = journal.get_run(run_id).pending_approval
    return journal.get_request(f"decision.{pending['id']}", run_id) if pending else None


@pytest.fixture
def lab(tmp_path: Path):
    journal = tmp_path / "journal"
    journal.mkdir()
    with JupyterLab(tmp_path, env={"DURABLE_NB_DIR": str(journal),
                                   "DURABLE_NB_INDEX": str(tmp_path / "index")}) as server:
        server.journal = str(journal)
        yield server


# --- the whole path: webhook -> page in Chromium -> decided -> the run goes on --------------

def test_a_link_opened_in_chromium_decides_once_and_the_run_continues(
        lab: JupyterLab, tmp_path: Path, capsys) -> None:
    require_chromium()
    from playwright.sync_api import sync_playwright
    journal = lab.journal
    with WebhookReceiver(SECRET) as hook:
        assert dn.execute("r", _ask, journal=journal, on_approval="park",
                          notify=_config(hook, lab.url)) is None
        link = _link_of(hook.wait_for(1)[0])
    assert link.startswith(f"{lab.url}/durable-nb/decide#")
    secret = parse_token(_token_of(link))[2]
    replay = Browserless()
    replay_xsrf = replay.xsrf(link)  # another tab's form, posted after the decision
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=str(CHROMIUM), headless=True,
                                    args=CHROMIUM_ARGS)
        page = browser.new_page(viewport={"width": 900, "height": 900})
        posted: list[tuple[int, str]] = []  # what the page posted, and what it was answered
        page.on("response", lambda r: r.request.method == "POST" and posted.append(
            (r.status, r.request.post_data or "")))
        page.goto(link)  # no Jupyter login, no kernel, no JupyterLab
        page.locator("#outcome").wait_for()
        assert [status for status, _ in posted] == [200]
        assert f"token={urllib.parse.quote(_token_of(link))}" in posted[0][1]  # in the body
        assert page.locator("h1").inner_text() == "Approval: drop_table"
        assert page.url == f"{lab.url}/durable-nb/decide"  # the token left the address bar
        assert "users" in page.locator("pre").inner_text()
        assert "webhook" in page.locator("table").inner_text()
        page.screenshot(path=str(tmp_path / "link-page.png"), full_page=True)
        # The GET decided nothing: no decision, the link unused.
        assert _decision(journal, "r") is None
        assert [r["state"] for r in _link_records(journal, "r")] == ["issued"]
        page.fill("textarea#note", "fine for the nightly job")
        with page.expect_navigation():
            page.click("button.approve")
        assert "Approved, as webhook." in page.locator("#outcome").inner_text(timeout=5000), \
            page.content()[:3000]
        page.screenshot(path=str(tmp_path / "link-decided.png"), full_page=True)
        # The page opened again (a second visit, a link scanner): used, 410, says when.
        posted.clear()
        page = browser.new_page()  # (the same tab would only move to the fragment)
        page.on("response", lambda r: r.request.method == "POST" and posted.append(
            (r.status, r.request.post_data or "")))
        page.goto(link)
        page.locator("#outcome.used").wait_for()
        assert [status for status, _ in posted] == [410]
        assert "used already" in page.locator("#outcome").inner_text()
        browser.close()
    decision = _decision(journal, "r")
    assert decision["by"] == "webhook" and decision["via"] == "link"
    assert decision["approved"] is True and decision["note"] == "fine for the nightly job"
    # A second POST of the same link (its form, fetched before the decision, replayed):
    # 410, nothing changes.
    status, page_text = replay.decide(link, "reject", "no", xsrf=replay_xsrf)
    assert status == 410 and "used already" in page_text
    assert _decision(journal, "r") == decision
    # The run re-run continues, approved by the link's recipient.
    result = dn.execute("r", _ask, journal=journal, on_approval="park")
    assert result == {"approved": True, "note": "fine for the nightly job", "by": "webhook"}
    assert open_journal(journal).get_run("r").status is Status.DONE
    capsys.readouterr()
    assert cli(["--journal", journal, "show", "r"]) == 0
    shown = capsys.readouterr().out
    assert "link_issued" in shown and "link_used" in shown and "link_refused" in shown
    assert "decision links to webhook" in shown
    assert secret not in shown
    # Nothing in the journal opens the link: its secret is stored only as a hash. (grep in a
    # process of its own: closing a file of the journal here would drop SQLite's locks.)
    assert subprocess.run(["grep", "-rlF", secret, journal]).returncode == 1



# --- refusals: forged, changed, expired ------------------------------------------------------

def test_a_forged_token_a_changed_request_and_an_expired_link_decide_nothing(
        lab: JupyterLab, capsys) -> None:
    journal = lab.journal
    client = Browserless()
    with WebhookReceiver(SECRET) as hook:
        assert dn.execute("r", _ask, journal=journal, on_approval="park",
                          notify=_config(hook, lab.url)) is None
        old_link = _link_of(hook.wait_for(1)[0])
        old_xsrf = client.xsrf(old_link)
        # A forged token: the right journal and run, a secret never issued -> 404.
        ref, run_b64, secret = _token_of(old_link).split(".")
        forged = f"{lab.url}/durable-nb/decide#{ref}.{run_b64}.{secret[::-1]}"
        assert client.view(forged, xsrf=old_xsrf)[0] == 404
        status, page = client.decide(forged, "approve", xsrf=old_xsrf)
        assert status == 404 and "Nothing was decided" in page
        garbage = f"{lab.url}/durable-nb/decide#not-a-token"
        assert client.view(garbage, xsrf=old_xsrf)[0] == 404
        assert client.decide(garbage, "approve", xsrf=old_xsrf)[0] == 404
        # The cell edited: the run asks something else at that step, and a new link is sent.
        assert dn.execute("r", _ask_other, journal=journal, on_approval="park",
                          notify=_config(hook, lab.url)) is None
        new_link = _link_of(hook.wait_for(2)[1])
    assert new_link != old_link
    status, page = client.decide(old_link, "approve", xsrf=old_xsrf)
    assert status == 409 and "no longer the one waiting" in page
    assert client.view(old_link)[0] == 409  # the page says so too, without a form
    assert _decision(journal, "r") is None  # nothing decided, on either request
    # A link issued by a delivery whose clock says eight days ago (so past the default
    # max age of seven days) -> 410, nothing decided.
    assert dn.execute("old", _ask, journal=journal, on_approval="park", notify="none") is None
    eight_days_ago = time.time() - 8 * 24 * 3600
    with WebhookReceiver(SECRET) as hook:
        opened = open_journal(journal)
        assert deliver(opened, opened.get_run("old"), _config(hook, lab.url),
                       now=lambda: eight_days_ago) == {"webhook": "sent"}
        expired_link = _link_of(hook.wait_for(1)[0])
    status, page = client.view(expired_link)
    assert status == 410 and "expired" in page
    status, page = client.decide(expired_link, "approve", xsrf=old_xsrf)
    assert status == 410 and "expired" in page
    assert _decision(journal, "old") is None
    # The new request's link still decides it.
    status, page = client.decide(new_link, "reject", "not orders")
    assert status == 200 and "Rejected" in page
    assert _decision(journal, "r")["approved"] is False
    result = dn.execute("r", _ask_other, journal=journal, on_approval="park")
    assert result == {"approved": False, "note": "not orders", "by": "webhook"}
    capsys.readouterr()
    assert cli(["--journal", journal, "show", "r"]) == 0
    shown = capsys.readouterr().out
    assert "link_refused" in shown and "no longer the one waiting" in shown


_QUERY_SCHEMA = {"type": "object", "properties": {"database": {"type": "string"}},
                 "required": ["database"], "additionalProperties": False}


def _ask_query(ctx: dn.Context) -> list:
    decision = ctx.approval("query", {"tool": "query", "arguments": {"database": "prod"}},
                            schema=_QUERY_SCHEMA)
    return [decision.approved, decision.args, decision.message]


def test_the_page_approves_with_edited_arguments_and_rejects_with_a_message(
        lab: JupyterLab) -> None:
    """Issue 34: the page shows a tool call's arguments editable; an edit that does not fit
    the schema decides nothing and leaves the link unused; one that fits is the decision."""
    journal = lab.journal
    client = Browserless()
    with WebhookReceiver(SECRET) as hook:
        for run_id in ("edit", "deny"):
            assert dn.execute(run_id, _ask_query, journal=journal, on_approval="park",
                              notify=_config(hook, lab.url)) is None
        edit_link, deny_link = (_link_of(r) for r in hook.wait_for(2))
    runs = {}
    for link in (edit_link, deny_link):
        status, page = client.view(link)
        assert status == 200 and 'name="args"' in page and "&quot;prod&quot;" in page
        runs["edit" if "Run</th><td>edit<" in page else "deny"] = link
    shown = '{\n  "database": "prod"\n}'
    xsrf = client.xsrf(runs["edit"])
    status, page = client.open(_page_of(runs["edit"]), {
        "_xsrf": xsrf, "action": "approve", "token": _token_of(runs["edit"]),
        "args": '{"db": "staging"}', "args_shown": shown})
    assert status == 400 and "unknown argument &#x27;db&#x27;" in page
    assert 'name="args"' in page  # the form again, to correct the edit
    assert _decision(journal, "edit") is None
    status, page = client.open(_page_of(runs["edit"]), {
        "_xsrf": xsrf, "action": "approve", "token": _token_of(runs["edit"]),
        "args": '{"database": "staging"}', "args_shown": shown})
    assert status == 200 and "Approved" in page
    status, page = client.open(_page_of(runs["deny"]), {
        "_xsrf": client.xsrf(runs["deny"]), "action": "reject",
        "token": _token_of(runs["deny"]), "message": "Denied: use staging"})
    assert status == 200 and "Rejected" in page
    assert dn.execute("edit", _ask_query, journal=journal) == [True, {"database": "staging"},
                                                               None]
    assert dn.execute("deny", _ask_query, journal=journal) == [False, None,
                                                               "Denied: use staging"]


# --- e-mail: a link per recipient ------------------------------------------------------------

def test_each_email_recipient_gets_a_link_of_their_own_and_decides_as_themselves(
        lab: JupyterLab, smtp_server) -> None:
    import email
    import email.policy
    port, received, _ = smtp_server
    journal = lab.journal
    config = NotifyConfig(email=EmailConfig(host="127.0.0.1", port=port,
                                            sender="dnb@example.org",
                                            to=("ana@example.org", "bo@example.org")),
                          links=LinksConfig(base_url=lab.url + "/"))
    assert dn.execute("r", _ask, journal=journal, on_approval="park", notify=config) is None
    wait_until(lambda: len(received) == 2, what="two e-mails", timeout=60)
    links = {}
    for envelope in received:
        message = email.message_from_bytes(envelope.content, policy=email.policy.default)
        assert envelope.rcpt_tos == [message["To"]]  # each recipient a message of their own
        text = message.get_body(("plain",)).get_content()
        html = message.get_body(("html",)).get_content()
        found = re.findall(rf"{re.escape(lab.url)}/durable-nb/decide#[\w.-]+", text)
        assert len(found) == 1 and f'href="{found[0]}"' in html
        links[message["To"]] = found[0]
    assert links["ana@example.org"] != links["bo@example.org"]
    client = Browserless()
    ana_xsrf = client.xsrf(links["ana@example.org"])
    status, page = client.decide(links["bo@example.org"], "approve", "bo says yes")
    assert status == 200 and "as bo@example.org" in page
    # Ana's link, the request decided by Bo meanwhile: 409 with who decided, nothing changed.
    status, page = client.decide(links["ana@example.org"], "reject", xsrf=ana_xsrf)
    assert status == 409 and "approved by bo@example.org via link" in page
    decision = _decision(journal, "r")
    assert decision["by"] == "bo@example.org" and decision["approved"] is True
    result = dn.execute("r", _ask, journal=journal, on_approval="park")
    assert result == {"approved": True, "note": "bo says yes", "by": "bo@example.org"}


def test_a_link_sent_to_someone_not_on_the_approvers_list_is_refused_and_stays_unused(
        tmp_path) -> None:
    """The link decides as its recipient, under the request's approvers' list: bo's link
    is refused (403, nothing decided, the link still unused), ana's decides."""
    journal_dir = str(tmp_path / "j")
    assert dn.execute("r", lambda ctx: ctx.approval("deploy", {}, approvers=["ana@example.org"]),
                      journal=journal_dir, on_approval="park") is None
    journal = open_journal(journal_dir)
    pending = journal.get_run("r").pending_approval
    links, _ = issue_links(journal, "r", pending, channel="email",
                           recipients=["bo@example.org", "ana@example.org"],
                           config=LinksConfig(base_url="http://127.0.0.1:1/"), delivery="r/x/email")
    secret = {to: parse_token(_token_of(url))[2] for to, url in links}
    refused = use_link(journal, "r", secret["bo@example.org"], approved=True, note=None)
    assert refused.status == 403 and "ana@example.org" in refused.message
    assert _decision(journal_dir, "r") is None
    assert [r["state"] for r in _link_records(journal_dir, "r")] == ["issued", "issued"]
    assert [e["kind"] for e in journal.events("r")].count("refused") == 1
    decided = use_link(journal, "r", secret["ana@example.org"], approved=True, note="ok")
    assert decided.status == 200 and _decision(journal_dir, "r")["by"] == "ana@example.org"


# --- the base URL: the server's own, or none (and show says why) -----------------------------

def _park_elsewhere(run_id: str, journal: str) -> None:
    """Park a run in a process of its own, which knows no Jupyter server, with a journal
    index of its own (a server extension an earlier test loaded into this process sweeps the
    journals this process's index lists: it would send the request first). It exits once
    its delivery is done."""
    park = ("import durable_nb as dn; from tests.test_decision_links import _ask; "
            f"assert dn.execute({run_id!r}, _ask, journal={journal!r}, "
            f"on_approval='park') is None")
    env = {k: v for k, v in os.environ.items() if k != "JPY_PARENT_PID"}
    subprocess.run([sys.executable, "-c", park], check=True, cwd=REPO, timeout=120,
                   env={**env, "PYTHONPATH": str(REPO),
                        "DURABLE_NB_INDEX": str(Path(journal).parent / "index-parker")})


def test_the_server_sends_links_to_itself(lab: JupyterLab) -> None:
    journal = lab.journal
    # Parked while no channel is configured: nobody notified it.
    _park_elsewhere("quiet", journal)
    with WebhookReceiver(SECRET) as hook:
        # The server extension's sweep (every 10 s) sends what nobody sent, with its own URL.
        (Path(journal) / "notify.toml").write_text(
            f'[webhook]\nurl = "{hook.url}"\nsecret = "{SECRET}"\n')
        quiet = hook.wait_for(1, timeout=60)[0]
    assert quiet["json"]["run_id"] == "quiet"
    assert _link_of(quiet).startswith(f"{lab.url}/durable-nb/decide#")
    status, page = Browserless().decide(_link_of(quiet), "approve")
    assert status == 200 and "Approved" in page


def test_a_sender_that_knows_no_server_sends_no_link_and_show_says_why(
        tmp_path: Path, capsys, monkeypatch) -> None:
    monkeypatch.delenv("JPY_PARENT_PID", raising=False)
    monkeypatch.delenv("JUPYTERHUB_PUBLIC_URL", raising=False)
    journal = str(tmp_path / "j")
    with WebhookReceiver(SECRET) as hook:
        assert dn.execute("r", _ask, journal=journal, on_approval="park", notify=NotifyConfig(
            webhook=WebhookConfig(hook.url, secret=SECRET))) is None
        assert hook.wait_for(1)[0]["json"]["links"] == []
    wait_until(lambda: "no decision links" in _show(journal, "r", capsys),
               what="the delivery's record", timeout=30)
    assert "set [links] base_url in notify.toml or DURABLE_NB_NOTIFY_LINK_BASE_URL" in \
        _show(journal, "r", capsys)
    assert open_journal(journal).link_records("r") == {}


def _show(journal: str, run_id: str, capsys: pytest.CaptureFixture) -> str:
    capsys.readouterr()
    assert cli(["--journal", journal, "show", run_id]) == 0
    return capsys.readouterr().out


# --- PostgreSQL: two servers, the same link posted at once -----------------------------------

_POSTER = textwrap.dedent("""
    import os, re, sys, time, urllib.parse, urllib.request, urllib.error, http.cookiejar
    url, go = sys.argv[1], sys.argv[2]
    opener = urllib.request.build_opener(
        urllib.request.HTTPCookieProcessor(http.cookiejar.CookieJar()),
        urllib.request.ProxyHandler({}))
    page_url, token = url.split("#")
    try:
        page = opener.open(page_url, timeout=30).read().decode()
    except urllib.error.HTTPError as exc:
        sys.exit(f"GET {exc.code}: {exc.read()[:300]!r}")
    xsrf = re.search(r'name="_xsrf" value="([^"]+)"', page).group(1)
    open(sys.argv[4], "w").close()  # ready: the form is here
    while not os.path.exists(go):
        time.sleep(0.005)
    form = urllib.parse.urlencode({"_xsrf": xsrf, "action": sys.argv[3], "token": token,
                                   "note": ""}).encode()
    try:
        status = opener.open(page_url, data=form, timeout=60).status
    except urllib.error.HTTPError as exc:
        status = exc.code
    print(status)
""")


@pytest.mark.postgres
def test_two_servers_posting_one_link_at_once_decide_exactly_once(
        pg_backend: Backend, tmp_path: Path) -> None:
    env = {"DURABLE_NB_JOURNAL": pg_backend.location,
           "DURABLE_NB_INDEX": str(tmp_path / "index")}
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    with JupyterLab(tmp_path / "a", env=env) as one, JupyterLab(tmp_path / "b", env=env) as two:
        with WebhookReceiver(SECRET) as hook:
            assert dn.execute("race", _ask, journal=pg_backend.location, on_approval="park",
                              notify=_config(hook, one.url)) is None
            link = _link_of(hook.wait_for(1)[0])
        token = _token_of(link)
        go = tmp_path / "go"
        posters = [subprocess.Popen(
            [sys.executable, "-c", _POSTER, f"{server.url}/durable-nb/decide#{token}", str(go),
             choice, str(tmp_path / f"ready-{choice}")], stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT, text=True)
            for server, choice in ((one, "approve"), (two, "reject"))]
        wait_until(lambda: all((tmp_path / f"ready-{c}").exists() for c in ("approve", "reject"))
                   or any(p.poll() is not None for p in posters), what="both forms", timeout=60)
        go.touch()
        outputs = [p.communicate(timeout=120)[0].strip() for p in posters]
        assert all(out.isdigit() for out in outputs), outputs
        statuses = [int(out) for out in outputs]
    assert sorted(statuses) == [200, 410], statuses
    journal = pg_backend.open()
    pending = journal.get_run("race").pending_approval
    decision = journal.get_request(f"decision.{pending['id']}", "race")
    assert decision["approved"] is (statuses[0] == 200)  # the one that got 200 decided
    kinds = [e["kind"] for e in journal.events("race")]
    assert kinds.count("decided") == 1 and kinds.count("link_used") == 1, kinds
    assert kinds.count("link_refused") == 1


# --- Slack: buttons that open the page -------------------------------------------------------

def test_slack_buttons_open_the_page_and_the_page_alone_decides(lab: JupyterLab) -> None:
    from durable_nb.notify import SlackConfig
    from tests.test_notifications import _check_block_kit
    with WebhookReceiver() as slack:
        config = NotifyConfig(slack=SlackConfig(slack.url),
                              links=LinksConfig(base_url=lab.url + "/"))
        assert dn.execute("r", _ask, journal=lab.journal, on_approval="park",
                          notify=config) is None
        payload = slack.wait_for(1)[0]["json"]
    _check_block_kit(payload)
    actions = [b for b in payload["blocks"] if b["type"] == "actions"]
    assert len(actions) == 1
    buttons = {b["text"]["text"]: b["url"] for b in actions[0]["elements"]}
    assert set(buttons) == {"Approve…", "Reject…"}
    client = Browserless()
    for url in buttons.values():  # a click on a button opens the page: it decides nothing
        assert url.startswith(f"{lab.url}/durable-nb/decide?choice=")
        status, page = client.view(url)
        assert status == 200 and 'name="action" value="reject"' in page
    assert _decision(lab.journal, "r") is None
    status, page = client.decide(buttons["Reject…"], "reject", "not today")
    assert status == 200 and "Rejected, as slack." in page
    assert _decision(lab.journal, "r")["by"] == "slack"
