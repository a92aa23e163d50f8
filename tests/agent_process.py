"""Agent loops run in real child processes, for the crash tests.

A child is forked from a multiprocessing *forkserver* that has imported openai and durable_nb
once, so starting one costs milliseconds instead of the ~0.7 s of a fresh interpreter; it is
still its own OS process, killed with a real SIGKILL (by itself at a named point, or by the
test). Each child writes ``result.json`` (what its execution returned) when it finishes and
``error.txt`` when it raises, so the test sees both without reading the child's stderr.

Two agents:

- :func:`demo_child`: the demo's sales agent (:func:`durable_nb.demo.sales_agent`, whose tools
  append to ``side_effects.log``) with kill hooks: ``tool-entry:NAME`` (before the tool's side
  effect), ``tool-exit:NAME`` (after it, before the step's journal write) and
  ``after-step:N`` (right after step N's journal write). A hook fires only while its marker
  file does not exist, so the kill happens on the first attempt only.
- :func:`fuzz_child`: many small steps (``FUZZ_ROUNDS`` rounds of a chat, ``FUZZ_CALLS``
  tool calls and a tally step); every ``ctx.run`` step appends its ``ctx.step_id`` to
  ``steps.log`` before returning, so a step executed twice shows up by id.
"""

from __future__ import annotations

import dataclasses
import json
import multiprocessing
import multiprocessing.forkserver
import os
import signal
import threading
import time
import traceback
from pathlib import Path
from typing import Any, Callable

from durable_nb import approve
from durable_nb.approvals.request import find_decision
from durable_nb.journal import Journal, Status
from durable_nb.testing import Reply, ToolCall
from durable_nb.llm.tokens import encoding_for
from durable_nb.llm.tools import Tool, tool

REPO_ROOT = Path(__file__).resolve().parents[1]
DEMO_RUN_ID = "sales-report"
FUZZ_RUN_ID = "fuzz"
FUZZ_ROUNDS = 6
FUZZ_CALLS = 3
FUZZ_ANSWER = "All six rounds are done."
MODEL = "loopback-1"

_PRELOAD = ["openai", "durable_nb", "durable_nb.demo", "tests.agent_process"]
_fork_lock = threading.Lock()
_fork_context: Any = None

# The forkserver imports this module, so loading the tokenizer (which ctx.chat's budget check
# uses) here saves every forked child ~0.2 s.
encoding_for(MODEL)


# --- starting and driving children ------------------------------------------------------

def _context() -> Any:
    """The forkserver context, its server started with this repo importable (Python 3.11's
    forkserver ignores the parent's sys.path, so the path goes in through PYTHONPATH)."""
    global _fork_context
    with _fork_lock:
        if _fork_context is None:
            context = multiprocessing.get_context("forkserver")
            context.set_forkserver_preload(_PRELOAD)
            saved = os.environ.get("PYTHONPATH")
            os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO_ROOT), saved) if p)
            try:
                multiprocessing.forkserver.ensure_running()
            finally:
                if saved is None:
                    del os.environ["PYTHONPATH"]
                else:
                    os.environ["PYTHONPATH"] = saved
            _fork_context = context
        return _fork_context


def preload(modules: list[str]) -> None:
    """Have the forkserver import ``modules`` too, if it has not started yet: a child then
    starts without importing them itself (once it runs, children import them as usual)."""
    with _fork_lock:
        if _fork_context is None:
            _PRELOAD.extend(m for m in modules if m not in _PRELOAD)


def start(target: Callable[..., None], *args: Any) -> multiprocessing.Process:
    """Start ``target(*args)`` in a new child process (forked from the forkserver)."""
    process = _context().Process(target=target, args=args, daemon=True)
    process.start()
    return process


def new_event() -> Any:
    """An event a child can set (for :func:`fuzz_child`'s ``ready``)."""
    return _context().Event()


def wait_ready(process: multiprocessing.Process, ready: Any, timeout: float = 60.0) -> bool:
    """Wait until the child set ``ready``; False if it exited or timed out first."""
    deadline = time.monotonic() + timeout
    while not ready.wait(0.01):
        if not process.is_alive() or time.monotonic() > deadline:
            return ready.is_set()
    return True


def kill(process: multiprocessing.Process) -> bool:
    """SIGKILL the child and reap it; True if it was still running when the signal went out."""
    alive = process.exitcode is None and process.is_alive()
    if alive:
        os.kill(process.pid, signal.SIGKILL)
    process.join()
    return alive


