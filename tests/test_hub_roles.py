"""Separation of duties in the database (issue 33): on a journal set up for a hub, only the
service's role writes a decision; a user's own role parks, reads, resumes and takes one, and
every way she has to write one herself is refused with one line and an event in the
history. Real PostgreSQL (tests/postgres.py) with a role per person; no hub here (the hub
itself: tests/test_hub.py)."""

from __future__ import annotations

import pytest

import durable_nb as dn
from durable_nb.errors import DatabaseError, RefusedByHub
from durable_nb.approvals.request import find_decision
from durable_nb.hub.config import HubConfig
from durable_nb.hub.decide import decide_as
from durable_nb.approvals.authority import SERVICE_VARIABLE, TOKEN_VARIABLE
from tests.hub_roles import make_hub_database
from tests.test_approvals import _drop

pytestmark = pytest.mark.postgres


@pytest.fixture
def team(postgres_server, monkeypatch):
    for variable in (SERVICE_VARIABLE, TOKEN_VARIABLE, "JUPYTERHUB_USER"):
        monkeypatch.delenv(variable, raising=False)
    database = make_hub_database(postgres_server)
    journals = {who: database.journal(who) for who in ("service", "ana", "bo")}
    yield database, journals
    for journal in journals.values():
        journal.dispose()


def _park(journal, monkeypatch, starter: str, run_id: str = "r") -> dict:
    monkeypatch.setenv("DURABLE_NB_USER", starter)
    assert dn.execute(run_id, _drop("staging", []), journal=journal, on_approval="park",
                      four_eyes=True) is None
    return journal.get_run(run_id).pending_approval


def test_her_kernel_naming_someone_else_is_refused_in_one_line_and_nothing_written(
        team, monkeypatch):
    _, journals = team
    pending = _park(journals["ana"], monkeypatch, "ana")
    monkeypatch.setenv("DURABLE_NB_USER", "bo")  # as in issue 33: her kernel says she is bo
    with pytest.raises(RefusedByHub) as refused:
        dn.approve("r", journal=journals["ana"])
    (line,) = str(refused.value).splitlines()
    assert line.startswith("run 'r': 'drop database' was not decided: on this hub only the "
                           "durable-nb service (database role dnb_service_"), line
    assert find_decision(journals["ana"], "r", pending) is None
    (event,) = journals["ana"].events("r")
    assert (event["kind"], event["by"], event["via"]) == ("refused", "bo", "Python")


def test_her_own_role_cannot_write_a_decision_an_approval_step_or_who_decides(
        team, monkeypatch, postgres_server):
    import psycopg

    database, journals = team
    pending = _park(journals["ana"], monkeypatch, "ana")
    forged = {"key": pending["key"], "digest": pending["digest"], "name": pending["name"],
              "approved": True, "note": None, "by": "bo", "via": "link", "at": 1.0}
    with pytest.raises(DatabaseError, match="only the role dnb_service_.* writes decisions "
                                            "in this journal, not dnb_ana_"):
        journals["ana"].add_request(f"decision.{pending['id']}", "r", forged)
    url = database.urls["ana"].split("?")[0]
    s = database.schema
    with psycopg.connect(url, autocommit=True) as conn:
        for statement in (
                f"INSERT INTO {s}.requests VALUES ('r', 'decision.{pending['id']}', "
                f"'{{\"approved\": true, \"by\": \"bo\"}}')",
                f"INSERT INTO {s}.steps VALUES ('r', 99, '{{\"id\": \"x\", \"n\": \"drop "
                f"database\", \"k\": \"approval\", \"r\": {{\"approved\": true, \"by\": "
                f"\"bo\", \"digest\": \"{pending['digest']}\"}}}}')",
                f"INSERT INTO {s}.steps VALUES ('r', 98, '{{\"id\": \"x\", \"n\": \"drop "
                f"database\", \"k\": \"approval\", \"ok\": true, \"r\": {{\"approved\": "
                f"true, \"by\": \"bo\", \"digest\": \"{pending['digest']}\"}}}}')",
                f"UPDATE {s}.meta SET value = '{{}}' WHERE key = 'decider'",
                f"ALTER TABLE {s}.requests DISABLE TRIGGER requests_decider"):
            with pytest.raises(psycopg.Error) as refused:
                conn.execute(statement)
            assert refused.value.sqlstate == "42501", statement  # insufficient_privilege
        # Who started a run is the database's to say: her UPDATE leaves it as it was.
        conn.execute(f"UPDATE {s}.runs SET created_by = 'dnb_bo', written_by = 'dnb_bo'")
        assert conn.execute(f"SELECT created_by, written_by FROM {s}.runs").fetchone() == \
            (database.user_roles["ana"],) * 2
    assert find_decision(journals["ana"], "r", pending) is None
    assert dn.get_run("r", journal=journals["ana"]).status is dn.Status.WAITING_APPROVAL


