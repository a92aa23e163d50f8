"""Framework fuzzing: random OpenAI Agents SDK and Pydantic AI runs, SIGKILLed at random
points and resumed, must end as an uninterrupted reference run of the same scenario.

A scenario (:func:`scenarios`, a hypothesis strategy) is a framework (``agents``: the SDK
through :mod:`durable_nb.integrations.openai_agents`, over Chat Completions or the Responses
API, maybe starting with a handoff to the agent with the tools; ``pydantic``: Pydantic AI
through :mod:`durable_nb.integrations.pydantic_ai`), streamed or not, and the rounds the
loopback server scripts: each round 1-4 tool calls (parallel when more than one) of the
tools ``find``, ``book``, ``note`` and ``charge`` (which needs approval: approved when its
amount is even, rejected when odd, by the driver through :func:`durable_nb.approve` /
:func:`~durable_nb.reject` while the child waits), each call sleeping a random time so that
the framework's tool tasks finish in a random order, each round answered after a random
delay; then a final text. Every tool call appends ``pid step-key tool call-id`` to
``effects.log``. The kills are a list of points, one per attempt: "after the n-th step
this process journaled" (the child kills itself from the run's observer), "s seconds after
the child was ready" (the driver kills it: in the middle of a request, a stream, a tool,
an approval wait) or "once the server received round r's request" (the driver kills it
while the reply is delayed or streamed: the round in flight).

A trial runs the scenario uninterrupted (the reference), then again in a fresh journal and
server, killed at each point in turn and resumed until DONE. Children run with
``DURABLE_NB_VERIFY_REPLAY=1``: a run that finishes is replayed once more in pure replay
and must not need anything live. It passes when:

- the final output equals the reference's, and the run is DONE;
- the journal's steps (key, kind, name; tool results) equal the reference's: step keys are
  stable across processes, kills and tool finishing orders;
- every tool call of the script ran (its effect is in ``effects.log``; a rejected ``charge``
  never), under one step key. A key ran more than once only if each earlier execution was
  in a process killed before that step was journaled (in flight), and no process ran a step
  journaled before it started;
- the server counted each model round once, plus once per kill that ended a process which
  had sent that round's request without journaling its reply (the round in flight: its
  response was lost with the process, so the resumed run sends it again). The reference
  counts each round exactly once;
- no more invalid requests reached the server than there were kills (a request cut by a
  kill arrives truncated).

``--cross A,B`` runs the reference under interpreter A and again under B (the keys must be
equal), and the killed run under A (killed after steps only: a subprocess's clock starts
before its imports) then B (resumed): a journal written by one Python version resumes on
another with the same keys. Each interpreter needs the frameworks at the same versions.

Usage: ``python tests/fuzz/framework_fuzz.py --examples 100 [--seed N] [--framework
pydantic] [--cross A,B] [--scenario JSON]`` (``--scenario``: one scenario, as a failure
prints it). The quick variant in the suite is ``tests/test_framework_fuzz.py``.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

if __name__ == "__main__":  # run as a script: make `tests` and `durable_nb` importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from hypothesis import strategies as st

from durable_nb.journal import DiskJournal, Status
from durable_nb.testing import LoopbackServer, Reply, ToolCall
from tests import agent_process
from tests.agent_process import _run_child, _undecided, kill, new_event, start, wait_ready

RUN_ID = "framework"
MODEL = "loopback-1"
PROMPT = "Plan and book the trip."
TOOLS = ("find", "book", "note", "charge")
CHILD_TIMEOUT = 90.0
AFTER_EFFECT = 0.01  # seconds a tool waits after its effect, before its step is journaled
REPO_ROOT = Path(__file__).resolve().parents[2]

# Children fork from the forkserver: with the frameworks imported there once, a child starts
# in milliseconds instead of seconds (only if no earlier test started the forkserver).
agent_process.preload(["agents", "pydantic_ai", "pydantic_ai.models.openai",
                       "durable_nb.integrations.openai_agents",
                       "durable_nb.integrations.pydantic_ai", "tests.fuzz.framework_fuzz"])


# -- scenarios -------------------------------------------------------------------------------

def _call(tool: str, wait_ms: int, amount: int) -> dict:
    return {"tool": tool, "wait_ms": wait_ms, **({"amount": amount} if tool == "charge" else {})}


_calls = st.lists(st.builds(_call, st.sampled_from(TOOLS), st.integers(0, 40), st.integers(1, 9)),
                  min_size=1, max_size=4)
_kill = st.one_of(st.builds(lambda n: {"after_steps": n}, st.integers(1, 10)),
                  st.builds(lambda s: {"after_seconds": round(s, 3)}, st.floats(0.0, 0.6)),
                  st.builds(lambda r: {"during_round": r}, st.integers(0, 4)))


def _scenario(framework: str, streamed: bool, api: str, handoff: bool, rounds: list,
              delays: list, kills: list) -> dict:
    if framework == "pydantic" and streamed:
        # agent.run_stream leaves approvals to the caller (the integration answers them in
        # run() only): no charge there.
        rounds = [[dict(c, tool="note") if c["tool"] == "charge" else c for c in r]
                  for r in rounds]
    for r, calls in enumerate(rounds):
        for i, c in enumerate(calls):
            c["call"] = f"r{r}c{i}"
    return {"framework": framework, "streamed": streamed,
            "api": api if framework == "agents" else "chat",
            "handoff": handoff and framework == "agents", "rounds": rounds,
            "delays_ms": delays[:len(rounds) + 1] + [0] * (len(rounds) + 1 - len(delays)),
            "final": f"Trip planned in {len(rounds)} rounds.", "kills": kills}


def scenarios(frameworks: tuple[str, ...] = ("agents", "pydantic"), max_rounds: int = 4,
              max_kills: int = 3) -> st.SearchStrategy[dict]:
    """Random framework runs (see the module docstring)."""
    return st.builds(_scenario, st.sampled_from(frameworks), st.booleans(),
                     st.sampled_from(["chat", "responses"]), st.booleans(),
                     st.lists(_calls, min_size=1, max_size=max_rounds),
                     st.lists(st.integers(0, 60), max_size=max_rounds + 1),
                     st.lists(_kill, min_size=1, max_size=max_kills))


def script(scenario: dict) -> list[Reply]:
    """The loopback server's replies: the handoff (if any), one per round, the final text."""
    delays = [d / 1000 for d in scenario["delays_ms"]]
    handoff = [Reply(tool_calls=[ToolCall("transfer_to_planner", {})])] \
        if scenario.get("handoff") else []
    replies = [Reply(tool_calls=[ToolCall(c["tool"], _arguments(c)) for c in calls],
                     delay=delays[r]) for r, calls in enumerate(scenario["rounds"])]
    return handoff + replies + [Reply(content=scenario["final"], delay=delays[-1])]


