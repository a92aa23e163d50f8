"""LangGraph's own state on a durable_nb journal: JournalCheckpointer with the real
``langgraph`` (a compiled ``StateGraph``), on a real diskcache journal and a real PostgreSQL
server (tests/postgres.py). Every test taking ``journal_at`` runs on both.

What is checked: LangGraph's own checkpointer conformance suite (``langgraph-checkpoint-
conformance``, every capability); get_state, get_state_history, update_state, interrupts and
time travel through a graph, sync and async; the history surviving a process SIGKILLed mid-graph;
a checkpoint naming a module loaded as data, never imported; pickles refused; secrets in the
config kept out of the journal; a fork from a checkpoint becoming a durable_nb fork.
"""

from __future__ import annotations

import asyncio
import base64
import json
import operator
import os
import pickle
import signal
import subprocess
import sys
import uuid
from pathlib import Path
from typing import Annotated, Any, TypedDict

import pytest

pytest.importorskip("langgraph")

import ormsgpack  # noqa: E402
from langgraph.checkpoint.memory import InMemorySaver  # noqa: E402
from langgraph.checkpoint.serde.jsonplus import JsonPlusSerializer  # noqa: E402
from langgraph.graph import END, START, StateGraph  # noqa: E402
from langgraph.types import Command, interrupt  # noqa: E402

import durable_nb as dn  # noqa: E402
from durable_nb.errors import CorruptEntry, JournalError  # noqa: E402
from durable_nb.integrations.langgraph.checkpoint import (  # noqa: E402
    SPACE,
    JournalCheckpointer,
    checkpoint_position,
    fork_from_checkpoint,
)
from durable_nb.journal import DiskJournal, PostgresJournal  # noqa: E402

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(params=["disk", pytest.param("postgres", marks=pytest.mark.postgres)])
def journal_at(request: pytest.FixtureRequest, tmp_path: Path):
    """Where a journal is: a fresh directory, or a fresh schema of the session's server."""
    if request.param == "disk":
        yield str(tmp_path / "journal")
        return
    server = request.getfixturevalue("postgres_server")
    schema = f"lg_{uuid.uuid4().hex[:12]}"
    yield f"{server.url}?schema={schema}"
    with server.connect() as conn:
        conn.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')


@pytest.fixture
def journal(journal_at: str):
    opened = PostgresJournal(journal_at) if journal_at.startswith("postgresql") \
        else DiskJournal(journal_at)
    yield opened
    if isinstance(opened, PostgresJournal):
        opened.dispose()
    else:
        opened.close()


class Notes(TypedDict):
    log: Annotated[list[str], operator.add]


def _graph(saver: Any, **nodes: Any):
    """a -> b -> c, each node adding its name to ``log`` (or what ``nodes`` gives)."""
    builder = StateGraph(Notes)
    names = ["a", "b", "c"]
    for name in names:
        builder.add_node(name, nodes.get(name, lambda s, name=name: {"log": [name]}))
    builder.add_edge(START, "a")
    builder.add_edge("a", "b")
    builder.add_edge("b", "c")
    builder.add_edge("c", END)
    return builder.compile(checkpointer=saver)


# --- LangGraph's own conformance suite --------------------------------------------------------

def test_langgraphs_checkpointer_conformance_suite_passes_every_capability(journal):
    from langgraph.checkpoint.conformance import checkpointer_test, validate

    @checkpointer_test(name=f"JournalCheckpointer on {type(journal).__name__}")
    async def factory():
        yield JournalCheckpointer(journal)

    report = asyncio.run(validate(factory))
    results = {name: (r.passed, r.failures) for name, r in report.results.items()}
    assert results == {name: (True, []) for name in
                       ("put", "put_writes", "get_tuple", "list", "delete_thread",
                        "delete_for_runs", "copy_thread", "prune")}


# --- a real graph -------------------------------------------------------------------------------

