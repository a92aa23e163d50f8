"""A real agent process SIGKILLed anywhere resumes to the uncrashed result, and nothing whose
journal entry was written runs again.

The agent is the demo's sales agent (LLM calls through the real openai client to the loopback
server in this process; tools that append to side_effects.log; send_email needs approval), run
in a child process by ``tests/agent_process.py``. It is killed with SIGKILL (a) at a tool's
entry, before its side effect; (b) after the side effect, before the journal write; (c) right
after a step's journal write; (d) while it waits for an approval; (e) while an LLM request is
in flight. Then it is run again, without kills, to DONE; the test approves as a person would.

Executions are counted outside the child: LLM calls by the server's requests per round, tool
calls by their side-effect lines. The *in-flight* step is the first one without a journal
entry at the kill: it may run twice; every other step runs exactly once.
"""

from __future__ import annotations

import signal
from collections import Counter
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Callable

import pytest

from durable_nb import Status, get_run, serde
from durable_nb.demo import SALES_CSV
from durable_nb.journal import DiskJournal, StepEntry
from durable_nb.testing import DEMO_SCRIPT, LoopbackServer
from tests.agent_process import DEMO_RUN_ID, demo_child, drive, read_result, start

KILLED = -signal.SIGKILL


@dataclass
class Uncrashed:
    result: Any
    tokens: int
    shape: list[tuple[str, str]]


class DemoRun:
    """One run of the demo agent in ``root``, executed by child processes."""

    def __init__(self, root: Path, server: LoopbackServer) -> None:
        root.mkdir(parents=True, exist_ok=True)
        (root / "sales.csv").write_text(SALES_CSV)
        self.root = root
        self.server = server
        self.journal = DiskJournal(root / "journal")
        self.approvals = 0

    def attempt(self, kills: tuple[str, ...] = (), kill_when: Callable[[], bool] | None = None,
                approve_waits: bool = True) -> int:
        """Run the agent in a new child until it exits (or is killed); its exit code."""
        process = start(demo_child, str(self.journal.directory), self.server.url,
                        str(self.root), list(kills))
        code, approvals = drive(process, self.journal, DEMO_RUN_ID,
                                approve_waits=approve_waits, kill_when=kill_when)
        self.approvals += approvals
        return code

    def status(self) -> Status | None:
        record = self.journal.find_run(DEMO_RUN_ID)
        return None if record is None else record.status

    def entries(self) -> list[StepEntry]:
        """Every journal entry, each parsed (CorruptEntry would fail the test)."""
        return list(self.journal.steps(DEMO_RUN_ID))

    def side_effects(self) -> Counter:
        log = self.root / "side_effects.log"
        lines = log.read_text().splitlines() if log.exists() else []
        return Counter(line.split()[0] for line in lines)

    def executions(self) -> dict[int, int]:
        """How often each journaled chat and tool step really ran, by position."""
        effects = self.side_effects()
        counts, round_ = {}, 0
        for entry in self.entries():
            if entry.kind == "chat":
                counts[entry.position] = self.server.count(round=round_)
                round_ += 1
            elif entry.kind == "run":  # each demo tool is called once
                counts[entry.position] = effects[entry.name]
        return counts


@pytest.fixture(scope="module")
def uncrashed(tmp_path_factory) -> Uncrashed:
    with LoopbackServer() as server:
        run = DemoRun(tmp_path_factory.mktemp("uncrashed"), server)
        assert run.attempt() == 0
        assert set(run.executions().values()) == {1}
        info = get_run(DEMO_RUN_ID, journal=run.journal)
        return Uncrashed(read_result(run.root), info.tokens,
                         [(e.kind, e.name) for e in info.steps])


def assert_resumed_like_uncrashed(run: DemoRun, uncrashed: Uncrashed, in_flight: int) -> None:
    """DONE with the uncrashed result and token total; every step ran once except the one
    at position ``in_flight``, which ran once or twice."""
    info = get_run(DEMO_RUN_ID, journal=run.journal)
    assert info.status is Status.DONE, info.error
    assert read_result(run.root) == uncrashed.result
    assert serde.decode(info.result) == uncrashed.result
    assert [(e.kind, e.name) for e in info.steps] == uncrashed.shape
    assert info.tokens == uncrashed.tokens  # each LLM call counted once
    assert sum(e.prompt_tokens + e.completion_tokens for e in info.steps) == uncrashed.tokens
    for position, times in run.executions().items():
        if position == in_flight:
            assert 1 <= times <= 2, (position, times)
        else:
            assert times == 1, f"step {position} {uncrashed.shape[position]} ran {times} times"
    assert run.approvals == 1  # the email was approved once, even across the kill
    assert run.server.count(kind="invalid") == 0


