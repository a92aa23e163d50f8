"""LangGraph made durable (durable_nb.integrations.langgraph), with the real ``langgraph``,
``langchain``, ``langchain-openai`` and ``langchain-anthropic`` packages against the loopback
server over HTTP (OpenAI chat and Anthropic Messages). The crash tests are in
tests/test_langgraph_kernel.py (a real kernel SIGKILLed)."""

from __future__ import annotations

import operator
import subprocess
import sys
from typing import Annotated, Any, TypedDict

import httpx
import pytest

pytest.importorskip("langgraph")
pytest.importorskip("langchain_openai")

from langchain_anthropic import ChatAnthropic  # noqa: E402
from langchain_core.messages import AIMessage, HumanMessage  # noqa: E402
from langchain_core.tools import tool  # noqa: E402
from langchain_openai import ChatOpenAI  # noqa: E402
from langgraph.checkpoint.memory import InMemorySaver  # noqa: E402
from langgraph.func import entrypoint, task  # noqa: E402
from langgraph.graph import END, START, MessagesState, StateGraph  # noqa: E402
from langgraph.types import Command, interrupt  # noqa: E402

import durable_nb  # noqa: E402
from durable_nb import InputChanged, RunOptions, Status, approve, reject  # noqa: E402
from durable_nb.integrations.langgraph import ainvoke, astream, invoke, stream  # noqa: E402
from durable_nb.runner import Runner  # noqa: E402
from durable_nb.testing import LoopbackServer, Reply, ToolCall  # noqa: E402

MODEL = "loopback-1"
EMAIL = ToolCall("send_email", {"to": "team@example.com", "subject": "Q3"})


def chat_model(server: LoopbackServer, kind: str = "openai") -> Any:
    if kind == "anthropic":
        return ChatAnthropic(model="claude-loopback", base_url=server.url.removesuffix("/v1"),
                             api_key="x", max_retries=0)
    return ChatOpenAI(model=MODEL, base_url=server.url, api_key="x", max_retries=0)


def email_tool(effects: list) -> Any:
    @tool
    def send_email(to: str, subject: str) -> str:
        """Email someone."""
        effects.append(f"{to}: {subject}")
        return f"sent to {to}"

    return send_email


def execute(run_id: str, handler: Any, journal: Any, **options: Any) -> Any:
    return Runner(run_id, handler, journal=journal,
                  options=RunOptions(poll_interval=0.05, on_approval="park", **options)).run()


def steps(journal: Any, run_id: str) -> list[tuple[str, str, str]]:
    return [(e.key, e.kind, e.name) for e in journal.steps(run_id)]


# -- model and tool calls -----------------------------------------------------------------

@pytest.mark.parametrize("kind", ["openai", "anthropic"])
def test_a_react_agent_runs_each_round_and_tool_once_and_replays_without_calls(journal, kind):
    from langgraph.prebuilt import create_react_agent

    effects: list[str] = []
    with LoopbackServer([Reply(tool_calls=[EMAIL]), "I emailed the team."]) as server:
        agent = create_react_agent(chat_model(server, kind), [email_tool(effects)])

        def handler(ctx):
            out = invoke(ctx, agent, {"messages": [("user", "Email the team.")]})
            return out["messages"][-1].content

        runs = [execute("react", handler, journal) for _ in range(2)]
        stats = server.stats()
    assert [r.result for r in runs] == ["I emailed the team."] * 2
    assert stats["by_round"] == {"0": 1, "1": 1} and effects == ["team@example.com: Q3"]
    entries = list(journal.steps("react"))
    assert [(e.kind, e.name) for e in entries] == [
        ("model", entries[0].name), ("run", "send_email"), ("model", entries[0].name)]
    assert entries[0].key == "langgraph#0.agent_1#0.0"
    assert entries[0].prompt_tokens > 0 and entries[2].prompt_tokens > entries[0].prompt_tokens
    assert runs[0].record.iteration == 2