def test_a_graphs_state_and_history_are_read_back_from_the_journal(journal):
    graph = _graph(JournalCheckpointer(journal))
    config = {"configurable": {"thread_id": "t1"}}
    assert graph.invoke({"log": ["start"]}, config) == {"log": ["start", "a", "b", "c"]}
    # A new checkpointer on the same journal (another process would see the same).
    reader = _graph(JournalCheckpointer(journal))
    state = reader.get_state(config)
    assert state.values == {"log": ["start", "a", "b", "c"]} and state.next == ()
    history = list(reader.get_state_history(config))
    assert [s.values.get("log") for s in history] == [
        ["start", "a", "b", "c"], ["start", "a", "b"], ["start", "a"], ["start"], []]
    assert [s.metadata["step"] for s in history] == [3, 2, 1, 0, -1]
    assert [s.metadata["source"] for s in history] == ["loop"] * 4 + ["input"]
    # As LangGraph's own in-memory saver gives it.
    memory = _graph(InMemorySaver())
    memory.invoke({"log": ["start"]}, config)
    assert [(s.values, s.next, s.metadata["step"]) for s in memory.get_state_history(config)] \
        == [(s.values, s.next, s.metadata["step"]) for s in history]
    assert all(s.parent_config["configurable"]["checkpoint_id"] ==
               history[i + 1].config["configurable"]["checkpoint_id"]
               for i, s in enumerate(history[:-1]))


def test_update_state_and_time_travel_from_an_earlier_checkpoint(journal):
    graph = _graph(JournalCheckpointer(journal))
    config = {"configurable": {"thread_id": "t2"}}
    graph.invoke({"log": []}, config)
    after_a = next(s for s in graph.get_state_history(config) if s.next == ("b",))
    # Time travel: go on from after a, with the state changed as a person would.
    forked = graph.update_state(after_a.config, {"log": ["edited"]})
    assert graph.invoke(None, forked) == {"log": ["a", "edited", "b", "c"]}
    assert graph.get_state(config).values == {"log": ["a", "edited", "b", "c"]}
    logs = [s.values.get("log") for s in graph.get_state_history(config)]
    assert ["a", "b", "c"] in logs  # the first branch is still in the history
    # Replaying from a checkpoint as it was (no update) runs b and c again from there.
    assert graph.invoke(None, after_a.config) == {"log": ["a", "b", "c"]}


def test_an_interrupt_is_resumed_from_the_journal_by_another_checkpointer(journal):
    def ask(state: Notes) -> dict:
        answer = interrupt({"question": "go on?"})
        return {"log": [f"answer:{answer}"]}

    config = {"configurable": {"thread_id": "t3"}}
    graph = _graph(JournalCheckpointer(journal), b=ask)
    result = graph.invoke({"log": []}, config)
    assert result["__interrupt__"][0].value == {"question": "go on?"}
    later = _graph(JournalCheckpointer(journal), b=ask)
    assert later.get_state(config).next == ("b",)
    assert later.get_state(config).tasks[0].interrupts[0].value == {"question": "go on?"}
    assert later.invoke(Command(resume="yes"), config) == {"log": ["a", "answer:yes", "c"]}


def test_async_graphs_use_the_async_methods(journal):
    graph = _graph(JournalCheckpointer(journal))
    config = {"configurable": {"thread_id": "t4"}}

    async def go() -> tuple[Any, list]:
        result = await graph.ainvoke({"log": []}, config)
        return result, [s async for s in graph.aget_state_history(config)]

    result, history = asyncio.run(go())
    assert result == {"log": ["a", "b", "c"]} and len(history) == 5
    assert graph.get_state(config).values == result


def test_a_checkpointer_for_a_run_uses_the_run_id_as_its_thread(journal):
    saver = JournalCheckpointer.for_run("report-1", journal)
    assert saver.config == {"configurable": {"thread_id": "report-1"}}
    graph = _graph(saver)
    graph.invoke({"log": []}, saver.config)
    assert journal.value_scopes(SPACE) == ["report-1"]  # the run's scope: its thread
    assert journal.scan_values(SPACE) == []
    latest = graph.get_state(saver.config).config["configurable"]["checkpoint_id"]
    assert checkpoint_position(journal, "report-1", latest) == 0  # no steps: no run yet


def test_a_config_without_a_thread_is_refused_with_what_to_pass(journal):
    with pytest.raises(ValueError, match="names no thread"):
        JournalCheckpointer(journal).get_tuple({"configurable": {"checkpoint_ns": ""}})
    with pytest.raises(ValueError, match="must not contain"):
        JournalCheckpointer(journal).get_tuple({"configurable": {"thread_id": "a\x1fb"}})


# --- a process killed mid-graph ---------------------------------------------------------------

