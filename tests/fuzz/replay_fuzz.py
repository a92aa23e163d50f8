"""Replay fuzzing: random agent programs, SIGKILLed at random moments and resumed, must end
exactly as an uninterrupted reference run of the same program.

A program (:func:`programs`, a hypothesis strategy) mixes ``ctx.run``, ``ctx.chat`` against the
loopback server, ``asyncio.gather`` of multi-step branches with random delays (``run_async``,
``chat_async``), steps in a task or under ``asyncio.wait_for``, parallel tool calls (tools
that take ``ctx`` make steps of their own), steps nested in steps, caught exceptions
(KeyError, ValueError, an exception with a two-argument constructor), a step that fails the
run once, and approvals. Step names repeat across
branches on purpose: equal names in concurrent branches are where a replay by position would
silently swap results.

Each step's function returns a value derived from its own step id and arguments, and logs
``pid key`` before it does, so values differ from step to step and every execution is on
record. A trial runs the program once without kills (the reference), then again in another
journal, SIGKILLing the child process at random points of its journal and resuming it until
it is DONE. A kill point is where the child writes an entry chosen at random among those
still to come: just before the write (its step ran, its entry is never written) or just
after it; a child that would record the run DONE before reaching its point dies there
instead. So every kill drawn lands, however loaded the machine. It passes when:

- the result (every value the program observed, by place in the program) equals the
  reference's, and so do the journaled steps (key -> kind, name, outcome) and the tokens;
- no step that was journaled before a kill was executed again by a later process (a step in
  flight at a kill may run again: its entry was never written);
- after every kill each entry reads back and positions are exactly 0..n-1.

With ``--changes``, each program is killed once and executed again as a changed program
(see *program changes* below): it must end as the changed program uninterrupted or be
refused with a divergence error, and no step journaled before the kill may run again.

With ``--edits``, each program is executed again (after a kill, or after it finished) with
``on_change="rerun"`` and one step inside a branch of a gather edited (see *edits inside
concurrent tasks* below): it must end as the edited program uninterrupted, and the steps of
the other branches, whose tasks existed before the edited step completed, replay; a task that
another branch creates once the edited step completed, whose step reads its result through
shared state, executes again and sees the new result.

Usage: ``python tests/fuzz/replay_fuzz.py --examples 2000 [--seed N] [--changes | --edits]``.
The quick variants in the suite are in ``tests/test_replay_fuzz.py``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import signal
import sqlite3
import sys
import tempfile
import threading
import time
from collections import Counter
from contextlib import closing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

if __name__ == "__main__":  # run as a script: make `tests` and `durable_nb` importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from hypothesis import strategies as st

from durable_nb.journal import DiskJournal, RunRecord, Status, StepEntry
from durable_nb.testing import LoopbackServer
from tests.agent_process import _run_child, drive, start

RUN_ID = "program"
MODEL = "loopback-1"
CHILD_TIMEOUT = 60.0
NAMES = ("a", "b", "c")  # few names: concurrent branches reuse them


class CustomError(Exception):
    """An exception whose constructor takes two arguments (it must replay as itself)."""

    def __init__(self, code: int, reason: str) -> None:
        super().__init__(code, reason)
        self.code = code
        self.reason = reason


# -- programs ------------------------------------------------------------------------------

def _op(kind: str, **fields: Any) -> dict:
    return {"op": kind, **fields}


_names = st.sampled_from(NAMES)
_args = st.integers(0, 9)
_tool_calls = st.lists(st.tuples(st.sampled_from(["calc", "calc_nested", "boom"]), _args),
                       min_size=1, max_size=3)

_sync_leaf = st.one_of(
    st.builds(lambda n, a: _op("run", name=n, arg=a), _names, _args),
    st.builds(lambda c: _op("chat", conv=c), st.integers(0, 1)),
    st.builds(lambda calls, p: _op("tools", calls=calls, parallel=p), _tool_calls, st.booleans()),
    st.builds(lambda n, e: _op("catch", name=n, exc=e), _names,
              st.sampled_from(["KeyError", "ValueError", "CustomError"])),
    st.builds(lambda n: _op("flaky", name=n), _names),
    st.builds(lambda n: _op("approval", name=n), _names),
)
_sync_ops = st.recursive(
    st.lists(_sync_leaf, min_size=1, max_size=5),
    lambda inner: st.lists(st.one_of(_sync_leaf, st.builds(
        lambda n, ops: _op("nested", name=n, ops=ops), _names, inner)), min_size=1, max_size=5),
    max_leaves=16)

_async_leaf = st.one_of(
    _sync_leaf,
    st.builds(lambda n, a: _op("run_async", name=n, arg=a), _names, _args),
    st.builds(lambda c: _op("chat_async", conv=c), st.integers(0, 1)),
)
_async_ops = st.recursive(
    st.lists(_async_leaf, min_size=1, max_size=5),
    lambda inner: st.lists(st.one_of(
        _async_leaf,
        st.builds(lambda branches: _op("gather", branches=branches),
                  st.lists(inner, min_size=2, max_size=4)),
        st.builds(lambda k, ops: _op(k, ops=ops), st.sampled_from(["task", "wait_for"]),
                  inner)), min_size=1, max_size=5),
    max_leaves=20)


def programs() -> st.SearchStrategy[dict]:
    """Random agent programs: ``{"mode": "sync" | "async", "ops": [...]}``."""
    return st.one_of(st.builds(lambda ops: {"mode": "sync", "ops": ops}, _sync_ops),
                     st.builds(lambda ops: {"mode": "async", "ops": ops}, _async_ops))


# -- the interpreter (runs in the child) ---------------------------------------------------

class Interpreter:
    """Runs a program with ``ctx``; returns what it observed, by place in the program."""

    def __init__(self, workdir: Path, url: str, kill_at: int | None = None) -> None:
        import openai

        self.workdir = workdir
        self.url = url
        self.client = openai.OpenAI(base_url=url, api_key="fuzz", max_retries=0)
        self.conversations: dict[tuple[str, int], list[dict]] = {}
        self.kill_at = kill_at  # SIGKILL this process as its kill_at-th step starts
        # The step a program's ``after_edit`` ops wait for (``watch``: its id), its result
        # once it completed in this execution, and the event they wait on.
        self.watch: int | None = None
        self.watched: Any = None
        self.edit_done: asyncio.Event | None = None
        self.started = 0
        self.lock = threading.Lock()

    # each step's function: logged by key, value derived from its key and argument
    def _key(self, ctx: Any) -> str:
        return ctx.step_id.split(":", 1)[1]

    def _log(self, key: str, effect: str = "-") -> None:
        """Log an execution of step ``key`` (``effect``: what it does, for programs whose
        steps carry an id); the kill_at-th one is killed here, its step unjournaled."""
        with self.lock:
            with open(self.workdir / "executions.log", "a") as f:
                f.write(f"{os.getpid()} {key} {effect}\n")
            self.started += 1
            if self.started == self.kill_at:
                os.kill(os.getpid(), signal.SIGKILL)

    def _effect(self, ctx: Any, name: str, arg: int, uid: int | None, extra: int | None) -> str:
        key = self._key(ctx)
        self._log(key, f"{uid}:{arg}:{extra}" if uid is not None else "-")
        tag = "" if uid is None else f"#{uid}" + ("" if extra is None else f"+{extra}")
        return f"{name}({arg}){tag}@{key}"

    def compute(self, ctx: Any, name: str, arg: int, uid: int | None = None,
                extra: int | None = None) -> str:
        value = self._effect(ctx, name, arg, uid, extra)
        time.sleep(random.random() * 0.004)
        return value

    async def compute_async(self, ctx: Any, name: str, arg: int, uid: int | None = None,
                            extra: int | None = None) -> str:
        value = self._effect(ctx, name, arg, uid, extra)
        await asyncio.sleep(random.random() * 0.004)
        return value

    async def reading_edit(self, ctx: Any, name: str, arg: int, uid: int | None = None,
                           extra: int | None = None) -> str:
        """A step whose result depends on the watched step's, read from shared state."""
        return f"{await self.compute_async(ctx, name, arg, uid, extra)} saw {self.watched}"

    def _watched(self, op: dict, value: Any) -> None:
        """The watched step (a program's ``watch``) completed with ``value``: shared state
        for the steps that read it (``reads_edit``), and the event they wait for."""
        if self.edit_done is not None and op.get("uid") is not None \
                and op.get("uid") == self.watch:
            self.watched = value
            self.edit_done.set()

    def raiser(self, ctx: Any, kind: str) -> None:
        key = self._key(ctx)
        self._log(key)
        if kind == "KeyError":
            raise KeyError(key)
        if kind == "ValueError":
            raise ValueError("bad value at", key)
        raise CustomError(7, f"custom at {key}")

    def flaky(self, ctx: Any) -> str:
        key = self._key(ctx)
        self._log(key)
        marker = self.workdir / f"flaky-{key}"
        if not marker.exists():
            marker.touch()
            raise RuntimeError(f"fails once at {key}")
        return f"recovered@{key}"

    def tools(self, ctx: Any) -> list:
        import durable_nb as dn

        @dn.tool
        def calc(ctx, x: int) -> str:
            """Deterministic work."""
            return self.compute(ctx, "calc", x)

        @dn.tool
        def calc_nested(ctx, x: int) -> str:
            """A tool that makes steps of its own."""
            inner = ctx.run("inner", self.compute, ctx, "inner", x)
            return f"outer[{inner}]@{self._key(ctx)}"

        @dn.tool
        def boom(ctx, x: int) -> str:
            """Always fails (an error message for the model)."""
            self._log(self._key(ctx))
            raise ValueError(f"boom {x}")

        return [calc, calc_nested, boom]

    # ops
    def chat_request(self, path: str, conv: int) -> list[dict]:
        # A conversation per list of ops (a branch, a nested body): ops in one list run one
        # after another, so its messages come in the same order in every execution.
        where = path.rsplit(".", 1)[0] if "." in path else ""
        messages = self.conversations.setdefault(
            (where, conv), [{"role": "system", "content": f"conversation {conv}"}])
        messages.append({"role": "user", "content": f"at {path}"})
        return messages

    def sync_op(self, ctx: Any, op: dict, path: str, seen: dict) -> None:
        kind = op["op"]
        if kind == "run":
            args, kwargs = _effect_args(op)
            seen[path] = ctx.run(op["name"], self.compute, ctx, *args, **kwargs)
            self._watched(op, seen[path])
        elif kind == "chat":
            messages = self.chat_request(path, op["conv"])
            reply = ctx.chat(model=MODEL, messages=messages, client=self.client)
            messages.append({"role": "assistant", "content": reply.choices[0].message.content})
            seen[path] = [reply.id, reply.choices[0].message.content]
        elif kind == "tools":
            message = {"role": "assistant", "content": None, "tool_calls": [
                {"id": f"{path}-{i}", "type": "function",
                 "function": {"name": name, "arguments": json.dumps({"x": x})}}
                for i, (name, x) in enumerate(op["calls"])]}
            results = ctx.call_tools(message, self.tools(ctx), parallel=op["parallel"])
            seen[path] = [m["content"] for m in results]
        elif kind == "catch":
            try:
                ctx.run(op["name"], self.raiser, ctx, op["exc"])
                seen[path] = "not raised"
            except (KeyError, ValueError, CustomError) as exc:
                seen[path] = [type(exc).__name__, [str(a) for a in exc.args]]
        elif kind == "flaky":
            seen[path] = ctx.run(op["name"], self.flaky, ctx)
        elif kind == "approval":
            details = {"uid": op["uid"], "arg": op["arg"]} if "uid" in op else {"at": path}
            decision = ctx.approval(op["name"], details)
            seen[path] = [decision.approved, decision.note]
        elif kind == "nested":
            def body(*_spec: Any) -> dict:
                inner: dict = {}
                for i, sub in enumerate(op["ops"]):
                    self.sync_op(ctx, sub, f"{path}.{i}", inner)
                # by place in the body, so that the step's result does not depend on where
                # the body is in the program
                return {k[len(path):]: v for k, v in inner.items()}
            # A body with ids is the step's input: a changed body is a changed step.
            spec = (json.dumps(op["ops"], sort_keys=True),) if "uid" in op else ()
            seen.update({path + k: v for k, v in ctx.run(op["name"], body, *spec).items()})
        else:
            raise ValueError(f"no sync op {kind!r}")

    async def async_op(self, ctx: Any, op: dict, path: str, seen: dict) -> None:
        kind = op["op"]
        await asyncio.sleep(random.random() * 0.003)
        if kind == "run_async":
            args, kwargs = _effect_args(op)
            work = self.reading_edit if op.get("reads_edit") else self.compute_async
            seen[path] = await ctx.run_async(op["name"], work, ctx, *args, **kwargs)
            self._watched(op, seen[path])
        elif kind == "chat_async":
            import openai

            client = openai.AsyncOpenAI(base_url=self.url, api_key="fuzz", max_retries=0)
            messages = self.chat_request(path, op["conv"])
            reply = await ctx.chat_async(model=MODEL, messages=messages, client=client)
            messages.append({"role": "assistant", "content": reply.choices[0].message.content})
            seen[path] = [reply.id, reply.choices[0].message.content]
        elif kind == "gather":
            async def branch(ops: list, where: str) -> None:
                for i, sub in enumerate(ops):
                    await self.async_op(ctx, sub, f"{where}.{i}", seen)

            await asyncio.gather(*(branch(ops, f"{path}/b{j}")
                                   for j, ops in enumerate(op["branches"])))
        elif kind == "after_edit":
            # Waits for the watched step's result, then creates a task: always after it.
            try:
                await asyncio.wait_for(self.edit_done.wait(), CHILD_TIMEOUT / 2)
            except asyncio.TimeoutError:
                self.watched = "never completed"

            async def after(ops: list, where: str) -> None:
                for i, sub in enumerate(ops):
                    await self.async_op(ctx, sub, f"{where}.{i}", seen)

            await asyncio.create_task(after(op["ops"], f"{path}/after"))
        elif kind in ("task", "wait_for"):
            async def body(ops: list, where: str) -> None:
                for i, sub in enumerate(ops):
                    await self.async_op(ctx, sub, f"{where}.{i}", seen)

            work = body(op["ops"], f"{path}/{kind}")
            # wait_for makes a task on 3.10/3.11 and none on 3.12+: the keys must not differ
            await (asyncio.create_task(work) if kind == "task" else asyncio.wait_for(work, 60))
        else:
            self.sync_op(ctx, op, path, seen)

    def handler(self, program: dict) -> Any:
        if program["mode"] == "sync":
            def run(ctx: Any) -> dict:
                self.conversations.clear()
                seen: dict = {}
                for i, op in enumerate(program["ops"]):
                    self.sync_op(ctx, op, str(i), seen)
                return seen
            return run

        async def run_async(ctx: Any) -> dict:
            self.conversations.clear()
            self.watch, self.watched, self.edit_done = program.get("watch"), None, asyncio.Event()
            seen: dict = {}
            for i, op in enumerate(program["ops"]):
                await self.async_op(ctx, op, str(i), seen)
            return seen
        return run_async