def test_the_service_decides_as_the_hub_user_with_the_starter_the_database_recorded(
        team, monkeypatch):
    database, journals = team
    config = HubConfig(roles=database.user_roles)
    # ana starts the run as cy (her kernel's DURABLE_NB_USER): the database knows better.
    pending = _park(journals["ana"], monkeypatch, "cy")
    assert pending["started_by"] == "cy" and pending["four_eyes"]
    with pytest.raises(dn.NotAllowedToDecide, match="ana started the run"):
        decide_as(journals["service"], config, "r", user="ana", approved=True, note=None,
                  via="hub inbox", request_id=pending["id"], digest=pending["digest"])
    assert [e["kind"] for e in journals["ana"].events("r")] == ["refused"]
    decision = decide_as(journals["service"], config, "r", user="bo", approved=True,
                         note=None, via="hub inbox", request_id=pending["id"],
                         digest=pending["digest"])
    assert (decision["by"], decision["via"]) == ("bo", "hub inbox")
    # ana's kernel resumes the run with her own role, takes the decision, journals the step.
    dropped: list[str] = []
    assert dn.execute("r", _drop("staging", dropped), journal=journals["ana"]) == \
        "dropped staging"
    assert dropped == ["staging"]


def test_without_a_decider_a_shared_journal_decides_as_before(postgres_server, monkeypatch):
    from durable_nb.journal import PostgresJournal

    monkeypatch.delenv(SERVICE_VARIABLE, raising=False)
    journal = PostgresJournal(postgres_server.url + "?schema=nohub_roles")
    try:
        _park(journal, monkeypatch, "ana", "plain")
        assert dn.approve("plain", by="bo", journal=journal).by == "bo"
    finally:
        journal.dispose()


def test_the_hub_configuration_names_what_is_wrong(tmp_path):
    from durable_nb.errors import DurableError
    from durable_nb.hub.config import load_config

    good = tmp_path / "hub.json"
    good.write_text('{"users": {"ana": {"email": "ana@x.test", "role": "dnb_ana"}}}')
    config = load_config(good)
    assert (config.emails, config.roles, config.four_eyes) == \
        ({"ana": "ana@x.test"}, {"ana": "dnb_ana"}, True)
    assert (config.person_of_role("dnb_ana"), config.person_of_role("other")) == \
        ("ana", "other")
    for text, says in (("{", "cannot be read"), ('{"users": ["ana"]}', '"users" must map'),
                       ('{"four_eyes": "yes"}', '"four_eyes" must be true or false')):
        good.write_text(text)
        with pytest.raises(DurableError, match=says):
            load_config(good)


def test_rewriting_someone_else_s_run_to_list_herself_makes_her_its_starter(team,
                                                                            monkeypatch):
    database, journals = team
    config = HubConfig(roles=database.user_roles)
    monkeypatch.setenv("DURABLE_NB_USER", "bo")
    assert dn.execute("b", _drop("staging", []), journal=journals["bo"], on_approval="park",
                      approvers=["cy"]) is None
    record = journals["ana"].get_run("b")  # ana's role may write any run's record
    record.pending_approval = dict(record.pending_approval, approvers=["ana"])
    journals["ana"].put_run(record)
    with pytest.raises(dn.NotAllowedToDecide, match="ana started the run"):
        decide_as(journals["service"], config, "b", user="ana", approved=True, note=None,
                  via="hub inbox", request_id=record.pending_approval["id"],
                  digest=record.pending_approval["digest"])
    assert find_decision(journals["ana"], "b", record.pending_approval) is None


def test_a_link_decides_with_what_was_typed_on_its_page(team, monkeypatch):
    """The service's link page offers a message for the model (and the arguments to edit):
    what the person typed is part of the decision, not dropped (found in review)."""
    from durable_nb.approvals.links import issue_links
    from durable_nb.hub.links import link_decision
    from durable_nb.notify.config import LinksConfig

    database, journals = team
    config = HubConfig(roles=database.user_roles, emails={"bo": "bo@example.org"})
    pending = _park(journals["ana"], monkeypatch, "ana")
    service = journals["service"]
    links, _ = issue_links(service, "r", pending, channel="email", recipients=["bo@example.org"],
                           config=LinksConfig(base_url="https://hub.example.org/services/dnb/"),
                           delivery="r/test")
    ((to, url),) = links
    token = url.split("#", 1)[1]
    outcome = link_decision(service, config, token, user="bo", approved=False,
                            message="Denied: drop the staging copy instead")
    assert outcome.kind == "decided", outcome.message
    decision = find_decision(service, "r", pending)
    assert (decision["by"], decision["approved"], decision["message"]) == (
        "bo", False, "Denied: drop the staging copy instead")
