"""Notifications when a run parks for an approval (durable_nb.notify), with real parts: an
HTTP receiver on loopback that verifies the HMAC signature, an SMTP server on loopback
(aiosmtpd), the disk journal and a real PostgreSQL journal raced by several processes, one
of them SIGKILLed after its claim.

Retries use the policy's injectable sleep (no test waits out a backoff); a hanging receiver
is bounded by the channel's timeout, never asserted against a wall-clock margin.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import textwrap
import threading
from pathlib import Path

import pytest

import durable_nb as dn
from durable_nb.errors import NotifyConfigError
from durable_nb.journal import Status, open_journal
from durable_nb.execution.retry import RetryPolicy
from durable_nb.notify import EmailConfig, NotifyConfig, WebhookConfig, load_config
from durable_nb.notify.audit import notifications
from durable_nb.notify.delivery import drain, sweep
from durable_nb.notify.loopback import WebhookReceiver, free_port, verify
from durable_nb.cli import main as cli
from durable_nb.export import export_run
from tests.harness.kernel import wait_until
from tests.test_journal_conformance import Backend, backend, pg_backend  # noqa: F401 (fixtures)

REPO = Path(__file__).resolve().parents[1]
SECRET = "s3cret-for-the-hook"


def _ask(ctx: dn.Context) -> dict:
    return ctx.approval("drop_table", {"table": "users", "rows": 1200})


def _park(run_id: str, journal: str, notify: object) -> None:
    assert dn.execute(run_id, _ask, journal=journal, on_approval="park", notify=notify) is None


def _finished(journal_dir: str, run_id: str, count: int) -> list[dict]:
    journal = open_journal(journal_dir)
    wait_until(lambda: len(rows := notifications(journal, run_id)) == count
               and all(r["state"] not in ("claimed",) for r in rows),
               what=f"{count} deliveries of {run_id} to finish", timeout=60)
    return notifications(journal, run_id)


def _show(journal: str, run_id: str, capsys: pytest.CaptureFixture) -> str:
    capsys.readouterr()
    assert cli(["--journal", journal, "show", run_id]) == 0
    return capsys.readouterr().out


# --- the journal's claim, on both backends -------------------------------------------------------

def test_a_delivery_is_claimed_by_exactly_one_and_swapped_only_from_what_is_stored(
        backend: Backend) -> None:
    import threading
    from durable_nb.journal import RunRecord
    journal = backend.open()
    for run_id in ("a", "a:2", "a/b"):
        journal.create_run(RunRecord(run_id=run_id, created_at=1.0, updated_at=1.0))
    wins: list[bool] = []
    barrier = threading.Barrier(8)

    def claim(i: int) -> None:
        barrier.wait()
        wins.append(backend.open().add_delivery("a", "req/webhook", {"state": "claimed", "i": i}))

    threads = [threading.Thread(target=claim, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(wins) == [False] * 7 + [True]
    held = journal.deliveries("a")["req/webhook"]
    assert not journal.swap_delivery("a", "req/webhook", dict(held, state="other"), {"x": 1})
    assert journal.swap_delivery("a", "req/webhook", held, dict(held, state="sent"))
    assert not journal.swap_delivery("a", "req/webhook", held, dict(held, state="lost"))
    journal.add_delivery("a:2", "req/webhook", {"state": "sent"})
    journal.add_delivery("a/b", "req/email", {"state": "sent"})
    assert list(journal.deliveries("a")) == ["req/webhook"]
    assert journal.deliveries("a")["req/webhook"]["state"] == "sent"
    journal.delete_run("a")
    assert journal.deliveries("a") == {} and list(journal.deliveries("a:2")) == ["req/webhook"]


# --- the webhook ----------------------------------------------------------------------------

def test_webhook_is_signed_sent_once_and_shown(tmp_path: Path, capsys) -> None:
    journal = str(tmp_path / "j")
    with WebhookReceiver(SECRET) as hook:
        _park("r1", journal, NotifyConfig(webhook=WebhookConfig(hook.url, secret=SECRET)))
        got = hook.wait_for(1)
        rows = _finished(journal, "r1", 1)
        _park("r1", journal, NotifyConfig(webhook=WebhookConfig(hook.url, secret=SECRET)))
        assert drain(30)
    assert len(hook.requests) == 1  # parked again: the same request is not sent again
    request = got[0]
    assert request["verified"], request["refused"]
    pending = open_journal(journal).get_run("r1").pending_approval
    body = request["json"]
    assert body["event"] == "approval.requested" and body["run_id"] == "r1"
    assert body["name"] == "drop_table" and body["details"] == {"table": "users", "rows": 1200}
    assert body["digest"] == pending["digest"] and body["request_id"] == pending["id"]
    assert request["delivery"] == f"r1/{pending['id']}/webhook" == body["delivery"]
    # A changed body, another secret or an old timestamp is refused by the receiver's check.
    headers = request["headers"]
    assert verify(SECRET, headers, request["body"] + b" ") == "bad signature"
    assert verify("another", headers, request["body"]) == "bad signature"
    assert verify(SECRET, headers, request["body"],
                  now=int(headers["x-durable-nb-timestamp"]) + 3600) == "too old (a replay?)"
    assert rows[0]["state"] == "sent" and len(rows[0]["attempts"]) == 1
    shown = _show(journal, "r1", capsys)
    assert "notified   1 delivery" in shown and "webhook  sent" in shown
    # The secret is nowhere in the journal's files, nor in an export.
    export = export_run("r1", tmp_path / "r1.json", journal=journal)
    assert json.loads(export.read_text())["notifications"][0]["state"] == "sent"
    assert "by" not in json.loads(export.read_text())["notifications"][0]
    for path in [*Path(journal).rglob("*"), export]:
        if path.is_file():
            assert SECRET.encode() not in path.read_bytes(), path


def test_the_sweep_never_notifies_the_fork_of_a_waiting_run(tmp_path: Path) -> None:
    journal = str(tmp_path / "j")

    def ask(table: str):
        def handler(ctx: dn.Context) -> dict:
            return ctx.approval("drop_table", {"table": ctx.run("pick", lambda v: v, table)})
        return handler

    assert dn.execute("w", ask("users"), journal=journal, on_approval="park") is None
    # The cell edited: executed again from its changed step, the run as it was kept as w@1.
    assert dn.execute("w", ask("orders"), journal=journal, on_approval="park",
                      on_change="rerun") is None
    assert open_journal(journal).find_run("w@1") is not None
    with WebhookReceiver(SECRET) as hook:
        done = sweep(open_journal(journal), NotifyConfig(webhook=WebhookConfig(hook.url,
                                                                               secret=SECRET)))
        assert list(done) == ["w"]
        assert [r["json"]["run_id"] for r in hook.wait_for(1)] == ["w"]
    assert notifications(open_journal(journal), "w@1") == []


def test_a_runs_own_channels_are_not_used_for_the_journals_other_runs(tmp_path: Path) -> None:
    """A run given its own ``notify=`` sends its requests there, and only its: the first
    sweep of the journal by its process sends the other waiting runs' requests with the
    journal's configuration (here none), not with this run's."""
    journal = str(tmp_path / "j")
    parked = subprocess.run(  # parked by another process: this one has not swept the journal
        [sys.executable, "-c", "import durable_nb as dn, sys; dn.execute('other', lambda ctx: "
         "ctx.approval('drop_table', {}), journal=sys.argv[1], on_approval='park')", journal],
        capture_output=True, text=True, timeout=120, env=dict(os.environ, PYTHONPATH=str(REPO)))
    assert parked.returncode == 0, parked.stderr
    with WebhookReceiver(SECRET) as hook:
        _park("mine", journal, NotifyConfig(webhook=WebhookConfig(hook.url, secret=SECRET)))
        hook.wait_for(1)
        wait_until(lambda: not any(t.name == "durable-nb-notify-sweep"
                                   for t in threading.enumerate()), what="the first sweep")
        assert drain(30)
        assert [r["json"]["run_id"] for r in hook.requests] == ["mine"]
    assert notifications(open_journal(journal), "other") == []


def _failing_target(kind: str) -> tuple[WebhookReceiver | None, str]:
    if kind == "refused":
        return None, f"http://127.0.0.1:{free_port()}/hook"
    receiver = WebhookReceiver(SECRET, status=500) if kind == "500" else \
        WebhookReceiver(SECRET, hang=1000)
    return receiver, receiver.url


@pytest.mark.parametrize("kind,error", [("500", "HTTP 500"), ("refused", "cannot connect"),
                                        ("hang", "timed out")])
def test_failing_webhook_is_retried_boundedly_and_the_run_stays_parked(
        tmp_path: Path, capsys, kind: str, error: str) -> None:
    journal = str(tmp_path / "j")
    receiver, url = _failing_target(kind)
    slept: list[float] = []
    retry = RetryPolicy(max_attempts=3, initial_delay=0.5, max_delay=1.0, jitter=0.0,
                        sleep=slept.append)
    try:
        _park("r", journal, NotifyConfig(webhook=WebhookConfig(url, secret=SECRET, timeout=1.0),
                                         retry=retry))
        rows = _finished(journal, "r", 1)
    finally:
        if receiver is not None:
            receiver.stop()
    assert rows[0]["state"] == "failed"
    assert len(rows[0]["attempts"]) == 3 and not any(a["ok"] for a in rows[0]["attempts"])
    assert all(error in a["error"] for a in rows[0]["attempts"]), rows[0]["attempts"]
    assert slept == [0.5, 1.0]  # backoff between the attempts, bounded by max_delay
    if receiver is not None:
        assert len(receiver.requests) == 3
    assert open_journal(journal).get_run("r").status is Status.WAITING_APPROVAL
    shown = _show(journal, "r", capsys)
    assert "webhook  failed" in shown and f"failed: {rows[0]['attempts'][0]['error']}" in shown
    # Nothing sends a failed delivery again by itself.
    assert sweep(open_journal(journal), NotifyConfig(webhook=WebhookConfig(url))) == {}


# --- Slack and e-mail -------------------------------------------------------------------------

_BLOCK_TYPES = {"header", "section", "context", "divider", "actions"}


def _check_block_kit(payload: dict) -> None:
    """The structure Slack's incoming webhooks take (api.slack.com/reference/block-kit)."""
    assert isinstance(payload["text"], str) and payload["text"]  # the notification's text
    blocks = payload["blocks"]
    assert isinstance(blocks, list) and 0 < len(blocks) <= 50
    for block in blocks:
        assert block["type"] in _BLOCK_TYPES
        if block["type"] == "header":
            assert block["text"]["type"] == "plain_text" and len(block["text"]["text"]) <= 150
        if block["type"] == "section":
            assert "text" in block or "fields" in block
            for text in block.get("fields", []) + ([block["text"]] if "text" in block else []):
                assert text["type"] in ("mrkdwn", "plain_text") and len(text["text"]) <= 3000
            assert len(block.get("fields", [])) <= 10
            assert all(len(f["text"]) <= 2000 for f in block.get("fields", []))
        if block["type"] == "context":
            assert 0 < len(block["elements"]) <= 10


