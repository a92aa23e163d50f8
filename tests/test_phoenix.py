"""End to end against a real trace viewer: Arize Phoenix, served on loopback by the test,
receives a durable run's spans over OTLP/HTTP (tracing turned on by the standard OTel
environment alone), and its own REST API shows what arrived.

Phoenix (arize-phoenix, ~150 packages) lives in a venv of its own, which .ci/run makes
(and keeps) and names in ``DURABLE_NB_PHOENIX``: the path of its ``phoenix`` executable.
Without it the test skips, except under ``CI=true``, where it fails.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

pytest.importorskip("opentelemetry.exporter.otlp.proto.http")

from durable_nb.testing import LoopbackServer  # noqa: E402
from tests.test_tracing import script, server_call_id  # noqa: E402

PROJECT = "durable-nb-e2e"

# The first test of the module waits for Phoenix to start (up to 600 s on a loaded machine).
pytestmark = pytest.mark.timeout(900)


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class Phoenix:
    """``phoenix serve`` on loopback with a fresh working directory (its SQLite database),
    no telemetry of its own and nothing fetched from outside."""

    def __init__(self, executable: str, workdir: Path) -> None:
        self.port = _free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        env = {key: value for key, value in os.environ.items() if not key.startswith("OTEL_")}
        env.update(PHOENIX_WORKING_DIR=str(workdir), PHOENIX_HOST="127.0.0.1",
                   PHOENIX_PORT=str(self.port), PHOENIX_GRPC_PORT=str(_free_port()),
                   PHOENIX_TELEMETRY_ENABLED="false", PHOENIX_ALLOW_EXTERNAL_RESOURCES="false",
                   PHOENIX_ALLOWED_SANDBOX_PROVIDERS="NONE")
        self.log = workdir / "phoenix.log"
        with open(self.log, "wb") as log:
            self.process = subprocess.Popen([executable, "serve"], env=env, stdout=log,
                                            stderr=subprocess.STDOUT)

    def wait_ready(self, within: float = 600) -> None:
        """Until ``/healthz`` answers (its database migrated); raises if Phoenix exits. It
        took 115 s to answer on a loaded 2-core machine: the bound is for a hung start only."""
        deadline = time.monotonic() + within
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise AssertionError(f"phoenix exited ({self.process.returncode}):\n"
                                     f"{self.log.read_text()[-3000:]}")
            try:
                with urllib.request.urlopen(f"{self.url}/healthz", timeout=5) as reply:
                    if reply.status == 200:
                        return
            except OSError:
                pass
            time.sleep(0.5)
        raise AssertionError(f"phoenix did not answer within {within} s:\n"
                             f"{self.log.read_text()[-3000:]}")

    def spans(self, project: str) -> list[dict]:
        """The project's spans as Phoenix's REST API lists them (none: an unknown project)."""
        try:
            with urllib.request.urlopen(f"{self.url}/v1/projects/{project}/spans?limit=1000",
                                        timeout=10) as reply:
                return json.load(reply)["data"]
        except urllib.error.HTTPError as exc:
            if exc.code == 404:
                return []
            raise

    def wait_spans(self, project: str, count: int, within: float = 120) -> list[dict]:
        """The project's spans once ``count`` of them are stored (Phoenix inserts what it
        received in batches, a moment later)."""
        deadline = time.monotonic() + within
        while True:
            spans = self.spans(project)
            if len(spans) >= count or time.monotonic() > deadline:
                return spans
            time.sleep(0.5)

    def stop(self) -> None:
        self.process.terminate()
        try:
            self.process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()


@pytest.fixture(scope="module")
def phoenix(tmp_path_factory):
    executable = os.environ.get("DURABLE_NB_PHOENIX")
    if not executable or not os.access(executable, os.X_OK):
        message = ("DURABLE_NB_PHOENIX does not name a phoenix executable (.ci/run installs "
                   "arize-phoenix in a venv of its own and sets it)")
        if os.environ.get("CI") == "true":
            pytest.fail(message)
        pytest.skip(message)
    server = Phoenix(executable, tmp_path_factory.mktemp("phoenix"))
    try:
        server.wait_ready()
        yield server
    finally:
        server.stop()


ATTEMPT = """
import sys, openai, durable_nb as dn
from tests.test_tracing import KEY, agent
client = openai.OpenAI(base_url=sys.argv[1], api_key=KEY)
crash = {"once": True} if sys.argv[3] == "crash" else None
print(dn.execute("adder-run", agent(client, crash), title="adder", journal=sys.argv[2]))
"""


def by_trace(spans: list[dict]) -> dict[str, list[dict]]:
    traces: dict[str, list[dict]] = {}
    for span in sorted(spans, key=lambda s: s["start_time"]):
        traces.setdefault(span["context"]["trace_id"], []).append(span)
    return traces


def test_phoenix_shows_each_attempt_as_a_trace_and_no_llm_span_for_a_replayed_call(
        phoenix, tmp_path):
    journal = str(tmp_path / "journal")
    env = {**os.environ, "PYTHONPATH": os.getcwd(),
           "OTEL_EXPORTER_OTLP_ENDPOINT": phoenix.url, "OTEL_SERVICE_NAME": "adder-agent",
           "OTEL_RESOURCE_ATTRIBUTES": f"openinference.project.name={PROJECT}"}
    with LoopbackServer(script()) as llm:
        crashed = subprocess.run([sys.executable, "-c", ATTEMPT, llm.url, journal, "crash"],
                                 env=env, capture_output=True, text=True, timeout=120)
        assert crashed.returncode == 1 and "the kernel died here" in crashed.stderr
        resumed = subprocess.run([sys.executable, "-c", ATTEMPT, llm.url, journal, "resume"],
                                 env=env, capture_output=True, text=True, timeout=120)
        assert resumed.returncode == 0, resumed.stderr
        assert resumed.stdout.strip() == "three"
        assert llm.count() == 2  # the resumed attempt did not ask the first question again

    traces = by_trace(phoenix.wait_spans(PROJECT, 5))
    import durable_nb as dn
    opened = dn.open_journal(journal)
    entries = list(opened.steps("adder-run"))
    attempts = opened.get_run("adder-run").attempts
    opened.close()
    first, second = sorted(traces.values(), key=lambda spans: spans[0]["start_time"])

    # Attempt 1: the run (an AGENT span, failed), its call (LLM) and its tool (TOOL).
    assert [(s["name"], s["span_kind"]) for s in first] == [
        ("invoke_agent adder", "AGENT"), ("chat gpt-4o-mini", "LLM"),
        ("execute_tool add", "TOOL")]
    root, chat, tool = first
    assert root["parent_id"] is None and root["status_code"] == "ERROR"
    assert root["attributes"]["durable_nb.attempt"] == 1
    assert root["attributes"]["durable_nb.attempt.end"] == "failed"
    assert root["attributes"]["gen_ai.conversation.id"] == "adder-run"
    assert {chat["parent_id"], tool["parent_id"]} == {root["context"]["span_id"]}
    a = chat["attributes"]
    assert (a["gen_ai.operation.name"], a["gen_ai.provider.name"], a["gen_ai.request.model"],
            a["gen_ai.response.model"], a["openai.api.type"]) == (
        "chat", "openai", "gpt-4o-mini", "gpt-4o-mini", "chat_completions")
    assert (a["gen_ai.usage.input_tokens"], a["gen_ai.usage.output_tokens"]) == (
        entries[0].prompt_tokens, entries[0].completion_tokens)
    assert a["gen_ai.response.finish_reasons"] == ["tool_calls"]
    assert a["gen_ai.usage.cost"] == pytest.approx(entries[0].meta["cost"])
    assert (a["server.address"], a["server.port"]) == ("127.0.0.1", llm.port)
    assert tool["attributes"]["gen_ai.tool.name"] == "add"
    assert tool["attributes"]["gen_ai.tool.call.id"] == server_call_id(entries[0])

    # Attempt 2 replayed the call and the tool: only the second call is an LLM span.
    assert [(s["name"], s["span_kind"]) for s in second] == [
        ("invoke_agent adder", "AGENT"), ("chat gpt-4o-mini", "LLM")]
    root, chat = second
    assert root["status_code"] == "UNSET"
    assert root["attributes"]["durable_nb.attempt"] == 2
    assert root["attributes"]["durable_nb.replayed_steps"] == 2
    assert root["attributes"]["durable_nb.replayed_tokens"] == entries[0].tokens
    assert root["attributes"]["gen_ai.conversation.id"] == "adder-run"
    assert chat["attributes"]["gen_ai.usage.input_tokens"] == entries[2].prompt_tokens
    assert chat["attributes"]["gen_ai.response.finish_reasons"] == ["stop"]
    # Each attempt record names the trace Phoenix shows for it (what the resumed attempt's
    # link points to: Phoenix 20.26 keeps no links).
    for attempt, spans in zip(attempts, (first, second)):
        assert (attempt["trace_id"], attempt["span_id"]) == (
            spans[0]["context"]["trace_id"], spans[0]["context"]["span_id"])
    # Phoenix groups both attempts in one session: the run.
    assert {s["attributes"].get("session.id") for s in (first[0], second[0])} == {"adder-run"}


CRASH_PROJECT = "durable-nb-crash"

SETUP = """
import os, time, openai, durable_nb as dn

