"""A plain loop over the sync durable client run in a real child process, for the crash test
of a live stream in tests/test_durable_client.py (started and read with
:mod:`tests.agent_process`)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from tests.agent_process import _run_child, kill_once

MODEL = "loopback-1"
ANSWER = "one two three four five six"


def stream_child(journal_dir: str, url: str, workdir: str) -> None:
    """Process target: stream one reply through ``ctx.openai`` and return its text; SIGKILL
    at the first chunk the reader gets (once: the next child reads to the end)."""
    import openai

    from durable_nb.runner import RunOptions, Runner

    root = Path(workdir)

    def handler(ctx: Any) -> str:
        stream = ctx.openai.chat.completions.create(
            model=MODEL, messages=[{"role": "user", "content": "count"}], stream=True)
        pieces = []
        for chunk in stream:
            kill_once(root / "killed-mid-stream")
            pieces += [c.delta.content or "" for c in chunk.choices]
        return "".join(pieces)

    client = openai.OpenAI(base_url=url, api_key="offline", max_retries=0)
    runner = Runner("stream", handler, journal=journal_dir,
                    options=RunOptions(client=client, poll_interval=0.05))
    _run_child(workdir, lambda: runner.run().result)
