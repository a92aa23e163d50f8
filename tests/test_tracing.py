"""OpenTelemetry traces of runs (durable_nb.telemetry): the real SDK with its in-memory
exporter and metric reader, the real openai client against the loopback server. A replayed
step is never reported as a call."""

from __future__ import annotations

import http.server
import os
import socket
import subprocess
import sys
import threading

import openai
import pytest

pytest.importorskip("opentelemetry.sdk")

from opentelemetry.sdk.metrics import MeterProvider  # noqa: E402
from opentelemetry.sdk.metrics.export import InMemoryMetricReader  # noqa: E402
from opentelemetry.sdk.trace import TracerProvider  # noqa: E402
from opentelemetry.sdk.trace.export import SimpleSpanProcessor  # noqa: E402
from opentelemetry.sdk.trace.export.in_memory_span_exporter import (  # noqa: E402
    InMemorySpanExporter,
)
from opentelemetry.trace import SpanKind, StatusCode  # noqa: E402

import durable_nb as dn  # noqa: E402
from durable_nb import Status  # noqa: E402
from durable_nb.testing import LoopbackServer, Reply, ToolCall  # noqa: E402

import durable_nb.telemetry as tracing_module
KEY = "sk-test-do-not-export-0123456789"


@dn.tool
def add(a: int, b: int) -> int:
    """Add two numbers."""
    return a + b


@pytest.fixture
def otel(monkeypatch):
    """Tracing on, to an in-memory exporter and metric reader; off again after."""
    monkeypatch.setattr(tracing_module, "_state", None)
    exporter, reader = InMemorySpanExporter(), InMemoryMetricReader()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    dn.tracing(provider, MeterProvider(metric_readers=[reader]))
    yield exporter, reader
    provider.shutdown()


def agent(client, crash: dict | None = None, approve: bool = False):
    """Ask, run the tool the model asks for, optionally crash there (once) or ask a person,
    ask again."""
    def handler(ctx):
        messages = [{"role": "user", "content": "1+2?"}]
        reply = ctx.chat(client=client, model="gpt-4o-mini", messages=messages,
                         tools=[add.schema])
        messages.append(reply.choices[0].message.model_dump(exclude_none=True))
        messages += ctx.call_tools(reply.choices[0].message, [add])
        if crash is not None and crash.pop("once", False):
            raise RuntimeError("the kernel died here")
        if approve:
            ctx.approval("send the answer", {"to": "alice"})
        return ctx.chat(client=client, model="gpt-4o-mini", messages=messages
                        ).choices[0].message.content
    return handler


def script():
    return [Reply(tool_calls=[ToolCall("add", {"a": 1, "b": 2})]), "three"]


def by_name(spans):
    return {span.name: span for span in spans}


def metric_points(reader, name):
    data = reader.get_metrics_data()
    return [point for rm in (data.resource_metrics if data else ())
            for sm in rm.scope_metrics for metric in sm.metrics if metric.name == name
            for point in metric.data.data_points]


