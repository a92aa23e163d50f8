"""Rewinds (``on_change="rerun"``, ``reset``, ``rerun_from``) and deletes: fenced by the run's
lease, cut by step key and scope, with the run's child runs - on disk and on PostgreSQL.

The fencing tests stall a real executor: a child process is SIGSTOPped, its lease goes stale
(aged in the journal, not waited for), another executor takes the run over and finishes it,
and the stalled one is SIGCONTinued: whatever it was about to write, nothing of the new
executor's is changed.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import openai
import pytest

import durable_nb as dn
from durable_nb import DiskJournal, RunRecord, Status
from durable_nb.errors import InputChanged, RunLeased
from durable_nb.journal import StepEntry, cut_at_key, rewind
from durable_nb.registry import is_interrupted
from durable_nb.testing import LoopbackServer
from durable_nb.execution.lease import Lease
from tests.test_journal_conformance import Backend, backend  # noqa: F401 (fixture)

REPO = Path(__file__).resolve().parents[1]


def _steps(ctx, first: str) -> list:
    return [ctx.run(f"s{i}", lambda v: v, first if i == 0 else f"v{i}") for i in range(4)]


# The executor that stalls: it takes the run's lease, says so, waits for `go` (where the test
# stops it), then replays step s0 with a changed input, which re-runs the run from s0
# (on_change="rerun": fork, then rewind). Its heartbeat never beats on its own.
_STALLING = """
import os, sys, time
import durable_nb as dn
location, ready, go, action = sys.argv[1:5]

def agent(ctx):
    open(ready, "w").close()
    while not os.path.exists(go):
        time.sleep(0.01)
    if action == "rerun":
        return [ctx.run(f"s{i}", lambda v: v, "changed" if i == 0 else f"v{i}") for i in range(4)]
    return ctx.run("late", lambda: "written by the stalled executor")

