"""How deliveries hold across senders, exits and recipients (durable_nb.notify.delivery),
with real parts: the runs and sweeps in processes of their own, HTTP receivers on loopback
(``durable_nb.notify.loopback``), an SMTP server on loopback (aiosmtpd) that refuses one
address, a disk journal, and PostgreSQL where processes race.

Each test is the regression test of a break found on 953f9b9: a run's channel choice
ignored by the sweep, a replacing decision never told, a normal exit that cut a delivery
short (sent again by the next process), attempts counted afresh after a takeover, a
``run.failed`` notice claimed forever, and one refused address that failed the others.
"""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

import durable_nb as dn
from durable_nb.errors import JournalError
from durable_nb.journal import DiskJournal, Status, open_journal
from durable_nb.execution.retry import RetryPolicy
from durable_nb.notify import EmailConfig, NotifyConfig, WebhookConfig
from durable_nb.notify.audit import notifications
from durable_nb.notify.delivery import drain, in_background, notify_in_background, sweep
from durable_nb.notify.loopback import WebhookReceiver, free_port
from durable_nb.notify.start import for_journal
from tests.harness.kernel import wait_until
from tests.test_journal_conformance import Backend, backend, pg_backend  # noqa: F401 (fixtures)

REPO = Path(__file__).resolve().parents[1]
SECRET = "delivery-secret"


def _env(tmp_path: Path, **extra: str) -> dict[str, str]:
    """A process's environment: this checkout, no user configuration but ``extra``."""
    return {**os.environ, "PYTHONPATH": str(REPO),
            "DURABLE_NB_NOTIFY_CONFIG": str(tmp_path / "no-user-config.toml"), **extra}