def test_a_run_is_an_invoke_agent_span_with_chat_client_spans_and_tool_spans(otel, journal):
    exporter, reader = otel
    with LoopbackServer(script()) as server:
        client = openai.OpenAI(base_url=server.url, api_key=KEY)
        assert dn.execute("r", agent(client), title="adder", journal=journal) == "three"
    spans = exporter.get_finished_spans()
    names = [span.name for span in spans]
    assert names == ["chat gpt-4o-mini", "execute_tool add", "chat gpt-4o-mini",
                     "invoke_agent adder"]
    root = spans[-1]
    assert root.kind is SpanKind.INTERNAL and root.parent is None
    assert root.attributes["gen_ai.operation.name"] == "invoke_agent"
    assert root.attributes["gen_ai.conversation.id"] == "r"
    assert root.attributes["durable_nb.attempt"] == 1
    assert root.attributes["durable_nb.replayed_steps"] == 0
    assert root.attributes["durable_nb.executed_steps"] == 3
    assert root.attributes["durable_nb.attempt.end"] == "completed"
    for child in spans[:-1]:
        assert child.parent.span_id == root.context.span_id
        assert child.context.trace_id == root.context.trace_id
    first, tool_span, second = spans[:3]
    assert first.kind is SpanKind.CLIENT and tool_span.kind is SpanKind.INTERNAL
    entries = list(journal.steps("r"))
    a = first.attributes
    assert (a["gen_ai.operation.name"], a["gen_ai.provider.name"], a["gen_ai.request.model"],
            a["gen_ai.response.model"], a["openai.api.type"]) == (
        "chat", "openai", "gpt-4o-mini", "gpt-4o-mini", "chat_completions")
    assert tuple(a["gen_ai.response.finish_reasons"]) == ("tool_calls",)
    # The server the call went to, from the client's base URL (journaled with the entry).
    assert (a["server.address"], a["server.port"]) == ("127.0.0.1", server.port)
    assert entries[0].meta["endpoint"] == server.url + "/"  # as the client keeps it
    assert tuple(second.attributes["gen_ai.response.finish_reasons"]) == ("stop",)
    assert (a["gen_ai.usage.input_tokens"], a["gen_ai.usage.output_tokens"]) == (
        entries[0].prompt_tokens, entries[0].completion_tokens)
    assert a["gen_ai.usage.input_tokens"] > 0
    assert a["gen_ai.usage.cost"] == entries[0].meta["cost"]
    assert a["gen_ai.response.id"].startswith("chatcmpl-")
    # The journal's timestamps (which it keeps to 0.1 ms), not the export's.
    assert round(first.start_time / 1e9, 4) == entries[0].started_at
    assert round(first.end_time / 1e9, 4) == entries[0].finished_at
    call_id = server_call_id(entries[0])
    assert tool_span.attributes["gen_ai.tool.name"] == "add"
    assert tool_span.attributes["gen_ai.tool.call.id"] == call_id
    assert tool_span.attributes["gen_ai.operation.name"] == "execute_tool"
    exported = repr([dict(span.attributes) for span in spans])
    assert KEY not in exported and "1+2?" not in exported  # no key, no message content
    usage = metric_points(reader, "gen_ai.client.token.usage")
    assert sum(p.sum for p in usage) == sum(e.tokens for e in entries if e.kind == "chat")
    assert sum(p.count for p in metric_points(reader, "gen_ai.client.operation.duration")) == 2


def server_call_id(entry):
    from durable_nb.summary import llm_reply, plain
    return llm_reply("chat", plain(entry.result))["tool_calls"][0]["id"]


def test_a_resumed_attempt_reports_no_replayed_call_only_what_replay_saved(otel, journal):
    exporter, reader = otel
    crash = {"once": True}
    with LoopbackServer(script()) as server:
        client = openai.OpenAI(base_url=server.url, api_key=KEY)
        with pytest.raises(RuntimeError):
            dn.execute("r", agent(client, crash), journal=journal)
        first_attempt = exporter.get_finished_spans()
        exporter.clear()
        tokens_before = sum(p.sum for p in metric_points(reader, "gen_ai.client.token.usage"))
        assert dn.execute("r", agent(client, crash), journal=journal) == "three"
    failed = first_attempt[-1]
    assert failed.name == "invoke_agent r"
    assert failed.status.status_code is StatusCode.ERROR
    assert failed.attributes["durable_nb.attempt.end"] == "failed"
    spans = exporter.get_finished_spans()
    # The chat and the tool call the crash came after are replayed: not reported as calls.
    assert [span.name for span in spans] == ["chat gpt-4o-mini", "invoke_agent r"]
    assert [span.kind for span in spans].count(SpanKind.CLIENT) == 1
    resumed = spans[-1]
    assert resumed.context.trace_id != failed.context.trace_id  # an attempt, a trace
    entries = list(journal.steps("r"))
    assert resumed.attributes["durable_nb.attempt"] == 2
    assert resumed.attributes["durable_nb.replayed_steps"] == 2
    assert resumed.attributes["durable_nb.replayed_tokens"] == entries[0].tokens
    assert resumed.attributes["durable_nb.replayed_cost"] == pytest.approx(entries[0].meta["cost"])
    assert resumed.attributes["durable_nb.executed_steps"] == 1
    assert resumed.status.status_code is StatusCode.UNSET
    # Its trace links to the attempt that executed what it replayed, whose span's ids the
    # attempt record keeps.
    (link,) = resumed.links
    assert link.context.span_id == failed.context.span_id
    assert link.context.trace_id == failed.context.trace_id
    assert link.attributes["durable_nb.attempt"] == 1
    first_attempt_record, second_attempt_record = journal.get_run("r").attempts
    assert first_attempt_record["trace_id"] == f"{failed.context.trace_id:032x}"
    assert first_attempt_record["span_id"] == f"{failed.context.span_id:016x}"
    assert second_attempt_record["span_id"] == f"{resumed.context.span_id:016x}"
    # The token metric counts the second chat only, once.
    tokens_after = sum(p.sum for p in metric_points(reader, "gen_ai.client.token.usage"))
    assert tokens_after - tokens_before == entries[2].tokens