dn.execute("r", agent, journal=location, on_change="rerun", heartbeat_interval=3600)
"""


def _stall_then_take_over(backend: Backend, tmp_path: Path, action: str) -> subprocess.CompletedProcess:
    """Run r: one entry journaled, then FAILED. A child executor takes it and is stopped;
    its lease is made stale; this process executes r to DONE (4 entries); the child goes on."""
    store = backend.open()

    def failing(ctx):
        ctx.run("s0", lambda v: v, "v0")
        raise RuntimeError("stop after s0")

    with pytest.raises(RuntimeError):
        dn.execute("r", failing, journal=store)
    ready, go = tmp_path / "ready", tmp_path / "go"
    child = subprocess.Popen([sys.executable, "-c", _STALLING, backend.location, str(ready),
                              str(go), action], cwd=REPO, stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True)
    try:
        while not ready.exists():
            assert child.poll() is None, child.communicate()
            time.sleep(0.01)
        os.kill(child.pid, signal.SIGSTOP)
        backend.age_lease(store, "r", 3600)  # stalled past stale_after
        assert dn.execute("r", lambda ctx: _steps(ctx, "v0"), journal=store) == \
            ["v0", "v1", "v2", "v3"]
        go.touch()
        os.kill(child.pid, signal.SIGCONT)
        out, err = child.communicate(timeout=120)
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()
    return subprocess.CompletedProcess(child.args, child.returncode, out, err)


@pytest.mark.parametrize("action", ["rerun", "append"])
def test_a_stalled_executor_that_lost_its_lease_changes_nothing(backend: Backend,  # noqa: F811
                                                                tmp_path: Path, action: str):
    store = backend.open()
    finished = _stall_then_take_over(backend, tmp_path, action)
    assert finished.returncode != 0 and "fenced out" in finished.stderr, finished.stderr
    record = store.get_run("r")
    assert record.status is Status.DONE and record.result == ["v0", "v1", "v2", "v3"]
    assert [e.name for e in store.steps("r")] == ["s0", "s1", "s2", "s3"]
    assert [r.run_id for r in store.list_runs()] == ["r"]  # no fork of the stalled re-run


def test_registry_edits_hold_the_lease_and_refuse_a_live_executor(backend: Backend):  # noqa: F811
    store = backend.open()
    dn.execute("r", lambda ctx: _steps(ctx, "v0"), journal=store)
    held = Lease.acquire(store, "r")
    try:
        for edit in (lambda: dn.reset("r", 1, journal=store),
                     lambda: dn.rerun_from("r", 1, journal=store),
                     lambda: dn.delete("r", journal=store)):
            with pytest.raises(RunLeased, match="cancel it first"):
                edit()
        assert store.count_steps("r") == 4 and store.get_run("r").status is Status.DONE
    finally:
        held.release()
    assert dn.reset("r", 2, journal=store).step_count == 2
    assert store.lease("r") is None  # the reset's own lease is released
    assert dn.execute("r", lambda ctx: _steps(ctx, "v0"), journal=store) == \
        ["v0", "v1", "v2", "v3"]


# --- cutting by key ------------------------------------------------------------------------

def _entry(position: int, key: str) -> StepEntry:
    return StepEntry(position, key, f"step {key}", "run")


def test_cut_at_key_keeps_other_tasks_and_drops_the_changed_scope():
    journal = [_entry(p, k) for p, k in enumerate([
        "0",            # root step before the tasks
        "beta#0.0",     # a task that existed before the change
        "alpha#0.0.0",  # inside the changed step
        "alpha#0.0",    # the changed step (position 3)
        "beta#0.1",     # the other task, completed later: stays
        "alpha#0.1",    # the changed task's later step
        "gamma#0.0",    # a task that did not exist yet at the change
        "alpha#0.sub#0.0",  # a task the changed task started after it
        "1",            # the root after the tasks
    ])]
    kept = cut_at_key(journal, journal[3])
    assert [e.key for e in kept] == ["0", "beta#0.0", "beta#0.1"]
    # a change inside a step: the step itself (completed after) and its later steps go
    nested = [_entry(p, k) for p, k in enumerate(["0", "1.0", "1.1", "1.2", "1", "2"])]
    assert [e.key for e in cut_at_key(nested, nested[2])] == ["0", "1.0"]
    # a task whose first entry is after the change, but written by the execution that found
    # it (before it was found), was made without the changed step's result: it stays
    again = [_entry(p, k) for p, k in enumerate(["beta#0.0", "beta#0.1", "alpha#0.0"])]
    assert [e.key for e in cut_at_key(again, again[1])] == ["beta#0.0"]
    assert [e.key for e in cut_at_key(again, again[1], live_from=2)] == ["beta#0.0",
                                                                         "alpha#0.0"]


def _concurrent_agent(calls: list[str], alpha_input: str, beta_input: str = "x"):
    async def agent(ctx):
        # completion order b0, a1, b1, a2
        b0_done, a1_done, b1_done = asyncio.Event(), asyncio.Event(), asyncio.Event()

        async def beta():
            first = await ctx.run_async("b0", _record(calls, "b0"))
            b0_done.set()
            await a1_done.wait()
            second = await ctx.run_async("b1", _record(calls, "b1"), beta_input)
            b1_done.set()
            return [first, second]

        async def alpha():
            await b0_done.wait()
            first = await ctx.run_async("a1", _record(calls, "a1"), alpha_input)
            a1_done.set()
            await b1_done.wait()
            return [first, await ctx.run_async("a2", _record(calls, "a2"))]

        return await asyncio.gather(alpha(), beta())
    return agent


def _record(calls: list[str], name: str):
    async def step(*args):
        await asyncio.sleep(0)
        calls.append(name)
        return [name, *args]
    return step


def test_rerun_replays_the_unchanged_steps_of_concurrent_tasks(backend: Backend):  # noqa: F811
    store = backend.open()
    calls: list[str] = []
    dn.execute("r", _concurrent_agent(calls, "x"), journal=store)
    assert [e.name for e in store.steps("r")] == ["b0", "a1", "b1", "a2"]
    assert calls == ["b0", "a1", "b1", "a2"]
    with pytest.raises(InputChanged):
        dn.execute("r", _concurrent_agent(calls, "y"), journal=store)
    calls.clear()
    result = dn.execute("r", _concurrent_agent(calls, "y"), journal=store, on_change="rerun")
    assert result == [[["a1", "y"], ["a2"]], [["b0"], ["b1", "x"]]]
    assert calls == ["a1", "a2"]  # b1 finished after a1, and still replayed
    entries = list(store.steps("r"))
    assert [(e.position, e.name) for e in entries] == [(0, "b0"), (1, "b1"), (2, "a1"),
                                                       (3, "a2")]
    fork = store.get_run("r@1")
    assert [e.name for e in store.steps("r@1")] == ["b0", "a1", "b1", "a2"]
    assert fork.forked_from["run_id"] == "r"


def test_two_changes_in_one_execution_keep_one_fork(backend: Backend):  # noqa: F811
    store = backend.open()
    calls: list[str] = []
    dn.execute("r", _concurrent_agent(calls, "x"), journal=store)
    calls.clear()
    result = dn.execute("r", _concurrent_agent(calls, "y", "z"), journal=store,
                        on_change="rerun")  # a1 changed, then (once a1 ran again) b1
    assert result == [[["a1", "y"], ["a2"]], [["b0"], ["b1", "z"]]]
    assert sorted(calls) == ["a1", "a2", "b1"]  # b0 replayed
    assert [r.run_id for r in store.list_runs()] == ["r", "r@1"]
    assert [e.name for e in store.steps("r@1")] == ["b0", "a1", "b1", "a2"]


# --- tasks that existed before the change ---------------------------------------------------

def _payments(charges: list[tuple[str, int]], bob_amount: int):
    """alice and bob pay at once; bob starts a receipt before paying and a thank-you after."""
    async def agent(ctx):
        bob_paid = asyncio.Event()

        async def charge(who: str, amount: int) -> str:
            await asyncio.sleep(0)
            charges.append((who, amount))
            return f"{who} paid {amount}"

        async def alice():
            await bob_paid.wait()  # running all along; its charge completes after bob's
            return await ctx.run_async("charge", charge, "alice", 10)

        async def receipt():
            await bob_paid.wait()
            return await ctx.run_async("receipt", charge, "receipt", 1)

        async def thanks():
            return await ctx.run_async("thanks", charge, "thanks", 0)

        async def bob():
            printing = asyncio.ensure_future(receipt())  # created before bob pays
            paid = await ctx.run_async("charge", charge, "bob", bob_amount)
            bob_paid.set()
            thanked = await asyncio.create_task(thanks())  # created after: it may depend on it
            return [paid, await printing, thanked]

        return await asyncio.gather(alice(), bob())
    return agent


def test_a_rerun_replays_the_tasks_that_existed_before_the_changed_step(
        backend: Backend):  # noqa: F811
    store = backend.open()
    charges: list[tuple[str, int]] = []
    dn.execute("pay", _payments(charges, 20), journal=store)
    first = [e.key for e in store.steps("pay")]
    assert first[0] == "bob#0.0" and "alice#0.0" in first[1:]
    charges.clear()
    result = dn.execute("pay", _payments(charges, 25), journal=store, on_change="rerun")
    assert result == ["alice paid 10", ["bob paid 25", "receipt paid 1", "thanks paid 0"]]
    # alice's charge and bob's receipt existed before bob's charge completed: replayed, not
    # charged again; the thank-you task was created after it: executed again.
    assert charges == [("bob", 25), ("thanks", 0)]
    # each entry journals when its tasks were created
    assert {e.key: e.spawned for e in store.steps("pay@1")} == {
        "bob#0.0": [0], "alice#0.0": [0], "bob#0.receipt#0.0": [0, 0],
        "bob#0.thanks#0.0": [0, 1]}  # created once bob's charge was in
    assert [(e.key, e.position) for e in store.steps("pay")][:2] == [
        ("alice#0.0", 0), ("bob#0.receipt#0.0", 1)]
    assert [e.key for e in store.steps("pay@1")] == first
    charges.clear()
    assert dn.execute("pay", _payments(charges, 25), journal=store) == result
    assert charges == []


def test_cut_at_key_keeps_the_tasks_journaled_as_created_before_the_change():
    def entry(position: int, key: str, spawned: list[int] | None = None) -> StepEntry:
        return dataclasses.replace(_entry(position, key), spawned=spawned)

    journal = [
        entry(0, "bob#0.0", [0]),              # the changed step
        entry(1, "alice#0.0", [0]),            # created before it, completed after: stays
        entry(2, "bob#0.tip#0.0", [0, 0]),     # created by bob before it: stays
        entry(3, "carol#0.0", [1]),            # created after it: goes
        entry(4, "alice#0.early#0.0", [0, 0]),  # created by alice before it: stays
        entry(5, "alice#0.late#0.0", [0, 2]),  # created after it by a task that was there: goes
        entry(6, "bob#0.1", [0]),              # bob's own later step: goes
        entry(7, "dave#0.0"),                  # journaled before creations were: as before,
    ]                                          # its first entry after the change: goes
    assert [e.key for e in cut_at_key(journal, journal[0])] == [
        "alice#0.0", "bob#0.tip#0.0", "alice#0.early#0.0"]
    # one entry of a task says it was created after the change (another execution's): the
    # latest creation counts, the whole task goes
    again = journal[:2] + [entry(2, "alice#0.1", [1])]
    assert [e.key for e in cut_at_key(again, again[0])] == []


def _uses_k_in_a_task_made_after_it(k: int, depth: int, k_in_task: bool):
    """Step ``k`` (its input edited between executions), then, once it completed, a task
    made ``depth`` tasks deep (every task around it running since before ``k``) takes step
    ``use``, which reads k's result from shared state, not from its inputs."""
    async def agent(ctx):
        seen: dict[str, int] = {}
        k_done = asyncio.Event()

        async def read_k() -> str:  # k reaches it through shared state, not its inputs
            return f"used k={seen['k']}"

        async def use() -> str:
            return await ctx.run_async("use", read_k)

        async def around(level: int) -> str:
            if level == 1:  # the innermost task around `use`, running since before k
                await k_done.wait()
                return await asyncio.create_task(use())
            return await asyncio.create_task(around(level - 1))

        async def take_k() -> None:
            seen["k"] = await ctx.run_async("k", _identity, k)
            k_done.set()

        waiting = asyncio.ensure_future(around(depth - 1)) if depth > 1 else None
        if k_in_task:
            await asyncio.create_task(take_k())
        else:
            await take_k()
        return await (waiting if waiting is not None else asyncio.create_task(use()))
    return agent