def _effect_args(op: dict) -> tuple[tuple, dict]:
    """The arguments of a leaf step's function: its id and an added argument when it has
    them (programs that are changed between executions)."""
    args = (op["name"], op["arg"]) + ((op["uid"],) if "uid" in op else ())
    return args, ({"extra": op["extra"]} if "extra" in op else {})


#: Where a child dies: as it writes the entry at ``position`` of the run, ``"before"`` or
#: ``"after"`` the write.
EntryKill = tuple[int, str]


class EntryKillJournal(DiskJournal):
    """A disk journal whose process SIGKILLs itself as it writes the entry at ``position``
    (``"before"`` the write: its step ran, its entry is never written; ``"after"``: the
    entry is committed), or, if the run ends before that entry, as it would record the run
    DONE: the kill lands in every execution that reaches the end."""

    def __init__(self, directory: str, kill: EntryKill) -> None:
        super().__init__(directory)
        self.kill_position, self.kill_phase = kill

    def append_step(self, run_id: str, entry: StepEntry, **write: Any) -> None:
        due = entry.position >= self.kill_position
        if due and self.kill_phase == "before":
            os.kill(os.getpid(), signal.SIGKILL)
        super().append_step(run_id, entry, **write)
        if due:
            os.kill(os.getpid(), signal.SIGKILL)

    def put_run(self, record: RunRecord, **write: Any) -> None:
        if record.status is Status.DONE:
            os.kill(os.getpid(), signal.SIGKILL)
        super().put_run(record, **write)