def test_an_approval_is_a_span_from_request_to_decision_with_who_decided(otel, journal):
    exporter, _ = otel
    with LoopbackServer(script()) as server:
        client = openai.OpenAI(base_url=server.url, api_key=KEY)
        assert dn.execute("r", agent(client, approve=True), journal=journal,
                          on_approval="park") is None
        parked = exporter.get_finished_spans()[-1]
        dn.approve("r", "fine", by="alice", journal=journal)
        exporter.clear()
        assert dn.execute("r", agent(client, approve=True), journal=journal,
                          on_approval="park") == "three"
    assert parked.name == "invoke_agent r"
    assert parked.attributes["durable_nb.attempt.end"] == "parked"
    assert parked.status.status_code is StatusCode.UNSET
    spans = by_name(exporter.get_finished_spans())
    approval = spans["approval send the answer"]
    assert approval.attributes["durable_nb.approval.approved"] is True
    assert approval.attributes["durable_nb.approval.by"] == "alice"
    entry = [e for e in journal.steps("r") if e.kind == "approval"][0]
    assert round(approval.start_time / 1e9, 4) == entry.started_at  # asked in attempt 1
    assert approval.parent.span_id == spans["invoke_agent r"].context.span_id


def test_a_done_run_executed_again_is_no_attempt_and_no_span(otel, journal):
    exporter, _ = otel
    with LoopbackServer(script()) as server:
        client = openai.OpenAI(base_url=server.url, api_key=KEY)
        dn.execute("r", agent(client), journal=journal)
        exporter.clear()
        assert dn.execute("r", agent(client), journal=journal) == "three"
    assert journal.get_run("r").status is Status.DONE
    assert exporter.get_finished_spans() == ()


def test_off_a_run_imports_nothing_of_opentelemetry_and_wraps_nothing(monkeypatch, journal):
    monkeypatch.setattr(tracing_module, "_state", None)
    monkeypatch.delenv("OTEL_EXPORTER_OTLP_ENDPOINT", raising=False)
    from durable_nb.runner import Runner
    runner = Runner("r", lambda ctx: 1, journal=journal)
    assert type(runner.observer).__name__ == "NullObserver"
    assert tracing_module._state is False


def test_the_otlp_endpoint_without_the_exporter_installed_is_silently_off(monkeypatch, journal):
    monkeypatch.setattr(tracing_module, "_state", None)
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", "http://127.0.0.1:9")
    monkeypatch.setitem(sys.modules, "opentelemetry.exporter.otlp.proto.http.trace_exporter",
                        None)  # as if not installed
    assert dn.execute("r", lambda ctx: ctx.run("one", lambda: 1), journal=journal) == 1
    assert tracing_module._state is False


def test_a_batch_is_an_invoke_workflow_span_over_its_items_attempts(otel, journal):
    exporter, _ = otel
    with LoopbackServer(["a", "b", "c"]) as server:
        client = openai.OpenAI(base_url=server.url, api_key=KEY)

        def ask(ctx, item):
            return ctx.chat(client=client, model="gpt-4o-mini",
                            messages=[{"role": "user", "content": item}]).choices[0].message.content
        dn.map(ask, ["x", "y", "z"], batch_id="eval", concurrency=2, journal=journal)
    spans = exporter.get_finished_spans()
    workflow = by_name(spans)["invoke_workflow eval"]
    assert workflow.attributes["gen_ai.operation.name"] == "invoke_workflow"
    attempts = [s for s in spans if s.name.startswith("invoke_agent ")]
    assert len(attempts) == 3
    assert all(s.parent.span_id == workflow.context.span_id for s in attempts)
    chats = [s for s in spans if s.kind is SpanKind.CLIENT]
    assert len(chats) == 3
    assert {c.parent.span_id for c in chats} == {s.context.span_id for s in attempts}


def test_a_child_runs_attempt_is_a_child_of_its_parents_attempt(otel, journal):
    exporter, _ = otel

    def parent(ctx):
        return ctx.child("research", lambda child: child.run("look", lambda: 41)) + 1
    assert dn.execute("p", parent, journal=journal) == 42
    spans = by_name(exporter.get_finished_spans())
    root = spans["invoke_agent p"]
    child = spans["invoke_agent research"]  # the child run's title
    assert child.attributes["durable_nb.run_id"] == "p/research-0"
    assert child.parent.span_id == root.context.span_id
    assert spans["run look"].parent.span_id == child.context.span_id


