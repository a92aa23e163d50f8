"""An approval's deadline, applied from the journal whether or not a kernel is alive: its
policy decides (``on_timeout="reject" | "approve"``) or escalates to a second list of
approvers with a second deadline, once, whoever looks first; reminders before the deadline
go through the notification channels once per channel.

Real parts: the Jupyter Server extension's own sweeper (pytest-jupyter's ``jp_serverapp``,
a real server in this process, no kernel), ``durable-nb notify`` and Python processes racing
on a real PostgreSQL, a real HTTP receiver verifying each webhook's signature. Deadlines
are seconds long, and every wait polls for the condition it needs.
"""

from __future__ import annotations

import datetime
import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

pytest.importorskip("pytest_jupyter")
from pytest_jupyter.jupyter_server import *  # noqa: E402,F401,F403 - jp_serverapp and friends

import durable_nb as dn  # noqa: E402
from durable_nb import DiskJournal, Status
from durable_nb.errors import ApprovalPolicyError, DecisionExists
from durable_nb.approvals.request import decision_kind, find_decision
from durable_nb.approvals.history import history
from durable_nb.notify.loopback import WebhookReceiver
from tests.harness import wait_until
from tests.test_journal_conformance import Backend, pg_backend  # noqa: F401 (fixture)
from tests.test_notifications import smtp_server  # noqa: F401 (fixture)

REPO = Path(__file__).resolve().parents[1]
SECRET = "deadline-secret"


def _park(journal, run_id: str, **options) -> dict:
    """Park run ``run_id`` on an approval with ``options``; its pending approval."""
    def agent(ctx):
        decision = ctx.approval("deploy", {"to": "prod"}, **options)
        return [decision.approved, decision.by, decision.note]

    assert dn.execute(run_id, agent, journal=journal, on_approval="park") is None
    return journal.get_run(run_id).pending_approval


def _resume(journal, run_id: str) -> list:
    def agent(ctx):
        decision = ctx.approval("deploy", {"to": "prod"})
        return [decision.approved, decision.by, decision.note]

    return dn.execute(run_id, agent, journal=journal, on_approval="park")


def _past(moment: float) -> None:
    wait_until(lambda: time.time() >= moment, what="the deadline to pass", timeout=60)


def _kinds(journal, run_id: str) -> list[str]:
    return [e["kind"] for e in history(journal, run_id)]


def _subprocess_env(**extra: str) -> dict:
    env = {**os.environ, "PYTHONPATH": str(REPO), **extra}
    env.pop("DURABLE_NB_DIR", None)
    env.pop("DURABLE_NB_JOURNAL", None)
    return env


# --- bad input ---------------------------------------------------------------------------------

@pytest.mark.parametrize("bad", ["2 hours", "soon", -5, 0, True, "1w", 10**400,
                                 "\u0669\u0660", "\uff19\uff10s", float("nan")])
def test_a_bad_timeout_is_a_short_error_saying_the_forms(tmp_path: Path, bad) -> None:
    journal = DiskJournal(tmp_path / "j")
    with pytest.raises(ApprovalPolicyError) as caught:
        dn.execute("bad", lambda ctx: ctx.approval("deploy", timeout=bad), journal=journal,
                   on_approval="park")
    message = str(caught.value)
    assert message.startswith(f"timeout={bad!r} is not a duration: use seconds")
    assert '"90s", "90sec", "30m", "30min", "2h", "1d"' in message and "\n" not in message
    assert journal.find_run("bad").pending_approval is None  # nothing asked


@pytest.mark.parametrize("form, seconds", [("90", 90.0), ("30min", 1800.0), ("90sec", 90.0),
                                           ("1.5h", 5400.0)])
def test_one_duration_grammar_for_the_call_the_tool_and_the_magic(tmp_path: Path, form: str,
                                                                    seconds: float) -> None:
    """ctx.approval(timeout=), @tool(timeout=) and %durable_agent --timeout read a duration
    the same way: "90" and "30min" were taken by --timeout and refused by ctx.approval."""
    from durable_nb.notebook.magics import parse_duration as magic_duration

    journal = DiskJournal(tmp_path / "j")
    pending = _park(journal, "call", timeout=form)
    assert pending["timeout_at"] - pending["requested_at"] == pytest.approx(seconds)
    tool = dn.tool(name="pay", needs_approval=True, timeout=form)(lambda: None)
    assert tool.approval_policy.timeout == seconds
    assert magic_duration(form) == seconds


