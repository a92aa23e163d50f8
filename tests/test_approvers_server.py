"""Who may approve, through a real Jupyter server (issue 27, item 3): the REST decision of a
user the request does not allow is answered 403 with the reason as data, nothing decided,
the refusal in the run's history. The server's fixtures are tests/test_server.py's."""

from __future__ import annotations

import pytest

pytest.importorskip("pytest_jupyter")
pytest.importorskip("jupyter_server")

from pytest_jupyter.jupyter_server import *  # noqa: E402,F401,F403 - fixtures for this module

import durable_nb as dn  # noqa: E402
from durable_nb.approvals.request import find_decision# noqa: E402
from durable_nb.journal.index import journal_id  # noqa: E402
from tests.test_approvals import _drop  # noqa: E402
from tests.test_server import _NamedIdentity, api, index, shared  # noqa: E402,F401

_NAMED = {"ServerApp": {"jpserver_extensions": {"durable_nb.server": True},
                        "identity_provider_class": _NamedIdentity}}


def _park(journal, run_id: str, dropped: list[str], **options) -> dict:
    assert dn.execute(run_id, _drop("staging", dropped), journal=journal, on_approval="park",
                      **options) is None
    return journal.get_run(run_id).pending_approval


def _decide(api, journal, run_id: str, pending: dict, expect: int) -> dict:
    return api("run/decision", method="POST", expect=expect, body={
        "journal": journal_id(str(journal.directory)), "id": run_id, "approved": True,
        "digest": pending["digest"], "request_id": pending["id"]})


@pytest.mark.parametrize("jp_server_config", [_NAMED])
def test_a_jupyter_user_not_on_the_list_gets_403_with_the_reason_and_nothing_is_decided(
        shared, api):
    dropped: list[str] = []
    pending = _park(shared, "r", dropped, approvers=["ana"])
    listed = api("runs")["runs"][0]["pending_approval"]
    assert listed["approvers"] == ["ana"]  # the inbox can say who may decide

    refused = _decide(api, shared, "r", pending, 403)
    assert refused == {
        "message": "run 'r': 'drop database' was not decided: Grace Hopper is not on its "
                   "approvers' list; only ana may decide. Nothing was written.",
        "reason": "not an approver", "by": "Grace Hopper", "approvers": ["ana"],
        "started_by": None}
    assert find_decision(shared, "r", pending) is None
    (event,) = shared.events("r")
    assert (event["kind"], event["by"], event["via"]) == \
        ("refused", "Grace Hopper", "Jupyter server")

    # On the list (names match whatever their case), the same user decides.
    pending = _park(shared, "s", dropped, approvers=["grace hopper"])
    assert _decide(api, shared, "s", pending, 200)["by"] == "Grace Hopper"
    assert dn.execute("s", _drop("staging", dropped), journal=shared) == "dropped staging"


@pytest.mark.parametrize("jp_server_config", [_NAMED])
def test_four_eyes_refuses_the_jupyter_user_who_started_the_run(shared, api, monkeypatch):
    monkeypatch.setenv("DURABLE_NB_USER", "Grace Hopper")  # who starts the run here
    pending = _park(shared, "r", [], four_eyes=True)
    refused = _decide(api, shared, "r", pending, 403)
    assert (refused["reason"], refused["started_by"]) == ("four-eyes", "Grace Hopper")
    assert "under four-eyes nobody decides a request of a run they started" in \
        refused["message"]
    assert find_decision(shared, "r", pending) is None