class Collector:
    """An OTLP/HTTP trace receiver on loopback: the spans as the wire carried them."""

    def __init__(self) -> None:
        from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
            ExportTraceServiceRequest, ExportTraceServiceResponse)
        spans = self.spans = []

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_POST(self):
                body = self.rfile.read(int(self.headers["Content-Length"]))
                request = ExportTraceServiceRequest.FromString(body)
                spans.extend((rs.resource, span) for rs in request.resource_spans
                             for ss in rs.scope_spans for span in ss.spans)
                reply = ExportTraceServiceResponse().SerializeToString()
                self.send_response(200)
                self.send_header("Content-Type", "application/x-protobuf")
                self.send_header("Content-Length", str(len(reply)))
                self.end_headers()
                self.wfile.write(reply)

            def log_message(self, *args):
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def names(self):
        return [span.name for _, span in self.spans]

    def close(self):
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def collector():
    pytest.importorskip("opentelemetry.exporter.otlp.proto.http")
    receiver = Collector()
    yield receiver
    receiver.close()


def attribute(span, name):
    for kv in span.attributes:
        if kv.key == name:
            value = kv.value
            return getattr(value, value.WhichOneof("value"))
    return None


def test_trace_sends_a_finished_runs_attempts_after_the_fact(collector, journal, monkeypatch):
    monkeypatch.setattr(tracing_module, "_state", False)  # executed untraced
    crash = {"once": True}
    with LoopbackServer(script()) as server:
        client = openai.OpenAI(base_url=server.url, api_key=KEY)
        with pytest.raises(RuntimeError):
            dn.execute("r", agent(client, crash), title="adder", journal=journal)
        dn.execute("r", agent(client, crash), title="adder", journal=journal)
    from durable_nb.cli import main
    assert main(["--journal", str(journal.location), "trace", "r", "--to", collector.url]) == 0
    assert collector.names() == ["chat gpt-4o-mini", "execute_tool add", "invoke_agent adder",
                                 "chat gpt-4o-mini", "invoke_agent adder"]
    spans = [span for _, span in collector.spans]
    assert [attribute(spans[i], "durable_nb.attempt") for i in (2, 4)] == [1, 2]
    assert attribute(spans[4], "durable_nb.replayed_steps") == 2
    assert attribute(spans[2], "durable_nb.replayed_steps") == 0
    assert attribute(spans[0], "server.address") == "127.0.0.1"
    assert spans[3].parent_span_id == spans[4].span_id
    (link,) = spans[4].links  # to the attempt 1 sent here, which executed what 2 replayed
    assert (link.trace_id, link.span_id) == (spans[2].trace_id, spans[2].span_id)
    assert not spans[2].links
    resource = collector.spans[0][0]
    assert any(kv.key == "service.name" and kv.value.string_value == "durable-nb"
               for kv in resource.attributes)


def test_trace_to_nowhere_says_so(journal):
    pytest.importorskip("opentelemetry.exporter.otlp.proto.http")
    dn.execute("r", lambda ctx: ctx.run("one", lambda: 1), journal=journal)
    with socket.socket() as sock:  # a port nobody listens on
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    with pytest.raises(dn.DurableError, match="did not take the 2 spans of run 'r'"):
        tracing_module.send_run(journal.get_run("r"), list(journal.steps("r")),
                                f"http://127.0.0.1:{port}", timeout=0.5)


def test_the_otlp_endpoint_in_the_environment_turns_tracing_on(collector, tmp_path):
    program = ("import durable_nb as dn\n"
               "dn.execute('r', lambda ctx: ctx.run('one', lambda: 1), title='envy',"
               f" journal={str(tmp_path / 'j')!r})\n")
    env = {**os.environ, "OTEL_EXPORTER_OTLP_ENDPOINT": collector.url,
           "OTEL_SERVICE_NAME": "nightly-agent"}
    subprocess.run([sys.executable, "-c", program], env=env, check=True, timeout=60)
    assert collector.names() == ["run one", "invoke_agent envy"]  # flushed at exit
    assert any(kv.key == "service.name" and kv.value.string_value == "nightly-agent"
               for kv in collector.spans[0][0].attributes)