def program_child(program_json: str, journal_dir: str, workdir: str, url: str,
                  kill_at: int | None = None, on_change: str = "error",
                  entry_kill: EntryKill | None = None) -> None:
    """Process target: execute the program as run ``program`` (result.json / error.txt),
    SIGKILLed as its ``kill_at``-th step starts, or at ``entry_kill``
    (:class:`EntryKillJournal`)."""
    import durable_nb as dn

    interpreter = Interpreter(Path(workdir), url, kill_at)
    handler = interpreter.handler(json.loads(program_json))
    journal = journal_dir if entry_kill is None else EntryKillJournal(journal_dir, entry_kill)
    try:
        _run_child(workdir, lambda: dn.execute(RUN_ID, handler, journal=journal,
                                               poll_interval=0.02, on_change=on_change))
    except Exception:
        sys.exit(1)  # error.txt has the traceback; the driver reads it


# -- trials --------------------------------------------------------------------------------

@dataclass
class Outcome:
    result: Any
    steps: dict[str, tuple]  # key -> (kind, name, ok, outcome)
    tokens: int
    entries: int  # in the journal, the ones replay skips included
    kills: int = 0
    restarts: int = 0
    problems: list[str] = field(default_factory=list)


def _journal_view(journal: DiskJournal) -> tuple[dict[str, tuple], int]:
    """The run's steps by key (entries replay skips left out), and its tokens."""
    record = journal.get_run(RUN_ID)
    skipped = set(record.retried_steps or ())
    view = {}
    for entry in journal.steps(RUN_ID):
        if entry.position in skipped:
            continue
        outcome = entry.result if entry.ok else [entry.error.get("type"), entry.error.get("args")]
        view[entry.key] = (entry.kind, entry.name, entry.ok,
                           json.dumps(_timeless(outcome), sort_keys=True))
    return view, record.tokens