def test_slack_message_is_block_kit_and_a_run_can_choose_its_channels(
        tmp_path: Path, monkeypatch, capsys) -> None:
    journal = str(tmp_path / "j")
    with WebhookReceiver() as slack, WebhookReceiver(SECRET) as hook:
        monkeypatch.setenv("DURABLE_NB_NOTIFY_CONFIG", str(tmp_path / "none.toml"))
        monkeypatch.setenv("DURABLE_NB_NOTIFY_WEBHOOK", hook.url)
        monkeypatch.setenv("DURABLE_NB_NOTIFY_WEBHOOK_SECRET", SECRET)
        monkeypatch.setenv("DURABLE_NB_NOTIFY_SLACK_WEBHOOK", slack.url)
        _park("r", journal, "slack")  # the webhook is configured but this run leaves it out
        payload = slack.wait_for(1)[0]["json"]
        rows = _finished(journal, "r", 2)
    _check_block_kit(payload)
    text = json.dumps(payload)
    assert "drop_table" in text and "users" in text and "`r`" in text
    assert SECRET not in text and slack.url not in text
    assert {r["channel"]: r["state"] for r in rows} == {"slack": "sent", "webhook": "skipped"}
    assert hook.requests == []
    assert "webhook  skipped" in _show(journal, "r", capsys)


