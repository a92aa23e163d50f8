"""Separation of duties in the database (issue 33): on a journal set up for a hub, only the
service's role writes a decision; a user's own role parks, reads, resumes and takes one, and
every way she has to write one herself is refused with one line and an event in the
history. Real PostgreSQL (tests/postgres.py) with a role per person; no hub here (the hub
itself: tests/test_hub.py)."""

from __future__ import annotations

import time

import psycopg
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
    _bo_parks(journals, monkeypatch, "b")  # bo's run, with a step before it asks
    url = database.urls["ana"].split("?")[0]
    s = database.schema
    forged_step = (f"'{{\"id\": \"{pending['key']}\", \"n\": \"drop database\", \"k\": "
                   f"\"approval\", \"r\": {{\"approved\": true, \"by\": \"bo\", "
                   f"\"digest\": \"{pending['digest']}\"}}}}'")
    with psycopg.connect(url, autocommit=True) as conn:
        # A step of her own run that is no approval: hers to write.
        conn.execute(f"INSERT INTO {s}.steps VALUES ('r', 97, "
                     f"'{{\"id\": \"y\", \"n\": \"note\", \"k\": \"step\", \"r\": 1}}')")
        for statement in (
                # UPDATE: made an approval step, or bo's history moved into her run or
                # hers into his.
                f"UPDATE {s}.steps SET entry = {forged_step} WHERE run_id = 'r'",
                f"UPDATE {s}.steps SET run_id = 'r', position = position + 50 "
                f"WHERE run_id = 'b'",
                f"UPDATE {s}.steps SET run_id = 'b', position = 50 WHERE run_id = 'r'",
                f"UPDATE {s}.steps SET run_id = 'gone' WHERE run_id = 'b'",
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
        conn.execute(f"UPDATE {s}.runs SET created_by = 'dnb_bo', written_by = 'dnb_bo' "
                     f"WHERE run_id = 'r'")
        assert conn.execute(f"SELECT created_by, written_by FROM {s}.runs "
                            f"WHERE run_id = 'r'").fetchone() == \
            (database.user_roles["ana"],) * 2
    assert find_decision(journals["ana"], "r", pending) is None
    assert dn.get_run("r", journal=journals["ana"]).status is dn.Status.WAITING_APPROVAL
    with psycopg.connect(url, autocommit=True) as conn:
        assert conn.execute(f"SELECT run_id, position, entry::json ->> 'k' FROM {s}.steps "
                            f"ORDER BY run_id").fetchall() == [("b", 0, "run"),
                                                               ("r", 97, "step")]


def test_the_service_decides_as_the_hub_user_with_the_starter_the_database_recorded(
        team, monkeypatch):
    database, journals = team
    config = HubConfig(roles=database.user_roles)
    # ana starts the run as cy (her kernel's DURABLE_NB_USER): the database knows better,
    # and every reader shows the hub user of the role that created the run (issue 41).
    pending = _park(journals["ana"], monkeypatch, "cy")
    assert pending["started_by"] == "ana" and pending["four_eyes"]
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


def test_the_starter_every_reader_shows_is_the_hub_user_of_the_role_that_created_the_run(
        team, monkeypatch, postgres_server):
    """Issue 41: ana's kernel names cy twice ($DURABLE_NB_USER and a $JUPYTERHUB_USER she
    set herself); her record says cy, but her journal, bo's and the service's read ana, the
    hub user of the role that created the run, and so does the panel (on e76e470 all said cy)."""
    from durable_nb.notebook.approval_view import approval_html

    database, journals = team
    monkeypatch.setenv("JUPYTERHUB_USER", "cy")
    pending = _park(journals["ana"], monkeypatch, "cy")
    with postgres_server.connect() as conn:  # what her kernel wrote
        written = conn.execute(f"SELECT record::json ->> 'started_by' FROM "
                               f"{database.schema}.runs WHERE run_id = 'r'").fetchone()[0]
    assert written == "cy"
    for who in ("ana", "bo", "service"):
        record = journals[who].get_run("r")
        assert (record.started_by, record.pending_approval["started_by"]) == ("ana", "ana")
        assert [r.started_by for r in journals[who].list_runs()] == ["ana"]
    assert "anyone but ana, who started the run (four-eyes)" in approval_html(pending, "r")


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


def _bo_parks(journals, monkeypatch, run_id: str, **approval) -> dict:
    """bo's kernel (his role) parks run ``run_id`` asking "deploy" with ``approval``."""
    monkeypatch.setenv("DURABLE_NB_USER", "bo")

    def agent(ctx):
        where = ctx.run("where", lambda: "prod")  # a step before it asks
        return "deployed" if ctx.approval("deploy", {"to": where}, **approval).approved \
            else "kept"

    assert dn.execute(run_id, agent, journal=journals["bo"], on_approval="park") is None
    return journals["bo"].get_run(run_id).pending_approval


def _one_line(exc: BaseException) -> str:
    (line,) = str(exc).splitlines()
    return line


def test_another_role_cannot_rewrite_someone_else_s_run_nor_vouch_for_it_by_a_copy(
        team, monkeypatch):
    """Review hole 2: ana's role could rewrite bo's run (clearing the approvers' list the
    service checks) or show a copy of his request in a run of her own without the list;
    with the hub's four-eyes off she then approved his run past his list."""
    database, journals = team
    config = HubConfig(roles=database.user_roles, four_eyes=False)
    pending = _bo_parks(journals, monkeypatch, "b", approvers=["cy"])
    record = journals["ana"].get_run("b")
    record.pending_approval = dict(pending, approvers=None, four_eyes=False)
    with pytest.raises(DatabaseError) as refused:
        journals["ana"].put_run(record)
    assert _one_line(refused.value).endswith(
        f"refused: run b was started by the role {database.user_roles['bo']}: only that role "
        f"and {database.service_role} (the durable-nb hub service) write or delete its record "
        f"and steps, not {database.user_roles['ana']}")
    assert journals["ana"].get_run("b").pending_approval["approvers"] == ["cy"]
    # Her own run showing his request without its list: the service reads his run's own.
    _park(journals["ana"], monkeypatch, "ana", "mine")
    mine = journals["ana"].get_run("mine")
    mine.pending_approval = dict(pending, run_id="b", approvers=None, four_eyes=False)
    journals["ana"].put_run(mine)
    with pytest.raises(dn.NotAllowedToDecide) as refused:
        decide_as(journals["service"], config, "mine", user="ana", approved=True, note=None,
                  via="hub inbox", request_id=pending["id"], digest=pending["digest"])
    assert "only cy may decide" in _one_line(refused.value), refused.value
    assert find_decision(journals["service"], "b", pending) is None
    assert [e["by"] for e in journals["service"].events("b") if e["kind"] == "refused"] \
        == ["ana"]


def test_her_role_cannot_claim_an_escalation_and_its_approvers_are_the_request_s_own(
        team, monkeypatch):
    """Review hole 1: any role could insert a request's escalation claim naming herself,
    and the escalation's approvers then decided."""
    database, journals = team
    config = HubConfig(roles=database.user_roles)
    pending = _bo_parks(journals, monkeypatch, "e", timeout=0.2, on_timeout="escalate",
                        escalate_to=["cy"])
    while time.time() <= pending["timeout_at"]:  # its first deadline passed
        time.sleep(0.05)
    claim = {"at": time.time(), "approvers": ["ana"], "timeout_at": time.time() + 3600,
             "digest": pending["digest"]}
    with pytest.raises(DatabaseError) as refused:
        journals["ana"].add_delivery("e", f"{pending['id']}/escalation", claim)
    assert _one_line(refused.value).endswith(
        f"refused: only the role {database.service_role} (the durable-nb hub service) sends "
        f"notifications, decision links and escalations in this journal, not "
        f"{database.user_roles['ana']}")
    # A claim the service made from a copy naming others still gives the request's own list.
    assert journals["service"].add_delivery("e", f"{pending['id']}/escalation", claim)
    with pytest.raises(dn.NotAllowedToDecide, match="only cy may decide"):
        decide_as(journals["service"], config, "e", user="ana", approved=True, note=None,
                  via="hub inbox", request_id=pending["id"], digest=pending["digest"])
    assert find_decision(journals["service"], "e", pending) is None


def test_a_run_whose_starter_the_database_does_not_know_is_refused_under_four_eyes(
        team, monkeypatch, postgres_server):
    """Review hole 3: the hub's four-eyes was skipped for a run whose creating role the
    database did not record (one from before the hub's roles): it fails closed now."""
    database, journals = team
    config = HubConfig(roles=database.user_roles)
    monkeypatch.setenv("DURABLE_NB_USER", "cy")  # what her kernel wrote
    assert dn.execute("old", _drop("staging", []), journal=journals["ana"],
                      on_approval="park") is None
    pending = journals["ana"].get_run("old").pending_approval
    s = database.schema
    with postgres_server.connect() as conn:  # as a row written before the hub's migration
        conn.execute(f"ALTER TABLE {s}.runs DISABLE TRIGGER runs_writer")
        conn.execute(f"UPDATE {s}.runs SET created_by = NULL, written_by = NULL")
        conn.execute(f"ALTER TABLE {s}.runs ENABLE TRIGGER runs_writer")
    with pytest.raises(RefusedByHub) as refused:
        decide_as(journals["service"], config, "old", user="ana", approved=True, note=None,
                  via="hub inbox", request_id=pending["id"], digest=pending["digest"])
    assert _one_line(refused.value) == (
        "run 'old': 'drop database' was not decided: the database does not know who started "
        "run 'old' (it predates the hub's roles), so four-eyes cannot be checked: the hub's "
        "administrator decides it. Nothing was written.")
    assert find_decision(journals["service"], "old", pending) is None
    (event,) = journals["service"].events("old")
    assert (event["kind"], event["by"]) == ("refused", "ana")


def test_her_role_cannot_write_a_deadline_s_rejection_the_service_applies_deadlines(
        team, monkeypatch):
    """Review hole 4: any role could reject any run "by timeout", at any time."""
    database, journals = team
    pending = _bo_parks(journals, monkeypatch, "t", timeout=3600)
    rejection = {"key": pending["key"], "digest": pending["digest"], "name": "deploy",
                 "approved": False, "note": "no decision", "by": "timeout", "via": "timeout",
                 "at": time.time()}
    with pytest.raises(DatabaseError) as refused:
        journals["ana"].add_request(f"decision.{pending['id']}", "t", rejection)
    assert _one_line(refused.value).endswith(
        f"refused: only the role {database.service_role} (the durable-nb hub service) writes "
        f"decisions in this journal, not {database.user_roles['ana']}: decide through the "
        f"service")
    assert find_decision(journals["service"], "t", pending) is None
    # Past its deadline, the service's sweep applies it (and no user's first sweep tries).
    from durable_nb.approvals.tick import tick
    short = _bo_parks(journals, monkeypatch, "t2", timeout=0.2)
    while time.time() <= short["timeout_at"]:
        time.sleep(0.05)
    assert tick(journals["service"]).applied == {"t2": "decided"}
    assert find_decision(journals["bo"], "t2", short)["by"] == "timeout"


def test_no_user_role_erases_a_decision_or_a_history(team, monkeypatch):
    """Review hole 5: DELETE by any user role erased undecided decisions and histories."""
    import psycopg

    database, journals = team
    config = HubConfig(roles=database.user_roles)
    pending = _bo_parks(journals, monkeypatch, "d")
    decide_as(journals["service"], config, "d", user="cy", approved=False, note=None,
              via="hub inbox", request_id=pending["id"], digest=pending["digest"])
    s = database.schema
    for who in ("ana", "bo"):  # bo, whose run it is, too: the decision is cy's
        with psycopg.connect(database.urls[who].split("?")[0], autocommit=True) as conn:
            for table in ("requests", "deliveries", "runs", "steps"):
                if who == "bo" and table in ("runs", "steps"):
                    continue  # his own run's rows: deleting them cascades to the above
                with pytest.raises(psycopg.Error) as refused:
                    conn.execute(f"DELETE FROM {s}.{table} WHERE run_id = 'd'")
                assert refused.value.sqlstate == "42501", (who, table)
    assert journals["service"].count_steps("d") == 1
    with pytest.raises(DatabaseError) as refused:
        dn.delete("d", journal=journals["bo"])
    assert "refused: only the role" in _one_line(refused.value)
    assert find_decision(journals["service"], "d", pending)["by"] == "cy"
    assert [e["kind"] for e in journals["service"].events("d")] == ["decided"]


def test_a_user_s_first_sweep_is_left_to_the_service(team, monkeypatch, caplog):
    """A kernel opening a hub's journal starts no sweep of its own: it used to try, and
    wrote deadlines' rejections of other people's runs; now it neither writes nor asks the
    service (a loopback receiver standing in for it hears nothing)."""
    import http.server
    import threading

    from durable_nb.notify.delivery import drain
    from durable_nb.notify.start import sweep_once_in_background

    database, journals = team
    pending = _bo_parks(journals, monkeypatch, "s", timeout=0.2)
    while time.time() <= pending["timeout_at"]:
        time.sleep(0.05)
    asked: list[str] = []

    class Receiver(http.server.BaseHTTPRequestHandler):
        def do_POST(self):
            asked.append(self.path)
            self.send_response(409)
            self.end_headers()

        def log_message(self, *args):
            pass

    receiver = http.server.HTTPServer(("127.0.0.1", 0), Receiver)
    threading.Thread(target=receiver.serve_forever, daemon=True).start()
    try:
        monkeypatch.setenv(SERVICE_VARIABLE, f"http://127.0.0.1:{receiver.server_port}/")
        monkeypatch.setenv(TOKEN_VARIABLE, "ana-token")
        caplog.set_level("DEBUG", logger="durable_nb")
        sweep_once_in_background(journals["ana"])
        assert drain(60)
    finally:
        receiver.shutdown()
        receiver.server_close()
    assert asked == []
    assert find_decision(journals["service"], "s", pending) is None
    assert journals["service"].events("s") == []
    assert not [r for r in caplog.records if r.levelname in ("WARNING", "ERROR")]


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


def test_a_link_viewed_by_someone_else_is_recorded_once_per_person(team, monkeypatch):
    """A non-recipient viewing a link again and again records one ``link_refused`` event
    (per link and person), not one per view: the history is bounded."""
    from durable_nb.approvals.links import issue_links
    from durable_nb.hub.links import link_decision
    from durable_nb.notify.config import LinksConfig

    database, journals = team
    config = HubConfig(roles=database.user_roles, emails={"bo": "bo@example.org"})
    pending = _park(journals["ana"], monkeypatch, "ana")
    service = journals["service"]
    ((_, url),), _ = issue_links(service, "r", pending, channel="email",
                                 recipients=["bo@example.org"],
                                 config=LinksConfig(base_url="https://hub.example.org/s/"),
                                 delivery="r/test")
    token = url.split("#", 1)[1]
    for user in ("ana", "ana", "ana", "cy", "cy"):
        outcome = link_decision(service, config, token, user=user, approved=None)
        assert (outcome.kind, outcome.status) == ("refused", 403)
    refused = [e for e in service.events("r") if e["kind"] == "link_refused"]
    assert [e["by"] for e in refused] == ["ana", "cy"]


def test_her_parked_run_is_notified_by_the_service_not_by_her_kernel(team, monkeypatch,
                                                                      caplog):
    """Her kernel used to send her run's request itself when it parked: the database
    refused the delivery's record and the refusal was printed in her cell. Now her kernel
    sends nothing and logs nothing; the service's sweep sends the request, once."""
    from durable_nb.notify.config import load_config
    from durable_nb.notify.delivery import drain
    from durable_nb.notify.loopback import WebhookReceiver
    from durable_nb.notify.sweeper import sweep_journal

    _, journals = team
    with WebhookReceiver() as hook:
        monkeypatch.setenv("DURABLE_NB_NOTIFY_WEBHOOK", hook.url)
        caplog.set_level("DEBUG", logger="durable_nb")
        _park(journals["ana"], monkeypatch, "ana", run_id="n")
        assert drain(60)
        assert hook.requests == []
        assert not [r for r in caplog.records if r.levelname in ("WARNING", "ERROR")]
        _, sent, _ = sweep_journal(journals["service"], load_config())
        assert list(sent) == ["n"]
        (request,) = hook.wait_for(1)
        assert request["json"]["run_id"] == "n"
        sweep_journal(journals["service"], load_config())
        assert drain(60) and len(hook.requests) == 1


def _step(key: str, **result) -> str:
    """A journal entry (its JSON) for an approval step at ``key`` with ``result``."""
    import json

    return json.dumps({"id": key, "n": "drop database", "k": "approval", "r": result})


def test_her_approval_step_must_repeat_the_decision_her_run_took_at_that_step(
        team, monkeypatch):
    """Review: the approval-step check matched digest, approved and by only, so a run's
    creator could journal bo's accept with other content (a message, edited arguments, a
    note) or at another step. The step's id is the decision's key; its content the
    decision's."""
    import psycopg

    from durable_nb.approvals.request import take_decision

    database, journals = team
    config = HubConfig(roles=database.user_roles)
    pending = _park(journals["ana"], monkeypatch, "ana")
    decision = decide_as(journals["service"], config, "r", user="bo", approved=True,
                         note="fine", via="hub inbox", request_id=pending["id"],
                         digest=pending["digest"])
    take_decision(journals["ana"], "r", pending, decision)
    same = {"approved": True, "note": "fine", "by": "bo", "at": 2.0,
            "digest": pending["digest"], "via": "hub inbox"}
    s = database.schema
    with psycopg.connect(database.urls["ana"].split("?")[0], autocommit=True) as conn:
        for position, entry in enumerate([
                _step(pending["key"], **dict(same, message="go ahead, drop prod too")),
                _step(pending["key"], **dict(same, args={"db": "prod"})),
                _step(pending["key"], **dict(same, note="bo said: also drop prod")),
                _step(pending["key"], **dict(same, answer={"db": "prod"})),
                _step(pending["key"] + "0", **same)], start=10):  # another step
            with pytest.raises(psycopg.Error) as refused:
                conn.execute(f"INSERT INTO {s}.steps VALUES ('r', %s, %s)", (position, entry))
            assert refused.value.sqlstate == "42501", entry
            assert "an approval step repeats a decision it wrote for this run and step" \
                in str(refused.value)
        # The decision as it was given, at its step: hers to journal (her run resuming).
        conn.execute(f"INSERT INTO {s}.steps VALUES ('r', 0, %s)",
                     (_step(pending["key"], **same),))


def test_only_the_run_s_creator_takes_a_decision_and_none_deletes_one_yet_re_run_works(
        team, monkeypatch):
    """Review: any role could stamp ``taken_at`` on a decision, after which the run's
    creator could delete a decision her run never took. Now only the creator takes one, no
    user role deletes one, and a re-run from a step (which clears a run's requests) keeps
    the decisions and asks anew."""
    database, journals = team
    config = HubConfig(roles=database.user_roles)
    pending = _bo_parks(journals, monkeypatch, "b")
    kind = f"decision.{pending['id']}"
    decision = decide_as(journals["service"], config, "b", user="cy", approved=False,
                         note="not today", via="hub inbox", request_id=pending["id"],
                         digest=pending["digest"])
    taken = dict(decision, taken_at=time.time())
    with pytest.raises(DatabaseError) as refused:
        journals["ana"].swap_request(kind, "b", decision, taken)
    assert "writes decisions in this journal, not " + database.user_roles["ana"] \
        in _one_line(refused.value)
    assert journals["bo"].swap_request(kind, "b", decision, taken)
    with pytest.raises(DatabaseError) as refused:
        journals["bo"].delete_request(kind, "b")
    assert _one_line(refused.value).endswith(
        f"refused: only the role {database.service_role} (the durable-nb hub service) "
        f"deletes a decision, not {database.user_roles['bo']}")
    assert find_decision(journals["service"], "b", pending)["by"] == "cy"
    # bo's run takes cy's rejection, then he re-runs it from the approval: it asks anew.
    assert dn.execute("b", lambda ctx: "kept" if not ctx.approval(
        "deploy", {"to": ctx.run("where", lambda: "prod")}).approved else "deployed",
        journal=journals["bo"], on_approval="park") == "kept"
    fork = dn.rerun_from("b", 1, journal=journals["bo"])
    assert dn.get_run(fork, journal=journals["bo"]).status is dn.Status.DONE
    assert dn.execute("b", lambda ctx: "kept" if not ctx.approval(
        "deploy", {"to": ctx.run("where", lambda: "prod")}).approved else "deployed",
        journal=journals["bo"], on_approval="park") is None
    again = journals["bo"].get_run("b").pending_approval
    assert again["id"] != pending["id"] and find_decision(journals["bo"], "b", again) is None
    assert journals["service"].get_request(kind, "b")["by"] == "cy"  # kept, not applied


def test_her_role_adds_to_a_history_only_her_refusals_stamped_with_her_role(
        team, monkeypatch):
    """Review: any role could add events of any kind to anyone's run history, e.g. a
    forged "decided by bo"."""
    database, journals = team
    _bo_parks(journals, monkeypatch, "h")
    with pytest.raises(DatabaseError) as refused:
        journals["ana"].add_event("h", {"kind": "decided", "by": "bo", "at": 1.0,
                                        "text": "approved by bo", "writer": "dnb_bo"})
    assert _one_line(refused.value).endswith(
        f"refused: {database.user_roles['ana']} adds to a run's history only the refusals "
        f"its processes meet, not an event of kind decided: the durable-nb hub service "
        f"({database.service_role}) records the rest")
    journals["ana"].add_event("h", {"kind": "refused", "by": "bo", "at": 1.0,
                                    "text": "refused", "writer": "dnb_bo"})
    import psycopg

    with psycopg.connect(database.urls["ana"].split("?")[0], autocommit=True) as conn:
        conn.execute(f"INSERT INTO {database.schema}.deliveries VALUES ('h', 'history/~', "
                     f"E'{{\"kind\": \"refused\", \"at\": 2.0, \"writer\": \"x\"}}\\n\\t ')")
    event, raw = journals["service"].events("h")
    assert (event["kind"], event["by"], event["writer"]) == \
        ("refused", "bo", database.user_roles["ana"])
    assert raw["writer"] == database.user_roles["ana"]
    from durable_nb.approvals.history import history_lines
    assert history_lines([event])[1].endswith(
        f"refused (written by database role {database.user_roles['ana']})")


def test_another_role_cannot_touch_a_run_s_stored_inputs_or_pending_requests(
        team, monkeypatch):
    """Review: ``blobs`` had no guard (another role could delete or replace a run's stored
    inputs), and any role could delete another run's pending requests (a cancel, say)."""
    import psycopg

    database, journals = team
    _bo_parks(journals, monkeypatch, "i")
    s = database.schema
    with psycopg.connect(database.urls["bo"].split("?")[0], autocommit=True) as conn:
        conn.execute(f"INSERT INTO {s}.blobs VALUES ('i', 'd1', 'his input')")
    journals["bo"].put_request("cancel", "i", {"at": 1.0})
    with psycopg.connect(database.urls["ana"].split("?")[0], autocommit=True) as conn:
        for statement in (f"DELETE FROM {s}.blobs WHERE run_id = 'i'",
                          f"UPDATE {s}.blobs SET value = 'hers' WHERE run_id = 'i'",
                          f"INSERT INTO {s}.blobs VALUES ('i', 'd2', 'hers')",
                          f"DELETE FROM {s}.requests WHERE run_id = 'i'"):
            with pytest.raises(psycopg.Error) as refused:
                conn.execute(statement)
            assert refused.value.sqlstate == "42501", statement
    assert journals["bo"].get_blob("i", "d1") == "his input"
    assert journals["bo"].get_request("cancel", "i") == {"at": 1.0}
    journals["bo"].delete_request("cancel", "i")  # his own
    assert journals["bo"].get_request("cancel", "i") is None


def test_her_role_pinned_search_path_cannot_shadow_what_the_checks_call(
        team, monkeypatch, postgres_server):
    """Review: no trigger function pinned ``search_path``, so a role with CREATE on some
    schema could shadow ``pg_has_role`` (or an operator) and pass every check."""
    import psycopg

    database, journals = team
    pending = _park(journals["ana"], monkeypatch, "ana")
    own = f"{database.schema}_ana"
    with postgres_server.connect() as conn:
        conn.execute(f"CREATE SCHEMA {own} AUTHORIZATION {database.user_roles['ana']}")
    s = database.schema
    with psycopg.connect(database.urls["ana"].split("?")[0], autocommit=True) as conn:
        conn.execute(f"CREATE FUNCTION {own}.pg_has_role(name, text, text) RETURNS boolean "
                     f"LANGUAGE sql AS 'SELECT true'")
        conn.execute(f"SET search_path = {own}, pg_catalog")
        with pytest.raises(psycopg.Error) as refused:
            conn.execute(f"INSERT INTO {s}.requests VALUES ('r', 'decision.{pending['id']}', "
                         f"'{{\"approved\": true, \"by\": \"bo\"}}')")
        assert refused.value.sqlstate == "42501"
    assert find_decision(journals["service"], "r", pending) is None


def test_her_approve_of_an_escalated_request_is_refused_in_one_line_not_a_database_error(
        team, monkeypatch):
    """Review: approving an escalated request from a user's own process wrote the
    escalation into the run's record (someone else's run: refused by the database, an
    uncaught DatabaseError). On a hub only the service writes it; her approve goes to the
    service (here none is reachable: the one-line refusal)."""
    database, journals = team
    pending = _bo_parks(journals, monkeypatch, "x", timeout=0.2, on_timeout="escalate",
                        escalate_to=["ana"])
    while time.time() <= pending["timeout_at"]:
        time.sleep(0.05)
    claim = {"at": time.time(), "approvers": ["ana"], "timeout_at": time.time() + 3600,
             "digest": pending["digest"]}
    assert journals["service"].add_delivery("x", f"{pending['id']}/escalation", claim)
    for who in ("ana", "bo"):
        monkeypatch.setenv("DURABLE_NB_USER", who)
        with pytest.raises(RefusedByHub) as refused:
            dn.approve("x", journal=journals[who])
        assert "only the durable-nb service" in _one_line(refused.value)
    assert "escalation" not in journals["service"].get_run("x").pending_approval
    assert find_decision(journals["service"], "x", pending) is None


def test_her_role_keeps_the_counts_by_status_every_reader_sees(team, monkeypatch,
                                                                 postgres_server):
    """Issue 42: the counts by status are a row her role cannot write; the trigger that keeps
    it (the schema owner's) counts her run as it parks and as she cancels it."""
    database, journals = team
    _park(journals["ana"], monkeypatch, "ana")
    assert {who: journals[who].count_runs() for who in journals} == {
        who: {dn.Status.WAITING_APPROVAL: 1} for who in journals}
    role = database.user_roles["ana"]
    with psycopg.connect(host="127.0.0.1", port=postgres_server.port, user=role,
                         password=f"pw-{role}", dbname=postgres_server.url.rsplit("/", 1)[1],
                         autocommit=True) as conn:
        with pytest.raises(psycopg.errors.InsufficientPrivilege):
            conn.execute(f"UPDATE {database.schema}.run_counts SET counts = '{{}}'")
    record = journals["ana"].get_run("r")
    record.status = dn.Status.CANCELLED
    journals["ana"].put_run(record)
    assert {who: journals[who].count_runs() for who in journals} == {
        who: {dn.Status.CANCELLED: 1} for who in journals}