async def _identity(value: int) -> int:
    return value


@pytest.mark.parametrize("k_in_task", [False, True], ids=["k_at_the_root", "k_in_a_task"])
@pytest.mark.parametrize("depth", [1, 2, 3])
def test_a_task_made_after_the_changed_step_executes_again_at_every_depth(
        backend: Backend, depth: int, k_in_task: bool):  # noqa: F811
    """The rule of a re-run (docs: guarantees, on_change="rerun") at every depth: a task
    created after the changed step completed executes again, also when the task that
    created it existed before the change and keeps its own place."""
    store = backend.open()
    assert dn.execute("r", _uses_k_in_a_task_made_after_it(1, depth, k_in_task),
                      journal=store) == "used k=1"
    use_key = next(e.key for e in store.steps("r") if e.name == "use")
    assert use_key.count("#") == depth, use_key
    assert dn.execute("r", _uses_k_in_a_task_made_after_it(2, depth, k_in_task),
                      journal=store, on_change="rerun") == "used k=2"
    assert [e.result for e in store.steps("r") if e.name == "use"] == ["used k=2"]


def test_a_rewind_renumbers_when_the_kept_tasks_were_created(backend: Backend):  # noqa: F811
    store = backend.open()
    store.create_run(RunRecord(run_id="r"))
    for position, (key, spawned) in enumerate([("0", None), ("1", None), ("t#0.0", [2]),
                                               ("t#0.1", [2]), ("2", None)]):
        store.append_step("r", dataclasses.replace(_entry(position, key), spawned=spawned))
    lease = Lease.acquire(store, "r")
    kept = [e for e in store.steps("r") if e.key != "1"]
    rewind(store, store.get_run("r"), kept, token=lease.token)
    assert [(e.key, e.position, e.spawned) for e in store.steps("r")] == [
        ("0", 0, None), ("t#0.0", 1, [1]), ("t#0.1", 2, [1]), ("2", 3, None)]