def test_bad_policies_are_refused_at_the_call_and_at_the_tool(tmp_path: Path) -> None:
    with pytest.raises(ApprovalPolicyError, match='on_timeout="escalate" needs escalate_to'):
        dn.tool(needs_approval=True, timeout="1h", on_timeout="escalate")
    with pytest.raises(ApprovalPolicyError, match="on_timeout='maybe' is not a policy"):
        dn.execute("p", lambda ctx: ctx.approval("x", timeout=5, on_timeout="maybe"),
                   journal=DiskJournal(tmp_path / "j"), on_approval="park")
    with pytest.raises(ApprovalPolicyError, match="remind needs a timeout"):
        dn.tool(needs_approval=True, remind="5m")


def test_the_accepted_forms_set_the_same_deadline(tmp_path: Path) -> None:
    journal = DiskJournal(tmp_path / "j")
    for i, form in enumerate([7200, 7200.0, "2h", "120m", datetime.timedelta(hours=2)]):
        pending = _park(journal, f"r{i}", timeout=form)
        assert pending["timeout_at"] - pending["requested_at"] == pytest.approx(7200)
        assert pending["on_timeout"] == "reject"


# --- the policy applied without a kernel -------------------------------------------------------

@pytest.fixture
def jp_server_config(tmp_path, monkeypatch):
    """A journal where a run parked on an approval whose 1 s deadline has passed, and no
    notification channel anywhere: the server's sweeper must still apply the deadline."""
    monkeypatch.setenv("DURABLE_NB_INDEX", str(tmp_path / "index"))
    monkeypatch.setenv("DURABLE_NB_NOTIFY_CONFIG", str(tmp_path / "none.toml"))
    journal = DiskJournal(tmp_path / "shared")
    pending = _park(journal, "overnight", timeout="1s", on_timeout="approve")
    _past(pending["timeout_at"])
    assert find_decision(journal, "overnight", pending) is None
    monkeypatch.setenv("DURABLE_NB_JOURNAL", str(journal.directory))
    return {"ServerApp": {"jpserver_extensions": {"durable_nb.server": True}}}


def test_the_server_sweep_decides_a_parked_run_past_its_deadline(jp_serverapp,
                                                                 tmp_path: Path) -> None:
    journal = DiskJournal(tmp_path / "shared")
    pending = journal.get_run("overnight").pending_approval
    wait_until(lambda: find_decision(journal, "overnight", pending) is not None,
               what="the server's sweep to apply the deadline", timeout=60)
    decision = find_decision(journal, "overnight", pending)
    assert decision["approved"] is True and decision["by"] == "timeout"
    assert decision["via"] == "timeout"
    assert decision["note"] == "no decision within 1 s: approved by its on_timeout policy"
    assert _kinds(journal, "overnight") == ["decided", "timed_out"]
    timed_out = history(journal, "overnight")[1]
    assert "on_timeout='approve'" in timed_out["text"] and timed_out["approved"] is True
    # Re-running continues with the policy's decision.
    assert _resume(journal, "overnight") == [True, "timeout", decision["note"]]
    assert journal.get_run("overnight").status is Status.DONE


# --- escalation ----------------------------------------------------------------------------------