def model_rounds(scenario: dict) -> int:
    """How many model calls the run makes: the handoff, the rounds, the final text."""
    return scenario.get("handoff", False) + len(scenario["rounds"]) + 1


def _arguments(call: dict) -> dict:
    args = {"call": call["call"], "wait_ms": call["wait_ms"]}
    return dict(args, amount=call["amount"]) if call["tool"] == "charge" else args


def approved(arguments: dict) -> bool:
    """The driver's decision on a ``charge``: approve an even amount, reject an odd one."""
    return arguments.get("amount", 0) % 2 == 0


def expected_calls(scenario: dict) -> set[str]:
    """The call ids whose effect must happen (once): all but the rejected charges."""
    return {c["call"] for calls in scenario["rounds"] for c in calls
            if c["tool"] != "charge" or approved(c)}


# -- the child -------------------------------------------------------------------------------

class _KillAfterSteps:
    """Observer: SIGKILL this process right after the journal write of its ``n``-th live
    step."""

    def __init__(self, n: int | None) -> None:
        self.left = n

    def on_step(self, entry: Any, replayed: bool) -> None:
        if self.left is None or replayed:
            return
        self.left -= 1
        if self.left == 0:
            os.kill(os.getpid(), signal.SIGKILL)

    def on_record(self, record: Any) -> None:
        pass