def test_create_agent_and_the_functional_api_are_journaled(journal):
    from langchain.agents import create_agent

    effects: list[str] = []
    script = [Reply(tool_calls=[EMAIL]), "Done.", "Summary."]
    with LoopbackServer(script) as server:
        model = chat_model(server)
        agent = create_agent(model, [email_tool(effects)])

        @task
        def summarize(messages: list) -> str:
            return model.invoke([*messages, HumanMessage("Summarize.")]).content

        @entrypoint()
        def workflow(request: str) -> str:
            out = agent.invoke({"messages": [("user", request)]})
            return summarize(out["messages"]).result()

        def handler(ctx):
            return invoke(ctx, workflow, "Email the team.")

        runs = [execute("flow", handler, journal) for _ in range(2)]
        stats = server.stats()
    assert [r.result for r in runs] == ["Summary."] * 2
    assert stats["chat"] == 3 and effects == ["team@example.com: Q3"]
    assert [kind for _, kind, _ in steps(journal, "flow")] == ["model", "run", "model", "model"]


class Report(TypedDict):
    topic: str
    drafts: Annotated[list[str], operator.add]


def two_calls_graph(model: Any) -> Any:
    """A node that makes two model calls in a row, and parallel nodes."""
    def write(state: Report) -> dict:
        first = model.invoke(f"Draft about {state['topic']}").content
        second = model.invoke(f"Improve: {first}").content
        return {"drafts": [first, second]}

    def left(state: Report) -> dict:
        return {"drafts": [model.invoke("left").content]}

    def right(state: Report) -> dict:
        return {"drafts": [model.invoke("right").content]}

    graph = StateGraph(Report)
    graph.add_node("write", write)
    graph.add_node("left", left)
    graph.add_node("right", right)
    graph.add_edge(START, "write")
    graph.add_edge("write", "left")
    graph.add_edge("write", "right")
    graph.add_edge("left", END)
    graph.add_edge("right", END)
    return graph.compile()


def test_parallel_nodes_on_threads_get_keys_of_their_own(journal):
    with LoopbackServer(["d1", "d2", "L", "R"]) as server:
        graph = two_calls_graph(chat_model(server))

        def handler(ctx):
            return invoke(ctx, graph, {"topic": "Q3", "drafts": []})["drafts"]

        runs = [execute("par", handler, journal) for _ in range(2)]
        stats = server.stats()
    assert stats["chat"] == 4
    assert runs[0].result == runs[1].result
    keys = sorted(key for key, _, _ in steps(journal, "par"))
    assert keys == ["langgraph#0.left_2#0.0", "langgraph#0.right_2#0.0",
                    "langgraph#0.write_1#0.0", "langgraph#0.write_1#0.1"]


def test_async_graph_and_astream_replay(journal):
    with LoopbackServer(["d1", "d2", "L", "R"] * 2) as server:
        graph = two_calls_graph(chat_model(server))

        async def handler(ctx):
            result = await ainvoke(ctx, graph, {"topic": "Q3", "drafts": []})
            chunks = [c async for c in astream(ctx, graph, {"topic": "Q3", "drafts": []},
                                               stream_mode="updates")]
            return [result["drafts"], len(chunks)]

        runs = [execute("async", handler, journal) for _ in range(2)]
        stats = server.stats()
    assert stats["chat"] == 8 and runs[0].result == runs[1].result
    assert runs[0].result[1] == 3


def test_stream_yields_langgraph_chunks(journal):
    with LoopbackServer(["d1", "d2", "L", "R"]) as server:
        graph = two_calls_graph(chat_model(server))

        def handler(ctx):
            # parallel nodes' updates arrive as they finish: their order is not the run's
            return sorted(name for c in stream(ctx, graph, {"topic": "Q3", "drafts": []},
                                               stream_mode="updates") for name in c)

        runs = [execute("stream", handler, journal) for _ in range(2)]
        stats = server.stats()
    assert runs[0].result == runs[1].result == ["left", "right", "write"]
    assert stats["chat"] == 4


