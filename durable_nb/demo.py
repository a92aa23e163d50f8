"""The offline demo: a sales-report agent that is killed halfway and resumed.

``durable-nb demo`` starts the bundled loopback model server, runs the agent in a child
process, kills it with SIGKILL after it wrote the report, runs it again (completed steps are
replayed from the journal, no LLM call or tool runs twice), approves the email as a person
would, and prints what was called how often. No API key or network is needed.

The agent itself (:func:`sales_agent`, :func:`make_tools`) is the same one the notebooks use.
"""

from __future__ import annotations

import csv
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any

import openai

from . import registry
from .approvals.request import find_decision
from .journal import Status, open_journal
from .llm.messages import assistant_message
from .runner import RunOptions, Runner
from .testing import LoopbackServer
from .llm.tools import Tool, tool

__all__ = ["SALES_CSV", "make_tools", "run_demo", "sales_agent"]

SALES_CSV = """region,month,revenue,units
North,Jul,12000,140
North,Aug,13500,151
North,Sep,12900,149
South,Jul,9800,120
South,Aug,10400,126
South,Sep,11900,133
West,Jul,15100,170
West,Aug,14800,166
West,Sep,16300,181
"""

SYSTEM_PROMPT = ("You are a careful data analyst. Use the tools to read the data, analyse it, "
                 "write a short report and email it to the team. Sending email needs approval.")
GOAL = "Write the Q3 sales report from sales.csv and email it to team@example.com."


def make_tools(workdir: str | os.PathLike) -> list[Tool]:
    """The agent's tools, working in ``workdir``. Each appends a line to
    ``side_effects.log`` there, so that a test can count how often each really ran."""
    root = Path(workdir)

    def log(line: str) -> None:
        with open(root / "side_effects.log", "a") as f:
            f.write(line + "\n")

    def load(path: str) -> list[dict[str, str]]:
        with open(root / path, newline="") as f:
            return list(csv.DictReader(f))

    @tool
    def read_csv(path: str) -> dict:
        """Read a CSV file and return its columns and first rows.

        Args:
            path: file name relative to the working directory
        """
        rows = load(path)
        log(f"read_csv {path}")
        return {"columns": list(rows[0]) if rows else [], "rows": len(rows), "head": rows[:3]}

    @tool
    def analyse(column: str) -> dict:
        """Total and monthly growth of a numeric column of sales.csv, by region.

        Args:
            column: the numeric column to analyse, e.g. revenue
        """
        totals: dict[str, float] = {}
        for row in load("sales.csv"):
            totals[row["region"]] = totals.get(row["region"], 0.0) + float(row[column])
        log(f"analyse {column}")
        best = max(totals, key=totals.__getitem__)
        return {"column": column, "total_by_region": totals, "best_region": best,
                "total": sum(totals.values())}

    @tool
    def write_report(title: str) -> str:
        """Write the report as markdown to report.md and return its path.

        Args:
            title: the report's title
        """
        totals: dict[str, float] = {}
        for row in load("sales.csv"):
            totals[row["region"]] = totals.get(row["region"], 0.0) + float(row["revenue"])
        lines = [f"# {title}", ""] + [f"- {region}: {value:,.0f}"
                                      for region, value in sorted(totals.items())]
        (root / "report.md").write_text("\n".join(lines) + "\n")
        log(f"write_report {title}")
        return "report.md"

    @tool(needs_approval=True)
    def send_email(ctx, to: str, subject: str) -> str:
        """Email the report. Needs a person's approval.

        Args:
            to: recipient address
            subject: the subject line
        """
        outbox = root / "outbox"
        outbox.mkdir(exist_ok=True)
        # ctx.step_id is stable across retries: a real mail API would get it as idempotency key.
        (outbox / f"{ctx.step_id.replace('/', '_').replace(':', '_')}.eml").write_text(
            f"To: {to}\nSubject: {subject}\n\n" + (root / "report.md").read_text())
        log(f"send_email {to}")
        return f"sent to {to}"

    return [read_csv, analyse, write_report, send_email]


def sales_agent(ctx: Any, tools: list[Tool], model: str = "loopback-1",
                client: Any = None) -> str:
    """The agent loop: chat, run the tool calls, repeat until the model answers in text."""
    messages: list[dict] = [{"role": "system", "content": SYSTEM_PROMPT},
                            {"role": "user", "content": GOAL}]
    schemas = [t.schema for t in tools]
    while True:
        reply = ctx.chat(model=model, messages=messages, tools=schemas,
                         **({"client": client} if client is not None else {}))
        message = reply.choices[0].message
        messages.append(assistant_message(message))
        if not message.tool_calls:
            return message.content
        messages += ctx.call_tools(message, tools)


class _PrintSteps:
    """Prints each step as it is replayed or executed (the demo's terminal 'panel')."""

    def on_step(self, entry: Any, replayed: bool) -> None:
        how = "replayed" if replayed else "executed"
        tokens = f"  ({entry.prompt_tokens}+{entry.completion_tokens} tokens)" \
            if entry.prompt_tokens else ""
        print(f"    {how:<9} step {entry.position}: {entry.kind} {entry.name}{tokens}", flush=True)

    def on_record(self, record: Any) -> None:
        if record.pending_approval:
            print(f"    waiting   approval for {record.pending_approval['name']}", flush=True)