def _effect(workdir: Path, tool: str, call: str) -> None:
    from durable_nb.context import current_context

    key = current_context().step_id.split(":", 1)[1]
    with open(workdir / "effects.log", "a") as f:
        f.write(f"{os.getpid()} {key} {tool} {call}\n")


def _tool_functions(workdir: Path) -> list[Any]:
    """The four tools as async functions (the frameworks run a sync one on a thread, where
    ctx, which the effect reads its step key from, is not available): each sleeps
    ``wait_ms``, then records its effect, then waits :data:`AFTER_EFFECT`."""
    import asyncio

    async def act(name: str, call: str, wait_ms: int) -> str:
        await asyncio.sleep(wait_ms / 1000)
        _effect(workdir, name, call)
        # widens the window "effect done, step not journaled" for the kills
        await asyncio.sleep(AFTER_EFFECT)
        return f"{name} {call} ok"

    async def find(call: str, wait_ms: int) -> str:
        """Find options."""
        return await act("find", call, wait_ms)

    async def book(call: str, wait_ms: int) -> str:
        """Book one."""
        return await act("book", call, wait_ms)

    async def note(call: str, wait_ms: int) -> str:
        """Take a note."""
        return await act("note", call, wait_ms)

    async def charge(call: str, wait_ms: int, amount: int) -> str:
        """Charge the card (needs approval)."""
        return await act("charge", call, wait_ms)

    return [find, book, note, charge]


def _agents_handler(scenario: dict, workdir: Path) -> Any:
    from agents import Agent, function_tool

    from durable_nb.integrations.openai_agents import run, run_streamed

    tools = [function_tool(f, needs_approval=f.__name__ == "charge")
             for f in _tool_functions(workdir)]
    agent = Agent(name="planner", instructions="Plan the trip.", model=MODEL, tools=tools)
    if scenario.get("handoff"):
        agent = Agent(name="triage", instructions="Hand off.", model=MODEL, handoffs=[agent])

    async def handler(ctx: Any) -> Any:
        api = scenario.get("api", "chat")
        if not scenario["streamed"]:
            return (await run(ctx, agent, PROMPT, api=api)).final_output
        stream = run_streamed(ctx, agent, PROMPT, api=api)
        async for _ in stream.stream_events():
            pass
        return stream.final_output

    return handler


def _pydantic_handler(scenario: dict, workdir: Path) -> Any:
    from pydantic_ai import Agent

    from durable_nb.integrations.pydantic_ai import JournaledTools, durable_model, run

    agent = Agent(instructions="Plan the trip.", name="planner")

    for f in _tool_functions(workdir):
        agent.tool_plain(requires_approval=f.__name__ == "charge")(f)

    async def handler(ctx: Any) -> Any:
        if not scenario["streamed"]:
            return (await run(ctx, agent, PROMPT)).output
        async with agent.run_stream(PROMPT, model=durable_model(ctx, MODEL),
                                    capabilities=[JournaledTools(ctx)]) as result:
            return "".join([piece async for piece in result.stream_text(delta=True)])

    return handler


def fuzz_child(scenario_json: str, journal_dir: str, url: str, workdir: str,
               kill_after_steps: int | None, ready: Any = None) -> None:
    """Process target: run the scenario as run ``framework`` (result.json / error.txt),
    with the always-replay check; SIGKILLed after its ``kill_after_steps``-th live step.
    Sets ``ready`` just before the run starts."""
    import openai

    from durable_nb.runner import RunOptions, Runner

    scenario = json.loads(scenario_json)
    root = Path(workdir)
    handler = (_agents_handler if scenario["framework"] == "agents"
               else _pydantic_handler)(scenario, root)
    client = openai.AsyncOpenAI(base_url=url, api_key="offline", max_retries=0)
    runner = Runner(RUN_ID, handler, journal=journal_dir,
                    observer=_KillAfterSteps(kill_after_steps),
                    options=RunOptions(client=client, model=MODEL, poll_interval=0.02,
                                       verify_replay=True))
    if ready is not None:
        ready.set()
    _run_child(workdir, lambda: runner.run().result)