def test_a_responses_api_call_is_a_chat_span_and_its_function_calls_tool_spans(otel, journal):
    exporter, _ = otel
    with LoopbackServer([Reply(tool_calls=[ToolCall("add", {"a": 2, "b": 2})]), "four"]) as server:
        client = openai.OpenAI(base_url=server.url, api_key=KEY)

        def handler(ctx):
            first = ctx.respond(client=client, model="gpt-4.1-mini", input="2+2?",
                                tools=[{"type": "function", "name": "add",
                                        "parameters": add.schema["function"]["parameters"]}])
            outputs = ctx.call_tools(first, [add])
            return ctx.respond(client=client, model="gpt-4.1-mini",
                               input=[*first.output, *outputs]).output_text
        assert dn.execute("r", handler, journal=journal) == "four"
    spans = exporter.get_finished_spans()
    assert [s.name for s in spans] == ["chat gpt-4.1-mini", "execute_tool add",
                                       "chat gpt-4.1-mini", "invoke_agent r"]
    first, tool_span = spans[0], spans[1]
    assert first.attributes["openai.api.type"] == "responses"
    assert first.attributes["server.port"] == server.port
    assert tuple(first.attributes["gen_ai.response.finish_reasons"]) == ("completed",)
    assert first.attributes["gen_ai.response.id"].startswith("resp")
    call_id = server_call_id_of_response(list(journal.steps("r"))[0])
    assert call_id and tool_span.attributes["gen_ai.tool.call.id"] == call_id


def server_call_id_of_response(entry):
    from durable_nb.summary import llm_reply, plain
    return llm_reply("respond", plain(entry.result))["tool_calls"][0]["id"]


def test_a_compaction_is_a_chat_span_to_its_summary_model(otel, journal):
    exporter, _ = otel
    rounds = [{"role": "user", "content": "read the parts"}]
    for n in range(6):
        rounds += [{"role": "user", "content": f"part {n}: " + "lorem ipsum " * 150},
                   {"role": "assistant", "content": f"noted {n}"}]
    with LoopbackServer(["the summary"]) as server:
        client = openai.OpenAI(base_url=server.url, api_key=KEY)
        compacted = dn.execute(
            "r", lambda ctx: ctx.compact([{"role": "system", "content": "be brief"}, *rounds],
                                         keep_last=1, summary_model="gpt-4o-mini"),
            journal=journal, client=client, model="gpt-4o", context_windows={"gpt-4o": 1500})
    assert len(compacted) < len(rounds)
    (span,) = [s for s in exporter.get_finished_spans() if s.kind is SpanKind.CLIENT]
    (entry,) = journal.steps("r")
    assert span.name == "chat gpt-4o-mini"
    assert span.attributes["durable_nb.step.kind"] == "compact"
    assert span.attributes["gen_ai.usage.input_tokens"] == entry.prompt_tokens > 0
    assert span.attributes["server.port"] == server.port


def test_otel_sdk_disabled_keeps_tracing_off_with_an_endpoint(monkeypatch, journal):
    monkeypatch.setattr(tracing_module, "_state", None)
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", "http://127.0.0.1:9")
    monkeypatch.setenv("OTEL_SDK_DISABLED", "true")
    from durable_nb.runner import Runner
    assert type(Runner("r", lambda ctx: 1, journal=journal).observer).__name__ == "NullObserver"


def test_message_content_only_when_the_environment_asks_for_it(otel, journal, monkeypatch):
    import json
    exporter, _ = otel
    monkeypatch.setenv("OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT", "true")
    with LoopbackServer(script()) as server:
        client = openai.OpenAI(base_url=server.url, api_key=KEY)
        assert dn.execute("r", agent(client), journal=journal) == "three"
    first, _, second = exporter.get_finished_spans()[:3]
    asked = json.loads(first.attributes["gen_ai.input.messages"])
    assert asked == [{"role": "user", "parts": [{"type": "text", "content": "1+2?"}]}]
    (call,) = json.loads(first.attributes["gen_ai.output.messages"])[0]["parts"]
    assert (call["type"], call["name"], json.loads(call["arguments"])) == (
        "tool_call", "add", {"a": 1, "b": 2})
    roles = [m["role"] for m in json.loads(second.attributes["gen_ai.input.messages"])]
    assert roles == ["user", "assistant", "tool"]
    tool_answer = json.loads(second.attributes["gen_ai.input.messages"])[2]["parts"][0]
    assert (tool_answer["id"], tool_answer["response"]) == (call["id"], "3")
    assert json.loads(second.attributes["gen_ai.output.messages"]) == [{
        "role": "assistant", "parts": [{"type": "text", "content": "three"}],
        "finish_reason": "stop"}]
    assert KEY not in repr([dict(s.attributes) for s in exporter.get_finished_spans()])