def _timeless(data: Any) -> Any:
    """``data`` without timestamps (a reply's ``created``, a decision's ``at``), which differ
    between the reference run and the killed one."""
    if isinstance(data, dict):
        return {k: _timeless(v) for k, v in data.items() if k not in ("created", "at")}
    if isinstance(data, list):
        return [_timeless(v) for v in data]
    return data


def _check_positions(journal: DiskJournal) -> str | None:
    entries = list(journal.steps(RUN_ID))  # CorruptEntry propagates
    with closing(sqlite3.connect(f"file:{journal.directory / 'cache.db'}?mode=ro",
                                 uri=True)) as db:
        keys = [k for (k,) in db.execute("SELECT key FROM Cache WHERE key LIKE ?",
                                         (f"step:{RUN_ID}:%",))]
    positions = sorted(int(k.rsplit(":", 1)[1]) for k in keys)
    if positions != list(range(len(entries))):
        return f"step positions on disk are {positions}: a gap or a stray entry"
    return None


def _count_entries(journal: DiskJournal) -> int:
    return len(list(journal.steps(RUN_ID))) if journal.find_run(RUN_ID) else 0


def _journaled_keys(journal: DiskJournal) -> set[str]:
    """Keys of every entry in the run's journal (their steps must never run again)."""
    return {entry.key for entry in journal.steps(RUN_ID)} if journal.find_run(RUN_ID) else set()


def _executions(workdir: Path) -> list[str]:
    """Keys of the step executions logged so far, in order."""
    log = workdir / "executions.log"
    return [line.split()[1] for line in log.read_text().splitlines()] if log.exists() else []


#: A kill drawn: where among the entries the child has still to write (a fraction of them,
#: counted from the reference run's), and whether ``"before"`` or ``"after"`` that write.
KillPoint = tuple[float, str]

kill_points = st.tuples(st.floats(0.0, 1.0, exclude_max=True),
                        st.sampled_from(["before", "after"]))


def _entry_kill(point: KillPoint, written: int, expected: int) -> EntryKill:
    """The entry at which a child resuming a journal of ``written`` entries dies, of the
    ``expected`` entries of the whole run."""
    fraction, phase = point
    return written + int(fraction * max(expected - written, 1)), phase


def execute_program(program: dict, workdir: Path, url: str, kills: list[KillPoint],
                    expected: int = 0) -> Outcome:
    """Run the program to DONE, SIGKILLing its process at each of ``kills`` in turn (each
    lands: :class:`EntryKillJournal`) and resuming it, as a person re-running the cell
    would. ``expected``: how many entries the run writes (the reference's)."""
    workdir.mkdir(parents=True, exist_ok=True)
    journal_dir = workdir / "journal"
    journal = DiskJournal(journal_dir)
    program_json = json.dumps(program)
    landed, restarts = 0, 0
    problems: list[str] = []
    # After each kill: how many executions were logged, and which steps were journaled.
    snapshots: list[tuple[int, set[str]]] = []
    try:
        while True:
            for name in ("result.json", "error.txt"):
                (workdir / name).unlink(missing_ok=True)
            entry_kill = _entry_kill(kills[landed], _count_entries(journal), expected) \
                if landed < len(kills) else None
            process = start(program_child, program_json, str(journal_dir), str(workdir), url,
                            None, "error", entry_kill)
            try:
                drive(process, journal, RUN_ID, timeout=CHILD_TIMEOUT)
            except TimeoutError as exc:
                problems.append(str(exc))
                break
            if process.exitcode == -9:
                landed += 1
                problem = _check_positions(journal)
                if problem:
                    problems.append(f"after kill {landed} at {entry_kill}: {problem}")
                    break
                snapshots.append((len(_executions(workdir)), _journaled_keys(journal)))
                continue
            if (workdir / "result.json").exists():
                break
            error = (workdir / "error.txt").read_text() if (workdir / "error.txt").exists() else ""
            if "fails once at" in error and restarts < 20:
                restarts += 1  # a flaky step failed the run: resume it, as a person would
                continue
            problems.append(f"the run failed: {error[-2000:] or f'exit code {process.exitcode}'}")
            break
        result = json.loads((workdir / "result.json").read_text())["result"] \
            if (workdir / "result.json").exists() else None
        if result is not None and journal.get_run(RUN_ID).status is not Status.DONE:
            problems.append("the run returned but is not DONE")
        # A step that failed the run once is tried again on purpose; any other journaled
        # step executed again after a kill ran twice.
        retried = {marker.name.removeprefix("flaky-") for marker in workdir.glob("flaky-*")}
        executed = _executions(workdir)
        for mark, journaled in snapshots:
            again = sorted({key for key in executed[mark:] if key in journaled} - retried)
            if again:
                problems.append(f"steps {again} were journaled before a kill and executed "
                                f"again by a later process")
        steps, tokens = _journal_view(journal)
        entries = _count_entries(journal)
    finally:
        journal.close()
    return Outcome(result, steps, tokens, entries, landed, restarts, problems)


