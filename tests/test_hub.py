"""Separation of duties on a real JupyterHub (issue 33): JupyterHub 5+/6 with
configurable-http-proxy on loopback, the dummy authenticator with ana, bo and cy, their
single-user servers (SimpleLocalProcessSpawner) with durable_nb's server extension, the
durable-nb service the hub starts, one shared PostgreSQL journal with a role per person
(tests/hub_roles.py). One hub for the module.

Each bypass of issue 33 worked on 953f9b9 (the decision was written as asked); here each is
refused with one line, nothing is written, and the refusal is in the run's history.
"""

from __future__ import annotations

import email
import json
import re
import socket
import threading
import time
import urllib.error
import urllib.parse
import urllib.request

import pytest

from durable_nb import Status
from durable_nb.approvals.request import find_decision
from tests.harness.hub import PASSWORD, Hub, run_in_kernel
from tests.hub_roles import make_hub_database

pytestmark = [pytest.mark.postgres, pytest.mark.timeout(600)]

_AGENT = """
import durable_nb as dn
def agent(ctx):
    if ctx.approval("drop database", {{"db": "staging"}}).approved:
        return "dropped staging"
    return "kept"
print(dn.execute({run!r}, agent, on_approval="park", four_eyes=True,
                 notebook="ops/cleanup.ipynb"))
"""


@pytest.fixture(scope="module")
def smtp():
    """An SMTP server on loopback (aiosmtpd): the messages it received, as they come."""
    from aiosmtpd.controller import Controller

    received: list = []

    class Handler:
        async def handle_DATA(self, server, session, envelope):
            received.append(envelope)
            return "250 OK"

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    controller = Controller(Handler(), hostname="127.0.0.1", port=port)
    controller.start()
    try:
        yield port, received
    finally:
        controller.stop()


@pytest.fixture(scope="module")
def hub(postgres_server, smtp):
    database = make_hub_database(postgres_server)
    started = Hub(database, service_env={  # the team's one sender: the service
        "DURABLE_NB_NOTIFY_SMTP_HOST": "127.0.0.1", "DURABLE_NB_NOTIFY_SMTP_PORT": str(smtp[0]),
        "DURABLE_NB_NOTIFY_SMTP_FROM": "durable-nb@team.test", "DURABLE_NB_HUB_SWEEP": "1"})
    started.start()
    try:
        started.servers = {"ana": started.start_server("ana")}
        yield started
    finally:
        started.stop()


@pytest.fixture(scope="module")
def service_journal(hub):
    journal = hub.database.journal("service")
    yield journal
    journal.dispose()


def _park(hub, run_id: str, code_before: str = "") -> dict:
    out = run_in_kernel(hub.servers["ana"], hub.admin_token,
                        code_before + _AGENT.format(run=run_id))
    assert out.strip().endswith("None"), out
    journal = hub.database.journal("service")
    try:
        return journal.get_run(run_id).pending_approval
    finally:
        journal.dispose()


def _refusals(journal, run_id: str) -> list[dict]:
    return [e for e in journal.events(run_id) if e["kind"] == "refused"]


def test_her_kernel_naming_bo_is_refused_as_ana(hub, service_journal):
    pending = _park(hub, "env-user")
    out = run_in_kernel(hub.servers["ana"], hub.admin_token,
                        "import os, durable_nb as dn\nos.environ['DURABLE_NB_USER'] = 'bo'\n"
                        "try:\n    dn.approve('env-user')\n"
                        "except dn.DurableError as exc:\n    print(exc)\n")
    (line,) = out.strip().splitlines()
    assert line == ("run 'env-user': 'drop database' was not decided: ana started the run, "
                    "and under four-eyes nobody decides a request of a run they started: ask "
                    "someone else to decide. Nothing was written."), line
    assert find_decision(service_journal, "env-user", pending) is None
    (event,) = _refusals(service_journal, "env-user")
    assert (event["by"], event["via"]) == ("ana", "Python on the hub")


