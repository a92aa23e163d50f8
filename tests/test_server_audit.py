"""What the REST API says of a run's notifications and history (issue 27): a waiting run's row
in ``GET runs`` carries its request's deliveries as counts and, when one failed or is
retrying, the reason; ``GET run`` carries every delivery and the run's history; the summary's
version changes when a delivery does (the sidebar fetches again). A real Jupyter Server
(pytest-jupyter), a directory journal and a real HTTP receiver answering 500.
"""

from __future__ import annotations

import re
import threading

import pytest

pytest.importorskip("pytest_jupyter")
pytest.importorskip("jupyter_server")

from pytest_jupyter.jupyter_server import *  # noqa: E402,F401,F403 - fixtures for this module

import durable_nb as dn  # noqa: E402
from durable_nb.errors import DecisionExists  # noqa: E402
from durable_nb.journal.index import journal_id  # noqa: E402
from durable_nb.execution.retry import RetryPolicy  # noqa: E402
from durable_nb.notify import NotifyConfig, WebhookConfig  # noqa: E402
from durable_nb.notify.delivery import deliver  # noqa: E402
from durable_nb.notify.loopback import WebhookReceiver  # noqa: E402
from tests.harness import wait_until  # noqa: E402
from tests.test_approvals import _drop  # noqa: E402
from tests.test_server import api, index, jp_server_config, shared  # noqa: E402,F401

SECRET = "audit-hook-secret"




def _row(api, run_id: str) -> dict:
    return next(run for run in api("runs")["runs"] if run["run_id"] == run_id)


def test_a_failing_webhook_is_listed_as_retrying_then_failed_with_its_reason(shared, api):
    dropped: list[str] = []
    assert dn.execute("r", _drop("staging", dropped), journal=shared, on_approval="park") is None
    assert _row(api, "r")["deliveries"] is None  # nothing configured, nothing sent
    retry_now = threading.Event()
    with WebhookReceiver(SECRET, status=500) as hook:
        # The backoff's wait held until the test has seen the delivery between two attempts.
        retry = RetryPolicy(max_attempts=2, initial_delay=0.0, jitter=0.0,
                            sleep=lambda _: retry_now.wait(60))
        config = NotifyConfig(webhook=WebhookConfig(hook.url, secret=SECRET), retry=retry)
        before = api("summary")["version"]
        sender = threading.Thread(target=deliver, args=(shared, shared.get_run("r"), config))
        sender.start()
        try:
            hook.wait_for(1)
            wait_until(lambda: (_row(api, "r")["deliveries"] or {}).get("retrying") == 1,
                       what="the first attempt's failure to be listed", timeout=30)
            retrying = api("summary")["version"]
        finally:
            retry_now.set()
            sender.join(60)
        assert len(hook.wait_for(2)) == 2
    listed = _row(api, "r")["deliveries"]
    assert set(listed) == {"failed", "problem"} and listed["failed"] == 1, listed
    assert listed["problem"].startswith("webhook failed after 2 attempts: HTTP 500"), listed
    assert before != retrying != api("summary")["version"]
    # The run stays parked; the run view has the whole delivery, attempt by attempt.
    view = api("run", params={"journal": journal_id(str(shared.directory)), "id": "r"})
    assert view["record"]["status"] == "WAITING_APPROVAL"
    [delivery] = view["record"]["notifications"]
    assert (delivery["channel"], delivery["state"]) == ("webhook", "failed")
    assert [a["ok"] for a in delivery["attempts"]] == [False, False]
    assert "token" not in delivery and SECRET not in str(view)


def test_a_run_not_waiting_lists_no_deliveries(shared, api):
    dn.execute("done", lambda ctx: ctx.run("step", lambda: 1), journal=shared)
    assert _row(api, "done")["deliveries"] is None


def test_the_run_view_has_the_decision_and_the_refused_second_decision(shared, api):
    dropped: list[str] = []
    assert dn.execute("r", _drop("staging", dropped), journal=shared, on_approval="park") is None
    pending = shared.get_run("r").pending_approval
    dn.approve("r", "looks fine", expect=pending["digest"], by="ana", journal=shared)
    with pytest.raises(DecisionExists):
        dn.reject("r", expect=pending["digest"], by="bob", journal=shared)
    view = api("run", params={"journal": journal_id(str(shared.directory)), "id": "r"})
    events = view["record"]["history"]
    assert [(e["kind"], e["by"]) for e in events] == [("decided", "ana"), ("refused", "bob")]
    assert events[0]["text"] == "approved by ana via Python"
    assert re.fullmatch(r"a decision by bob via Python to reject was refused: the request was "
                        r"already approved by ana via Python at \S+ \S+", events[1]["text"])
    assert all(e["request"] == pending["id"] and isinstance(e["at"], float) for e in events)