# --- the fork a re-run keeps ------------------------------------------------------------------

def _chat_then_step(client, value: str):
    def agent(ctx):
        reply = ctx.chat(client=client, model="loopback-1",
                         messages=[{"role": "user", "content": "hi"}])
        return [reply.choices[0].message.content, ctx.run("step", lambda v: v, value)]
    return agent


def test_the_fork_of_a_rerun_keeps_the_done_run_as_it_was(backend: Backend):  # noqa: F811
    store = backend.open()
    with LoopbackServer(["hello"] * 3) as server:
        client = openai.OpenAI(base_url=server.url, api_key="loopback", max_retries=0)
        assert dn.execute("r", _chat_then_step(client, "a"), journal=store) == ["hello", "a"]
        done = store.get_run("r")
        assert dn.execute("r", _chat_then_step(client, "b"), journal=store,
                          on_change="rerun") == ["hello", "b"]
        fork = store.get_run("r@1")
        assert (fork.status, fork.result, fork.error, fork.finished_at) == \
            (Status.DONE, done.result, None, done.finished_at)
        assert (fork.step_count, fork.iteration, fork.prompt_tokens, fork.completion_tokens,
                fork.cost) == (2, 1, done.prompt_tokens, done.completion_tokens, done.cost) \
            and done.prompt_tokens > 0
        assert fork.attempts == done.attempts and fork.forked_from["run_id"] == "r"
        assert [e.result for e in store.steps("r@1")][1] == "a"
        # the fork replays as the run did
        assert dn.execute("r@1", _chat_then_step(client, "a"), journal=store) == ["hello", "a"]
        assert server.stats()["total"] == 1