@pytest.fixture
def smtp_server():
    """An SMTP server on loopback (aiosmtpd) that keeps the messages and the logins."""
    aiosmtpd = pytest.importorskip("aiosmtpd.controller")
    from aiosmtpd.smtp import AuthResult

    received: list = []
    logins: list = []

    class Handler:
        async def handle_DATA(self, server, session, envelope):
            received.append(envelope)
            return "250 OK"

    def authenticate(server, session, envelope, mechanism, data):
        logins.append((data.login.decode(), data.password.decode()))
        return AuthResult(success=data.password == b"mail-pass")

    port = free_port()
    controller = aiosmtpd.Controller(Handler(), hostname="127.0.0.1", port=port,
                                     authenticator=authenticate, auth_require_tls=False)
    controller.start()
    try:
        yield port, received, logins
    finally:
        controller.stop()


def test_email_over_smtp_with_login(tmp_path: Path, smtp_server, capsys) -> None:
    import email
    port, received, logins = smtp_server
    journal = str(tmp_path / "j")
    config = NotifyConfig(email=EmailConfig(host="127.0.0.1", port=port, sender="dnb@example.org",
                                            to=("oncall@example.org",), username="bot",
                                            password="mail-pass"))
    _park("r", journal, config)
    rows = _finished(journal, "r", 1)
    assert rows[0]["state"] == "sent", rows
    assert logins == [("bot", "mail-pass")]
    assert len(received) == 1 and received[0].rcpt_tos == ["oncall@example.org"]
    message = email.message_from_bytes(received[0].content)
    pending = open_journal(journal).get_run("r").pending_approval
    assert message["Subject"] == "Approval needed: drop_table (run r)"
    assert message["X-Durable-NB-Delivery"] == f"r/{pending['id']}/email"
    assert "users" in message.get_payload() and "mail-pass" not in message.as_string()
    # A wrong password: the login fails, the delivery is failed, and the error recorded and
    # shown never holds the password.
    bad = NotifyConfig(email=EmailConfig(host="127.0.0.1", port=port, sender="dnb@example.org",
                                         to=("oncall@example.org",), username="bot",
                                         password="wrong-pass", timeout=2.0),
                       retry=RetryPolicy(max_attempts=1))
    _park("r2", journal, bad)
    rows = _finished(journal, "r2", 1)
    assert rows[0]["state"] == "failed" and rows[0]["attempts"][0]["error"]
    assert len(received) == 1 and ("bot", "wrong-pass") in logins
    assert "wrong-pass" not in _show(journal, "r2", capsys)