def test_a_changed_prompt_is_input_changed_in_one_line(journal):
    with LoopbackServer(["d1", "d2", "L", "R"]) as server:
        graph = two_calls_graph(chat_model(server))
        topic = {"value": "Q3"}

        def handler(ctx):
            return invoke(ctx, graph, {"topic": topic["value"], "drafts": []})["drafts"]

        execute("changed", handler, journal)
        topic["value"] = "Q4"
        with pytest.raises(InputChanged, match="Draft about Q3.*Draft about Q4") as raised:
            execute("changed", handler, journal)
    assert "messages[0].content" in str(raised.value)


def test_a_changed_tool_list_is_input_changed(journal):
    from langgraph.prebuilt import create_react_agent

    @tool
    def lookup(city: str) -> str:
        """Look a city up."""
        return city

    with LoopbackServer(["Hello."]) as server:
        tools = [email_tool([])]

        def handler(ctx):
            agent = create_react_agent(chat_model(server), tools)
            return invoke(ctx, agent, {"messages": [("user", "hi")]})["messages"][-1].content

        execute("tools", handler, journal)
        tools.append(lookup)
        with pytest.raises(InputChanged, match="tools"):
            execute("tools", handler, journal)


# -- interrupts ----------------------------------------------------------------------------

def effect_then_interrupt_graph(model: Any, effects: list, checkpointer: Any = None) -> Any:
    """The caveat LangGraph documents: a side effect, then interrupt(), in one node."""
    send_email = email_tool(effects)

    def draft_and_ask(state: MessagesState) -> dict:
        draft = model.invoke(state["messages"])
        send_email.invoke({"to": "boss@example.com", "subject": "draft ready"})
        answer = interrupt({"draft": draft.content})
        verdict = "approved" if (answer is True or (isinstance(answer, dict) and answer.get(
            "approved"))) else "rejected"
        return {"messages": [draft, AIMessage(f"{verdict}: {answer}")]}

    graph = StateGraph(MessagesState)
    graph.add_node("draft_and_ask", draft_and_ask)
    graph.add_edge(START, "draft_and_ask")
    graph.add_edge("draft_and_ask", END)
    return graph.compile(checkpointer=checkpointer)


def _cli(*args: str, journal_dir: Any) -> str:
    """A decision from another process: the ``durable-nb`` command line."""
    return subprocess.run([sys.executable, "-m", "durable_nb.cli", *args, "--journal",
                           str(journal_dir)], capture_output=True, text=True, check=True,
                          timeout=60).stdout


@pytest.mark.parametrize("approved", [True, False])
def test_an_interrupt_parks_the_run_and_the_cli_decides_it(tmp_path, journal, approved):
    effects: list[str] = []
    with LoopbackServer(["The Q3 draft."]) as server:
        graph = effect_then_interrupt_graph(chat_model(server), effects)

        def handler(ctx):
            return invoke(ctx, graph, {"messages": [("user", "Draft Q3.")]})["messages"][-1].content

        parked = execute("ask", handler, journal)
        assert parked.record.status is Status.WAITING_APPROVAL
        pending = parked.record.pending_approval
        assert (pending["name"], pending["details"]) == (
            "draft_and_ask", {"node": "draft_and_ask", "interrupt": {"draft": "The Q3 draft."}})
        if approved:
            _cli("approve", "ask", journal_dir=tmp_path / "journal")
        else:
            _cli("reject", "ask", "--message", "too long", journal_dir=tmp_path / "journal")
        done = execute("ask", handler, journal)
        again = execute("ask", handler, journal)
        stats = server.stats()
    expected = ("approved: {'approved': True}" if approved else
                "rejected: {'approved': False, 'message': 'too long'}")
    assert done.record.status is Status.DONE and done.result == expected
    assert again.result == expected and again.record.pending_approval is None
    assert stats["chat"] == 1 and effects == ["boss@example.com: draft ready"]
    assert [kind for _, kind, _ in steps(journal, "ask")] == ["model", "run", "approval"]