def read_result(workdir: Path) -> Any:
    """What the last child that finished returned (``result.json``); AssertionError with the
    child's traceback if it raised."""
    error = workdir / "error.txt"
    if error.exists():
        raise AssertionError(f"the agent child raised:\n{error.read_text()}")
    return json.loads((workdir / "result.json").read_text())["result"]


def drive(process: multiprocessing.Process, journal: Journal, run_id: str, *,
          approve_waits: bool = True,
          kill_when: Callable[[], bool] | None = None,
          timeout: float = 60.0) -> tuple[int, int]:
    """Watch the child until it exits; approve its pending approvals as a person would (when
    ``approve_waits``), or SIGKILL it as soon as ``kill_when()`` is true.

    Returns (exit code, approvals given). Raises TimeoutError (after killing the child) if
    it does not end within ``timeout`` seconds.
    """
    approvals = 0
    deadline = time.monotonic() + timeout
    while process.is_alive():
        if kill_when is not None and kill_when():
            kill(process)
            break
        if approve_waits and _undecided(journal, run_id):
            approve(run_id, "approved by the crash test", by="crash-test", journal=journal)
            approvals += 1
        if time.monotonic() > deadline:
            kill(process)
            raise TimeoutError(f"the agent child did not finish within {timeout:g} s")
        time.sleep(0.01)
    process.join()
    return process.exitcode, approvals


def _undecided(journal: Journal, run_id: str) -> bool:
    """Whether the run waits for an approval nobody decided. The record is read again after
    the decision: a decision the run took stays in the journal (stamped ``taken_at``), so
    this never approves twice (a second approval would be refused: DecisionExists)."""
    record = journal.find_run(run_id)
    if record is None or record.status is not Status.WAITING_APPROVAL:
        return False
    pending = record.pending_approval
    if find_decision(journal, run_id, pending) is not None:
        return False
    again = journal.find_run(run_id)
    return again.status is Status.WAITING_APPROVAL and again.pending_approval == pending


def _run_child(workdir: str, run: Callable[[], Any]) -> None:
    """Run the agent and leave its outcome in ``workdir`` (result.json or error.txt)."""
    root = Path(workdir)
    try:
        value = run()
    except BaseException:
        (root / "error.txt").write_text(traceback.format_exc())
        raise
    tmp = root / "result.json.tmp"
    tmp.write_text(json.dumps({"result": value}))
    tmp.replace(root / "result.json")


def kill_once(marker: Path) -> None:
    """SIGKILL this process unless ``marker`` exists; create it first, so that the next
    attempt goes past this point."""
    try:
        fd = os.open(marker, os.O_CREAT | os.O_EXCL | os.O_WRONLY)
    except FileExistsError:
        return
    os.close(fd)
    os.kill(os.getpid(), signal.SIGKILL)


# --- the demo agent with kill hooks ------------------------------------------------------

def _hooked(t: Tool, workdir: Path, kills: list[str]) -> Tool:
    entry, exit_ = f"tool-entry:{t.name}" in kills, f"tool-exit:{t.name}" in kills
    if not (entry or exit_):
        return t
    original = t.fn

    def fn(*args: Any, **kwargs: Any) -> Any:
        if entry:
            kill_once(workdir / f"killed-tool-entry-{t.name}")
        value = original(*args, **kwargs)
        if exit_:
            kill_once(workdir / f"killed-tool-exit-{t.name}")
        return value

    return dataclasses.replace(t, fn=fn)


class _KillAfterStep:
    """Observer: SIGKILL right after the journal write of the named step positions."""

    def __init__(self, workdir: Path, positions: set[int]) -> None:
        self.workdir = workdir
        self.positions = positions

    def on_step(self, entry: Any, replayed: bool) -> None:
        if not replayed and entry.position in self.positions:
            kill_once(self.workdir / f"killed-after-step-{entry.position}")

    def on_record(self, record: Any) -> None:
        pass