# --- configuration --------------------------------------------------------------------------

def test_config_from_files_and_environment(tmp_path: Path) -> None:
    user = tmp_path / "user.toml"
    user.write_text('[webhook]\nurl = "https://user.example/hook"\nsecret = "u"\n'
                    '[retry]\nattempts = 2\nlease = 5\n')
    beside = tmp_path / "journal"
    beside.mkdir()
    (beside / "notify.toml").write_text('[webhook]\nurl = "https://team.example/hook"\n')
    env = {"DURABLE_NB_NOTIFY_CONFIG": str(user), "DURABLE_NB_NOTIFY_SMTP_HOST": "mail",
           "DURABLE_NB_NOTIFY_SMTP_FROM": "a@x", "DURABLE_NB_NOTIFY_SMTP_TO": "b@x, c@x",
           "DURABLE_NB_NOTIFY_SMTP_PORT": "587", "DURABLE_NB_NOTIFY_SMTP_STARTTLS": "1",
           "DURABLE_NB_NOTIFY_SMTP_PASSWORD": "pw"}
    config = load_config(beside, env)
    assert config.webhook.url == "https://team.example/hook" and config.webhook.secret == "u"
    assert config.email.to == ("b@x", "c@x") and config.email.port == 587
    assert config.email.starttls and config.retry.max_attempts == 2 and config.lease == 5
    assert "pw" not in repr(config) and "'u'" not in repr(config)
    (beside / "notify.toml").write_text("[webhook\n")
    with pytest.raises(NotifyConfigError, match="notify.toml cannot be read"):
        load_config(beside, env)
    (beside / "notify.toml").write_text('[sms]\nto = "1"\n')
    with pytest.raises(NotifyConfigError, match=r"unknown section \[sms\]"):
        load_config(beside, env)
    with pytest.raises(NotifyConfigError, match=r"\[email\] needs 'to'"):
        load_config(None, {"DURABLE_NB_NOTIFY_CONFIG": str(tmp_path / "no.toml"),
                           "DURABLE_NB_NOTIFY_SMTP_HOST": "mail"})
    with pytest.raises(NotifyConfigError, match="unknown channel 'pager'"):
        dn.RunOptions(notify="webhook,pager")