# -- driving a run ---------------------------------------------------------------------------

@dataclass
class Attempt:
    """One process of a run: which keys were journaled when it started and when it ended,
    the chat rounds the server had counted then, and whether it was killed."""

    pid: int
    journaled_before: set[str]
    journaled_after: set[str] = field(default_factory=set)
    rounds_before: dict[str, int] = field(default_factory=dict)
    rounds_after: dict[str, int] = field(default_factory=dict)
    chats_after: int = 0
    killed: bool = False


@dataclass
class Outcome:
    result: Any
    status: Any
    steps: dict[str, tuple]  # key -> (kind, name, tool result)
    effects: list[tuple[int, str, str, str]]  # (pid, key, tool, call)
    by_round: dict[str, int]
    invalid: int
    attempts: list[Attempt]
    problems: list[str] = field(default_factory=list)

    @property
    def kills(self) -> int:
        return sum(a.killed for a in self.attempts)


def _steps(journal: DiskJournal) -> dict[str, tuple]:
    if journal.find_run(RUN_ID) is None:
        return {}
    return {e.key: (e.kind, e.name, e.result if e.kind == "run" else None)
            for e in journal.steps(RUN_ID)}


def _effects(workdir: Path) -> list[tuple[int, str, str, str]]:
    log = workdir / "effects.log"
    if not log.exists():
        return []
    return [(int(pid), key, tool, call) for pid, key, tool, call in
            (line.split() for line in log.read_text().splitlines())]


def _decide_pending(journal: DiskJournal) -> None:
    """Approve or reject the run's pending approval as :func:`approved` says."""
    from durable_nb import approve, reject

    if not _undecided(journal, RUN_ID):
        return
    details = journal.get_run(RUN_ID).pending_approval["details"]
    (approve if approved(details["arguments"]) else reject)(RUN_ID, by="fuzz", journal=journal)


class _Child:
    """A child process: forked from the forkserver (this interpreter), or a subprocess of
    another interpreter (``python``) for the cross-version runs."""

    def __init__(self, python: str | None, scenario: dict, journal_dir: Path, url: str,
                 workdir: Path, kill_after_steps: int | None) -> None:
        self.process: Any
        args = (json.dumps(scenario), str(journal_dir), url, str(workdir), kill_after_steps)
        if python is None:
            ready = new_event()
            self.process = start(fuzz_child, *args, ready)
            self.ready = lambda: wait_ready(self.process, ready, CHILD_TIMEOUT)
        else:
            env = dict(os.environ, PYTHONPATH=str(REPO_ROOT), DURABLE_NB_VERIFY_REPLAY="1")
            self.process = subprocess.Popen(
                [python, str(Path(__file__).resolve()), "--child", json.dumps(list(args))],
                env=env, cwd=str(REPO_ROOT))
            self.ready = lambda: True

    @property
    def pid(self) -> int:
        return self.process.pid

    def alive(self) -> bool:
        return (self.process.is_alive() if hasattr(self.process, "is_alive")
                else self.process.poll() is None)

    def kill(self) -> bool:
        if hasattr(self.process, "is_alive"):
            return kill(self.process)
        alive = self.process.poll() is None
        if alive:
            self.process.kill()
        self.process.wait()
        return alive

    def exitcode(self) -> int | None:
        return (self.process.exitcode if hasattr(self.process, "exitcode")
                else self.process.returncode)