def demo_child(journal_dir: str, url: str, workdir: str, kills: list[str]) -> None:
    """Process target: run the demo's sales agent as run ``sales-report`` with kill hooks."""
    import openai

    from durable_nb.demo import make_tools, sales_agent
    from durable_nb.runner import RunOptions, Runner

    root = Path(workdir)
    client = openai.OpenAI(base_url=url, api_key="offline", max_retries=0)
    tools = [_hooked(t, root, kills) for t in make_tools(root)]
    after = {int(k.split(":", 1)[1]) for k in kills if k.startswith("after-step:")}
    runner = Runner(DEMO_RUN_ID, lambda ctx: sales_agent(ctx, tools, model=MODEL, client=client),
                    journal=journal_dir, observer=_KillAfterStep(root, after),
                    options=RunOptions(title="Q3 sales report", max_iterations=10,
                                       poll_interval=0.05))
    _run_child(workdir, lambda: runner.run().result)


# --- the fuzz agent: many small steps, each logged by step id ----------------------------

def fuzz_script() -> list[Reply]:
    """The loopback server's replies for :func:`fuzz_child`: FUZZ_ROUNDS rounds of
    FUZZ_CALLS tool calls, then the final answer."""
    tools = ("add", "multiply", "echo")
    rounds = [Reply(tool_calls=[
        ToolCall(tools[i % 3], {"text": f"r{r}c{i}"} if tools[i % 3] == "echo"
                 else {"a": r + 1, "b": i + 2})
        for i in range(FUZZ_CALLS)]) for r in range(FUZZ_ROUNDS)]
    return rounds + [Reply(content=FUZZ_ANSWER)]


def _effect(ctx: Any, log: Path, value: Any, pause: float) -> Any:
    # The pauses widen the windows before and after the side effect, so random kills land
    # in both: "before the effect" and "after it, before the journal write".
    time.sleep(pause)
    with open(log, "a") as f:
        f.write(f"{ctx.step_id}\n")
    time.sleep(pause)
    return value


def make_fuzz_tools(log: Path, pause: float) -> list[Tool]:
    """Three tools whose every execution appends its step id to ``log``."""

    @tool
    def add(ctx, a: int, b: int) -> int:
        """Add two integers.

        Args:
            a: first addend
            b: second addend
        """
        return _effect(ctx, log, a + b, pause)

    @tool
    def multiply(ctx, a: int, b: int) -> int:
        """Multiply two integers.

        Args:
            a: first factor
            b: second factor
        """
        return _effect(ctx, log, a * b, pause)

    @tool
    def echo(ctx, text: str) -> str:
        """Return the text upper-cased.

        Args:
            text: any text
        """
        return _effect(ctx, log, text.upper(), pause)

    return [add, multiply, echo]


def fuzz_agent(ctx: Any, tools: list[Tool], client: Any, log: Path, pause: float) -> dict:
    """Chat, run the tool calls, tally them in a ``ctx.run`` step, count rounds in
    ``ctx.state``; repeat until the model answers in text."""
    messages: list[dict] = [
        {"role": "system", "content": "Use the tools as asked, one round at a time."},
        {"role": "user", "content": "Do the six rounds of arithmetic."}]
    schemas = [t.schema for t in tools]
    tallies = []
    while True:
        reply = ctx.chat(model=MODEL, messages=messages, tools=schemas, client=client)
        message = reply.choices[0].message
        messages.append(message.model_dump(exclude_none=True))
        if not message.tool_calls:
            return {"answer": message.content, "tallies": tallies, "tokens": ctx.tokens.total,
                    "rounds": ctx.state.get("rounds")}
        results = ctx.call_tools(message, tools)
        messages += results
        contents = [m["content"] for m in results]
        tallies.append(ctx.run("tally", lambda: _effect(ctx, log, contents, pause)))
        ctx.state["rounds"] = len(tallies)


def fuzz_child(journal_dir: str, url: str, workdir: str, pause: float, ready: Any) -> None:
    """Process target: run :func:`fuzz_agent` as run ``fuzz``; step ids go to steps.log.
    Sets ``ready`` just before the run starts, so that a killer times its kill from there."""
    import openai

    from durable_nb.runner import RunOptions, Runner

    root = Path(workdir)
    client = openai.OpenAI(base_url=url, api_key="offline", max_retries=0)
    log = root / "steps.log"
    tools = make_fuzz_tools(log, pause)
    runner = Runner(FUZZ_RUN_ID, lambda ctx: fuzz_agent(ctx, tools, client, log, pause),
                    journal=journal_dir, options=RunOptions(title="crash fuzz",
                                                            poll_interval=0.05))
    ready.set()
    _run_child(workdir, lambda: runner.run().result)
