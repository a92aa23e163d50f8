"""A failed step's line in ``durable-nb show`` says what failed: the exception's type and its
message, on one line, shortened (issue 41: it showed ``FAILED builtins.RuntimeError`` only)."""

from __future__ import annotations

import json
from pathlib import Path

import durable_nb
from durable_nb import DiskJournal, Status, execute, get_run
from tests.test_cli import cli


def call(*tools: str) -> dict:
    """An assistant message calling each tool without arguments."""
    return {"role": "assistant", "content": None, "tool_calls": [
        {"id": f"c{i}", "type": "function", "function": {"name": name, "arguments": "{}"}}
        for i, name in enumerate(tools)]}


@durable_nb.tool
def reserve(ctx) -> str:
    """Reserve capacity."""
    raise RuntimeError("quota exceeded")


@durable_nb.tool
def report(ctx) -> str:
    """Send the report."""
    raise ValueError("the mail server said:\n  550 mailbox unavailable \x1b[31m" + "x" * 300)


def step_lines(shown: str, name: str) -> list[str]:
    return [line for line in shown.splitlines() if f" {name} " in line]


def test_a_failed_steps_line_gives_the_exceptions_message_on_one_shortened_line(
        tmp_path: Path) -> None:
    """Failed on 1642cc7 (the line ended ``FAILED builtins.RuntimeError``)."""
    journal = DiskJournal(tmp_path / "j")
    told = execute("quota", lambda ctx: ctx.call_tools(call("reserve", "report"),
                                                       [reserve, report]), journal=journal)
    assert get_run("quota", journal=journal).status is Status.DONE
    assert "quota exceeded" in json.dumps(told)  # the model was told; the step failed
    journal.close()

    shown = cli("--journal", str(tmp_path / "j"), "show", "quota").stdout

    [reserved] = step_lines(shown, "reserve")
    assert reserved.endswith("FAILED builtins.RuntimeError: quota exceeded")
    [reported] = step_lines(shown, "report")
    failure = reported[reported.index("FAILED"):]
    assert failure.startswith("FAILED builtins.ValueError: the mail server said: 550 mailbox "
                              "unavailable ?[31mxxx")
    assert failure.endswith("x\u2026") and len(failure) < 160