KILLED_RUN = """
import os, sys, openai, durable_nb as dn
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from tests.test_tracing import KEY, add
client = openai.OpenAI(base_url=sys.argv[1], api_key=KEY)
if sys.argv[3] == "sent":  # each span sent as it ends: the collector gets the steps' spans
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(OTLPSpanExporter(endpoint=sys.argv[4])))
    dn.tracing(provider)

def handler(ctx):
    messages = [{"role": "user", "content": "1+2?"}]
    reply = ctx.chat(client=client, model="gpt-4o-mini", messages=messages, tools=[add.schema])
    ctx.call_tools(reply.choices[0].message, [add])
    os._exit(9)  # the process dies after the tool call: nothing more is written

dn.execute("r", handler, journal=sys.argv[2])
"""


def die_after_the_tool_call(server, path, collector, how="batched"):
    """Attempt 1 of run "r" in a process that dies after its chat and tool steps, traced to
    ``collector``: ``batched`` (the environment's batch processor: nothing reaches it) or
    ``sent`` (each span as it ends)."""
    died = subprocess.run([sys.executable, "-c", KILLED_RUN, server.url, path, how,
                           collector.url + "/v1/traces"],
                          env={**os.environ, "PYTHONPATH": os.getcwd(),
                               "OTEL_EXPORTER_OTLP_ENDPOINT": collector.url},
                          timeout=60)
    assert died.returncode == 9


def test_a_run_whose_process_died_resumes_with_no_client_span_for_what_replay_answers(
        otel, journal, monkeypatch, collector):
    exporter, _ = otel
    journal.close()
    path = str(journal.location)
    with LoopbackServer(script()) as server:
        die_after_the_tool_call(server, path, collector)
        client = openai.OpenAI(base_url=server.url, api_key=KEY)
        assert dn.execute("r", agent(client), journal=path) == "three"
        assert server.count() == 2  # the first call was not made again
    assert collector.spans == []  # the batch processor died holding them
    spans = exporter.get_finished_spans()
    reopened = dn.open_journal(path)
    died_attempt, resumed_attempt = reopened.get_run("r").attempts
    entries = list(reopened.steps("r"))
    reopened.close()
    # The resume sent the dead attempt's spans again first, under its journaled ids ...
    assert [(s.name, s.kind) for s in spans] == [
        ("chat gpt-4o-mini", SpanKind.CLIENT), ("execute_tool add", SpanKind.INTERNAL),
        ("invoke_agent r", SpanKind.INTERNAL),
        ("chat gpt-4o-mini", SpanKind.CLIENT), ("invoke_agent r", SpanKind.INTERNAL)]
    chat, tool, died, _, resumed = spans
    assert (f"{died.context.trace_id:032x}", f"{died.context.span_id:016x}") == (
        died_attempt["trace_id"], died_attempt["span_id"])
    assert died.parent is None
    assert died.attributes["durable_nb.attempt"] == 1
    assert died.attributes["durable_nb.attempt.end"] == "died"
    assert died.status.status_code is StatusCode.ERROR
    assert died.status.description.startswith("died")
    assert round(died.end_time / 1e9, 4) == entries[1].finished_at  # its last step's end
    assert {chat.parent.span_id, tool.parent.span_id} == {died.context.span_id}
    assert tool.attributes["gen_ai.tool.call.id"] == server_call_id(entries[0])
    assert died_attempt["spans_resent"] > 0  # and noted it, with the record that opened 2
    # ... then its own, with no client span for what replay answered.
    assert resumed.attributes["durable_nb.attempt"] == 2
    assert resumed.attributes["durable_nb.replayed_steps"] == 2
    assert resumed.context.trace_id != died.context.trace_id
    (link,) = resumed.links
    assert (link.context.trace_id, link.context.span_id) == (
        died.context.trace_id, died.context.span_id)
    assert link.attributes["durable_nb.attempt"] == 1
    # Every LLM call of the journal is one client span, its tokens once.
    clients = [s for s in spans if s.kind is SpanKind.CLIENT]
    assert len(clients) == sum(e.kind == "chat" for e in entries) == 2
    assert sum(s.attributes["gen_ai.usage.input_tokens"]
               + s.attributes["gen_ai.usage.output_tokens"] for s in clients) == sum(
        e.tokens for e in entries)
    # After the fact, the attempt that died is sent with the very same ids.
    monkeypatch.setattr(tracing_module, "_state", False)
    after = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(after))
    reopened = dn.open_journal(path)
    assert tracing_module.export_run(reopened.get_run("r"), list(reopened.steps("r")),
                                     provider.get_tracer("t")) == 2
    reopened.close()
    assert [(s.name, s.context.span_id) for s in after.get_finished_spans()] == [
        (s.name, s.context.span_id) for s in spans]