def test_a_side_effect_before_interrupt_happens_once_where_plain_langgraph_does_it_twice(
        journal):
    """The caveat gone: the same node, resumed with a decision in the same process, under
    LangGraph's own checkpointer (the effect twice) and under durable_nb (once)."""
    plain: list[str] = []
    durable: list[str] = []
    with LoopbackServer(["The Q3 draft."] * 3) as server:
        graph = effect_then_interrupt_graph(chat_model(server), plain, InMemorySaver())
        config = {"configurable": {"thread_id": "plain"}}
        graph.invoke({"messages": [("user", "Draft Q3.")]}, config)
        graph.invoke(Command(resume=True), config)
        plain_requests = server.stats()["chat"]

        durable_graph = effect_then_interrupt_graph(chat_model(server), durable)

        def handler(ctx):
            out = invoke(ctx, durable_graph, {"messages": [("user", "Draft Q3.")]})
            return out["messages"][-1].content

        parked = execute("caveat", handler, journal)
        assert parked.record.status is Status.WAITING_APPROVAL
        approve("caveat", journal=journal)
        execute("caveat", handler, journal)
        durable_requests = server.stats()["chat"] - plain_requests
    assert plain == ["boss@example.com: draft ready"] * 2 and plain_requests == 2
    assert durable == ["boss@example.com: draft ready"] and durable_requests == 1


def test_several_interrupts_in_one_superstep_are_several_requests(journal):
    class State(TypedDict):
        answers: Annotated[list[str], operator.add]

    def asker(name: str) -> Any:
        def node(state: State) -> dict:
            return {"answers": [f"{name}={interrupt({'ask': name})['approved']}"]}
        return node

    graph = StateGraph(State)
    for name in ("a", "b"):
        graph.add_node(name, asker(name))
        graph.add_edge(START, name)
        graph.add_edge(name, END)
    compiled = graph.compile()

    def handler(ctx):
        return sorted(invoke(ctx, compiled, {"answers": []})["answers"])

    first = execute("two", handler, journal)
    assert first.record.pending_approval["details"] == {"node": "a", "interrupt": {"ask": "a"}}
    approve("two", journal=journal)
    second = execute("two", handler, journal)
    assert second.record.pending_approval["details"] == {"node": "b", "interrupt": {"ask": "b"}}
    reject("two", journal=journal)
    done = execute("two", handler, journal)
    assert done.record.status is Status.DONE and done.result == ["a=True", "b=False"]


@pytest.mark.parametrize("decision", ["approve", "edit", "reject"])
def test_create_agent_human_in_the_loop_gets_the_decision(journal, decision):
    from langchain.agents import create_agent
    from langchain.agents.middleware import HumanInTheLoopMiddleware

    effects: list[str] = []
    with LoopbackServer([Reply(tool_calls=[EMAIL]), "Handled."]) as server:
        agent = create_agent(chat_model(server), [email_tool(effects)], middleware=[
            HumanInTheLoopMiddleware(interrupt_on={"send_email": True})])

        def handler(ctx):
            return invoke(ctx, agent, {"messages": [("user", "Email the team.")]}
                          )["messages"][-1].content

        parked = execute("hitl", handler, journal)
        pending = parked.record.pending_approval
        assert (pending["name"], pending["details"]["arguments"]) == (
            "send_email", {"to": "team@example.com", "subject": "Q3"})
        if decision == "approve":
            approve("hitl", journal=journal)
        elif decision == "edit":
            approve("hitl", args={"to": "ceo@example.com", "subject": "Q3"}, journal=journal)
        else:
            reject("hitl", message="Not today.", journal=journal)
        done = execute("hitl", handler, journal)
        told = server.requests[-1]["messages"][-1]
    assert done.record.status is Status.DONE and done.result == "Handled."
    assert effects == {"approve": ["team@example.com: Q3"], "edit": ["ceo@example.com: Q3"],
                       "reject": []}[decision]
    assert told["role"] == "tool"
    if decision == "reject":
        assert "Not today." in told["content"]