_CHILD = """
import json, operator, sys, time
from typing import Annotated, TypedDict
from langgraph.graph import END, START, StateGraph
from durable_nb.integrations.langgraph.checkpoint import JournalCheckpointer

location, phase = sys.argv[1:3]

class Notes(TypedDict):
    log: Annotated[list[str], operator.add]

def b(state):
    if phase == "kill":
        print("inside b", flush=True)
        time.sleep(600)
    return {"log": ["b"]}

builder = StateGraph(Notes)
builder.add_node("a", lambda s: {"log": ["a"]})
builder.add_node("b", b)
builder.add_node("c", lambda s: {"log": ["c"]})
builder.add_edge(START, "a"); builder.add_edge("a", "b"); builder.add_edge("b", "c")
builder.add_edge("c", END)
graph = builder.compile(checkpointer=JournalCheckpointer(location))
config = {"configurable": {"thread_id": "killed"}}
if phase == "kill":
    graph.invoke({"log": ["start"]}, config, durability="sync")
elif phase == "read":
    state = graph.get_state(config)
    print(json.dumps({"next": list(state.next), "values": state.values,
                      "history": [s.metadata["step"] for s in graph.get_state_history(config)]}))
else:
    print(json.dumps(graph.invoke(None, config)))
"""


def _child(location: str, phase: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", _CHILD, location, phase], capture_output=True,
                          text=True, timeout=120, cwd=REPO)