def _agent_main(journal: str, url: str, workdir: str, crash_after: str | None) -> None:
    """The child process: run the agent; SIGKILL itself after the named tool's step.

    The model is ``$DURABLE_NB_MODEL`` (default the loopback one) and the key
    ``$OPENAI_API_KEY``, so that a notebook on a real model gets the same run. With a crash
    point the child never waits for a decision: a run already past that point (a second
    Run All of the notebook) is only replayed, and parks at a pending approval.
    """
    model = os.environ.get("DURABLE_NB_MODEL") or "loopback-1"
    client = openai.OpenAI(base_url=url, api_key=os.environ.get("OPENAI_API_KEY") or
                           "offline-demo", max_retries=0)
    observer = _PrintSteps()
    if crash_after:
        printer = observer.on_step

        def on_step(entry: Any, replayed: bool) -> None:
            printer(entry, replayed)
            if not replayed and entry.name == crash_after:
                os.kill(os.getpid(), signal.SIGKILL)

        observer.on_step = on_step  # type: ignore[method-assign]
    tools = make_tools(workdir)
    runner = Runner("sales-report",
                    lambda ctx: sales_agent(ctx, tools, model=model, client=client),
                    journal=journal, observer=observer,
                    options=RunOptions(title="Q3 sales report", max_iterations=10,
                                       poll_interval=0.05,
                                       on_approval="park" if crash_after else "wait"))
    outcome = runner.run()
    if outcome.record.pending_approval:
        print(f"    parked: the run waits for approval of "
              f"{outcome.record.pending_approval.get('name')!r}", flush=True)
    else:
        print(f"    result: {outcome.result}", flush=True)


def _spawn(journal: Path, url: str, workdir: Path, crash_after: str | None
           ) -> subprocess.Popen:
    args = [sys.executable, "-m", "durable_nb.demo", "--agent", str(journal), url, str(workdir)]
    return subprocess.Popen(args + ([crash_after] if crash_after else []))


def run_demo(directory: str | None = None) -> int:
    """Run the crash-and-resume demo in ``directory`` (a new temp dir by default)."""

    workdir = Path(directory or tempfile.mkdtemp(prefix="durable-nb-demo-"))
    workdir.mkdir(parents=True, exist_ok=True)
    (workdir / "sales.csv").write_text(SALES_CSV)
    journal_dir = workdir / ".durable_nb"
    print(f"durable_nb demo in {workdir} (offline: bundled loopback model, no API key)\n")
    with LoopbackServer() as server:
        print("1. The agent runs, and its process is killed (SIGKILL) right after write_report:")
        first = _spawn(journal_dir, server.url, workdir, "write_report")
        first.wait()
        print(f"   -> the process died with signal {-first.returncode}\n")
        print("2. Run it again: completed steps are replayed from the journal, then it goes on.")
        print("   The email needs approval; the demo approves it as a person would.")
        second = _spawn(journal_dir, server.url, workdir, None)
        journal = open_journal(journal_dir)
        while second.poll() is None:
            record = journal.find_run("sales-report")
            if record and record.status is Status.WAITING_APPROVAL and \
                    find_decision(journal, "sales-report", record.pending_approval) is None:
                time.sleep(0.5)
                registry.approve("sales-report", "ok to send", by="demo-user", journal=journal)
                print("    (approved by demo-user)", flush=True)
            time.sleep(0.05)
        info = registry.get_run("sales-report", journal=journal)
        by_round = server.stats()["by_round"]
        effects = Counter(line.split()[0] for line in
                          (workdir / "side_effects.log").read_text().splitlines())
    print(f"\n3. Outcome: {info.status}, {len(info.steps)} steps, {info.iteration} LLM calls, "
          f"{info.prompt_tokens}+{info.completion_tokens} tokens counted once.")
    print(f"   LLM requests per round: {json.dumps(by_round)}")
    print(f"   tool side effects:      {json.dumps(dict(effects))}")
    print(f"   report: {workdir / 'report.md'}   emails: {len(list((workdir / 'outbox').glob('*')))}")
    print(f"   inspect it: durable-nb --journal {journal_dir} show sales-report")
    repeated = [r for r, n in by_round.items() if n > 1]
    twice = [t for t, n in effects.items() if n > 1]
    print(f"   repeated after the crash: LLM rounds {repeated or 'none'}, tools {twice or 'none'}")
    return 0 if info.status is Status.DONE else 1


if __name__ == "__main__":
    if len(sys.argv) >= 5 and sys.argv[1] == "--agent":
        _agent_main(sys.argv[2], sys.argv[3], sys.argv[4],
                    sys.argv[5] if len(sys.argv) > 5 else None)
    else:
        sys.exit(run_demo(sys.argv[1] if len(sys.argv) > 1 else None))