def test_a_run_naming_an_unconfigured_channel_is_refused_before_it_starts(
        tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setenv("DURABLE_NB_NOTIFY_CONFIG", str(tmp_path / "none.toml"))
    with pytest.raises(NotifyConfigError, match="'email', but none is configured"):
        dn.execute("r", _ask, journal=str(tmp_path / "j"), on_approval="park", notify="email")
    assert open_journal(str(tmp_path / "j")).find_run("r") is None


# --- several processes on PostgreSQL ---------------------------------------------------------

_SWEEPER = textwrap.dedent("""
    import os, sys, time
    from durable_nb.journal import open_journal
    from durable_nb.notify.config import load_config
    from durable_nb.notify.delivery import sweep
    journal = open_journal(sys.argv[1])
    while not os.path.exists(sys.argv[2]):
        time.sleep(0.01)
    done = {}
    while not done and time.time() < float(sys.argv[3]):
        done = sweep(journal, load_config())
        if not done and any(r.get("state") != "claimed" for r in
                            journal.deliveries("race").values()):
            break  # someone else's, finished
        time.sleep(0.02)
    print(done)
""")

_PARKER = textwrap.dedent("""
    import sys
    import durable_nb as dn
    dn.execute("race", lambda ctx: ctx.approval("deploy", {"to": "prod"}), journal=sys.argv[1],
               on_approval="park")
""")


def _env(url: str, tmp_path: Path, lease: float = 120.0) -> dict:
    config = tmp_path / "notify.toml"
    config.write_text(f"[retry]\nlease = {lease}\n")
    return {**os.environ, "PYTHONPATH": str(REPO), "DURABLE_NB_NOTIFY_CONFIG": str(config),
            "DURABLE_NB_NOTIFY_WEBHOOK": url, "DURABLE_NB_NOTIFY_WEBHOOK_SECRET": SECRET}


@pytest.mark.postgres
def test_processes_racing_on_postgres_send_exactly_once(pg_backend: Backend,
                                                        tmp_path: Path) -> None:
    import time
    go = tmp_path / "go"
    with WebhookReceiver(SECRET) as hook:
        env = _env(hook.url, tmp_path)
        until = str(time.time() + 120)
        sweepers = [subprocess.Popen([sys.executable, "-c", _SWEEPER, pg_backend.location,
                                      str(go), until], env=env, stdout=subprocess.PIPE,
                                     text=True) for _ in range(4)]
        parker = subprocess.Popen([sys.executable, "-c", _PARKER, pg_backend.location],
                                  env=env)
        journal = pg_backend.open()
        wait_until(lambda: (r := journal.find_run("race")) is not None
                   and r.status is Status.WAITING_APPROVAL, what="the run to park", timeout=60)
        go.touch()  # the sweepers race the parker (which sends as it parks) for the claim
        assert parker.wait(60) == 0
        outputs = [p.communicate(timeout=120)[0] for p in sweepers]
        assert all(p.returncode == 0 for p in sweepers), outputs
        rows = journal.deliveries("race")
        assert len(rows) == 1 and next(iter(rows.values()))["state"] == "sent", rows
        assert len(hook.requests) == 1 and hook.requests[0]["verified"], outputs


_DIES = textwrap.dedent("""
    import sys
    from durable_nb.journal import open_journal
    from durable_nb.notify.config import load_config
    from durable_nb.notify.delivery import sweep
    sweep(open_journal(sys.argv[1]), load_config())  # blocks in the send; SIGKILLed there
""")


def _blackhole() -> tuple[socket.socket, str]:
    """A listener that never accepts: a request's bytes go into its backlog and no answer
    comes (a sender there is stuck before its message reached any receiver)."""
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen(8)
    return sock, f"http://127.0.0.1:{sock.getsockname()[1]}/hook"


@pytest.mark.postgres
@pytest.mark.parametrize("died", ["before its message arrived", "after its message arrived"])
def test_a_sender_killed_after_its_claim_is_taken_over(pg_backend: Backend, tmp_path: Path,
                                                       died: str) -> None:
    journal = pg_backend.open()
    _park_on(pg_backend.location)
    before = died == "before its message arrived"
    with WebhookReceiver(SECRET, hang=0 if before else 1) as hook:
        hole, hole_url = _blackhole()
        try:
            env = _env(hole_url if before else hook.url, tmp_path, lease=1.0)
            dying = subprocess.Popen([sys.executable, "-c", _DIES, pg_backend.location], env=env)
            wait_until(lambda: any(r["state"] == "claimed"
                                   for r in journal.deliveries("race").values()),
                       what="the first sender's claim", timeout=60)
            if not before:
                hook.wait_for(1)
            dying.send_signal(signal.SIGKILL)
            dying.wait(30)
        finally:
            hole.close()
        config = load_config(None, {"DURABLE_NB_NOTIFY_CONFIG": str(tmp_path / "notify.toml"),
                                    "DURABLE_NB_NOTIFY_WEBHOOK": hook.url,
                                    "DURABLE_NB_NOTIFY_WEBHOOK_SECRET": SECRET})
        wait_until(lambda: sweep(journal, config) != {}, what="a takeover after the lease",
                   timeout=60)
        row = next(iter(journal.deliveries("race").values()))
        assert row["state"] == "sent" and row["takeovers"] == 1
        ids = {r["delivery"] for r in hook.requests}
        # Before: the receiver sees one delivery. After: the one extra at-least-once allows,
        # with the same delivery id, so a receiver that dedupes by it sees one.
        assert len(hook.requests) == (1 if before else 2) and len(ids) == 1
        assert all(r["verified"] for r in hook.requests)


def _park_on(location: str) -> None:
    subprocess.run([sys.executable, "-c", _PARKER, location], check=True, timeout=60,
                   env={**os.environ, "PYTHONPATH": str(REPO),
                        "DURABLE_NB_NOTIFY_CONFIG": "/nonexistent/notify.toml"})


# --- %%durable_agent --notify ------------------------------------------------------------------

@pytest.fixture
def ip(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    import IPython
    from IPython.testing.globalipapp import start_ipython
    monkeypatch.setenv("DURABLE_NB_DIR", str(tmp_path / "journal"))
    monkeypatch.setenv("DURABLE_NB_NOTIFY_CONFIG", str(tmp_path / "none.toml"))
    start_ipython()
    shell = IPython.get_ipython()
    shell.run_line_magic("load_ext", "durable_nb")
    return shell


def test_the_magic_takes_notify(ip, tmp_path: Path, monkeypatch) -> None:
    from IPython.core.error import UsageError
    with pytest.raises(UsageError, match="unknown channel 'pager'"):
        ip.run_cell_magic("durable_agent", "r --notify pager", "ctx.approval('x')")
    with WebhookReceiver(SECRET) as hook, WebhookReceiver() as slack:
        monkeypatch.setenv("DURABLE_NB_NOTIFY_WEBHOOK", hook.url)
        monkeypatch.setenv("DURABLE_NB_NOTIFY_WEBHOOK_SECRET", SECRET)
        monkeypatch.setenv("DURABLE_NB_NOTIFY_SLACK_WEBHOOK", slack.url)
        ip.run_cell_magic("durable_agent", "nb-run --notify webhook",
                          "ctx.approval('send_report', {'to': 'board'})")
        request = hook.wait_for(1)[0]
        rows = _finished(str(tmp_path / "journal"), "nb-run", 2)
    assert request["verified"] and request["json"]["details"] == {"to": "board"}
    assert {r["channel"]: r["state"] for r in rows} == {"webhook": "sent", "slack": "skipped"}
    assert slack.requests == []


# --- the docs' receiver ----------------------------------------------------------------------

class _Headers(dict):
    """Headers looked up in any case, as a web framework's are."""

    def __getitem__(self, name: str) -> str:
        return super().__getitem__(name.lower())


def test_the_docs_receiver_snippet_accepts_a_real_delivery_once(tmp_path: Path) -> None:
    import re
    page = (REPO / "docs" / "pages" / "guide" / "notifications.md").read_text()
    snippet = re.search(r"```py\n(.*?)```", page, re.S).group(1)
    namespace: dict = {}
    exec(snippet, namespace)
    docs_verify = namespace["verify"]
    with WebhookReceiver(SECRET) as hook:
        _park("r", str(tmp_path / "j"), NotifyConfig(webhook=WebhookConfig(hook.url, SECRET)))
        request = hook.wait_for(1)[0]
    headers, body, seen = _Headers(request["headers"]), request["body"], set()
    assert docs_verify(SECRET, headers, body, seen)
    assert not docs_verify(SECRET, headers, body, seen)  # the same delivery again
    assert not docs_verify(SECRET, headers, body + b"x", set())
    assert not docs_verify("another secret", headers, body, set())


def test_parking_never_waits_for_a_delivery(tmp_path: Path) -> None:
    """The run parks (execute returns) while the receiver still holds the request unanswered:
    the send is on a thread of its own, and its timeout (60 s) is not the run's business."""
    journal = str(tmp_path / "j")
    hook = WebhookReceiver(SECRET, hang=1)
    try:
        _park("r", journal, NotifyConfig(webhook=WebhookConfig(hook.url, SECRET, timeout=60.0),
                                         retry=RetryPolicy(max_attempts=1)))
        hook.wait_for(1)  # the request is at the receiver, which has not answered
        rows = notifications(open_journal(journal), "r")
        assert [(r["state"], r["attempts"]) for r in rows] == [("claimed", [])]
        assert open_journal(journal).get_run("r").status is Status.WAITING_APPROVAL
    finally:
        hook.stop()  # the connection closes: the attempt ends, recorded as failed
    rows = _finished(journal, "r", 1)
    assert rows[0]["state"] == "failed" and len(rows[0]["attempts"]) == 1