def test_her_panel_s_approve_with_her_kernel_naming_bo_is_refused_as_ana(hub,
                                                                         service_journal):
    pending = _park(hub, "panel")
    out = run_in_kernel(hub.servers["ana"], hub.admin_token, _AGENT.format(run="unused")
                        .split("print(")[0] + (
        "import html, os\n"
        "from durable_nb.journal import open_journal\n"
        "from durable_nb.notebook.session import NotebookRun\n"
        "from durable_nb.options import RunOptions\n"
        "os.environ['DURABLE_NB_USER'] = 'bo'\n"
        "journal = open_journal()\n"
        "cell = NotebookRun('panel', agent, RunOptions(on_approval='park', four_eyes=True), "
        "journal)\n"
        "cell.panel.on_record(journal.get_run('panel'))\n"
        "cell.panel.approve_button.click()  # the panel's own button\n"
        "print(html.unescape(cell.panel.approval_text.value))\n"))
    assert ("'drop database' was not decided: ana started the run, and under four-eyes "
            "nobody decides a request of a run they started: ask someone else to decide. "
            "Nothing was written.") in out, out
    assert find_decision(service_journal, "panel", pending) is None
    (event,) = _refusals(service_journal, "panel")
    assert (event["by"], event["via"]) == ("ana", "panel on the hub")


def test_her_terminal_with_by_bo_is_refused_as_ana(hub, service_journal):
    pending = _park(hub, "cli-by")
    out = run_in_kernel(hub.servers["ana"], hub.admin_token,
                        "import subprocess, sys\n"
                        "p = subprocess.run([sys.executable, '-m', 'durable_nb.cli', 'approve', "
                        "'cli-by', '--by', 'bo'], capture_output=True, text=True)\n"
                        "print(p.returncode); print(p.stderr)\n")
    code, line = out.strip().splitlines()
    assert code == "1"
    assert line == ("durable-nb: error: run 'cli-by': 'drop database' was not decided: ana "
                    "started the run, and under four-eyes nobody decides a request of a run "
                    "they started: ask someone else to decide. Nothing was written."), line
    assert find_decision(service_journal, "cli-by", pending) is None
    assert [e["by"] for e in _refusals(service_journal, "cli-by")] == ["ana"]


def test_her_server_api_after_starting_as_cy_is_refused_as_ana(hub, service_journal):
    pending = _park(hub, "as-cy", "import os\nos.environ['DURABLE_NB_USER'] = 'cy'\n")
    assert pending["started_by"] == "ana"  # the hub's user, not what her kernel says
    headers = {"Authorization": f"token {hub.token('ana')}",
               "Content-Type": "application/json"}
    listed = urllib.request.Request(hub.servers["ana"] + "durable-nb/api/journals",
                                    headers=headers)
    with urllib.request.urlopen(listed, timeout=60) as response:
        (journal,) = json.loads(response.read())["journals"]
    request = urllib.request.Request(
        hub.servers["ana"] + "durable-nb/api/run/decision", method="POST",
        data=json.dumps({"id": "as-cy", "approved": True, "journal": journal["id"],
                         "request_id": pending["id"], "digest": pending["digest"]}).encode(),
        headers=headers)
    with pytest.raises(urllib.error.HTTPError) as refused:
        urllib.request.urlopen(request, timeout=60)
    assert refused.value.code == 403
    answer = json.loads(refused.value.read())
    assert "ana started the run" in answer["message"], answer
    assert find_decision(service_journal, "as-cy", pending) is None
    assert [e["by"] for e in _refusals(service_journal, "as-cy")] == ["ana"]


def test_a_run_she_starts_naming_cy_shows_her_as_its_starter_everywhere(hub, service_journal):
    """Issue 41: ``$DURABLE_NB_USER=cy`` in ana's kernel; the record, her server's REST API
    and her panel say ana started the run, the starter the service checks four-eyes against
    (on e76e470 all three said cy)."""
    pending = _park(hub, "starter", "import os\nos.environ['DURABLE_NB_USER'] = 'cy'\n")
    assert service_journal.get_run("starter").started_by == "ana"
    assert pending["started_by"] == "ana"
    headers = {"Authorization": f"token {hub.token('ana')}"}
    with urllib.request.urlopen(urllib.request.Request(
            hub.servers["ana"] + "durable-nb/api/journals", headers=headers), timeout=60) as r:
        (journal,) = json.loads(r.read())["journals"]
    url = (hub.servers["ana"] + "durable-nb/api/run?" + urllib.parse.urlencode(
        {"journal": journal["id"], "id": "starter"}))
    with urllib.request.urlopen(urllib.request.Request(url, headers=headers), timeout=60) as r:
        assert json.loads(r.read())["record"]["pending_approval"]["started_by"] == "ana"
    out = run_in_kernel(hub.servers["ana"], hub.admin_token,
                        "import html, os\nos.environ['DURABLE_NB_USER'] = 'cy'\n"
                        "from durable_nb.journal import open_journal\n"
                        "from durable_nb.notebook.approval_view import approval_html\n"
                        "record = open_journal().get_run('starter')\n"
                        "print(html.unescape(approval_html(record.pending_approval, "
                        "'starter')))\n")
    assert "Who may decide: anyone but ana, who started the run (four-eyes)" in out, out