#: Totals over the trials of this process, for the report line.
TOTALS: Counter = Counter()


def check_program(program: dict, kills: list[KillPoint], root: Path, url: str) -> list[str]:
    """One trial: the reference run, then the killed-and-resumed one; the problems found."""
    root.mkdir(parents=True, exist_ok=True)
    reference = execute_program(program, root / "reference", url, [])
    if reference.problems:
        return [f"reference run: {p}" for p in reference.problems]
    crashed = execute_program(program, root / "crashed", url, kills, reference.entries)
    TOTALS.update(programs=1, kills=crashed.kills, resumes_after_failure=crashed.restarts,
                  steps=len(reference.steps))
    problems = list(crashed.problems)
    if not problems and crashed.kills != len(kills):
        problems.append(f"{crashed.kills} of the {len(kills)} kills drawn landed")
    if crashed.result != reference.result:
        problems.append(f"result differs from the reference:\n  {crashed.result}\n  "
                        f"{reference.result}")
    if crashed.steps != reference.steps:
        differing = sorted(k for k in set(crashed.steps) | set(reference.steps)
                           if crashed.steps.get(k) != reference.steps.get(k))
        problems.append(f"journaled steps differ at keys {differing[:8]}")
    if crashed.tokens != reference.tokens:
        problems.append(f"tokens {crashed.tokens} != reference {reference.tokens}")
    return problems


# -- program changes -----------------------------------------------------------------------
#
# Run program P, SIGKILL it as a random step starts, then execute the run again with P', a
# changed P (steps reordered, moved into or out of tasks, gather, wait_for and other steps,
# arguments or an approval's details changed, arguments added, steps removed or added).
# Every leaf step and every nested step
# carries an id, passed to its function (a nested step's body is its input), so a step's
# identity is its id and arguments. The resumed run must either end as P' uninterrupted
# (result and journal) or stop with a divergence error; either way, no step P journaled
# before the kill may be executed again (the same id and arguments), and an unchanged
# program must not be refused.

#: Errors that report a changed program.
DIVERGENCE = ("JournalMismatch", "InputChanged", "ReplayDiverged")

_changing_leaf = st.builds(lambda n, a: _op("run", name=n, arg=a), _names, _args)
_changing_sync = st.recursive(
    st.lists(_changing_leaf, min_size=1, max_size=3),
    lambda inner: st.lists(st.one_of(_changing_leaf, st.builds(
        lambda n, ops: _op("nested", name=n, ops=ops), _names, inner)), min_size=1, max_size=3),
    max_leaves=6)
_changing_async_leaf = st.one_of(
    _changing_leaf,
    st.builds(lambda n, a: _op("run_async", name=n, arg=a), _names, _args),
    st.builds(lambda n, a: _op("approval", name=n, arg=a), _names, _args),
    st.builds(lambda n, ops: _op("nested", name=n, ops=ops), _names, _changing_sync))
_changing_async = st.recursive(
    st.lists(_changing_async_leaf, min_size=1, max_size=4),
    lambda inner: st.lists(st.one_of(
        _changing_async_leaf,
        st.builds(lambda branches: _op("gather", branches=branches),
                  st.lists(inner, min_size=2, max_size=3)),
        st.builds(lambda k, ops: _op(k, ops=ops), st.sampled_from(["task", "wait_for"]),
                  inner)), min_size=1, max_size=4),
    max_leaves=14)


def changed_programs() -> st.SearchStrategy[tuple[dict, dict, list[str], int]]:
    """``(P, P', the changes made, kill_at)``: P SIGKILLed as its kill_at-th step starts."""
    def build(ops: list, seed: int, changes: int, kill: int) -> tuple:
        program = {"mode": "async", "ops": ops}
        _number(program["ops"], iter(range(10**6)))
        changed, made = mutate(program, random.Random(seed), changes)
        # killed as one of its steps from the second to the last starts
        return program, changed, made, 2 + kill % (len(_leaves(ops, LOGGED)) - 1)
    return st.builds(build, _changing_async.filter(lambda ops: len(_leaves(ops, LOGGED)) >= 3),
                     st.integers(0, 2**32),
                     st.sampled_from([1, 2, 3, 1, 2, 0]), st.integers(0, 10**6))


def _number(ops: list, ids: Any) -> None:
    """Give every leaf and nested step an id."""
    for op in ops:
        if op["op"] in ("run", "run_async", "approval", "nested"):
            op["uid"] = next(ids)
        for inner in _inner_lists(op):
            _number(inner, ids)


def _inner_lists(op: dict) -> list[list]:
    if op["op"] == "gather":
        return op["branches"]
    return [op["ops"]] if "ops" in op else []


def _lists(ops: list, sync: bool, branch: tuple, out: list) -> None:
    """Every op list of a program: (list, inside a step's body (sync), which gather branches
    it is in)."""
    out.append((ops, sync, branch))
    for op in ops:
        if op["op"] == "gather":
            for j, inner in enumerate(op["branches"]):
                _lists(inner, False, branch + ((id(op), j),), out)
        else:
            for inner in _inner_lists(op):
                _lists(inner, sync or op["op"] == "nested", branch, out)


#: Leaves whose function logs its execution (an approval's does not).
LOGGED = ("run", "run_async")


def _leaves(ops: list, kinds: tuple = ("run", "run_async", "approval")) -> list[dict]:
    found = []
    for op in ops:
        if op["op"] in kinds:
            found.append(op)
        for inner in _inner_lists(op):
            found.extend(_leaves(inner, kinds))
    return found