@pytest.mark.parametrize("decision,expected", [
    ("accept", {"type": "accept", "args": None}),
    ("edit", {"type": "edit", "args": {"action": "send_email", "args": {"to": "ana"}}}),
    ("respond", {"type": "response", "args": "Use the other list."}),
    ("ignore", {"type": "ignore", "args": None})])
def test_the_agent_inbox_schema_gets_accept_edit_respond_ignore(journal, decision, expected):
    def ask(state: MessagesState) -> dict:
        response = interrupt([{
            "action_request": {"action": "send_email", "args": {"to": "team"}},
            "config": {"allow_ignore": True, "allow_respond": True, "allow_edit": True,
                       "allow_accept": True},
            "description": "Send it?"}])[0]
        return {"messages": [AIMessage(repr(response))]}

    graph = StateGraph(MessagesState)
    graph.add_node("ask", ask)
    graph.add_edge(START, "ask")
    compiled = graph.compile()

    def handler(ctx):
        return invoke(ctx, compiled, {"messages": []})["messages"][-1].content

    parked = execute("inbox", handler, journal)
    assert parked.record.pending_approval["details"] == {
        "tool": "send_email", "arguments": {"to": "team"}, "description": "Send it?"}
    if decision == "accept":
        approve("inbox", journal=journal)
    elif decision == "edit":
        approve("inbox", args={"to": "ana"}, journal=journal)
    elif decision == "respond":
        reject("inbox", message="Use the other list.", journal=journal)
    else:
        reject("inbox", journal=journal)
    assert execute("inbox", handler, journal).result == repr(expected)


def approval_tool(effects: list) -> Any:
    """The human-in-the-loop pattern LangGraph documents most: interrupt() inside the tool,
    before its side effect."""
    @tool
    def send_email(to: str, subject: str) -> str:
        """Email someone, once a person approves."""
        answer = interrupt({"to": to, "subject": subject})
        if not answer["approved"]:
            return f"not sent: {answer.get('message', 'rejected')}"
        effects.append(f"{to}: {subject}")
        return f"sent to {to}"

    return send_email


@pytest.mark.parametrize("approved", [True, False])
def test_an_interrupt_inside_a_react_agents_tool_is_decided_from_the_cli(tmp_path, journal,
                                                                       approved):
    """Parked in the tool, decided in another process, resumed: the effect once (none when
    rejected), and the run replays purely (the suite's always-replay check, which failed
    with ReplayDiverged when the resumed tool took another key than the replay asks for)."""
    from langgraph.prebuilt import create_react_agent

    effects: list[str] = []
    with LoopbackServer([Reply(tool_calls=[EMAIL]), "Handled."]) as server:
        agent = create_react_agent(chat_model(server), [approval_tool(effects)])

        def handler(ctx):
            return invoke(ctx, agent, {"messages": [("user", "Email the team.")]}
                          )["messages"][-1].content

        parked = execute("tool-ask", handler, journal)
        assert parked.record.status is Status.WAITING_APPROVAL and effects == []
        assert parked.record.pending_approval["details"] == {
            "node": "tools", "interrupt": {"to": "team@example.com", "subject": "Q3"}}
        if approved:
            _cli("approve", "tool-ask", journal_dir=tmp_path / "journal")
        else:
            _cli("reject", "tool-ask", "--message", "not today",
                 journal_dir=tmp_path / "journal")
        done = execute("tool-ask", handler, journal)
        again = execute("tool-ask", handler, journal)
        told = server.requests[-1]["messages"][-1]
        stats = server.stats()
    assert done.record.status is Status.DONE and done.result == again.result == "Handled."
    assert stats["chat"] == 2
    assert effects == (["team@example.com: Q3"] if approved else [])
    assert told["role"] == "tool" and told["content"] == (
        "sent to team@example.com" if approved else "not sent: not today")
    # The stop at interrupt() is journaled, so that a replay stops there too.
    assert [kind for _, kind, _ in steps(journal, "tool-ask")] == [
        "model", "run", "approval", "run", "model"]