def test_bo_decides_through_the_service_and_ana_s_run_goes_on(hub, service_journal):
    pending = _park(hub, "happy")
    request = urllib.request.Request(
        hub.service_url + "api/decide", method="POST",
        data=json.dumps({"run_id": "happy", "request": pending["id"],
                         "digest": pending["digest"], "approved": True,
                         "via": "test"}).encode(),
        headers={"Authorization": f"token {hub.token('bo')}",
                 "Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=60) as response:
        decision = json.loads(response.read())["decision"]
    assert (decision["by"], decision["via"]) == ("bo", "test on the hub")
    out = run_in_kernel(hub.servers["ana"], hub.admin_token, _AGENT.format(run="happy"))
    assert out.strip() == "dropped staging", out


def _sign_in(browser, hub, user: str):
    """A browser context signed in to the hub as ``user`` (the hub's login form)."""
    context = browser.new_context()
    page = context.new_page()
    # To the hub's home page after, not to her server (which the hub would start).
    page.goto(hub.public_url + "hub/login?next=%2Fhub%2Fhome")
    page.fill("input[name=username]", user)
    page.fill("input[name=password]", PASSWORD)
    page.click("input[type=submit], button[type=submit]")
    page.wait_for_url("**/hub/home")
    return page


def test_bo_approves_in_the_service_inbox_with_ana_s_server_stopped(hub, service_journal,
                                                                    tmp_path):
    from playwright.sync_api import sync_playwright

    from tests.harness.lab import CHROMIUM, CHROMIUM_ARGS, require_chromium

    require_chromium()
    pending = _park(hub, "inbox")
    hub.stop_server("ana")
    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=str(CHROMIUM), headless=True,
                                     args=CHROMIUM_ARGS)
        try:
            # ana, in the team's inbox, is not offered her own run.
            ana = _sign_in(browser, hub, "ana")
            ana.goto(hub.service_url)
            row = ana.locator("tr", has_text="inbox")
            assert row.locator("td").nth(1).inner_text() == "ops/cleanup.ipynb"
            assert row.locator("td").nth(4).inner_text() == "ana"
            assert row.locator("td").nth(5).inner_text() == \
                "you started this run: under four-eyes someone else decides"
            assert row.get_by_role("button").count() == 0
            # bo approves there, as the hub knows him.
            bo = _sign_in(browser, hub, "bo")
            bo.goto(hub.service_url)
            assert "Signed in as bo." in bo.content()
            bo.locator("tr", has_text="inbox").get_by_role("button", name="Approve").click()
            assert bo.locator("p.said").inner_text() == \
                "run 'inbox': approved by bo via hub inbox."
            assert bo.locator("tr", has_text="inbox").locator("td").nth(5).inner_text() == \
                "approved by bo via hub inbox; the run goes on when it is resumed"
            bo.screenshot(path=str(tmp_path / "inbox.png"))
        finally:
            browser.close()
    decision = find_decision(service_journal, "inbox", pending)
    assert (decision["by"], decision["via"]) == ("bo", "hub inbox")
    hub.servers["ana"] = hub.start_server("ana")
    out = run_in_kernel(hub.servers["ana"], hub.admin_token, _AGENT.format(run="inbox"))
    assert out.strip() == "dropped staging", out


def _mails_to(smtp, address: str, run_id: str, timeout: float = 60) -> list[str]:
    """The text of each message ``address`` received about run ``run_id``, waiting for one."""
    until = time.monotonic() + timeout
    while True:
        found = []
        for envelope in list(smtp[1]):
            if address not in envelope.rcpt_tos:
                continue
            message = email.message_from_bytes(envelope.content)
            text = "".join(part.get_payload(decode=True).decode()
                           for part in message.walk() if not part.is_multipart())
            if f"run {run_id}" in message["Subject"]:
                found.append(text)
        if found or time.monotonic() > until:
            return found
        time.sleep(0.2)


def test_a_link_she_addresses_to_herself_is_never_issued(hub, service_journal, smtp):
    setting = (f"import os\nos.environ.update(DURABLE_NB_NOTIFY_SMTP_HOST='127.0.0.1', "
               f"DURABLE_NB_NOTIFY_SMTP_PORT='{smtp[0]}', DURABLE_NB_NOTIFY_SMTP_FROM="
               f"'ana@team.test', DURABLE_NB_NOTIFY_SMTP_TO='bo@ana-inbox.test', "
               f"DURABLE_NB_NOTIFY_LINK_BASE_URL={hub.service_url!r})\n")
    assert run_in_kernel(hub.servers["ana"], hub.admin_token,
                         setting + _AGENT.format(run="self-link")).strip() == "None"
    # The team's messages come from the service alone, to the hub's addresses, each with
    # a link of its own; her kernel's claim to send was refused, so bo@ana-inbox.test got
    # nothing and no link names that address.
    for address in ("ana@team.test", "bo@team.test", "cy@team.test"):
        (mailed,) = _mails_to(smtp, address, "self-link")
        assert hub.service_url + "durable-nb/decide#" in mailed
    assert sorted(link["to"] for link in service_journal.link_records("self-link").values()) \
        == ["ana@team.test", "bo@team.test", "cy@team.test"]
    assert not [e for e in smtp[1] if "bo@ana-inbox.test" in e.rcpt_tos]
    # Writing the link record herself, as her kernel's sender would: one line, refused.
    out = run_in_kernel(hub.servers["ana"], hub.admin_token,
                        "import durable_nb as dn\ntry:\n    dn.open_journal().add_delivery("
                        "'self-link', 'link/' + '0' * 64, {'kind': 'link', 'to': "
                        "'bo@ana-inbox.test'})\nexcept dn.DurableError as exc:\n"
                        "    print(exc)\n")
    (line,) = out.strip().splitlines()
    assert "only the role dnb_service_" in line and "sends notifications, decision links " \
        "and escalations in this journal, not dnb_ana_" in line, line


def test_bo_approves_by_his_e_mailed_link_with_ana_s_server_stopped(hub, service_journal,
                                                                   smtp):
    from playwright.sync_api import sync_playwright

    from tests.harness.lab import CHROMIUM, CHROMIUM_ARGS, require_chromium

    require_chromium()
    pending = _park(hub, "mailed")
    (mailed,) = _mails_to(smtp, "bo@team.test", "mailed")
    (link,) = set(re.findall(re.escape(hub.service_url) + r"durable-nb/decide#[\w.-]+",
                             mailed))
    hub.stop_server("ana")
    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=str(CHROMIUM), headless=True,
                                     args=CHROMIUM_ARGS)
        try:
            ana = _sign_in(browser, hub, "ana")  # bo's link is bo's alone
            ana.goto(link)
            assert ana.locator("#outcome").inner_text() == (
                "This link was sent to bo@team.test (e-mail), which is bo; you are signed "
                "in as ana. Nothing was decided.")
            assert ana.get_by_role("button").count() == 0
            # bo opens it before signing in: the hub's login keeps the token in the tab.
            bo = browser.new_context().new_page()
            bo.goto(link)
            bo.wait_for_url("**/hub/login**")
            bo.fill("input[name=username]", "bo")
            bo.fill("input[name=password]", PASSWORD)
            bo.click("input[type=submit], button[type=submit]")
            assert bo.locator("#outcome").inner_text() == "This request waits for a decision."
            bo.get_by_role("button", name="Approve").click()
            assert bo.locator("#outcome").inner_text() == \
                "Approved, as bo. The run goes on when its cell is run again."
        finally:
            browser.close()
    decision = find_decision(service_journal, "mailed", pending)
    assert (decision["by"], decision["via"]) == ("bo", "link")
    # The token travelled in the fragment and in POST bodies only: the hub, its proxy and
    # the service (whose output is the hub's log) never saw it in a URL.
    log = (hub.root / "hub.log").read_text()
    assert "POST /services/durable-nb/durable-nb/decide" in log  # the service's access log
    assert link.partition("#")[2] not in log
    assert len(_mails_to(smtp, "bo@team.test", "mailed")) == 1  # once per recipient
    hub.servers["ana"] = hub.start_server("ana")
    out = run_in_kernel(hub.servers["ana"], hub.admin_token, _AGENT.format(run="mailed"))
    assert out.strip() == "dropped staging", out


