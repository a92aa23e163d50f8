"""The REST reference says what the server does (issue 41): every example the generated page
shows is sent to a real Jupyter Server with the extension (pytest-jupyter's ``jp_serverapp``)
over a real directory journal, and answered with the status and the fields the page lists.

Before, docs/pages/guide/server.md listed `POST run/decision`'s body by hand without
``request_id``; a client that sent exactly that got a bare 400.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

pytest.importorskip("pytest_jupyter")
pytest.importorskip("jupyter_server")

from pytest_jupyter.jupyter_server import *  # noqa: E402,F401,F403 - fixtures for this module

import durable_nb as dn  # noqa: E402
from durable_nb.journal.index import journal_id  # noqa: E402
from durable_nb.server.api import API_VERSION, ENDPOINTS, Endpoint  # noqa: E402
from tests.test_server import (  # noqa: E402,F401 - fixtures
    _asked_nights,
    api,
    index,
    jp_server_config,
    shared,
)

REPO = Path(__file__).resolve().parents[1]
_SCHEMA = {"type": "object", "properties": {"to": {"type": "string"},
                                            "subject": {"type": "string"}},
           "required": ["to", "subject"]}


def _rendered() -> str:
    sys.path.insert(0, str(REPO / "docs" / "hooks"))
    try:
        import rest_reference
    finally:
        sys.path.remove(str(REPO / "docs" / "hooks"))
    return rest_reference.rest_reference()


def _email(ctx):
    decision = ctx.approval("send_email", {"tool": "send_email", "arguments": {
        "to": "team@example.com", "subject": "Q3"}}, schema=_SCHEMA)
    return [decision.approved, decision.args, decision.message]


def _fill(journal, example) -> dict:
    """The example's request with the values it says a client takes from earlier answers
    (the journal's id, the pending request's id and digest) taken from this journal; the run
    it names parked anew first (each decision example decides a request of its own)."""
    request = dict(example.request)
    run_id = request.get("id")
    if "digest" in example.given or "request_id" in example.given:
        if journal.find_run(run_id) is not None:
            journal.delete_run(run_id)
        asks = _asked_nights if "answer" in request else _email
        assert dn.execute(run_id, asks, journal=journal, on_approval="park") is None
        pending = journal.get_run(run_id).pending_approval
        request.update({k: v for k, v in (("digest", pending["digest"]),
                                          ("request_id", pending["id"]))
                        if k in example.given})
    if "journal" in example.given:
        request["journal"] = journal_id(str(journal.directory))
    return request


def _prepare(journal) -> None:
    """The runs the GET examples name: a parked q3-email, a running nightly, a batch."""
    if journal.find_run("q3-email") is None:
        assert dn.execute("q3-email", _email, journal=journal, on_approval="park") is None
    dn.map(lambda ctx, item: ctx.run("price", lambda: item * 2), [1, 2], batch_id="prices",
           journal=journal)
    assert dn.execute("nightly", _email, journal=journal, on_approval="park") is None


def _answered_as_documented(endpoint: Endpoint, answer: dict) -> None:
    listed = {field.name: field for field in endpoint.answer}
    assert set(answer) == set(listed), (endpoint.path, sorted(answer), sorted(listed))
    for name, field in listed.items():
        assert field.fits(answer[name]), (endpoint.path, name, answer[name])


def test_every_example_the_reference_shows_is_answered_as_documented(shared, api):
    rendered = _rendered()
    _prepare(shared)
    sent = 0
    for endpoint in ENDPOINTS:
        for example in endpoint.examples:
            if endpoint.method == "POST":
                assert json.dumps(example.request, indent=2) in rendered  # shown as sent
                answer = api(endpoint.path, method="POST", expect=example.status,
                             body=_fill(shared, example))
            else:
                query = "&".join(f"{k}={v}" for k, v in example.request.items())
                assert f"`GET {endpoint.path}{'?' + query if query else ''}`" in rendered
                answer = api(endpoint.path, params=_fill(shared, example) or None,
                             expect=example.status)
            if example.status == 200:
                _answered_as_documented(endpoint, answer)
            else:  # the refusal the page shows, word for word
                assert json.dumps({"message": answer["message"]}, indent=2) in rendered
            sent += 1
    assert sent == sum(len(e.examples) for e in ENDPOINTS) >= 12


def test_the_reference_names_the_api_version_the_server_reports(shared, api):
    assert api("version")["api"] == API_VERSION
    assert f"version {API_VERSION}** of the API" in _rendered()


def test_a_decision_body_of_the_first_api_is_told_what_is_missing_and_that_the_api_changed(
        shared, api):
    """The body the guide listed before (journal, id, approved, note, digest, replace): a
    400 naming request_id and the versions, and nothing decided."""
    _prepare(shared)
    pending = shared.get_run("q3-email").pending_approval
    answer = api("run/decision", method="POST", expect=400, body={
        "journal": journal_id(str(shared.directory)), "id": "q3-email", "approved": True,
        "note": None, "digest": pending["digest"], "replace": False})
    assert answer["message"].startswith("'request_id' (the id of the pending request as "
                                        "shown; null for a request written before ids) is "
                                        "missing: it is required since version 2 of this "
                                        f"API, and this server speaks version {API_VERSION}")
    assert shared.get_run("q3-email").pending_approval == pending


def test_a_request_that_does_not_fit_its_endpoint_names_the_field_and_its_kind(shared, api):
    for body, said in (({"id": "r", "approved": "yes"}, "'journal' (the run's journal"),
                       ({"journal": "j", "id": "r", "approved": "yes", "request_id": None,
                         "digest": "0123456789"}, "'approved' must be true or false"),
                       ({"journal": "j", "id": 3}, "'id' must be a string")):
        path = "run/decision" if "approved" in body else "run/cancel"
        assert api(path, method="POST", expect=400, body=body)["message"].startswith(said)
    assert api("runs", params={"limit": "0"}, expect=400)["message"] == \
        "'limit' must be a whole number from 1 to 500 (runs per page)"


def test_every_route_is_a_documented_endpoint_served_with_its_method():
    from durable_nb.server.handlers import HANDLERS

    assert sorted(h.endpoint.path for h in HANDLERS) == sorted(e.path for e in ENDPOINTS)
    for handler in HANDLERS:
        method = handler.endpoint.method.lower()
        assert method in vars(handler), (handler.__name__, method)
        other = {"get": "post", "post": "get"}[method]
        assert other not in vars(handler), (handler.__name__, other)