def test_an_interrupt_inside_an_async_tool_parks_and_its_effect_happens_once(journal):
    from langgraph.prebuilt import create_react_agent

    effects: list[str] = []

    @tool
    async def send_email(to: str, subject: str) -> str:
        """Email someone, once a person approves."""
        if not interrupt({"to": to})["approved"]:
            return "not sent"
        effects.append(f"{to}: {subject}")
        return f"sent to {to}"

    with LoopbackServer([Reply(tool_calls=[EMAIL]), "Handled."]) as server:
        async def handler(ctx):
            # Each execution runs on an event loop of its own: a client of its own too.
            async with httpx.AsyncClient() as client:
                model = ChatOpenAI(model=MODEL, base_url=server.url, api_key="x",
                                   max_retries=0, http_async_client=client)
                agent = create_react_agent(model, [send_email])
                out = await ainvoke(ctx, agent, {"messages": [("user", "Email the team.")]})
            return out["messages"][-1].content

        parked = execute("async-tool-ask", handler, journal)
        assert parked.record.status is Status.WAITING_APPROVAL and effects == []
        approve("async-tool-ask", journal=journal)
        done = execute("async-tool-ask", handler, journal)
    assert done.record.status is Status.DONE and done.result == "Handled."
    assert effects == ["team@example.com: Q3"]

def test_an_agent_inbox_interrupt_inside_a_tool_resumes_with_the_edited_arguments(journal):
    from langgraph.prebuilt import create_react_agent

    effects: list[str] = []

    @tool
    def send_email(to: str, subject: str) -> str:
        """Email someone, as a person reviewing it in an agent inbox decides."""
        response = interrupt([{
            "action_request": {"action": "send_email", "args": {"to": to, "subject": subject}},
            "config": {"allow_ignore": True, "allow_respond": True, "allow_edit": True,
                       "allow_accept": True},
            "description": "Send it?"}])[0]
        if response["type"] == "edit":
            to, subject = response["args"]["args"]["to"], response["args"]["args"]["subject"]
        elif response["type"] != "accept":
            return f"not sent: {response['type']}"
        effects.append(f"{to}: {subject}")
        return f"sent to {to}"

    with LoopbackServer([Reply(tool_calls=[EMAIL]), "Handled."]) as server:
        agent = create_react_agent(chat_model(server), [send_email])

        def handler(ctx):
            return invoke(ctx, agent, {"messages": [("user", "Email the team.")]}
                          )["messages"][-1].content

        parked = execute("tool-inbox", handler, journal)
        assert parked.record.pending_approval["details"] == {
            "tool": "send_email", "arguments": {"to": "team@example.com", "subject": "Q3"},
            "description": "Send it?"}
        approve("tool-inbox", args={"to": "ceo@example.com", "subject": "Q3"}, journal=journal)
        done = execute("tool-inbox", handler, journal)
        told = server.requests[-1]["messages"][-1]
    assert done.record.status is Status.DONE and done.result == "Handled."
    assert effects == ["ceo@example.com: Q3"] and told["content"] == "sent to ceo@example.com"


def test_on_change_rerun_goes_on_from_the_changed_model_call(journal):
    with LoopbackServer(["d1", "d2", "L", "R", "e1", "e2", "L2", "R2"]) as server:
        graph = two_calls_graph(chat_model(server))
        topic = {"value": "Q3"}

        def handler(ctx):
            return invoke(ctx, graph, {"topic": topic["value"], "drafts": []})["drafts"]

        execute("fork", handler, journal)
        topic["value"] = "Q4"
        rerun = execute("fork", handler, journal, on_change="rerun")
        asked = [r["messages"][0]["content"] for r in server.requests]
    assert rerun.record.status is Status.DONE
    assert asked[:4].count("Draft about Q3") == 1 and asked[4:].count("Draft about Q4") == 1
    assert len(asked) == 8