def test_a_dead_attempts_steps_are_sent_again_under_the_span_ids_they_had_live(
        otel, journal, collector):
    exporter, _ = otel
    journal.close()
    path = str(journal.location)
    with LoopbackServer(script()) as server:
        die_after_the_tool_call(server, path, collector, how="sent")
        client = openai.OpenAI(base_url=server.url, api_key=KEY)
        assert dn.execute("r", agent(client), journal=path) == "three"
    live = {span.name: span for _, span in collector.spans}
    assert sorted(live) == ["chat gpt-4o-mini", "execute_tool add"]  # no attempt span
    again = by_name(exporter.get_finished_spans()[:3])
    for name, span in live.items():  # the same ids: a collector keeps each once
        assert span.span_id == again[name].context.span_id.to_bytes(8, "big")
        assert span.trace_id == again[name].context.trace_id.to_bytes(16, "big")
        assert span.parent_span_id == again["invoke_agent r"].context.span_id.to_bytes(8, "big")


def test_a_dead_attempts_spans_are_sent_once_whatever_resumes_after(otel, journal, collector):
    exporter, _ = otel
    journal.close()
    path = str(journal.location)
    with LoopbackServer(script() + ["three"]) as server:
        die_after_the_tool_call(server, path, collector)
        client = openai.OpenAI(base_url=server.url, api_key=KEY)
        assert dn.execute("r", agent(client, approve=True), journal=path,
                          on_approval="park") is None
        first_resume = [s.name for s in exporter.get_finished_spans()]
        exporter.clear()
        dn.approve("r", "fine", by="alice", journal=path)
        assert dn.execute("r", agent(client, approve=True), journal=path,
                          on_approval="park") == "three"
    assert first_resume == ["chat gpt-4o-mini", "execute_tool add", "invoke_agent r",
                            "invoke_agent r"]
    # Attempt 3 resumes after the approval: attempt 1's spans are not sent again.
    spans = exporter.get_finished_spans()
    assert [s.name for s in spans] == ["approval send the answer", "chat gpt-4o-mini",
                                       "invoke_agent r"]
    assert spans[-1].attributes["durable_nb.attempt"] == 3


RESUME_KILLED_AFTER_SENDING = """
import os, sys, openai, durable_nb as dn
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from tests.test_tracing import KEY, agent

class SendThenDie(OTLPSpanExporter):
    def export(self, spans):
        sent = super().export(spans)
        if any(span.name.startswith("invoke_agent") for span in spans):
            os._exit(7)  # the dead attempt's spans sent, the record saying so not written
        return sent

provider = TracerProvider()
provider.add_span_processor(SimpleSpanProcessor(SendThenDie(endpoint=sys.argv[3])))
dn.tracing(provider)
client = openai.OpenAI(base_url=sys.argv[1], api_key=KEY)
dn.execute("r", agent(client), journal=sys.argv[2])
"""


def test_a_resume_killed_after_sending_a_dead_attempts_spans_sends_the_same_ids_again(
        otel, journal, collector):
    exporter, _ = otel
    journal.close()
    path = str(journal.location)
    with LoopbackServer(script()) as server:
        die_after_the_tool_call(server, path, collector)
        killed = subprocess.run([sys.executable, "-c", RESUME_KILLED_AFTER_SENDING, server.url,
                                 path, collector.url + "/v1/traces"],
                                env={**os.environ, "PYTHONPATH": os.getcwd()}, timeout=60)
        assert killed.returncode == 7
        reopened = dn.open_journal(path)
        assert [a.get("end") for a in reopened.get_run("r").attempts] == [None]  # not noted
        reopened.close()
        client = openai.OpenAI(base_url=server.url, api_key=KEY)
        assert dn.execute("r", agent(client), journal=path) == "three"
    first = sorted((span.name, span.span_id) for _, span in collector.spans)
    assert [name for name, _ in first] == ["chat gpt-4o-mini", "execute_tool add",
                                          "invoke_agent r"]
    again = sorted((span.name, span.context.span_id.to_bytes(8, "big"))
                   for span in exporter.get_finished_spans()[:3])
    assert again == first  # the same spans, the same ids: a collector keeps each once
    reopened = dn.open_journal(path)
    died, resumed = reopened.get_run("r").attempts
    reopened.close()
    assert (died["end"], died["spans_resent"] > 0, resumed["n"]) == ("died", True, 2)