def test_the_fork_of_a_rerun_keeps_a_failed_or_waiting_run_as_it_was(
        backend: Backend):  # noqa: F811
    store = backend.open()

    def failing(value: str, fail: bool):
        def agent(ctx):
            ctx.run("step", lambda v: v, value)
            if fail:
                raise RuntimeError("the handler broke")
            return "ok"
        return agent

    with pytest.raises(RuntimeError):
        dn.execute("f", failing("a", True), journal=store)
    failed = store.get_run("f")
    assert dn.execute("f", failing("b", False), journal=store, on_change="rerun") == "ok"
    fork = store.get_run("f@1")
    assert (fork.status, fork.error, fork.step_count) == (Status.FAILED, failed.error, 1)

    def parking(value: str):
        def agent(ctx):
            ctx.run("step", lambda v: v, value)
            return ctx.approval("send", {"to": "bob"}).approved
        return agent

    assert dn.execute("w", parking("a"), journal=store, on_approval="park") is None
    waiting = store.get_run("w")
    assert dn.execute("w", parking("b"), journal=store, on_approval="park",
                      on_change="rerun") is None
    fork = store.get_run("w@1")
    # A fork asks nobody: kept CANCELLED, with the request it waited for.
    assert fork.status is Status.CANCELLED and fork.step_count == 1
    assert fork.pending_approval == dict(waiting.pending_approval, run_id="w@1")
    assert "while it waited for approval of 'send'" in fork.error


def test_the_fork_of_a_waiting_run_and_its_waiting_child_run_asks_nobody(
        backend: Backend):  # noqa: F811
    store = backend.open()

    def helper(ctx, to):
        return ctx.approval("send", {"to": to}).approved

    def agent(to: str):
        return lambda ctx: ctx.child("helper", helper, ctx.run("to", lambda v: v, to))

    assert dn.execute("p", agent("bob"), journal=store, on_approval="park") is None
    asked = store.get_run("p/helper-1").pending_approval
    assert dn.rerun_from("p", 0, journal=store) == "p@1"
    fork, fork_child = store.get_run("p@1"), store.get_run("p@1/helper-1")
    assert (fork.status, fork_child.status) == (Status.CANCELLED, Status.CANCELLED)
    assert fork.pending_approval == dict(asked, run_id="p@1/helper-1")
    assert fork_child.pending_approval == dict(asked, run_id="p@1/helper-1")
    assert dn.runs("waiting_approval", journal=store) == []
    # Executing the fork again resumes it: then it asks again, its own request.
    assert dn.execute("p@1", agent("bob"), journal=store, on_approval="park") is None
    assert [r.run_id for r in dn.runs("waiting_approval", journal=store)] == \
        ["p@1", "p@1/helper-1"]