def test_traces_show_model_calls_as_chat_spans_and_tools_as_tool_spans(journal, monkeypatch):
    pytest.importorskip("opentelemetry.sdk")
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    from durable_nb import telemetry

    from langgraph.prebuilt import create_react_agent

    monkeypatch.setattr(telemetry, "_state", None)
    exporter, provider = InMemorySpanExporter(), TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    durable_nb.tracing(provider)
    try:
        with LoopbackServer([Reply(tool_calls=[EMAIL]), "I emailed the team."]) as server:
            agent = create_react_agent(chat_model(server), [email_tool([])])

            def handler(ctx):
                return invoke(ctx, agent, {"messages": [("user", "Email the team.")]}
                              )["messages"][-1].content

            execute("traced", handler, journal, title="emailer")
    finally:
        provider.shutdown()
    spans = exporter.get_finished_spans()
    assert [s.name for s in spans] == ["chat loopback-1", "execute_tool send_email",
                                       "chat loopback-1", "invoke_agent emailer"]
    first, tool_span = spans[:2]
    assert tuple(first.attributes["gen_ai.response.finish_reasons"]) == ("tool_calls",)
    assert first.attributes["gen_ai.usage.input_tokens"] > 0
    assert tool_span.attributes["gen_ai.tool.call.id"] == "call_0_0"


def test_a_graph_run_with_its_own_invoke_inside_a_run_is_refused_saying_what_to_call(journal):
    with LoopbackServer(["d1", "d2", "L", "R"]) as server:
        graph = two_calls_graph(chat_model(server))

        def handler(ctx):
            return graph.invoke({"topic": "Q3", "drafts": []})["drafts"]

        with pytest.raises(durable_nb.NotJournaled, match=r"langgraph\.invoke\(ctx, graph"):
            execute("own-invoke", handler, journal)
        assert server.stats()["chat"] == 0


def test_stream_mode_messages_yields_the_reply_live_and_on_replay(journal):
    with LoopbackServer(["d1", "d2", "L", "R"]) as server:
        graph = two_calls_graph(chat_model(server))

        def handler(ctx):
            texts = [message.content for message, meta in stream(
                ctx, graph, {"topic": "Q3", "drafts": []}, stream_mode="messages")
                if meta["langgraph_node"] == "write" and message.content]
            return "".join(texts)

        runs = [execute("messages", handler, journal) for _ in range(2)]
    # each call is a conversation's first round: the script's first reply, twice
    assert runs[0].result == runs[1].result == "d1d1"


@pytest.mark.postgres
def test_on_a_postgresql_journal_the_interrupt_is_decided_from_the_cli(postgres_server):
    import uuid

    from langchain.agents import create_agent
    from langchain.agents.middleware import HumanInTheLoopMiddleware

    url = f"{postgres_server.url}?schema=langgraph_{uuid.uuid4().hex[:10]}"
    journal = durable_nb.open_journal(url)
    effects: list[str] = []
    with LoopbackServer([Reply(tool_calls=[EMAIL]), "Handled."]) as server:
        agent = create_agent(chat_model(server), [email_tool(effects)], middleware=[
            HumanInTheLoopMiddleware(interrupt_on={"send_email": True})])

        def handler(ctx):
            return invoke(ctx, agent, {"messages": [("user", "Email the team.")]}
                          )["messages"][-1].content

        assert execute("pg", handler, journal).record.status is Status.WAITING_APPROVAL
        _cli("approve", "pg", "--args", '{"to": "ceo@example.com", "subject": "Q3"}',
             journal_dir=url)
        done = execute("pg", handler, journal)
        again = execute("pg", handler, journal)
        stats = server.stats()
    assert done.result == again.result == "Handled."
    assert effects == ["ceo@example.com: Q3"] and stats["chat"] == 2


