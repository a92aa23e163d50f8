"""The Jupyter Server extension sends what no kernel notified: a run parked by a process
that sent nothing (it had no channel configured; it could as well have died) is notified by
the server, whose environment configures a webhook, once (a real server: pytest-jupyter's
``jp_serverapp`` with the extension enabled; a real HTTP receiver verifying the signature)."""

from __future__ import annotations

import pytest

pytest.importorskip("pytest_jupyter")
pytest.importorskip("jupyter_server")

from pytest_jupyter.jupyter_server import *  # noqa: E402,F401,F403 - fixtures for this module

import durable_nb as dn  # noqa: E402
from durable_nb import DiskJournal  # noqa: E402
from durable_nb.notify.loopback import WebhookReceiver  # noqa: E402
from durable_nb.server.notify import sweep_allowed  # noqa: E402
from tests.harness import wait_until  # noqa: E402

SECRET = "server-side-secret"


@pytest.fixture
def receiver():
    with WebhookReceiver(SECRET) as hook:
        yield hook


@pytest.fixture
def jp_server_config(tmp_path, monkeypatch, receiver):
    """The server's environment: a journal where a run is parked, un-notified, and a webhook
    configured (the parking process had none)."""
    monkeypatch.setenv("DURABLE_NB_INDEX", str(tmp_path / "index"))
    monkeypatch.setenv("DURABLE_NB_NOTIFY_CONFIG", str(tmp_path / "none.toml"))
    journal = DiskJournal(tmp_path / "shared")
    assert dn.execute("parked", lambda ctx: ctx.approval("wire_money", {"eur": 900}),
                      journal=journal, on_approval="park") is None
    assert journal.deliveries("parked") == {}
    monkeypatch.setenv("DURABLE_NB_JOURNAL", str(journal.directory))
    monkeypatch.setenv("DURABLE_NB_NOTIFY_WEBHOOK", receiver.url)
    monkeypatch.setenv("DURABLE_NB_NOTIFY_WEBHOOK_SECRET", SECRET)
    return {"ServerApp": {"jpserver_extensions": {"durable_nb.server": True}}}


def test_the_server_notifies_a_parked_run_nobody_notified(jp_serverapp, receiver, tmp_path):
    request = receiver.wait_for(1)[0]
    assert request["verified"] and request["json"]["run_id"] == "parked"
    journal = DiskJournal(tmp_path / "shared")
    wait_until(lambda: [r["state"] for r in journal.deliveries("parked").values()] == ["sent"],
               what="the server's delivery to be recorded", timeout=30)
    assert sweep_allowed()[0] == {}  # a second sweep sends nothing more
    assert len(receiver.requests) == 1