def test_a_deadline_s_approval_in_her_run_is_written_by_the_service(hub, service_journal):
    out = run_in_kernel(hub.servers["ana"], hub.admin_token,
                        "import durable_nb as dn\n"
                        "def agent(ctx):\n"
                        "    decision = ctx.approval('deploy', {}, timeout=1, "
                        "on_timeout='approve')\n"
                        "    return f'{decision.approved} {decision.by}'\n"
                        "print(dn.execute('deadline', agent))\n")
    assert out.strip() == "True timeout", out
    (event,) = [e for e in service_journal.events("deadline") if e["kind"] == "decided"]
    assert (event["by"], event["via"]) == ("timeout", "timeout")


def test_a_deadline_s_rejection_in_her_run_is_written_by_the_service(hub, service_journal):
    """Under a hub only the service applies deadlines (review hole 4): her waiting run asks
    it when the deadline passes, and goes on rejected."""
    out = run_in_kernel(hub.servers["ana"], hub.admin_token,
                        "import durable_nb as dn\n"
                        "def agent(ctx):\n"
                        "    decision = ctx.approval('deploy', {}, timeout=1)\n"
                        "    return f'{decision.approved} {decision.by}'\n"
                        "print(dn.execute('deadline-reject', agent))\n")
    assert out.strip() == "False timeout", out
    events = service_journal.events("deadline-reject")
    assert [(e["kind"], e["by"]) for e in events if e["kind"] in ("decided", "timed_out",
                                                                 "refused")] == [
        ("decided", "timeout"), ("timed_out", "timeout")]