def test_a_renamed_node_is_refused_before_anything_is_called_again(journal):
    with LoopbackServer(["d1", "d2", "L", "R"]) as server:
        model = chat_model(server)
        names = {"node": "write"}

        def handler(ctx):
            def write(state: MessagesState) -> dict:
                return {"messages": [model.invoke(state["messages"])]}

            graph = StateGraph(MessagesState)
            graph.add_node(names["node"], write)
            graph.add_edge(START, names["node"])
            return invoke(ctx, graph.compile(), {"messages": [("user", "hi")]}
                          )["messages"][-1].content

        execute("renamed", handler, journal)
        names["node"] = "draft"
        with pytest.raises(durable_nb.JournalMismatch, match="write_1"):
            execute("renamed", handler, journal)
        assert server.stats()["chat"] == 1


def test_an_interrupt_in_a_subgraph_parks_and_its_node_calls_once(journal):
    effects: list[str] = []
    with LoopbackServer(["The Q3 draft."]) as server:
        inner = effect_then_interrupt_graph(chat_model(server), effects)
        outer = StateGraph(MessagesState)
        outer.add_node("review", inner)
        outer.add_edge(START, "review")
        compiled = outer.compile()

        def handler(ctx):
            return invoke(ctx, compiled, {"messages": [("user", "Draft Q3.")]}
                          )["messages"][-1].content

        parked = execute("sub", handler, journal)
        assert parked.record.pending_approval["details"]["interrupt"] == {
            "draft": "The Q3 draft."}
        approve("sub", journal=journal)
        done = execute("sub", handler, journal)
        stats = server.stats()
    assert done.result == "approved: {'approved': True}"
    assert stats["chat"] == 1 and effects == ["boss@example.com: draft ready"]
    assert [k for k, kind, _ in steps(journal, "sub") if kind == "model"] == [
        "langgraph#0.review_draft_and_ask_1#0.0"]


def test_an_interrupt_with_a_response_schema_is_refused_before_anyone_is_asked(journal):
    def ask(state: MessagesState) -> dict:
        answer = interrupt("How many?", response_schema={"type": "integer"})
        return {"messages": [AIMessage(str(answer))]}

    graph = StateGraph(MessagesState)
    graph.add_node("ask", ask)
    graph.add_edge(START, "ask")
    compiled = graph.compile()

    def handler(ctx):
        return invoke(ctx, compiled, {"messages": []})["messages"][-1].content

    with pytest.raises(durable_nb.NotJournaled, match="response_schema"):
        execute("schema", handler, journal)
    assert journal.find_run("schema").pending_approval is None


def test_a_failed_model_call_is_not_journaled_and_is_made_again_when_the_run_goes_on(journal):
    with LoopbackServer(["d1", "d2", "L", "R"]) as server:
        graph = two_calls_graph(chat_model(server))

        def handler(ctx):
            return invoke(ctx, graph, {"topic": "Q3", "drafts": []})["drafts"]

        server.fail_next(1, status=503)
        with pytest.raises(Exception, match="503|Service|server"):
            execute("failed", handler, journal)
        assert list(journal.steps("failed")) == []
        done = execute("failed", handler, journal)
        stats = server.stats()
    assert done.record.status is Status.DONE and len(done.result) == 4
    assert stats["chat"] == 4 and stats["failures"] == 1


def test_a_second_invoke_on_the_thread_goes_on_from_the_first_conversation(journal):
    from langgraph.prebuilt import create_react_agent

    with LoopbackServer(["Hello, Ana.", "Your name is Ana."]) as server:
        agent = create_react_agent(chat_model(server), [])

        def handler(ctx):
            invoke(ctx, agent, {"messages": [("user", "I am Ana.")]})
            out = invoke(ctx, agent, {"messages": [("user", "What is my name?")]})
            return [m.content for m in out["messages"]]

        runs = [execute("chat", handler, journal) for _ in range(2)]
        stats = server.stats()
    assert runs[0].result == runs[1].result == [
        "I am Ana.", "Hello, Ana.", "What is my name?", "Your name is Ana."]
    assert stats["by_round"] == {"0": 1, "1": 1}