def _sync_only(op: dict) -> bool:
    return op["op"] == "run" or (op["op"] == "nested")


def _concurrent(a: tuple, b: tuple) -> bool:
    """Whether two lists are in different branches of one gather (concurrent flows)."""
    branches = dict(a)
    return any(gather in branches and branches[gather] != j for gather, j in b)


#: The changes, shape changes more often than the others.
_CHANGES = ("swap", "move", "wrap", "unwrap") * 2 + ("arg", "extra", "remove", "add")


def mutate(program: dict, rng: random.Random, count: int) -> tuple[dict, list[str]]:
    """A changed copy of ``program`` and what was changed. A step moved from one branch of
    a gather to another is not made: durable_nb cannot tell it, before it executes, from a
    step the other branch has not got to yet (it is refused when the run ends)."""
    import copy

    changed = copy.deepcopy(program)
    ids = iter(range(10**6, 2 * 10**6))
    made: list[str] = []
    for _ in range(20 * count):  # a change that does not apply here is drawn again
        if len(made) == count:
            break
        lists: list = []
        _lists(changed["ops"], False, (), lists)
        ops, sync, branch = rng.choice(lists)
        kind = rng.choice(_CHANGES)
        i = rng.randrange(len(ops))
        if kind == "swap" and len(ops) > 1:
            j = (i + 1) % len(ops)
            ops[i], ops[j] = ops[j], ops[i]
        elif kind == "move" and len(ops) > 1:
            op = ops[i]
            inside: list = []
            for inner in _inner_lists(op):
                _lists(inner, False, (), inside)
            targets = [(t, s) for t, s, b in lists
                       if t is not ops and all(t is not x for x, _, _ in inside)
                       and (not s or _sync_only(op)) and not _concurrent(branch, b)]
            if not targets:
                continue
            target, _ = rng.choice(targets)
            del ops[i]
            target.insert(rng.randrange(len(target) + 1), op)
        elif kind == "wrap":
            j = rng.randrange(i + 1, len(ops) + 1)
            part = ops[i:j]
            wrappers = ["nested"] if sync else ["task", "wait_for", "gather"] + (
                ["nested"] if all(map(_sync_only, part)) else [])
            wrapper = rng.choice(wrappers)
            if wrapper == "gather":
                cut = rng.randrange(len(part) + 1)
                new = _op("gather", branches=[b for b in (part[:cut], part[cut:]) if b])
            elif wrapper == "nested":
                new = _op("nested", name=rng.choice(NAMES), ops=part, uid=next(ids))
            else:
                new = _op(wrapper, ops=part)
            ops[i:j] = [new]
        elif kind == "unwrap" and _inner_lists(ops[i]):
            ops[i:i + 1] = [inner for branch_ops in _inner_lists(ops[i]) for inner in branch_ops]
        elif kind in ("arg", "extra"):
            leaf = rng.choice(_leaves(changed["ops"]) or [None])
            if leaf is None:
                continue
            if kind == "arg":  # an approval's details change with it
                leaf["arg"] = (leaf["arg"] + 1) % 10
            elif leaf["op"] == "approval":
                continue
            else:
                leaf["extra"] = leaf.get("extra", 0) + 1
        elif kind == "remove" and len(ops) > 1:
            del ops[i]
        elif kind == "add":
            leaf = "run" if sync or rng.random() < 0.5 else "run_async"
            ops.insert(rng.randrange(len(ops) + 1),
                       _op(leaf, name=rng.choice(NAMES), arg=rng.randrange(10), uid=next(ids)))
        else:
            continue
        made.append(kind)
    return changed, made


def _run_once(program: dict, workdir: Path, journal: DiskJournal, url: str,
              kill_at: int | None, on_change: str = "error") -> tuple[Any, str | None]:
    """One execution of the program in its own process: (result, None), (None, the error's
    traceback), or (None, None) when it was killed."""
    for name in ("result.json", "error.txt"):
        (workdir / name).unlink(missing_ok=True)
    process = start(program_child, json.dumps(program), str(journal.directory), str(workdir),
                    url, kill_at, on_change)
    drive(process, journal, RUN_ID, timeout=CHILD_TIMEOUT)
    if process.exitcode == -9:
        return None, None
    if (workdir / "result.json").exists():
        return json.loads((workdir / "result.json").read_text())["result"], None
    error = workdir / "error.txt"
    return None, error.read_text() if error.exists() else f"exit code {process.exitcode}"


def _logged(workdir: Path) -> list[tuple[str, str]]:
    """(key, effect) of every step execution logged so far, in order."""
    log = workdir / "executions.log"
    return [tuple(line.split()[1:3]) for line in log.read_text().splitlines()] \
        if log.exists() else []