def execute(scenario: dict, workdir: Path, kills: list[dict], *,
            pythons: list[str | None] | None = None) -> Outcome:
    """Run the scenario to DONE in ``workdir`` against a server of its own, one process per
    kill point in ``kills`` then one to finish (``pythons[i]``, when given, is the
    interpreter of attempt i, the last one for the rest)."""
    workdir.mkdir(parents=True, exist_ok=True)
    journal_dir = workdir / "journal"
    journal = DiskJournal(journal_dir)
    attempts: list[Attempt] = []
    problems: list[str] = []
    try:
        with LoopbackServer(script(scenario)) as server:
            while True:
                n = len(attempts)
                point = kills[n] if n < len(kills) else {}
                python = pythons[min(n, len(pythons) - 1)] if pythons else None
                for name in ("result.json", "error.txt"):
                    (workdir / name).unlink(missing_ok=True)
                before = set(_steps(journal))
                rounds = server.stats()["by_round"]
                child = _Child(python, scenario, journal_dir, server.url, workdir,
                               point.get("after_steps"))
                attempt = Attempt(child.pid, before, rounds_before=rounds)
                attempts.append(attempt)
                child.ready()  # False when it exited first: the loop below just reaps it
                deadline = time.monotonic() + CHILD_TIMEOUT
                kill_at = (time.monotonic() + point["after_seconds"]
                           if "after_seconds" in point else None)
                during = str(point.get("during_round"))
                while child.alive():
                    if kill_at is not None and time.monotonic() >= kill_at or \
                            server.count(round=point.get("during_round", -1)) > \
                            rounds.get(during, 0):
                        child.kill()
                        break
                    _decide_pending(journal)
                    if time.monotonic() > deadline:
                        child.kill()
                        problems.append(f"attempt {n} did not finish in {CHILD_TIMEOUT:g} s")
                        break
                    time.sleep(0.005)
                child.kill()  # reap
                attempt.killed = child.exitcode() == -signal.SIGKILL
                attempt.journaled_after = set(_steps(journal))
                attempt.rounds_after = server.stats()["by_round"]
                attempt.chats_after = sum(1 for kind, _, _ in _steps(journal).values()
                                          if kind in ("chat", "respond"))
                if problems:
                    break
                if attempt.killed:
                    if len(attempts) > len(kills) + 3:
                        problems.append("killed more often than planned")
                        break
                    continue
                break
            stats = server.stats()
        error = workdir / "error.txt"
        if error.exists():
            problems.append(f"the run failed: {error.read_text()[-3000:]}")
        result = (json.loads((workdir / "result.json").read_text())["result"]
                  if (workdir / "result.json").exists() else None)
        record = journal.find_run(RUN_ID)
        return Outcome(result, record.status if record else None, _steps(journal),
                       _effects(workdir), stats["by_round"], stats["invalid"], attempts,
                       problems)
    finally:
        journal.close()


# -- checks ----------------------------------------------------------------------------------

def check_reference(scenario: dict, reference: Outcome) -> list[str]:
    """The uninterrupted run: DONE, every expected call once, every round once."""
    problems = [f"reference: {p}" for p in reference.problems]
    if reference.status is not Status.DONE:
        problems.append(f"reference ended {reference.status}")
    calls = Counter(call for _, _, _, call in reference.effects)
    if calls != Counter(expected_calls(scenario)):
        problems.append(f"reference effects {dict(calls)} != once each of "
                        f"{sorted(expected_calls(scenario))}")
    rounds = model_rounds(scenario)
    if reference.by_round != {str(r): 1 for r in range(rounds)}:
        problems.append(f"reference rounds {reference.by_round}, not once each of {rounds}")
    return problems