# Executes run "k" until its second step has started, then waits to be SIGKILLed.
_DYING = """
import sys, time
import durable_nb as dn
location, started = sys.argv[1:3]

def agent(ctx):
    ctx.run("step", lambda v: v, "a")
    ctx.run("hang", lambda: open(started, "w").close() or time.sleep(3600))

dn.execute("k", agent, journal=location)
"""


@pytest.mark.parametrize("fork_by", ["edit", "rerun_from"])
def test_the_fork_of_a_rerun_keeps_a_run_whose_executor_died_interrupted(
        backend: Backend, tmp_path: Path, fork_by: str):  # noqa: F811
    store = backend.open()
    started = tmp_path / "started"
    child = subprocess.Popen([sys.executable, "-c", _DYING, backend.location, str(started)],
                             cwd=REPO)
    try:
        while not started.exists():
            assert child.poll() is None, "the executor ended before its second step"
            time.sleep(0.01)
    finally:
        child.kill()
        child.wait()
    assert store.get_run("k").status is Status.RUNNING
    if fork_by == "rerun_from":  # the same fork as an execution that found a change keeps
        assert dn.rerun_from("k", 0, journal=store) == "k@1"
    else:
        assert dn.execute("k", lambda ctx: [ctx.run("step", lambda v: v, "b"),
                                            ctx.run("hang", lambda: "done")],
                          journal=store, on_change="rerun") == ["b", "done"]
    fork = store.get_run("k@1")
    assert (fork.status, fork.error, fork.step_count) == (Status.RUNNING, None, 1)
    assert is_interrupted(fork, store)  # listed as interrupted, not cancelled


# --- child runs ---------------------------------------------------------------------------

def _parent(calls: list[str], question: str):
    def helper(ctx, q):
        return ctx.run("answer", lambda: calls.append(f"answer {q}") or f"answer to {q}")

    def agent(ctx):
        asked = ctx.run("ask", lambda: question)
        return ctx.child("helper", helper, asked)
    return agent


def test_reset_removing_a_child_step_deletes_its_child_run(backend: Backend):  # noqa: F811
    store = backend.open()
    calls: list[str] = []
    assert dn.execute("job", _parent(calls, "q1"), journal=store) == "answer to q1"
    assert [r.run_id for r in store.list_runs()] == ["job", "job/helper-1"]
    dn.reset("job", 0, journal=store)
    assert [r.run_id for r in store.list_runs()] == ["job"]
    assert dn.execute("job", _parent(calls, "q2"), journal=store) == "answer to q2"
    assert calls == ["answer q1", "answer q2"]  # the sub-agent ran again, not replayed


def test_rerun_from_forks_the_child_runs_with_the_parent(backend: Backend):  # noqa: F811
    store = backend.open()
    calls: list[str] = []
    dn.execute("job", _parent(calls, "q1"), journal=store)
    assert dn.rerun_from("job", 1, journal=store) == "job@1"
    assert sorted(r.run_id for r in store.list_runs()) == ["job", "job@1", "job@1/helper-1"]
    fork_child = store.get_run("job@1/helper-1")
    assert fork_child.parent == "job@1" and store.count_steps("job@1/helper-1") == 1
    [child_step] = [e for e in store.steps("job@1") if e.kind == "child"]
    assert child_step.meta["run_id"] == "job@1/helper-1"
    assert dn.execute("job", _parent(calls, "q1"), journal=store) == "answer to q1"
    assert calls == ["answer q1", "answer q1"]