def _park_as_bo(hub, run_id: str) -> dict:
    """bo's run, parked with his database role (no server of his needed)."""
    import durable_nb as dn

    journal = hub.database.journal("bo")
    try:
        def agent(ctx):
            return "deployed" if ctx.approval("deploy", {"to": "prod"}).approved else "kept"

        assert dn.execute(run_id, agent, journal=journal, on_approval="park") is None
        return journal.get_run(run_id).pending_approval
    finally:
        journal.dispose()


def test_a_link_nobody_signed_in_to_decides_nothing_through_her_server(hub,
                                                                       service_journal):
    """Review hole 6: a decision by a link that does not say who clicked it (a channel's),
    handed to the service by her server, was written as ana signed in; the service now
    applies the rule for such links (four-eyes holds on this hub: they must sign in)."""
    pending = _park_as_bo(hub, "shared-link")
    out = run_in_kernel(hub.servers["ana"], hub.admin_token, (
        "import durable_nb as dn\n"
        "from durable_nb.approvals.decide import decide\n"
        "try:\n"
        f"    decide(dn.open_journal(), 'shared-link', request_id={pending['id']!r}, "
        f"digest={pending['digest']!r}, approved=True, by='#ops', via='link', "
        "signed_in=False)\n"
        "except dn.DurableError as exc:\n    print(exc)\n"))
    (line,) = out.strip().splitlines()
    assert line == ("run 'shared-link': 'deploy' was not decided: a link sent to ana does "
                    "not say who clicked it, and four-eyes applies: sign in to Jupyter and "
                    "decide there. Nothing was written."), line
    assert find_decision(service_journal, "shared-link", pending) is None
    (event,) = _refusals(service_journal, "shared-link")
    assert (event["by"], event["via"]) == ("ana", "link on the hub")