def test_escalation_then_a_second_deadline_rejects(tmp_path: Path) -> None:
    """``durable-nb sweep`` (another process, no notification channel) escalates once past
    the first deadline, and rejects past the second; ``show`` then says so."""
    journal = DiskJournal(tmp_path / "j")
    pending = _park(journal, "esc", timeout=1, on_timeout="escalate",
                    escalate_to=["bo@example.org", "ana"])
    assert pending["escalate_to"] == ["bo@example.org", "ana"]
    env = _subprocess_env(DURABLE_NB_NOTIFY_CONFIG=str(tmp_path / "none.toml"),
                          DURABLE_NB_INDEX=str(tmp_path / "index"))

    def notify() -> str:
        for command in (["sweep", "--once"], ["show", "esc"]):
            shown = subprocess.run([sys.executable, "-m", "durable_nb.cli", "--journal",
                                    str(tmp_path / "j"), *command], env=env, check=True,
                                   capture_output=True, text=True, timeout=120).stdout
        return shown

    _past(pending["timeout_at"])
    shown = notify()
    assert "escalated to bo@example.org, ana" in shown, shown
    escalated = journal.get_run("esc").pending_approval
    escalation = escalated["escalation"]
    assert escalation["approvers"] == ["bo@example.org", "ana"]
    assert escalation["timeout_at"] - escalation["at"] == pytest.approx(1.0)
    assert find_decision(journal, "esc", pending) is None
    assert _kinds(journal, "esc") == ["escalated"]

    _past(escalation["timeout_at"])
    notify()
    decision = find_decision(journal, "esc", pending)
    assert decision["approved"] is False and decision["by"] == "timeout"
    assert decision["note"] == "no decision within 1 s, nor by bo@example.org, ana after " \
                               "the escalation"
    assert _kinds(journal, "esc") == ["escalated", "decided", "timed_out"]
    assert _resume(journal, "esc") == [False, "timeout", decision["note"]]


def _records(journal, run_id: str) -> list:
    """Everything the journal holds about run ``run_id``, record for record."""
    record = journal.get_run(run_id)
    pending = record.pending_approval
    return [record.to_json(), [s.__dict__ for s in journal.steps(run_id)],
            journal.get_request(decision_kind(pending), run_id) if pending else None,
            journal.events(run_id), journal.deliveries(run_id), journal.link_records(run_id)]


def _cli(tmp_path: Path, *command: str) -> str:
    env = _subprocess_env(DURABLE_NB_NOTIFY_CONFIG=str(tmp_path / "none.toml"),
                          DURABLE_NB_INDEX=str(tmp_path / "index"))
    return subprocess.run([sys.executable, "-m", "durable_nb.cli", "--journal",
                           str(tmp_path / "j"), *command], env=env, check=True,
                          capture_output=True, text=True, timeout=120).stdout


def test_reading_a_run_past_its_deadline_writes_nothing_and_says_its_effective_state(
        tmp_path: Path) -> None:
    """``show``, ``runs``, ``durable_nb.runs`` and ``get_run`` used to apply the deadline
    (``show`` wrote a decision and three events); they read now, and say what the run
    amounts to: rejected by its deadline, not resumed yet. ``sweep`` writes it."""
    journal = DiskJournal(tmp_path / "j")
    pending = _park(journal, "late", timeout=1)
    _past(pending["timeout_at"])
    before = _records(journal, "late")
    shown = _cli(tmp_path, "show", "late")
    listed = _cli(tmp_path, "runs")
    dn.runs(journal=str(tmp_path / "j"))
    dn.get_run("late", journal=str(tmp_path / "j"))
    assert _records(journal, "late") == before  # record for record
    assert find_decision(journal, "late", pending) is None and history(journal, "late") == []
    assert "REJECTED in effect: rejected by its deadline at" in shown, shown
    row = next(line for line in listed.splitlines() if line.startswith("late "))
    assert "REJECTED" in row and "WAITING_APPROVAL" not in row, listed
    assert "late: rejected by its deadline at" in listed

    _cli(tmp_path, "sweep", "--once")  # the write is the sweep's
    decision = find_decision(journal, "late", pending)
    assert decision["by"] == "timeout" and decision["approved"] is False
    assert "REJECTED in effect: rejected by its deadline at" in _cli(tmp_path, "show", "late")
    assert _resume(journal, "late") == [False, "timeout", "no decision within 1 s"]


def test_a_late_decision_after_the_deadline_is_refused_naming_the_policy(
        tmp_path: Path) -> None:
    journal = DiskJournal(tmp_path / "j")
    pending = _park(journal, "late", timeout=1)
    _past(pending["timeout_at"])
    with pytest.raises(DecisionExists, match="rejected by timeout via timeout"):
        dn.approve("late", by="ana", journal=journal)
    assert _resume(journal, "late") == [False, "timeout", "no decision within 1 s"]


# --- racing processes on PostgreSQL ----------------------------------------------------------------