def test_the_history_survives_a_process_killed_mid_graph_and_resumes_elsewhere(journal_at):
    child = subprocess.Popen([sys.executable, "-c", _CHILD, journal_at, "kill"], cwd=REPO,
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert child.stdout.readline() == "inside b\n", child.stderr.read()
        os.kill(child.pid, signal.SIGKILL)
        child.wait(timeout=30)
    finally:
        if child.poll() is None:
            child.kill()
    assert child.returncode == -signal.SIGKILL
    read = _child(journal_at, "read")
    assert read.returncode == 0, read.stderr
    assert json.loads(read.stdout) == {"next": ["b"], "values": {"log": ["start", "a"]},
                                       "history": [1, 0, -1]}
    resumed = _child(journal_at, "resume")
    assert resumed.returncode == 0, resumed.stderr
    assert json.loads(resumed.stdout) == {"log": ["start", "a", "b", "c"]}


# --- the journal is data, not code ------------------------------------------------------------

def _store_channel_value(journal, thread: str, typed: list[str]) -> JournalCheckpointer:
    """A one-channel checkpoint whose stored value is replaced by ``typed`` (as a person
    who can write the journal could)."""
    saver = JournalCheckpointer(journal)
    graph = _graph(saver)
    graph.invoke({"log": ["x"]}, {"configurable": {"thread_id": thread}})
    blobs = [key for key, _ in journal.scan_values(SPACE, "b\x1f", scope=thread)]
    journal.put_values(SPACE, {key: json.dumps(typed) for key in blobs}, scope=thread)
    return saver


def test_a_checkpoint_naming_a_module_is_loaded_as_data_and_never_imports_it(
        journal, tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    marker = tmp_path / "imported"
    (tmp_path / "dnb_probe_module.py").write_text(
        f"import pathlib\npathlib.Path({str(marker)!r}).write_text('ran')\n"
        f"def build(*args):\n    return 'built'\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    # msgpack's constructor extension: import dnb_probe_module, call build("payload").
    hostile = ormsgpack.packb(ormsgpack.Ext(1, ormsgpack.packb(
        ["dnb_probe_module", "build", ["payload"]])))
    saver = _store_channel_value(journal, "hostile",
                                 ["msgpack", base64.b64encode(hostile).decode()])
    config = {"configurable": {"thread_id": "hostile"}}
    loaded = saver.get_tuple(config).checkpoint["channel_values"]["log"]
    assert loaded == ["payload"]  # its data, as stored
    assert not marker.exists() and "dnb_probe_module" not in sys.modules
    # The same journal read with LangGraph's default serializer runs the module's code: the
    # record is a real attack, and the strict serializer is what stops it.
    permissive = JournalCheckpointer(journal, serde=JsonPlusSerializer())
    try:
        assert permissive.get_tuple(config).checkpoint["channel_values"]["log"] == "built"
        assert marker.read_text() == "ran"
    finally:
        sys.modules.pop("dnb_probe_module", None)


@pytest.mark.parametrize("kind, data", [
    ("pickle", pickle.dumps(["anything"])),
    # LangChain's JSON constructor form, which LangGraph's serializer revives by importing.
    ("json", json.dumps({"lc": 2, "type": "constructor", "id": ["os", "getcwd"]}).encode()),
])
def test_pickled_or_constructor_values_are_refused_not_loaded(journal, kind: str, data: bytes):
    saver = _store_channel_value(journal, kind, [kind, base64.b64encode(data).decode()])
    with pytest.raises(CorruptEntry, match=f"serialized as '{kind}'.*never loads"):
        saver.get_tuple({"configurable": {"thread_id": kind}})


# --- secrets ----------------------------------------------------------------------------------

def test_secrets_in_the_config_never_enter_the_journal(journal, journal_at):
    key = "sk-" + "A1b2C3d4" * 4
    url = "postgresql://agent:hunter2secret@db.example/prod"
    config = {"configurable": {"thread_id": "secret", "openai_api_key": key,
                               "auth_token": "tok-4f9a8b7c6d5e", "database": url,
                               "user": "ann"}}
    # LangGraph copies the config's entries into each checkpoint's metadata.
    memory = _graph(InMemorySaver())
    memory.invoke({"log": []}, config)
    assert memory.get_state(config).metadata["openai_api_key"] == key
    graph = _graph(JournalCheckpointer(journal))
    graph.invoke({"log": []}, config)
    stored = json.dumps(journal.scan_values(SPACE, scope="secret"))
    assert "user" in stored
    for secret in (key, "tok-4f9a8b7c6d5e", "hunter2secret"):
        assert secret not in stored
    metadata = graph.get_state(config).metadata
    assert metadata["user"] == "ann" and "openai_api_key" not in metadata
    assert metadata["database"] == "postgresql://agent:<redacted>@db.example/prod"


# --- a fork from a checkpoint is a durable_nb fork ---------------------------------------------

def _handler(journal: Any, effects: list[str]):
    """A run's handler invoking a -> b -> c, each node one journaled step (its effect noted
    in ``effects``), its checkpoints on the run's journal."""
    def node(ctx: Any, name: str):
        def run(state: Notes) -> dict:
            return {"log": [ctx.run(name, lambda: effects.append(name) or name)]}
        return run

    def handler(ctx: Any) -> list[str]:
        saver = JournalCheckpointer.for_run(ctx.run_id, journal)
        graph = _graph(saver, **{name: node(ctx, name) for name in "abc"})
        state = graph.get_state(saver.config)
        # The steps of the nodes the thread has done, asked again in their order (replayed:
        # their functions do not run), as the LangGraph integration's runner keeps a
        # graph's steps matching its journal; then the graph goes on from its checkpoint.
        for name in state.values.get("log", []):
            node(ctx, name)(state.values)
        start = None if state.next else {"log": []}
        return graph.invoke(start, saver.config, durability="sync")["log"]
    return handler


def test_a_fork_from_a_checkpoint_keeps_the_run_as_a_fork_and_goes_on_from_there(journal):
    effects: list[str] = []
    handler = _handler(journal, effects)
    assert dn.execute("lg", handler, journal=journal, verify_replay=False) == ["a", "b", "c"]
    saver = JournalCheckpointer.for_run("lg", journal)
    after_a = next(s for s in _graph(saver).get_state_history(saver.config)
                   if s.next == ("b",))
    checkpoint_id = after_a.config["configurable"]["checkpoint_id"]
    assert checkpoint_position(journal, "lg", checkpoint_id) == 1

    fork_id = fork_from_checkpoint("lg", checkpoint_id, journal=journal)
    assert fork_id == "lg@1"
    fork = journal.get_run(fork_id)
    assert fork.forked_from["run_id"] == "lg" and fork.forked_from["position"] == 1
    assert fork.forked_from["langgraph_checkpoint"] == checkpoint_id
    assert [e.name for e in journal.steps(fork_id)] == ["a", "b", "c"]
    assert [e.name for e in journal.steps("lg")] == ["a"]
    # The fork keeps the whole LangGraph history; the run's thread ends at the checkpoint.
    forked_saver = JournalCheckpointer(journal, thread_id=fork_id)
    assert _graph(forked_saver).get_state(forked_saver.config).values == {"log": ["a", "b", "c"]}
    assert _graph(saver).get_state(saver.config).config["configurable"]["checkpoint_id"] == \
        checkpoint_id

    assert dn.execute("lg", handler, journal=journal, verify_replay=False) == ["a", "b", "c"]
    assert effects == ["a", "b", "c", "b", "c"]  # a replayed, b and c executed again
    assert [e.name for e in journal.steps("lg")] == ["a", "b", "c"]
    assert [r.run_id for r in dn.runs(journal=journal)] == ["lg", "lg@1"]


def test_a_fork_from_the_last_checkpoint_keeps_every_step_and_reopens_the_run(journal):
    effects: list[str] = []
    dn.execute("end", _handler(journal, effects), journal=journal, verify_replay=False)
    saver = JournalCheckpointer.for_run("end", journal)
    latest = _graph(saver).get_state(saver.config).config["configurable"]["checkpoint_id"]
    assert checkpoint_position(journal, "end", latest) == 3
    assert fork_from_checkpoint("end", latest, journal=journal) == "end@1"
    assert [e.name for e in journal.steps("end")] == ["a", "b", "c"]
    assert journal.get_run("end@1").status is dn.Status.DONE
    assert journal.get_run("end").status is dn.Status.RUNNING


def test_a_fork_is_refused_while_the_run_executes(journal):
    from durable_nb.errors import RunLeased

    def handler(ctx: Any) -> None:
        saver = JournalCheckpointer.for_run(ctx.run_id, journal)
        graph = _graph(saver)
        graph.invoke({"log": []}, saver.config, durability="sync")
        latest = graph.get_state(saver.config).config["configurable"]["checkpoint_id"]
        with pytest.raises(RunLeased, match="then fork it from the checkpoint"):
            fork_from_checkpoint(ctx.run_id, latest, journal=journal)

    dn.execute("busy", handler, journal=journal, verify_replay=False)
    assert [r.run_id for r in dn.runs(journal=journal)] == ["busy"]
    assert journal.value_scopes(SPACE) == ["busy"]  # no thread copied either


def test_a_fork_needs_a_checkpoint_written_for_the_run(journal):
    dn.execute("plain", lambda ctx: ctx.run("x", lambda: 1), journal=journal)
    graph = _graph(JournalCheckpointer(journal, thread_id="plain"))
    graph.invoke({"log": []}, {"configurable": {"thread_id": "plain"}})
    first = list(graph.get_state_history({"configurable": {"thread_id": "plain"}}))[-1]
    with pytest.raises(JournalError, match="noted no step of run 'plain'"):
        fork_from_checkpoint("plain", first.config["configurable"]["checkpoint_id"],
                             journal=journal)
    with pytest.raises(JournalError, match="no LangGraph checkpoint 'nope'"):
        fork_from_checkpoint("plain", "nope", journal=journal)


# --- a run's thread is the run's ----------------------------------------------------------------

def _run_with_thread(journal: Any, run_id: str) -> None:
    """Run ``run_id`` (one journaled step) invoking a -> b -> c on the run's thread."""
    def handler(ctx: Any) -> str:
        ctx.run("start", lambda: "started")
        saver = JournalCheckpointer.for_run(ctx.run_id, journal)
        _graph(saver).invoke({"log": []}, saver.config, durability="sync")
        return "done"
    dn.execute(run_id, handler, journal=journal, verify_replay=False)


def _thread_log(journal: Any, thread: str) -> list[str] | None:
    saver = JournalCheckpointer(journal, thread_id=thread)
    return _graph(saver).get_state(saver.config).values.get("log")


def test_deleting_a_run_deletes_its_thread_and_no_other(journal):
    _run_with_thread(journal, "gone")
    _run_with_thread(journal, "gone-2")
    _graph(JournalCheckpointer(journal)).invoke({"log": []},
                                                {"configurable": {"thread_id": "free"}})
    assert journal.value_scopes(SPACE) == ["free", "gone", "gone-2"]
    dn.delete("gone", journal=journal)
    assert journal.value_scopes(SPACE) == ["free", "gone-2"]
    assert _thread_log(journal, "gone") is None
    assert _thread_log(journal, "gone-2") == _thread_log(journal, "free") == ["a", "b", "c"]


def test_copying_a_run_copies_its_thread_and_moving_it_moves_it(journal, tmp_path: Path):
    _run_with_thread(journal, "src")
    history = [s.config["configurable"]["checkpoint_id"] for s in _graph(
        JournalCheckpointer(journal)).get_state_history({"configurable": {"thread_id": "src"}})]
    dn.copy_run("src", journal, journal=journal, new_id="dst")
    copied = [s.config["configurable"]["checkpoint_id"] for s in _graph(
        JournalCheckpointer(journal)).get_state_history({"configurable": {"thread_id": "dst"}})]
    assert copied == history and len(history) == 5
    assert _thread_log(journal, "src") == _thread_log(journal, "dst") == ["a", "b", "c"]
    other = DiskJournal(str(tmp_path / "other"))
    try:
        dn.copy_run("src", other, journal=journal, move=True)
        assert _thread_log(other, "src") == ["a", "b", "c"]
        assert journal.value_scopes(SPACE) == ["dst"]
    finally:
        other.close()


def test_a_pure_replay_of_a_finished_run_writes_no_checkpoint(journal):
    invoked = []

    def handler(ctx: Any) -> str:
        ctx.run("start", lambda: "started")
        saver = JournalCheckpointer.for_run(ctx.run_id, journal)
        _graph(saver).invoke({"log": []}, saver.config, durability="sync")
        invoked.append(ctx.replaying)
        return "done"
    dn.execute("verified", handler, journal=journal, verify_replay=True)
    assert len(invoked) == 2  # the execution, then the pure replay of the DONE run
    config = {"configurable": {"thread_id": "verified"}}
    assert len(list(_graph(JournalCheckpointer(journal)).get_state_history(config))) == 5
    assert _thread_log(journal, "verified") == ["a", "b", "c"]


@pytest.mark.postgres
def test_a_hub_users_role_keeps_its_graphs_state_in_the_shared_journal(postgres_server):
    from tests.hub_roles import make_hub_database

    database = make_hub_database(postgres_server, users=("ana",))
    ana = database.journal("ana")
    try:
        graph = _graph(JournalCheckpointer(ana))
        config = {"configurable": {"thread_id": "ana-thread"}}
        graph.invoke({"log": []}, config)
        assert len(list(graph.get_state_history(config))) == 5
        JournalCheckpointer(ana).delete_thread("ana-thread")
        assert graph.get_state(config).values == {}
    finally:
        ana.dispose()


@pytest.mark.postgres
def test_on_a_hub_only_the_role_that_started_a_thread_writes_or_deletes_it(postgres_server):
    from durable_nb.errors import DatabaseError
    from tests.hub_roles import make_hub_database

    database = make_hub_database(postgres_server, users=("ana", "bo"))
    ana, bo, service = (database.journal(who) for who in ("ana", "bo", "service"))
    roles = database.user_roles
    try:
        _run_with_thread(ana, "ana-run")  # a run's thread: the run's creator's
        _graph(JournalCheckpointer(ana)).invoke({"log": []},
                                                {"configurable": {"thread_id": "ana-free"}})
        for thread, says in (("ana-run", f"run ana-run was started by the role {roles['ana']}"),
                             ("ana-free", f"the keyed values ana-free \\(a LangGraph thread\\) "
                                          f"were started by the role {roles['ana']}")):
            refused = f"{says}: only that role and {database.service_role} .* not {roles['bo']}"
            key, text = ana.scan_values(SPACE, scope=thread)[0]
            with pytest.raises(DatabaseError, match=refused):
                bo.put_values(SPACE, {key: '["null", ""]'}, scope=thread)  # overwrite
            saver = JournalCheckpointer(bo, thread_id=thread)
            with pytest.raises(DatabaseError, match=refused):
                _graph(saver).invoke({"log": ["bo"]}, saver.config)  # a checkpoint added
            with pytest.raises(DatabaseError, match=refused):
                saver.delete_thread(thread)
            assert _thread_log(bo, thread) == ["a", "b", "c"]  # read, as runs are
            assert ana.get_values(SPACE, [key], scope=thread) == {key: text}
        _graph(JournalCheckpointer(bo)).invoke({"log": []},
                                               {"configurable": {"thread_id": "bo-free"}})
        JournalCheckpointer(ana).delete_thread("ana-free")
        dn.delete("ana-run", journal=ana)
        assert ana.value_scopes(SPACE) == ["bo-free"]
        JournalCheckpointer(service).delete_thread("bo-free")  # the service writes every one
        assert ana.value_scopes(SPACE) == []
    finally:
        for opened in (ana, bo, service):
            opened.dispose()