def test_delete_removes_the_run_and_its_children_only(backend: Backend):  # noqa: F811
    store = backend.open()
    calls: list[str] = []
    for run_id in ("job", "job:2", "jobs"):
        dn.execute(run_id, _parent(calls, run_id), journal=store)
    dn.delete("job", journal=store)
    assert sorted(r.run_id for r in store.list_runs()) == ["job:2", "job:2/helper-1", "jobs",
                                                           "jobs/helper-1"]
    assert dn.execute("job:2", _parent(calls, "job:2"), journal=store) == "answer to job:2"
    assert calls.count("answer job:2") == 1  # replayed from a journal left whole


def test_reset_deletes_the_child_run_of_a_failed_child_step(backend: Backend):  # noqa: F811
    store = backend.open()
    calls: list[str] = []

    def helper(ctx, fail):
        answer = ctx.run("answer", lambda: calls.append("answer") or "42")
        if fail:
            raise RuntimeError("the sub-agent broke after its step")
        return answer

    def agent(fail):
        return lambda ctx: ctx.child("helper", helper, ctx.run("ask", lambda: fail))

    with pytest.raises(RuntimeError):
        dn.execute("job", agent(True), journal=store)
    assert store.find_run("job/helper-1") is not None  # no meta names it: found by its key
    dn.reset("job", 1, journal=store)
    assert [r.run_id for r in store.list_runs()] == ["job"]
    dn.reset("job", 0, journal=store)
    assert dn.execute("job", agent(False), journal=store) == "42"
    assert calls == ["answer", "answer"]


# --- a journal written before task creations were journaled ---------------------------------

def test_a_journal_written_by_4099b3e_replays_and_reruns_counting_tasks_from_their_first_step(
        tmp_path: Path):
    from tests.fixtures.old_journal import FIXTURE, RUN_ID, payments, restore
    written = json.loads(FIXTURE.read_text())
    restore(written["rows"], tmp_path / "old")
    location = str(tmp_path / "old")
    store = DiskJournal(location)
    assert [e.spawned for e in store.steps(RUN_ID)] == [None] * 5
    charges: list[tuple[str, int]] = []
    before = [["alice paid 10", "tip paid 1"], ["bob paid 20", "receipt paid 1", "thanks paid 0"]]
    assert dn.execute(RUN_ID, payments(charges, 20), journal=location) == before
    assert charges == []  # replayed whole

    # bob's charge edited: executed again from it (step 1)
    after = dn.execute(RUN_ID, payments(charges, 25), journal=location, on_change="rerun")
    assert after == [["alice paid 10", "tip paid 1"],
                     ["bob paid 25", "receipt paid 1", "thanks paid 0"]]
    # alice's task completed a step before bob's charge, so it existed: her charge and her
    # tip (completed after bob's) replay. The receipt's task, created before bob paid but
    # without a journaled creation, counts as created when its first step completed, after
    # bob's charge: it is charged again, as the thank-you created after it is.
    assert charges[0] == ("bob", 25) and sorted(charges[1:]) == [("receipt", 1), ("thanks", 0)]
    fork = {e.key: e for e in store.steps(RUN_ID + "@1")}
    assert [(k, e.result, e.spawned) for k, e in fork.items()] == [
        (json.loads(row["value"])["id"], json.loads(row["value"])["r"], None)
        for row in written["rows"] if row["key"].startswith("step:")]
    assert store.get_run(RUN_ID + "@1").status is Status.DONE
    # the kept entries stay as the old code wrote them; those executed again journal their
    # tasks' creations
    spawned = {e.key: e.spawned for e in store.steps(RUN_ID)}
    assert spawned["alice#0.0"] is None and spawned["alice#0.1"] is None
    assert spawned["bob#0.receipt#0.0"] is not None and spawned["bob#0.thanks#0.0"] is not None

    # edited again: now the receipt's creation is journaled (before bob's charge): it replays
    charges.clear()
    again = dn.execute(RUN_ID, payments(charges, 30), journal=location, on_change="rerun")
    assert again[1] == ["bob paid 30", "receipt paid 1", "thanks paid 0"]
    assert charges == [("bob", 30), ("thanks", 0)]
    charges.clear()
    assert dn.execute(RUN_ID, payments(charges, 30), journal=location) == again
    assert charges == []
