"""Notifications of what became of a request or a run (``[events] send``): a decision, a
decision by the deadline's policy, a failed run; each sent once per channel, whoever sees
it, and nothing of them unless configured. Real parts: an HTTP receiver on loopback that
verifies each webhook's signature, a disk journal, the runs' own processes and sweeps."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

import durable_nb as dn
from durable_nb import DiskJournal
from durable_nb.errors import NotifyConfigError
from durable_nb.notify import NotifyConfig, WebhookConfig, load_config
from durable_nb.notify.delivery import drain, sweep
from durable_nb.notify.loopback import WebhookReceiver
from tests.harness import wait_until

SECRET = "events-secret"
ALL = ("waiting", "decided", "timed_out", "failed")


def _ask(ctx, **options):
    decision = ctx.approval("deploy", {"to": "prod"}, **options)
    return [decision.approved, decision.by]


def _events(hook: WebhookReceiver) -> list[str]:
    assert all(r["verified"] for r in hook.requests)
    return [r["json"]["event"] for r in hook.requests]


@pytest.fixture
def hook():
    with WebhookReceiver(SECRET) as receiver:
        yield receiver


def test_a_decision_taken_by_the_run_is_notified_once(tmp_path: Path, hook) -> None:
    config = NotifyConfig(webhook=WebhookConfig(hook.url, secret=SECRET), events=ALL)
    journal = DiskJournal(tmp_path / "j")
    assert dn.execute("r", _ask, journal=journal, on_approval="park", notify=config) is None
    dn.approve("r", "ship it", by="ana", journal=journal)
    assert dn.execute("r", _ask, journal=journal, on_approval="park",
                      notify=config) == [True, "ana"]
    wait_until(lambda: len(hook.requests) == 2, what="the decision's notice", timeout=60)
    # Both sent on threads of their own: in either order.
    assert sorted(_events(hook)) == ["approval.decided", "approval.requested"]
    decided = next(r["json"] for r in hook.requests if r["json"]["event"] == "approval.decided")
    assert decided["outcome"]["approved"] is True and decided["outcome"]["by"] == "ana"
    assert decided["outcome"]["note"] == "ship it"
    pending_id = decided["request_id"]
    assert decided["delivery"] == f"r/{pending_id}/webhook/decided"
    assert sweep(journal, config) == {} and drain(30)
    assert len(hook.requests) == 2


def test_a_deadline_decision_is_notified_once_by_the_sweep_then_not_by_the_run(
        tmp_path: Path, hook) -> None:
    config = NotifyConfig(webhook=WebhookConfig(hook.url, secret=SECRET), events=ALL)
    journal = DiskJournal(tmp_path / "j")
    assert dn.execute("t", lambda ctx: _ask(ctx, timeout=1), journal=journal,
                      on_approval="park", notify=config) is None
    timeout_at = journal.get_run("t").pending_approval["timeout_at"]
    wait_until(lambda: time.time() >= timeout_at, what="the deadline to pass", timeout=60)
    assert drain(30)
    sent = sweep(journal, config)
    assert sent == {"t": {"webhook/timed_out": "sent"}}, sent
    assert sweep(journal, config) == {}
    assert dn.execute("t", lambda ctx: _ask(ctx, timeout=1), journal=journal,
                      on_approval="park", notify=config) == [False, "timeout"]
    assert drain(30)
    assert _events(hook) == ["approval.requested", "approval.timed_out"]
    assert hook.requests[1]["json"]["outcome"]["via"] == "timeout"


def test_a_failed_run_is_notified_once_per_failure(tmp_path: Path, hook) -> None:
    config = NotifyConfig(webhook=WebhookConfig(hook.url, secret=SECRET), events=ALL)
    journal = DiskJournal(tmp_path / "j")

    def breaks(ctx):
        ctx.run("fetch", lambda: 1)
        raise RuntimeError("the disk is full")

    for _ in range(2):
        with pytest.raises(RuntimeError):
            dn.execute("f", breaks, journal=journal, notify=config)
    assert drain(30)
    assert _events(hook) == ["run.failed", "run.failed"]
    # Each failure's notice is sent on a thread of its own: in either order.
    first, second = sorted((r["json"] for r in hook.requests), key=lambda j: j["delivery"])
    assert first["outcome"]["error"] == "RuntimeError: the disk is full"
    assert first["delivery"] == "f/failed-1/webhook" and second["delivery"] == "f/failed-2/webhook"


def test_by_default_only_waiting_is_notified(tmp_path: Path, hook) -> None:
    config = NotifyConfig(webhook=WebhookConfig(hook.url, secret=SECRET))
    journal = DiskJournal(tmp_path / "j")
    assert dn.execute("d", _ask, journal=journal, on_approval="park", notify=config) is None
    dn.reject("d", by="ana", journal=journal)
    assert dn.execute("d", _ask, journal=journal, notify=config) == [False, "ana"]
    with pytest.raises(ZeroDivisionError):
        dn.execute("e", lambda ctx: 1 / 0 if ctx.run("x", lambda: 1) else 0, journal=journal,
                   notify=config)
    assert drain(30) and sweep(journal, config) == {}
    assert _events(hook) == ["approval.requested"]


def test_the_events_setting_is_checked(tmp_path: Path) -> None:
    env = {"DURABLE_NB_NOTIFY_CONFIG": str(tmp_path / "none.toml"),
           "DURABLE_NB_NOTIFY_EVENTS": "decided, failed"}
    assert load_config(None, env).events == ("decided", "failed")
    with pytest.raises(NotifyConfigError, match="unknown event 'exploded': use waiting, "
                                                "decided, timed_out, failed"):
        load_config(None, {**env, "DURABLE_NB_NOTIFY_EVENTS": "exploded"})