@dn.tool
def slow_add(a: int, b: int) -> int:
    \"\"\"Add two numbers (held while the test says so).\"\"\"
    while os.path.exists(f"hold-{a}"):
        time.sleep(0.05)
    return a + b

client = openai.OpenAI(base_url=%r, api_key="sk-test-not-a-key")
"""

AGENT_CELL = """%%durable_agent sums --title sums
messages = [{"role": "user", "content": "add them up"}]
while True:
    reply = ctx.chat(client=client, model="gpt-4o-mini", messages=messages,
                     tools=[slow_add.schema])
    message = reply.choices[0].message
    messages.append(message.model_dump(exclude_none=True))
    if not message.tool_calls:
        break
    messages += ctx.call_tools(message, [slow_add])
print("answer:", message.content)
"""


def _kernel_env(phoenix) -> dict[str, str]:
    return {"PYTHONPATH": os.pathsep.join(filter(None, [os.getcwd(),
                                                        os.environ.get("PYTHONPATH")])),
            "OTEL_EXPORTER_OTLP_ENDPOINT": phoenix.url, "OTEL_SERVICE_NAME": "sums-agent",
            "OTEL_RESOURCE_ATTRIBUTES": f"openinference.project.name={CRASH_PROJECT}"}


def test_phoenix_holds_every_step_of_attempts_killed_twice_once_as_the_journal_does(
        phoenix, tmp_path):
    from durable_nb import DiskJournal
    from durable_nb.testing import Reply, ToolCall
    from tests.harness import start_kernel, wait_until

    journal = DiskJournal(tmp_path / ".durable_nb")

    def journaled() -> int:
        return len(list(journal.steps("sums"))) if journal.find_run("sums") else 0

    def start(k, url: str) -> None:
        k.execute("%load_ext durable_nb").raise_for_error()
        k.execute(SETUP % url).raise_for_error()
        k.execute_async(AGENT_CELL)

    # Six rounds of a chat asking for slow_add(i, 1), then the answer: 13 steps.
    rounds = [Reply(tool_calls=[ToolCall("slow_add", {"a": i, "b": 1})]) for i in range(6)]
    with LoopbackServer([*rounds, "done"]) as llm, \
            start_kernel(tmp_path, env=_kernel_env(phoenix)) as k:
        # Attempt 1 is SIGKILLed in its second tool call (steps 0-2 journaled): its batch
        # processor held every span.
        (tmp_path / "hold-1").touch()
        start(k, llm.url)
        wait_until(lambda: journaled() == 3, 60, "attempt 1's three steps")
        k.kill()
        (tmp_path / "hold-1").unlink()
        # Attempt 2 is SIGKILLed in its fourth tool call (steps 3-6 executed), after its
        # exporter sent some of its spans: the same spans, sent again, must count once.
        (tmp_path / "hold-3").touch()
        k.restart()
        start(k, llm.url)
        wait_until(lambda: journaled() == 7, 60, "attempt 2's four steps")
        second = journal.get_run("sums").attempts[1]
        wait_until(lambda: any(s["context"]["trace_id"] == second["trace_id"]
                               for s in phoenix.spans(CRASH_PROJECT)), 120,
                   "a span of attempt 2 in Phoenix (its batch processor sends every 5 s)")
        k.kill()
        (tmp_path / "hold-3").unlink()
        # Attempt 3 resumes and finishes.
        k.restart()
        start(k, llm.url)
        wait_until(lambda: journal.get_run("sums").status.value == "DONE", 60, "the run DONE")
        k.execute("from opentelemetry import trace\n"  # before the harness kills the kernel
                  "trace.get_tracer_provider().force_flush()").raise_for_error()
        assert llm.count() == 7  # each call once: the dead attempts' calls were not made again

    entries = list(journal.steps("sums"))
    attempts = journal.get_run("sums").attempts
    journal.close()
    chats = [e for e in entries if e.kind == "chat"]
    tools = [e for e in entries if e.kind == "run" and e.name == "slow_add"]
    assert (len(entries), len(chats), len(tools)) == (13, 7, 6)
    assert [(a["end"], a["from_step"], a["at_step"]) for a in attempts] == [
        ("died", 0, 3), ("died", 3, 7), ("completed", 7, 13)]

    spans = phoenix.wait_spans(CRASH_PROJECT, 3 + len(chats) + len(tools))
    kinds = [s["span_kind"] for s in spans]
    llm_spans = [s for s in spans if s["span_kind"] == "LLM"]
    # Phoenix holds what the journal holds: every LLM call, its tokens and every tool call,
    # once, and no span for a replayed step.
    assert (kinds.count("AGENT"), len(llm_spans), kinds.count("TOOL")) == (3, 7, 6)
    assert sum(s["attributes"]["gen_ai.usage.input_tokens"]
               + s["attributes"]["gen_ai.usage.output_tokens"] for s in llm_spans) == sum(
        e.tokens for e in chats)
    assert sorted(s["attributes"]["durable_nb.step.position"] for s in spans
                  if s["span_kind"] in ("LLM", "TOOL")) == list(range(13))
    agents = sorted((s for s in spans if s["span_kind"] == "AGENT"),
                    key=lambda s: s["attributes"]["durable_nb.attempt"])
    for attempt, span in zip(attempts, agents):
        # Each attempt's span under the ids it journaled; the dead ones closed as died.
        assert (span["context"]["trace_id"], span["context"]["span_id"]) == (
            attempt["trace_id"], attempt["span_id"])
        children = [s for s in spans if s["parent_id"] == span["context"]["span_id"]]
        assert len(children) == attempt["at_step"] - attempt["from_step"]
    for span in agents[:2]:
        assert span["status_code"] == "ERROR"
        assert span["attributes"]["durable_nb.attempt.end"] == "died"
    assert agents[2]["status_code"] == "UNSET"
    assert [s["attributes"]["durable_nb.replayed_steps"] for s in agents] == [0, 3, 7]
    assert all(a.get("spans_resent") for a in attempts[:2])
    # The attempt killed after replaying three steps says so, in the journal and its span.
    assert [a["replayed"] for a in attempts] == [0, 3, 7]