def _python(code: str, *args: str, env: dict[str, str]) -> subprocess.CompletedProcess:
    done = subprocess.run([sys.executable, "-c", textwrap.dedent(code), *args], env=env,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    return done


_PARK = """
    import sys
    import durable_nb as dn
    from durable_nb.notify import NotifyConfig, WebhookConfig
    notify = NotifyConfig(webhook=WebhookConfig(sys.argv[3])) if len(sys.argv) > 3 else None
    dn.execute(sys.argv[2], lambda ctx: ctx.approval("pay", {"amount": 120}),
               journal=sys.argv[1], on_approval="park", notify=notify)
"""


def _journal_config(journal: str, text: str) -> None:
    Path(journal).mkdir(parents=True, exist_ok=True)
    (Path(journal) / "notify.toml").write_text(textwrap.dedent(text))


# -- a run's own channels -----------------------------------------------------------------------

def test_a_channel_the_run_left_out_is_left_out_by_the_servers_sweep(tmp_path: Path) -> None:
    """A run given ``notify=NotifyConfig(webhook=...)`` is posted to its webhook only: the
    sweep with the journal's channels (the server's, another process's first look) leaves
    its Slack out, as the run chose when it parked."""
    journal = str(tmp_path / "j")
    with WebhookReceiver() as slack, WebhookReceiver() as own:
        _journal_config(journal, f'[slack]\nurl = "{slack.url}"\n')
        _python(_PARK, journal, "pay", own.url, env=_env(tmp_path))  # exits once it sent
        assert [r["json"]["run_id"] for r in own.requests] == ["pay"]
        swept = open_journal(journal)
        assert sweep(swept, for_journal(swept)) == {}
        assert slack.requests == []
    pending = swept.get_run("pay").pending_approval
    assert pending["notify"]["channels"] == ["webhook"]


# -- a decision replaced before the run took it --------------------------------------------------

def _refund(ctx: dn.Context) -> list:
    decision = ctx.approval("refund", {"order": 7})
    return [decision.approved, decision.by]


def test_the_replacing_decision_the_run_took_is_notified(tmp_path: Path) -> None:
    """Receivers told "rejected by lead" (the sweep saw it first) are told too that the
    run took bo's replacing approval."""
    journal = open_journal(str(tmp_path / "j"))
    with WebhookReceiver(SECRET) as hook:
        config = NotifyConfig(webhook=WebhookConfig(hook.url, secret=SECRET),
                              events=("waiting", "decided"))
        assert dn.execute("r", _refund, journal=journal, on_approval="park",
                          notify=config) is None
        assert drain(30)
        dn.reject("r", "not now", by="lead", journal=journal)
        assert sweep(journal, config) == {"r": {"webhook/decided": "sent"}}
        dn.approve("r", "refund it", by="bo", replace=True, journal=journal)
        assert dn.execute("r", _refund, journal=journal, on_approval="park",
                          notify=config) == [True, "bo"]
        assert drain(30)
        told = [(r["json"]["outcome"]["approved"], r["json"]["outcome"]["by"])
                for r in hook.requests if r["json"]["event"] == "approval.decided"]
        assert told == [(False, "lead"), (True, "bo")]
        assert all(r["verified"] for r in hook.requests)
        assert sweep(journal, config) == {} and len(hook.requests) == 3  # each told once


# -- a normal exit ------------------------------------------------------------------------------

_QUICK_RUN = """
    import sys, time
    import durable_nb as dn
    from durable_nb.journal import open_journal
    # A run that finishes at once; its process's first look at the journal sends the other
    # run's request, and the script ends normally once that delivery is under way.
    assert dn.execute(sys.argv[2], lambda ctx: 1, journal=sys.argv[1]) == 1
    journal = open_journal(sys.argv[1])
    while not journal.deliveries("waiting"):
        time.sleep(0.01)
"""


def test_a_normal_exit_records_the_delivery_its_first_sweep_sent(tmp_path: Path) -> None:
    """A script that ends normally while its first sweep waits for a slow receiver's answer
    waits for it and records the delivery sent: the next process sends nothing again."""
    journal = str(tmp_path / "j")
    _python(_PARK, journal, "waiting", env=_env(tmp_path))  # no channel configured yet
    with WebhookReceiver(SECRET, answer_after=2.0) as hook:
        _journal_config(journal, f'[webhook]\nurl = "{hook.url}"\nsecret = "{SECRET}"\n')
        _python(_QUICK_RUN, journal, "quick", env=_env(tmp_path))
        assert len(hook.requests) == 1
        rows = notifications(open_journal(journal), "waiting")
        assert [(r["channel"], r["state"]) for r in rows] == [("webhook", "sent")]
        store = open_journal(journal)
        assert sweep(store, for_journal(store)) == {}  # the next process: nothing to send
        assert len(hook.requests) == 1


_SWEEP_ONCE = """
    import sys
    from durable_nb.journal import open_journal
    from durable_nb.notify.start import for_journal
    from durable_nb.notify.delivery import sweep
    journal = open_journal(sys.argv[1])
    sweep(journal, for_journal(journal))  # SIGKILLed in its backoff after the first attempt
"""


def test_the_retry_bound_holds_across_a_takeover(tmp_path: Path) -> None:
    """``[retry] attempts = 4``, a Slack channel at a closed port: a sender killed after
    its first attempt and the sweep that takes its claim over make 4 attempts in all."""
    journal = str(tmp_path / "j")
    _python(_PARK, journal, "pay", env=_env(tmp_path))
    _journal_config(journal, f"""
        [slack]
        url = "http://127.0.0.1:{free_port()}/services/T/B/x"
        [retry]
        attempts = 4
        first_delay = 600
        lease = 1
    """)
    dying = subprocess.Popen([sys.executable, "-c", textwrap.dedent(_SWEEP_ONCE), journal],
                             env=_env(tmp_path))
    try:
        store = open_journal(journal)
        wait_until(lambda: any(len(r.get("attempts") or ()) == 1
                               for r in store.deliveries("pay").values()),
                   what="the first sender's first attempt", timeout=60)
    finally:
        dying.send_signal(signal.SIGKILL)
        dying.wait(30)
    config = for_journal(store)
    config = NotifyConfig(slack=config.slack, lease=config.lease, retry=RetryPolicy(
        max_attempts=config.retry.max_attempts, sleep=lambda seconds: None))
    wait_until(lambda: sweep(store, config) != {}, what="a takeover after the lease",
               timeout=60)
    row, = notifications(store, "pay")
    assert row["state"] == "failed" and row["takeovers"] == 1
    assert len(row["attempts"]) == 4


# -- a notice cut short -------------------------------------------------------------------------

_FAILING_RUN = """
    import sys
    import durable_nb as dn
    def fails(ctx):
        raise RuntimeError("the warehouse API is down")
    try:
        dn.execute("nightly", fails, journal=sys.argv[1])
    except RuntimeError:
        pass
    import time
    time.sleep(600)  # SIGKILLed while its run.failed notice waits for an answer
"""


def test_a_failed_notice_cut_short_is_taken_over_by_the_next_sweep(tmp_path: Path) -> None:
    """The run's process dies while its ``run.failed`` notice is in flight: once the claim
    lapses, the next sweep sends it (on a fresh channel config, the same notice)."""
    journal = str(tmp_path / "j")
    with WebhookReceiver(SECRET, hang=1) as hook:
        _journal_config(journal, f"""
            [webhook]
            url = "{hook.url}"
            secret = "{SECRET}"
            [events]
            send = ["failed"]
            [retry]
            lease = 1
        """)
        dying = subprocess.Popen([sys.executable, "-c", textwrap.dedent(_FAILING_RUN),
                                  journal], env=_env(tmp_path))
        try:
            hook.wait_for(1, timeout=60)
        finally:
            dying.send_signal(signal.SIGKILL)
            dying.wait(30)
        store = open_journal(journal)
        assert store.get_run("nightly").status is Status.FAILED
        wait_until(lambda: sweep(store, for_journal(store)) != {},
                   what="the lapsed notice taken over", timeout=60)
        hook.wait_for(2)
    first, again = hook.requests
    assert first["delivery"] == again["delivery"] and again["verified"]
    assert again["json"]["event"] == "run.failed"
    assert "the warehouse API is down" in again["json"]["outcome"]["error"]
    row, = notifications(store, "nightly")
    assert row["state"] == "sent" and row["takeovers"] == 1


# -- one refused address ------------------------------------------------------------------------

@pytest.fixture
def smtp_refusing():
    """An SMTP server on loopback that refuses ``bad@example.org`` (550) and keeps the
    messages it accepts."""
    controller_module = pytest.importorskip("aiosmtpd.controller")
    received: list = []

    class Handler:
        async def handle_RCPT(self, server, session, envelope, address, options):
            if address == "bad@example.org":
                return "550 5.1.1 no such user"
            envelope.rcpt_tos.append(address)
            return "250 OK"

        async def handle_DATA(self, server, session, envelope):
            received.append(envelope)
            return "250 OK"

    port = free_port()
    controller = controller_module.Controller(Handler(), hostname="127.0.0.1", port=port)
    controller.start()
    try:
        yield port, received
    finally:
        controller.stop()


def test_a_background_delivery_that_fails_is_logged_once(tmp_path: Path, caplog) -> None:
    """A run's notice sent in the background on a journal it cannot write (read-only here):
    one warning names the delivery and the error; nothing is sent. On 29bcdb7 it left no
    trace at all."""
    where = str(tmp_path / "j")
    dn.execute("r", lambda ctx: ctx.approval("pay", {"amount": 120}), journal=where,
               on_approval="park")
    read_only = DiskJournal(where, read_only=True)
    with WebhookReceiver(SECRET) as hook, caplog.at_level(logging.WARNING, "durable_nb"):
        notify_in_background(read_only, read_only.get_run("r"),
                             NotifyConfig(webhook=WebhookConfig(hook.url, secret=SECRET)))
        assert drain(30)
        assert hook.requests == []
    logged = [r for r in caplog.records if r.name.startswith("durable_nb")]
    assert len(logged) == 1, logged
    assert logged[0].levelno == logging.WARNING
    assert logged[0].getMessage().startswith(
        "durable_nb: durable-nb-notify-r stopped: JournalError: the journal at "), logged[0].getMessage()
    assert SECRET not in logged[0].getMessage()


def test_a_failed_background_delivery_logs_no_url(caplog) -> None:
    """The error of a journal that cannot be reached names its URL, password included: the
    warning shows the error without it."""
    def send() -> None:
        raise JournalError("cannot reach postgresql://ana:pw-7f3a@db.example:5432/runs")

    with caplog.at_level(logging.WARNING, "durable_nb"):
        in_background(send, name="durable-nb-sweep")
        assert drain(30)
    [logged] = [r.getMessage() for r in caplog.records if r.name.startswith("durable_nb")]
    assert logged.startswith("durable_nb: durable-nb-sweep stopped: JournalError: cannot "
                             "reach <URL>. "), logged
    assert "pw-7f3a" not in logged and "ana" not in logged


def test_one_refused_address_fails_alone(tmp_path: Path, smtp_refusing) -> None:
    """``to = ana, bad, bo`` with bad refused: ana and bo get the request once each, the
    refused address is retried up to the bound and recorded failed on its own."""
    port, received = smtp_refusing
    journal = str(tmp_path / "j")
    config = NotifyConfig(
        email=EmailConfig(host="127.0.0.1", port=port, sender="dnb@example.org",
                          to=("ana@example.org", "bad@example.org", "bo@example.org")),
        retry=RetryPolicy(max_attempts=3, sleep=lambda seconds: None))
    assert dn.execute("pay", lambda ctx: ctx.approval("pay", {"amount": 120}), journal=journal,
                      on_approval="park", notify=config) is None
    assert drain(60)
    assert sorted(r.rcpt_tos[0] for r in received) == ["ana@example.org", "bo@example.org"]
    rows = {r["to"]: r for r in notifications(open_journal(journal), "pay")}
    assert {to: r["state"] for to, r in rows.items()} == {
        "ana@example.org": "sent", "bad@example.org": "failed", "bo@example.org": "sent"}
    refused = rows["bad@example.org"]["attempts"]
    assert len(refused) == 3 and all("550" in a["error"] for a in refused), refused


# -- processes racing on PostgreSQL ---------------------------------------------------------------

_PARK_AND_EXIT = """
    import sys
    import durable_nb as dn
    dn.execute(sys.argv[2], lambda ctx: ctx.approval("pay", {"n": sys.argv[2]}),
               journal=sys.argv[1], on_approval="park")
"""


@pytest.mark.postgres
def test_parkers_exiting_normally_on_postgres_send_each_email_once(
        pg_backend: Backend, tmp_path: Path) -> None:
    """Five processes park a run each and exit normally, each first sweep sending the
    others' requests: every recipient gets each request once."""
    import email

    import aiosmtpd.controller

    received: list = []

    class Handler:
        async def handle_DATA(self, server, session, envelope):
            message = email.message_from_bytes(envelope.content)
            received.append((envelope.rcpt_tos[0], message["X-Durable-NB-Delivery"]))
            return "250 OK"

    port = free_port()
    controller = aiosmtpd.controller.Controller(Handler(), hostname="127.0.0.1", port=port)
    controller.start()
    try:
        env = _env(tmp_path, DURABLE_NB_NOTIFY_SMTP_HOST="127.0.0.1",
                   DURABLE_NB_NOTIFY_SMTP_PORT=str(port),
                   DURABLE_NB_NOTIFY_SMTP_FROM="dnb@example.org",
                   DURABLE_NB_NOTIFY_SMTP_TO="ana@example.org,bo@example.org")
        parkers = [subprocess.Popen([sys.executable, "-c", textwrap.dedent(_PARK_AND_EXIT),
                                     pg_backend.location, f"p{i}"], env=env)
                   for i in range(5)]
        assert [p.wait(120) for p in parkers] == [0] * 5
        journal = pg_backend.open()
        for i in range(5):
            rows = notifications(journal, f"p{i}")
            assert sorted((r["to"], r["state"]) for r in rows) == [
                ("ana@example.org", "sent"), ("bo@example.org", "sent")], rows
        assert len(received) == 10 and len(set(received)) == 10, received
    finally:
        controller.stop()
