"""Opt-in: Pydantic AI's real ``AnthropicModel`` against a real server speaking Anthropic's
Messages API that nobody on the project wrote: llama.cpp's ``llama-server`` on 127.0.0.1:8012
(``/v1/messages``, SmolLM2-135M-Instruct), built and started by ``shared/real-llm`` (``bash
setup.sh``, then ``bash start.sh cpp``). Run with ``pytest -m real_llm tests/
test_real_llm_anthropic.py``; every test skips when the server does not answer, so the suite
(and CI) stays green without it. On a CPU with AMX that the kernel does not enable for the
process, llama-server built with ``-march=native`` crashes loading the model (SIGSEGV in
``ggml_backend_amx_mul_mat``): start it with ``--no-repack`` there (measured 2026-12-04: the
three tests pass, 33 and 34 prompt tokens, 20 completion tokens each).

Requests are counted where the client sends them (an httpx event hook on the real anthropic
client, appending to a file, so that a killed child's requests count too), since the server
keeps no counts.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("pydantic_ai")
pytest.importorskip("anthropic")

import durable_nb  # noqa: E402
from durable_nb.journal import open_journal  # noqa: E402
from tests import agent_process  # noqa: E402
from tests.test_real_llm import CPP, MODEL, needs  # noqa: E402

pytestmark = pytest.mark.real_llm

PROMPTS = ("Say hi.", "Say bye.")


def counted_agent(sent_log: Path) -> Any:
    """An agent on ``AnthropicModel`` sending to llama-server, each request it sends appended
    to ``sent_log``; the client's own retries off."""
    import anthropic
    from pydantic_ai import Agent
    from pydantic_ai.models.anthropic import AnthropicModel
    from pydantic_ai.providers.anthropic import AnthropicProvider

    async def hook(request: Any) -> None:
        with open(sent_log, "a") as f:
            f.write(f"{request.url.path}\n")

    client = anthropic.AsyncAnthropic(
        base_url=f"http://127.0.0.1:{CPP}", api_key="any", max_retries=0,
        http_client=anthropic.DefaultAsyncHttpxClient(event_hooks={"request": [hook]}))
    model = AnthropicModel(MODEL, provider=AnthropicProvider(anthropic_client=client))
    return Agent(model, name="greeter", model_settings={"max_tokens": 20})


def two_questions(agent: Any):
    from durable_nb.integrations.pydantic_ai import run

    async def handler(ctx: Any) -> list[str]:
        return [(await run(ctx, agent, prompt)).output for prompt in PROMPTS]

    return handler


class _KillAfterFirstModelStep:
    def __init__(self, workdir: Path) -> None:
        self.workdir = workdir

    def on_step(self, entry: Any, replayed: bool) -> None:
        if entry.kind == "model" and not replayed:
            agent_process.kill_once(self.workdir / "killed-after-model")

    def on_record(self, record: Any) -> None:
        pass


def real_child(journal_dir: str, workdir: str) -> None:
    """Process target: the two questions as run ``greet``; SIGKILL right after the first
    request's journal write (once)."""
    from durable_nb.runner import RunOptions, Runner

    root = Path(workdir)
    runner = Runner("greet", two_questions(counted_agent(root / "sent.log")),
                    journal=journal_dir, observer=_KillAfterFirstModelStep(root),
                    options=RunOptions(poll_interval=0.05))
    agent_process._run_child(workdir, lambda: runner.run().result)


def _sent(workdir: Path) -> list[str]:
    log = workdir / "sent.log"
    return log.read_text().splitlines() if log.exists() else []


def test_llama_servers_messages_api_requests_are_model_steps_that_replay(tmp_path, journal):
    needs(CPP)
    handler = two_questions(counted_agent(tmp_path / "sent.log"))
    first = durable_nb.execute("greet", handler, journal=journal)
    again = durable_nb.execute("greet", handler, journal=journal)
    assert first == again and all(isinstance(text, str) and text for text in first)
    assert _sent(tmp_path) == ["/v1/messages"] * 2  # none for the replay
    steps = list(journal.steps("greet"))
    assert [(e.kind, e.name) for e in steps] == [("model", MODEL)] * 2
    # The server's own counts (its chat template adds a system prompt), not estimates.
    assert all(e.prompt_tokens > 0 and e.completion_tokens > 0 and not e.meta.get("estimated")
               for e in steps)
    print(f"\nllama-server /v1/messages: {[(e.prompt_tokens, e.completion_tokens) for e in steps]}"
          f" tokens; answers {first!r}")


def test_sigkill_between_real_requests_sends_each_once(tmp_path):
    needs(CPP)
    journal = str(tmp_path / "journal")
    for _ in range(2):
        child = agent_process.start(real_child, journal, str(tmp_path))
        child.join(120)
    assert (tmp_path / "killed-after-model").exists()
    answers = agent_process.read_result(tmp_path)
    assert len(answers) == 2 and all(answers)
    assert _sent(tmp_path) == ["/v1/messages"] * 2
    assert [e.kind for e in open_journal(journal).steps("greet")] == ["model", "model"]


def test_a_streamed_real_request_is_a_model_step_that_replays(tmp_path, journal):
    needs(CPP)
    from durable_nb.integrations.pydantic_ai import JournaledModelRequests

    agent = counted_agent(tmp_path / "sent.log")

    async def handler(ctx: Any) -> str:
        async with agent.run_stream(PROMPTS[0],
                                    capabilities=[JournaledModelRequests(ctx)]) as result:
            return "".join([piece async for piece in result.stream_text(delta=True)])

    first = durable_nb.execute("stream", handler, journal=journal)
    again = durable_nb.execute("stream", handler, journal=journal)
    assert first == again and first
    assert _sent(tmp_path) == ["/v1/messages"]
    (step,) = journal.steps("stream")
    assert step.kind == "model" and step.prompt_tokens > 0 and step.completion_tokens > 0