def check_resumed(scenario: dict, reference: Outcome, resumed: Outcome) -> list[str]:
    """The killed-and-resumed run against the reference (see the module docstring)."""
    problems = list(resumed.problems)
    if resumed.status is not Status.DONE:
        problems.append(f"the resumed run ended {resumed.status}")
    if resumed.result != reference.result:
        problems.append(f"output {resumed.result!r} != reference {reference.result!r}")
    if resumed.steps != reference.steps:
        differing = sorted(k for k in set(resumed.steps) | set(reference.steps)
                           if resumed.steps.get(k) != reference.steps.get(k))
        problems.append("journaled steps differ from the reference at "
                        + "; ".join(f"{k}: {resumed.steps.get(k)} vs {reference.steps.get(k)}"
                                    for k in differing[:6]))
    problems += _check_effects(scenario, resumed)
    problems += _check_rounds(scenario, resumed)
    if resumed.invalid > resumed.kills:
        problems.append(f"{resumed.invalid} invalid requests, more than the {resumed.kills} "
                        f"kills explain")
    return problems


def _check_effects(scenario: dict, outcome: Outcome) -> list[str]:
    problems = []
    by_pid = {a.pid: a for a in outcome.attempts}
    keys_of: dict[str, set[str]] = {}
    runs: Counter = Counter()
    for pid, key, tool, call in outcome.effects:
        keys_of.setdefault(call, set()).add(key)
        runs[key] += 1
        attempt = by_pid.get(pid)
        if attempt is None:
            problems.append(f"effect of {call} by unknown process {pid}")
        elif key in attempt.journaled_before:
            problems.append(f"{tool} {call} (step {key}) was journaled before process {pid} "
                            f"started and ran again in it")
    if set(keys_of) != expected_calls(scenario):
        problems.append(f"calls that ran: {sorted(keys_of)}, expected "
                        f"{sorted(expected_calls(scenario))}")
    for call, keys in sorted(keys_of.items()):
        if len(keys) > 1:
            problems.append(f"call {call} ran under different step keys {sorted(keys)}")
    for key, times in runs.items():
        # Once, plus once per killed process that ran it and died before journaling it.
        in_flight = sum(1 for a in outcome.attempts if a.killed
                        and key not in a.journaled_after
                        and any(p == a.pid and k == key for p, k, _, _ in outcome.effects))
        if times > 1 + in_flight:
            problems.append(f"step {key} ran {times} times, {1 + in_flight} allowed")
    return problems


def _check_rounds(scenario: dict, outcome: Outcome) -> list[str]:
    problems = []
    for r in range(model_rounds(scenario)):
        count = outcome.by_round.get(str(r), 0)
        # A round's request lost with its process: sent by a killed attempt that had not
        # journaled it (at most `r` model steps journaled when it died).
        in_flight = sum(1 for a in outcome.attempts if a.killed and a.chats_after <= r
                        and a.rounds_after.get(str(r), 0) > a.rounds_before.get(str(r), 0))
        if not 1 <= count <= 1 + in_flight:
            problems.append(f"round {r} counted {count} times at the server, 1 to "
                            f"{1 + in_flight} allowed ({in_flight} in flight at a kill)")
    return problems


#: Totals over the trials of this process, for the report line.
TOTALS: Counter = Counter()


def check_scenario(scenario: dict, root: Path, *, pythons: tuple[str | None, str | None]
                   = (None, None)) -> list[str]:
    """One trial: the reference run (under ``pythons[0]``), then the killed-and-resumed one
    (killed under ``pythons[0]``, resumed under ``pythons[1]``); the problems found."""
    kills = scenario["kills"]
    if pythons[0] != pythons[1]:
        # A subprocess is timed from its start, imports included: kill it from inside.
        kills = [k for k in kills if "after_steps" in k] or [{"after_steps": 1}]
    reference = execute(scenario, root / "reference", [], pythons=[pythons[0]])
    problems = check_reference(scenario, reference)
    if pythons[0] != pythons[1]:
        other = execute(scenario, root / "reference-other", [], pythons=[pythons[1]])
        problems += check_reference(scenario, other)
        if other.steps != reference.steps:
            problems.append(f"the step keys differ between the interpreters: "
                            f"{sorted(set(other.steps) ^ set(reference.steps))}")
    if problems:
        return problems
    resumed = execute(scenario, root / "resumed", kills,
                      pythons=[pythons[0]] * len(kills) + [pythons[1]])
    TOTALS.update(scenarios=1, kills=resumed.kills, steps=len(reference.steps),
                  **{f"framework_{scenario['framework']}": 1})
    TOTALS["streamed"] += scenario["streamed"]
    TOTALS["responses_api"] += scenario.get("api") == "responses"
    TOTALS["handoffs"] += scenario.get("handoff", False)
    TOTALS["approvals"] += sum(c["tool"] == "charge" for r in scenario["rounds"] for c in r)
    TOTALS["parallel_rounds"] += sum(len(r) > 1 for r in scenario["rounds"])
    TOTALS["rounds_resent"] += sum(resumed.by_round.values()) - model_rounds(scenario)
    TOTALS["tools_rerun_in_flight"] += len(resumed.effects) - len(reference.effects)
    return check_resumed(scenario, reference, resumed)