def check_changed_program(program: dict, changed: dict, kill_at: int, root: Path,
                          url: str) -> list[str]:
    """One trial: P' uninterrupted (the reference); P killed at step ``kill_at``, then P'
    on its journal. The problems found."""
    root.mkdir(parents=True, exist_ok=True)
    reference = execute_program(changed, root / "reference", url, [])
    if reference.problems:
        return [f"reference run of P': {p}" for p in reference.problems]
    workdir = root / "changed"
    workdir.mkdir()
    journal = DiskJournal(workdir / "journal")
    try:
        result, error = _run_once(program, workdir, journal, url, kill_at)
        if error is not None:
            return [f"P failed: {error[-2000:]}"]
        killed = result is None
        journaled = _journaled_keys(journal)
        done = {effect for key, effect in _logged(workdir) if key in journaled}
        mark = len(_logged(workdir))
        result, error = _run_once(changed, workdir, journal, url, None)
        problems = []
        again = sorted({effect for _, effect in _logged(workdir)[mark:]} & done)
        if again:
            problems.append(f"steps (id:arg:extra) {again} journaled by P were executed again "
                            f"by P'")
        if error is not None:
            raised = error.strip().splitlines()[-1].split(":", 1)[0].rsplit(".", 1)[-1]
            refused = raised if raised in DIVERGENCE else None
            if refused is None:
                problems.append(f"P' failed with another error than a divergence: "
                                f"{error[-2000:]}")
            elif changed == program:
                problems.append(f"the unchanged program was refused: {error[-2000:]}")
            TOTALS.update(refused=1)
        elif result is None:
            problems.append("P' was killed")
        else:
            steps, _ = _journal_view(journal)
            if result != reference.result:
                problems.append(f"P' returned another result than uninterrupted:\n  {result}"
                                f"\n  {reference.result}")
            if steps != reference.steps:
                differing = sorted(k for k in set(steps) | set(reference.steps)
                                   if steps.get(k) != reference.steps.get(k))
                problems.append(f"P' journaled other steps than uninterrupted at {differing[:8]}")
            TOTALS.update(equal=1)
        TOTALS.update(changed_programs=1, kills=int(killed), unchanged=int(changed == program))
        return problems
    finally:
        journal.close()


# -- edits inside concurrent tasks, re-run -------------------------------------------------
#
# Run program P (SIGKILLed as a random step starts, or to its end), then execute the run
# again with on_change="rerun" and P', P with the argument of one step inside a branch of a
# gather changed. It must end as P' uninterrupted (result and journal), and no step that P
# journaled in another branch of a gather around the changed step (reached in that branch
# without a task or gather of its own, so its task existed before the changed step
# completed) may be executed again: it is unchanged, and it replays. Most programs also get
# a reader (``after_edit``): another branch of a gather around the changed step waits for
# it, then creates a task whose step reads its result from shared state (not its inputs).
# That task is created after the changed step inside a task that existed before it: the
# re-run must execute it again, or the result differs from P' uninterrupted.

def edited_programs() -> st.SearchStrategy[tuple[dict, dict, int, int]]:
    """``(P, P', the id of the step edited, kill_at)``; P is SIGKILLed as its kill_at-th
    step starts (when it has that many)."""
    def build(ops: list, seed: int, kill: int) -> tuple:
        program = {"mode": "async", "ops": ops}
        _number(program["ops"], iter(range(10**6)))
        rng = random.Random(seed)
        candidates = _in_branches(program["ops"])
        first = [op for op in candidates if _first_in_branch(program["ops"], op)]
        # Half the time a branch's first step: the other branches' steps then often
        # complete after it, where a cut by completion order went wrong.
        leaf = rng.choice(first if first and rng.random() < 0.5 else candidates)
        if rng.random() < 0.75:
            _add_reader_after(program, leaf, rng)
        edited = json.loads(json.dumps(program))
        target = next(op for op in _leaves(edited["ops"], LOGGED) if op["uid"] == leaf["uid"])
        if rng.random() < 0.5:
            target["arg"] = (target["arg"] + 1) % 10
        else:
            target["extra"] = target.get("extra", 0) + 1
        return program, edited, leaf["uid"], 2 + kill % len(_leaves(ops, LOGGED))
    return st.builds(build, _changing_async.filter(lambda ops: bool(_in_branches(ops))),
                     st.integers(0, 2**32), st.integers(0, 10**6))


def _add_reader_after(program: dict, leaf: dict, rng: random.Random) -> None:
    """Make another branch of a gather around ``leaf`` (a task that exists before ``leaf``
    completes) wait for it, then create a task whose step reads ``leaf``'s result through
    shared state, not its inputs: a task created after the edited step inside a task that
    existed before it, which a re-run must execute again (the rule holds at every depth)."""
    gathers: dict[int, dict] = {}

    def walk(ops: list) -> None:
        for op in ops:
            if op["op"] == "gather":
                gathers[id(op)] = op
            for inner in _inner_lists(op):
                walk(inner)

    walk(program["ops"])
    gather_id, branch, _ = rng.choice(_gathers_above(program["ops"])[id(leaf)])
    others = [j for j in range(len(gathers[gather_id]["branches"])) if j != branch]
    uid = 1 + max(op["uid"] for op in _leaves(program["ops"], LOGGED + ("approval",)))
    reader = _op("run_async", name=rng.choice(NAMES), arg=rng.randrange(10), uid=uid,
                 reads_edit=True)
    gathers[gather_id]["branches"][rng.choice(others)].insert(0, _op("after_edit",
                                                                     ops=[reader]))
    program["watch"] = leaf["uid"]


def _gathers_above(ops: list, above: tuple = (), out: dict | None = None) -> dict[int, tuple]:
    """For each leaf step (by ``id()`` of its op): the gathers it is in, as ``(gather,
    branch, direct)``; ``direct``: no task or gather of its own between that branch and the
    step."""
    out = {} if out is None else out
    for op in ops:
        if op["op"] in LOGGED:
            out[id(op)] = above
        if op["op"] == "gather":
            for j, branch in enumerate(op["branches"]):
                inner = tuple((g, b, False) for g, b, _ in above) + ((id(op), j, True),)
                _gathers_above(branch, inner, out)
        elif op["op"] in ("task", "after_edit"):
            _gathers_above(op["ops"], tuple((g, b, False) for g, b, _ in above), out)
        else:
            for inner in _inner_lists(op):
                _gathers_above(inner, above, out)
    return out


def _first_in_branch(ops: list, leaf: dict) -> bool:
    """Whether ``leaf`` is the first op of a branch of a gather."""
    for op in ops:
        if op["op"] == "gather" and any(branch and branch[0] is leaf
                                        for branch in op["branches"]):
            return True
        if any(_first_in_branch(inner, leaf) for inner in _inner_lists(op)):
            return True
    return False