_RACER = textwrap.dedent("""
    import os, sys, time
    from durable_nb.errors import DecisionExists, NoPendingApproval
    from durable_nb.approvals.decide import decide
    from durable_nb.approvals.tick import tick
    from durable_nb.journal import open_journal
    journal = open_journal(sys.argv[1])
    record = journal.get_run("race")
    while not os.path.exists(sys.argv[2]):
        time.sleep(0.005)
    if sys.argv[3] == "person":
        try:
            pending = record.pending_approval
            decide(journal, "race", request_id=pending["id"], digest=pending["digest"],
                   approved=True, note="looks fine", by="ana", via="CLI")
            print("person decided")
        except (DecisionExists, NoPendingApproval):  # decided, or past its deadline
            print("person refused")
    else:
        print(tick(journal, records=[record]).applied)
""")


@pytest.mark.postgres
def test_a_person_deciding_while_the_deadline_applies_gives_one_decision(
        pg_backend: Backend, tmp_path: Path) -> None:
    journal = pg_backend.open()
    pending = _park(journal, "race", timeout=1)
    _past(pending["timeout_at"])
    go = tmp_path / "go"
    roles = ["person", "deadline"] * 3
    racers = [subprocess.Popen([sys.executable, "-c", _RACER, pg_backend.location, str(go), role],
                               env=_subprocess_env(), stdout=subprocess.PIPE, text=True)
              for role in roles]
    go.touch()  # the racers read the run, then all go at once
    outputs = [p.communicate(timeout=120)[0] for p in racers]
    assert all(p.returncode == 0 for p in racers), outputs
    decision = journal.get_request(decision_kind(pending), "race")
    events = history(journal, "race")
    decided = [e for e in events if e["kind"] == "decided"]
    assert len(decided) == 1, events
    if decision["by"] == "ana":
        assert decision["approved"] is True and "timed_out" not in _kinds(journal, "race")
        assert sum("person decided" in o for o in outputs) == 1
    else:
        assert decision["approved"] is False and _kinds(journal, "race").count("timed_out") == 1
        assert not any("person decided" in o for o in outputs)
    assert _resume(journal, "race")[0] is decision["approved"]


_REMINDER_SWEEPER = textwrap.dedent("""
    import sys, time
    from durable_nb.journal import open_journal
    from durable_nb.notify.config import load_config
    from durable_nb.notify.delivery import sweep
    journal = open_journal(sys.argv[1])
    config = load_config()
    sent = {}
    while time.time() < float(sys.argv[2]):
        for outcome in sweep(journal, config).values():
            sent.update(outcome)
        rows = journal.deliveries("remind")
        if any(k.endswith("/remind-1") and r["state"] != "claimed" for k, r in rows.items()):
            break
        time.sleep(0.02)
    print(sent)
""")


@pytest.mark.postgres
def test_a_reminder_is_delivered_once_across_racing_processes(pg_backend: Backend,
                                                              tmp_path: Path) -> None:
    journal = pg_backend.open()
    pending = _park(journal, "remind", timeout=60, remind="58s")  # due 2 s after parking
    assert pending["remind_at"] == [pytest.approx(pending["requested_at"] + 2)]
    with WebhookReceiver(SECRET) as hook:
        env = _subprocess_env(DURABLE_NB_NOTIFY_CONFIG=str(tmp_path / "none.toml"),
                              DURABLE_NB_NOTIFY_WEBHOOK=hook.url,
                              DURABLE_NB_NOTIFY_WEBHOOK_SECRET=SECRET)
        until = str(time.time() + 120)
        sweepers = [subprocess.Popen([sys.executable, "-c", _REMINDER_SWEEPER,
                                      pg_backend.location, until], env=env,
                                     stdout=subprocess.PIPE, text=True) for _ in range(4)]
        outputs = [p.communicate(timeout=180)[0] for p in sweepers]
        assert all(p.returncode == 0 for p in sweepers), outputs
        rows = journal.deliveries("remind")
        first = f"{pending['id']}/webhook"
        assert {k: r["state"] for k, r in rows.items()} == {first: "sent",
                                                           f"{first}/remind-1": "sent"}
        events = sorted(r["json"]["event"] for r in hook.requests)
        assert events == ["approval.reminder", "approval.requested"], hook.requests
        assert all(r["verified"] for r in hook.requests)
        reminder = next(r for r in hook.requests if r["json"]["event"] == "approval.reminder")
        assert reminder["json"]["delivery"] == f"remind/{first}/remind-1"
        assert reminder["json"]["timeout_at"] == pytest.approx(pending["timeout_at"])
    assert _kinds(journal, "remind") == ["reminded"]
    assert history(journal, "remind")[0]["text"].startswith("reminder 1 sent by webhook")