@pytest.fixture
def openai_v2(monkeypatch):
    """Tracing on, and the official openai instrumentation too, both to one in-memory
    exporter and metric reader."""
    instrumentation = pytest.importorskip("opentelemetry.instrumentation.openai_v2")
    monkeypatch.setattr(tracing_module, "_state", None)
    exporter, reader = InMemorySpanExporter(), InMemoryMetricReader()
    provider, meters = TracerProvider(), MeterProvider(metric_readers=[reader])
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    instrumentor = instrumentation.OpenAIInstrumentor()
    instrumentor.instrument(tracer_provider=provider, meter_provider=meters)
    dn.tracing(provider, meters)
    yield exporter, reader
    instrumentor.uninstrument()
    provider.shutdown()


def test_with_the_official_openai_instrumentation_each_executed_call_is_one_client_span(
        openai_v2, journal):
    exporter, reader = openai_v2
    crash = {"once": True}
    with LoopbackServer(script()) as server:
        client = openai.OpenAI(base_url=server.url, api_key=KEY)
        with pytest.raises(RuntimeError):
            dn.execute("r", agent(client, crash), journal=journal)
        first = exporter.get_finished_spans()
        exporter.clear()
        assert dn.execute("r", agent(client, crash), journal=journal) == "three"
        assert server.count() == 2
    second = exporter.get_finished_spans()
    for spans, calls in ((first, 1), (second, 1)):
        clients = [s for s in spans if s.kind is SpanKind.CLIENT]
        # The instrumentation's span (not durable_nb's), under the attempt's.
        assert len(clients) == calls
        assert clients[0].instrumentation_scope.name != "durable_nb"
        assert clients[0].name == "chat gpt-4o-mini"
        (attempt,) = [s for s in spans if s.name == "invoke_agent r"]
        assert clients[0].parent.span_id == attempt.context.span_id
    assert "execute_tool add" in [s.name for s in first]  # tools stay durable_nb's
    assert by_name(second)["invoke_agent r"].attributes["durable_nb.replayed_steps"] == 2
    # Its token metric alone counts the calls: twice the input and the output of two calls.
    usage = metric_points(reader, "gen_ai.client.token.usage")
    assert sum(p.count for p in usage) == 4
    # Sent after the fact, the calls are durable_nb's to report again: nothing else will.
    sent = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(sent))
    assert tracing_module.export_run(journal.get_run("r"), list(journal.steps("r")),
                                     provider.get_tracer("t")) == 2
    assert [s.name for s in sent.get_finished_spans() if s.kind is SpanKind.CLIENT] == [
        "chat gpt-4o-mini", "chat gpt-4o-mini"]


def test_a_pydantic_ai_model_request_is_a_chat_span_of_its_provider(otel, journal, tmp_path):
    pytest.importorskip("pydantic_ai")
    pytest.importorskip("anthropic")
    from durable_nb.integrations.pydantic_ai import run
    from tests.openai_agents_process import script as travel_script
    from tests.pydantic_ai_process import anthropic_model, travel_agent

    exporter, _ = otel
    with LoopbackServer(travel_script()) as server:
        agent = travel_agent(tmp_path, model=anthropic_model(server.url))

        async def handler(ctx):
            return (await run(ctx, agent, "Book me a flight to Oslo.")).output

        dn.execute("trip", handler, journal=journal)
    spans = exporter.get_finished_spans()
    assert [s.name for s in spans] == [
        "chat claude-sonnet-4-5", "execute_tool find_flight", "chat claude-sonnet-4-5",
        "execute_tool book_flight", "chat claude-sonnet-4-5", "invoke_agent trip"]
    first, tool_span = spans[0], spans[1]
    assert first.kind is SpanKind.CLIENT
    assert first.attributes["gen_ai.provider.name"] == "anthropic"
    assert "openai.api.type" not in first.attributes
    assert first.attributes["server.port"] == server.port
    assert tuple(first.attributes["gen_ai.response.finish_reasons"]) == ("tool_call",)
    assert first.attributes["gen_ai.response.id"].startswith("msg_")
    entry = list(journal.steps("trip"))[0]
    assert first.attributes["gen_ai.usage.input_tokens"] == entry.prompt_tokens > 0
    assert tool_span.attributes["gen_ai.tool.call.id"] == "toolu_0_0"