# (kill point, position of the step in flight, how often that step ran in the end)
# Demo steps: 0 chat, 1 read_csv, 2 chat, 3 analyse, 4 chat, 5 write_report, 6 chat,
# 7 approval send_email, 8 send_email, 9 chat.
KILL_POINTS = [
    pytest.param("tool-entry:analyse", 3, 1, id="a-before-side-effect"),
    pytest.param("tool-exit:write_report", 5, 2, id="b-after-side-effect-before-journal"),
    pytest.param("tool-exit:send_email", 8, 2, id="b-after-approved-side-effect"),
    pytest.param("after-step:4", 5, 1, id="c-after-llm-step-journaled"),
    pytest.param("after-step:7", 8, 1, id="c-after-approval-journaled"),
]


@pytest.mark.parametrize("kill, in_flight, in_flight_runs", KILL_POINTS)
def test_self_sigkill_resumes_without_rerunning_journaled_steps(
        tmp_path, uncrashed, kill, in_flight, in_flight_runs):
    with LoopbackServer() as server:
        run = DemoRun(tmp_path, server)
        assert run.attempt((kill,)) == KILLED
        at_kill = run.entries()
        assert len(at_kill) == in_flight
        assert run.status() is not Status.DONE

        assert run.attempt((kill,)) == 0  # the marker file keeps the hook from firing again
        assert_resumed_like_uncrashed(run, uncrashed, in_flight)
        assert run.executions()[in_flight] == in_flight_runs
        assert [e.to_json() for e in run.entries()[:in_flight]] == \
            [e.to_json() for e in at_kill]  # resuming rewrote no journaled step
        # send_email's idempotency key (ctx.step_id) is stable: one email however often it ran.
        assert len(list((tmp_path / "outbox").iterdir())) == 1


def test_sigkill_while_waiting_for_approval_resumes_the_wait(tmp_path, uncrashed):
    with LoopbackServer() as server:
        run = DemoRun(tmp_path, server)
        waiting = lambda: run.status() is Status.WAITING_APPROVAL  # noqa: E731
        assert run.attempt(kill_when=waiting, approve_waits=False) == KILLED
        record = run.journal.get_run(DEMO_RUN_ID)
        assert record.pending_approval["name"] == "send_email"
        assert len(run.entries()) == 7  # the approval is in flight at position 7
        assert run.approvals == 0

        assert run.attempt() == 0
        assert_resumed_like_uncrashed(run, uncrashed, in_flight=7)
        assert run.side_effects()["send_email"] == 1


def test_sigkill_during_an_llm_request_counts_its_tokens_once(tmp_path, uncrashed):
    # Round 1 (step 2) answers after 1.5 s: the test kills the child while it waits.
    slow = list(DEMO_SCRIPT)
    slow[1] = replace(slow[1], delay=1.5)
    with LoopbackServer(slow) as server:
        run = DemoRun(tmp_path, server)
        assert run.attempt(kill_when=lambda: server.count(round=1) >= 1) == KILLED
        assert len(run.entries()) == 2
        assert server.count(round=0) == 1 and server.count(round=1) == 1

        assert run.attempt() == 0
        assert_resumed_like_uncrashed(run, uncrashed, in_flight=2)
        assert run.executions()[2] == 2  # the killed request and the resumed one


def test_rerunning_a_finished_run_makes_no_llm_requests_and_returns_the_same_result(
        tmp_path, uncrashed):
    with LoopbackServer() as server:
        run = DemoRun(tmp_path, server)
        assert run.attempt() == 0
        first = read_result(run.root)
        requests, effects = server.stats(), run.side_effects()
        (tmp_path / "result.json").unlink()

        assert run.attempt() == 0
        assert read_result(run.root) == first == uncrashed.result
        assert server.stats() == requests  # zero LLM requests
        assert run.side_effects() == effects  # and no tool ran
        assert run.approvals == 1  # nobody was asked again