def test_an_escalation_is_notified_once_by_email_to_the_new_approvers(tmp_path: Path,
                                                                      smtp_server) -> None:
    import email

    from durable_nb.notify import EmailConfig, NotifyConfig, WebhookConfig
    from durable_nb.notify.delivery import sweep
    port, received, _ = smtp_server
    journal = DiskJournal(tmp_path / "j")
    pending = _park(journal, "esc", timeout=1, on_timeout="escalate",
                    escalate_to=["bo@example.org", "ana", "cy@example.org"])
    with WebhookReceiver(SECRET) as hook:
        config = NotifyConfig(
            webhook=WebhookConfig(hook.url, secret=SECRET),
            email=EmailConfig(host="127.0.0.1", port=port, sender="dnb@example.org",
                              to=("oncall@example.org",)))
        assert sweep(journal, config) == {"esc": {"webhook": "sent", "email": "sent"}}
        _past(pending["timeout_at"])
        assert sweep(journal, config) == {"esc": {"webhook/escalated": "sent",
                                                  "email/escalated": "sent"}}
        assert sweep(journal, config) == {}  # each sent once
        escalated = hook.requests[1]["json"]
        assert escalated["event"] == "approval.escalated" and hook.requests[1]["verified"]
        assert escalated["approvers"] == ["bo@example.org", "ana", "cy@example.org"]
        assert escalated["delivery"] == f"esc/{pending['id']}/webhook/escalated"
    # One message to each address (a refused one would fail alone).
    assert [r.rcpt_tos for r in received] == [["oncall@example.org"], ["bo@example.org"],
                                              ["cy@example.org"]]
    message = email.message_from_bytes(received[1].content)
    assert message["Subject"] == "Escalated: approval needed: deploy (run esc)"
    assert "Escalated to: bo@example.org, ana, cy@example.org" in message.get_payload()
    assert _kinds(journal, "esc") == ["escalated"]


def test_a_tool_needing_approval_takes_its_deadline_policy(tmp_path: Path) -> None:
    @dn.tool(needs_approval=True, timeout="1s", on_timeout="approve")
    def deploy(to: str) -> str:
        return f"deployed to {to}"

    message = {"role": "assistant", "content": None, "tool_calls": [
        {"id": "c1", "type": "function",
         "function": {"name": "deploy", "arguments": '{"to": "prod"}'}}]}
    journal = DiskJournal(tmp_path / "j")

    def agent(ctx):
        return ctx.call_tools(message, [deploy])

    assert dn.execute("tool", agent, journal=journal, on_approval="park") is None
    pending = journal.get_run("tool").pending_approval
    assert pending["on_timeout"] == "approve" and pending["name"] == "deploy"
    _past(pending["timeout_at"])
    answers = dn.execute("tool", agent, journal=journal, on_approval="park")
    assert answers[0]["content"] == "deployed to prod"


def test_a_waiting_run_escalates_itself_and_takes_an_escalation_approvers_decision(
        tmp_path: Path) -> None:
    """A run waiting in its process (``on_approval="wait"``) applies its own deadline:
    escalated in its record, it goes on waiting, and takes the decision given then."""
    import threading
    journal = DiskJournal(tmp_path / "j")
    outcome: dict = {}

    def agent(ctx):
        decision = ctx.approval("deploy", {"to": "prod"}, timeout=2, on_timeout="escalate",
                                escalate_to=["ana"])
        return [decision.approved, decision.by]

    waiting = threading.Thread(target=lambda: outcome.update(
        result=dn.execute("self", agent, journal=journal, on_approval="wait")))
    waiting.start()
    wait_until(lambda: ((r := journal.find_run("self")) is not None and r.pending_approval
                        and "escalation" in r.pending_approval),
               what="the waiting run to escalate", timeout=60)
    assert journal.get_run("self").pending_approval["escalation"]["approvers"] == ["ana"]
    try:
        dn.approve("self", by="ana", journal=journal)
        expected, events = [True, "ana"], ["escalated", "decided"]
    except DecisionExists:  # a machine too slow for the second 2 s: rejected, not lost
        expected, events = [False, "timeout"], ["escalated", "decided", "timed_out"]
    waiting.join(60)
    assert outcome["result"] == expected
    assert _kinds(journal, "self") == events