def test_her_panel_goes_on_when_bo_approves_in_the_service(hub, service_journal):
    """The happy path seen in her notebook: the cell parks, its panel's watcher waits; bo
    approves through the service; the panel's run resumes and shows DONE."""
    approved: list[dict] = []

    def bo_approves_once_it_waits() -> None:
        while True:  # the cell below ends (and the test with it) only once this approves
            record = service_journal.find_run("widget")
            if record is not None and record.pending_approval:
                break
            time.sleep(0.2)
        pending = record.pending_approval
        request = urllib.request.Request(
            hub.service_url + "api/decide", method="POST",
            data=json.dumps({"run_id": "widget", "request": pending["id"],
                             "digest": pending["digest"], "approved": True,
                             "via": "test"}).encode(),
            headers={"Authorization": f"token {hub.token('bo')}",
                     "Content-Type": "application/json"})
        with urllib.request.urlopen(request, timeout=60) as response:
            approved.append(json.loads(response.read())["decision"])

    deciding = threading.Thread(target=bo_approves_once_it_waits, daemon=True)
    deciding.start()
    out = run_in_kernel(hub.servers["ana"], hub.admin_token, _AGENT.format(run="unused")
                        .split("print(")[0] + (
        "import time\n"
        "from durable_nb import Status\n"
        "from durable_nb.journal import open_journal\n"
        "from durable_nb.notebook.session import NotebookRun\n"
        "from durable_nb.options import RunOptions\n"
        "cell = NotebookRun('widget', agent, RunOptions(on_approval='park', four_eyes=True), "
        "open_journal())\n"
        "print(cell.start().status.name)\n"
        "while cell.panel.record.status is not Status.DONE:  # its watcher resumes it\n"
        "    time.sleep(0.2)\n"
        "print(cell.panel.record.status.name, cell.panel.record.result)\n"))
    deciding.join(timeout=60)
    assert out.strip().splitlines() == ["WAITING_APPROVAL", "DONE dropped staging"], out
    assert [(d["by"], d["via"]) for d in approved] == [("bo", "test on the hub")]


def test_users_servers_leave_the_team_s_sweep_to_the_service(hub):
    """One sweep per journal for the team: each user's server, told where the service is,
    starts no sweeper of its own (it would only be refused by the database)."""
    text = (hub.root / "hub.log").read_text()
    loaded = text.count("durable_nb: REST API at")  # each start of a user's server
    declined = text.count(f"the hub's durable-nb service at {hub.service_url} sweeps the "
                          f"journals; this server does not")
    assert loaded >= 1 and declined == loaded, text[-3000:]


def test_her_waiting_cell_goes_on_when_bo_approves_in_the_service(hub, service_journal):
    """The happy path without re-running anything: ana's cell waits in her kernel; bo
    approves through the service; her run takes his decision and goes on."""
    approved: list[dict] = []

    def bo_approves_once_it_waits() -> None:
        while True:  # the cell below ends (and the test with it) only once this approves
            record = service_journal.find_run("waiting")
            if record is not None and record.pending_approval:
                break
            time.sleep(0.2)
        pending = record.pending_approval
        request = urllib.request.Request(
            hub.service_url + "api/decide", method="POST",
            data=json.dumps({"run_id": "waiting", "request": pending["id"],
                             "digest": pending["digest"], "approved": True,
                             "via": "test"}).encode(),
            headers={"Authorization": f"token {hub.token('bo')}",
                     "Content-Type": "application/json"})
        with urllib.request.urlopen(request, timeout=60) as response:
            approved.append(json.loads(response.read())["decision"])

    deciding = threading.Thread(target=bo_approves_once_it_waits, daemon=True)
    deciding.start()
    out = run_in_kernel(hub.servers["ana"], hub.admin_token,
                        _AGENT.format(run="waiting").replace('on_approval="park", ', ""))
    deciding.join(timeout=60)
    assert out.strip() == "dropped staging", out
    assert [(d["by"], d["via"]) for d in approved] == [("bo", "test on the hub")]
    assert service_journal.get_run("waiting").status is Status.DONE


def test_the_service_answers_404_for_a_run_that_does_not_exist(hub):
    """Review: a deadline asked for an unknown run escaped as a 500."""
    for body in ({"run_id": "no-such-run", "via": "timeout"},
                 {"run_id": "no-such-run", "request": "x", "digest": "y" * 8,
                  "approved": True}):
        request = urllib.request.Request(
            hub.service_url + "api/decide", method="POST", data=json.dumps(body).encode(),
            headers={"Authorization": f"token {hub.token('bo')}",
                     "Content-Type": "application/json"})
        with pytest.raises(urllib.error.HTTPError) as answered:
            urllib.request.urlopen(request, timeout=60)
        assert answered.value.code == 404, body
        assert json.loads(answered.value.read())["why"].startswith(
            "no run 'no-such-run' in the journal")