def main(argv: list[str] | None = None) -> int:
    from hypothesis import HealthCheck, Phase, given, settings
    from hypothesis import seed as hypothesis_seed

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--examples", type=int, default=100)
    parser.add_argument("--seed", type=int, default=None)
    parser.add_argument("--framework", choices=["agents", "pydantic"], action="append",
                        help="only these frameworks (repeatable; default: both)")
    parser.add_argument("--cross", default=None,
                        help="A,B: reference and kills under interpreter A, resumed under B")
    parser.add_argument("--scenario", default=None,
                        help="run this one scenario (JSON, as a failure prints it) instead")
    parser.add_argument("--dir", default=None,
                        help="trial directories here, kept (default: a temp dir, removed "
                             "when every scenario passed)")
    parser.add_argument("--child", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:  # a cross-version child: python framework_fuzz.py --child '[args]'
        try:
            fuzz_child(*json.loads(args.child))
        except Exception:
            return 1
        return 0
    chosen = args.seed if args.seed is not None else random.SystemRandom().randrange(2**32)
    pythons = tuple(args.cross.split(",")) if args.cross else (None, None)
    root = Path(args.dir or tempfile.mkdtemp(prefix="durable-nb-framework-fuzz-"))
    print(f"framework fuzz: {'1 given' if args.scenario else args.examples} scenarios, "
          f"seed {chosen}, dir {root}"
          + (f", reference on {pythons[0]}, resumed on {pythons[1]}" if args.cross else ""),
          flush=True)
    examples = iter(range(10**9))
    failures: list[str] = []
    if args.scenario:
        problems = check_scenario(json.loads(args.scenario), root / "0", pythons=pythons)
        print("\n".join(problems) or "passed", dict(TOTALS), flush=True)
        return 1 if problems else 0

    @hypothesis_seed(chosen)
    @settings(max_examples=args.examples, deadline=None, database=None,
              phases=[Phase.generate], suppress_health_check=list(HealthCheck))
    @given(scenario=scenarios(tuple(args.framework or ("agents", "pydantic"))))
    def trial(scenario: dict) -> None:
        i = next(examples)
        problems = check_scenario(scenario, root / str(i), pythons=pythons)
        if problems:
            failures.append(f"scenario {i} ({root / str(i)}): " + "\n  ".join(problems)
                            + f"\n  scenario: {json.dumps(scenario)}")
            print(f"FAIL {failures[-1]}", flush=True)
        elif (i + 1) % 10 == 0:
            print(f"  {i + 1} scenarios, {len(failures)} failures, {dict(TOTALS)}", flush=True)

    started = time.monotonic()
    trial()
    print(" ".join(f"{k}={v}" for k, v in sorted(TOTALS.items()))
          + f" failures={len(failures)} seconds={time.monotonic() - started:.0f} seed={chosen}",
          flush=True)
    if not failures and not args.dir:
        shutil.rmtree(root)
    return 1 if failures else 0


if __name__ == "__main__":
    # Through the module, so that the children's target pickles as tests.fuzz.framework_fuzz
    # (which the forkserver has imported), not as __main__.
    from tests.fuzz.framework_fuzz import main as _main

    sys.exit(_main())