def test_the_servers_sweeper_applies_a_deadline_when_it_falls_due_not_a_period_later(
        tmp_path: Path, monkeypatch) -> None:
    """The sweeper sleeps until the next thing falls due, at most its period: with a period
    of an hour, a deadline two seconds away is still applied when it passes. (On 953f9b9 it
    slept a whole period between sweeps: a deadline was applied up to a period late.)"""
    from durable_nb.server.notify import start_sweeper

    monkeypatch.setenv("DURABLE_NB_INDEX", str(tmp_path / "index"))
    monkeypatch.setenv("DURABLE_NB_NOTIFY_CONFIG", str(tmp_path / "none.toml"))
    journal = DiskJournal(tmp_path / "j")
    monkeypatch.setenv("DURABLE_NB_JOURNAL", str(journal.directory))
    pending = _park(journal, "due", timeout=2)
    running = [True]
    start_sweeper(period=3600, running=lambda: running[0])
    try:
        wait_until(lambda: find_decision(journal, "due", pending) is not None,
                   what="the sweeper to apply the deadline", timeout=60)
    finally:
        running[0] = False
    decision = find_decision(journal, "due", pending)
    assert decision["by"] == "timeout" and decision["at"] >= pending["timeout_at"]


def test_durable_nb_sweep_sends_what_nobody_sent_for_a_journal_no_server_sweeps(
        tmp_path: Path) -> None:
    """``durable-nb sweep --once`` (cron, a CronJob) ticks the journal with its channels as
    the listener: a request parked with no channel is sent once to the configured webhook,
    and a second sweep sends nothing more."""
    journal = DiskJournal(tmp_path / "j")
    assert dn.execute("quiet", lambda ctx: ctx.approval("pay", {"eur": 5}), journal=journal,
                      on_approval="park", notify="none") is None
    with WebhookReceiver("sweep-secret") as hook:
        env = _subprocess_env(DURABLE_NB_NOTIFY_CONFIG=str(tmp_path / "none.toml"),
                              DURABLE_NB_INDEX=str(tmp_path / "index"),
                              DURABLE_NB_NOTIFY_WEBHOOK=hook.url,
                              DURABLE_NB_NOTIFY_WEBHOOK_SECRET="sweep-secret")
        for sweep in range(2):
            printed = subprocess.run([sys.executable, "-m", "durable_nb.cli", "--journal",
                                      str(tmp_path / "j"), "sweep", "--once"], env=env,
                                     check=True, capture_output=True, text=True,
                                     timeout=120).stdout
            if sweep == 0:
                assert "quiet: notified (webhook sent)" in printed, printed
        request = hook.wait_for(1)[0]
        assert request["verified"] and request["json"]["run_id"] == "quiet"
        assert len(hook.requests) == 1


def test_a_tick_applies_a_deadline_once_and_then_has_nothing_due(tmp_path: Path) -> None:
    """The tick that applies a deadline says so; the next one (the run not resumed yet)
    applies nothing and has nothing due, so a sweeper sleeps its period instead of ticking
    again at once; before the deadline, the deadline is what falls due next."""
    from durable_nb.approvals.tick import tick

    journal = DiskJournal(tmp_path / "j")
    pending = _park(journal, "once", timeout=2)
    assert tick(journal).next_due == pending["timeout_at"]
    _past(pending["timeout_at"])
    first = tick(journal)
    assert first.applied == {"once": "decided"} and first.next_due is None
    second = tick(journal)
    assert second.applied == {} and second.overdue == [] and second.next_due is None
    assert _kinds(journal, "once") == ["decided", "timed_out"]