def test_bo_answers_a_server_s_question_in_the_service_inbox(hub, service_journal, tmp_path,
                                                            monkeypatch):
    """Review: the inbox had Approve and Reject only, which sends an MCP server's question
    "cancel" when it requires fields; it shows the question's fields now, as a decision
    page does, and the answer typed there is the decision's."""
    from playwright.sync_api import sync_playwright

    import durable_nb as dn
    from tests.harness.lab import CHROMIUM, CHROMIUM_ARGS, require_chromium

    require_chromium()
    details = {"kind": "elicitation", "server": "files", "tool": "lookup",
               "message": "Which branch?",
               "schema": {"type": "object", "required": ["branch"],
                          "properties": {"branch": {"type": "string", "title": "Branch"}}}}
    journal = hub.database.journal("ana")
    try:
        monkeypatch.setenv("DURABLE_NB_USER", "ana")
        assert dn.execute("asks", lambda ctx: ctx.approval("lookup asks", details),
                          journal=journal, on_approval="park") is None
        pending = journal.get_run("asks").pending_approval
    finally:
        journal.dispose()
    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=str(CHROMIUM), headless=True,
                                     args=CHROMIUM_ARGS)
        try:
            bo = _sign_in(browser, hub, "bo")
            bo.goto(hub.service_url)
            row = bo.locator("tr", has_text="asks")
            assert row.locator("td").nth(3).inner_text() == "Which branch?"
            assert row.get_by_role("button", name="Approve").count() == 0
            row.get_by_label("Branch").fill("main")
            bo.screenshot(path=str(tmp_path / "question-form.png"))
            row.get_by_role("button", name="Accept").click()
            assert bo.locator("p.said").inner_text() == \
                "run 'asks': answered accept by bo via hub inbox."
            bo.screenshot(path=str(tmp_path / "question.png"))
        finally:
            browser.close()
    decision = find_decision(service_journal, "asks", pending)
    assert (decision["by"], decision["approved"], decision["answer"]) == (
        "bo", True, {"action": "accept", "content": {"branch": "main"}})


def test_her_prune_is_refused_and_the_service_s_sweep_prunes_by_the_policy(hub,
                                                                          service_journal):
    """Retention on a real hub (issue 42): ana's terminal cannot prune nor set the policy;
    the service's sweep (every second here) applies the policy the administrator set."""
    from durable_nb.retention.policy import RetentionPolicy, set_policy

    out = run_in_kernel(hub.servers["ana"], hub.admin_token,
                        "import subprocess, sys\nimport durable_nb as dn\n"
                        "print(dn.execute('prune-hub-old', lambda ctx: ctx.run('a', "
                        "lambda: 'done')))\n"
                        "for args in (['prune', '--older-than', '1s'], "
                        "['retention', '--older-than', '1s']):\n"
                        "    p = subprocess.run([sys.executable, '-m', 'durable_nb.cli', *args],"
                        " capture_output=True, text=True)\n"
                        "    print(p.returncode, p.stderr.strip())\n")
    lines = out.strip().splitlines()
    assert lines[0] == "done", out
    refusal = (f"durable-nb: error: on this hub's journal only the role "
               f"{hub.database.service_role} (the durable-nb hub service) removes runs, by "
               f"the journal's retention policy; ask your hub's administrator.")
    assert lines[1:] == [f"1 {refusal}", f"1 {refusal}"], out
    assert service_journal.find_run("prune-hub-old").status is Status.DONE

    set_policy(service_journal, RetentionPolicy.of("1s", prefix="prune-hub-", every="1s"))
    try:
        deadline = time.monotonic() + 120
        while service_journal.find_run("prune-hub-old") is not None:
            assert time.monotonic() < deadline, hub.tail()
            time.sleep(0.5)  # the service's sweeper runs every second
    finally:
        set_policy(service_journal, None)
    (event,) = [e for e in service_journal.journal_events() if e["kind"] == "pruned"]
    assert (event["runs"], event["via"], event["statuses"]) == (1, "policy", {"DONE": 1})