def _in_branches(ops: list) -> list[dict]:
    """The leaf steps inside a branch of a gather."""
    above = _gathers_above(ops)
    return [op for op in _leaves(ops, LOGGED) if above[id(op)]]


def _kept_by_edit(program: dict, edited: int) -> set[int]:
    """The ids of the steps whose tasks existed before step ``edited`` completed: in another
    branch of a gather around it, reached there directly."""
    above = _gathers_above(program["ops"])
    leaves = {op["uid"]: above[id(op)] for op in _leaves(program["ops"], LOGGED)}
    branch_of = {gather: branch for gather, branch, _ in leaves[edited]}
    return {uid for uid, gathers in leaves.items() if uid != edited and any(
        direct and gather in branch_of and branch_of[gather] != branch
        for gather, branch, direct in gathers)}


def check_edited_program(program: dict, edited: dict, uid: int, kill_at: int, root: Path,
                         url: str) -> list[str]:
    """One trial: P' uninterrupted (the reference); P killed at step ``kill_at`` (or run to
    its end), then P' on its journal with on_change="rerun". The problems found."""
    root.mkdir(parents=True, exist_ok=True)
    reference = execute_program(edited, root / "reference", url, [])
    if reference.problems:
        return [f"reference run of P': {p}" for p in reference.problems]
    workdir = root / "edited"
    workdir.mkdir()
    journal = DiskJournal(workdir / "journal")
    try:
        result, error = _run_once(program, workdir, journal, url, kill_at)
        if error is not None:
            return [f"P failed: {error[-2000:]}"]
        killed = result is None
        kept = _kept_by_edit(program, uid)
        journaled = _journaled_keys(journal)
        done = {effect for key, effect in _logged(workdir) if key in journaled
                and int(effect.split(":")[0]) in kept}
        mark = len(_logged(workdir))
        result, error = _run_once(edited, workdir, journal, url, None, on_change="rerun")
        problems = []
        again = sorted({effect for _, effect in _logged(workdir)[mark:]} & done)
        if again:
            problems.append(f"steps (id:arg:extra) {again}, unchanged in tasks that existed "
                            f"before step {uid} completed, were executed again by the re-run")
        if error is not None:
            problems.append(f"P' re-run failed: {error[-2000:]}")
        elif result != reference.result:
            problems.append(f"P' returned another result than uninterrupted:\n  {result}"
                            f"\n  {reference.result}")
        else:
            steps, _ = _journal_view(journal)
            if steps != reference.steps:
                differing = sorted(k for k in set(steps) | set(reference.steps)
                                   if steps.get(k) != reference.steps.get(k))
                problems.append(f"P' journaled other steps than uninterrupted at {differing[:8]}")
        TOTALS.update(edited_programs=1, kills=int(killed),
                      forks=int(journal.find_run(f"{RUN_ID}@1") is not None),
                      replayed_in_other_tasks=len(done), readers_after_the_edit=int(
                          "watch" in program))
        return problems
    finally:
        journal.close()


def main(argv: list[str] | None = None) -> int:
    from hypothesis import HealthCheck, given, settings
    from hypothesis import seed as hypothesis_seed

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--examples", type=int, default=200)
    parser.add_argument("--seed", type=int, default=None)
    parser.add_argument("--changes", action="store_true",
                        help="resume each killed program with a changed program")
    parser.add_argument("--edits", action="store_true",
                        help="re-run each program (on_change='rerun') with one step inside a "
                             "gather branch edited")
    args = parser.parse_args(argv)
    chosen = args.seed if args.seed is not None else random.SystemRandom().randrange(2**32)
    what = ("edited programs" if args.edits else "changed programs" if args.changes
            else "programs")
    print(f"replay fuzz: {args.examples} {what}, seed {chosen}", flush=True)
    examples = iter(range(10**9))
    with LoopbackServer(["first", "second", "third", "fourth", "fifth"]) as server, \
            tempfile.TemporaryDirectory() as tmp:

        @hypothesis_seed(chosen)
        @settings(max_examples=args.examples, deadline=None, database=None,
                  suppress_health_check=list(HealthCheck))
        @given(program=programs(), kills=st.lists(kill_points, max_size=3))
        def trial(program: dict, kills: list[KillPoint]) -> None:
            problems = check_program(program, kills, Path(tmp) / str(next(examples)), server.url)
            assert not problems, "\n".join(problems) + f"\nprogram: {json.dumps(program)}"

        @hypothesis_seed(chosen)
        @settings(max_examples=args.examples, deadline=None, database=None,
                  suppress_health_check=list(HealthCheck))
        @given(case=changed_programs())
        def changed_trial(case: tuple) -> None:
            program, changed, made, kill_at = case
            problems = check_changed_program(program, changed, kill_at,
                                             Path(tmp) / str(next(examples)), server.url)
            assert not problems, "\n".join(problems) + (
                f"\nP: {json.dumps(program)}\nchanges: {made}\nP': {json.dumps(changed)}"
                f"\nkilled at step {kill_at}")

        @hypothesis_seed(chosen)
        @settings(max_examples=args.examples, deadline=None, database=None,
                  suppress_health_check=list(HealthCheck))
        @given(case=edited_programs())
        def edited_trial(case: tuple) -> None:
            program, edited, uid, kill_at = case
            problems = check_edited_program(program, edited, uid, kill_at,
                                            Path(tmp) / str(next(examples)), server.url)
            assert not problems, "\n".join(problems) + (
                f"\nP: {json.dumps(program)}\nedited step {uid}\nP': {json.dumps(edited)}"
                f"\nkilled at step {kill_at}")

        started = time.monotonic()
        try:
            (edited_trial if args.edits else changed_trial if args.changes else trial)()
        finally:
            print(" ".join(f"{k}={v}" for k, v in sorted(TOTALS.items()))
                  + f" seconds={time.monotonic() - started:.0f} seed={chosen}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
