"""Moving a run between journals: ``durable-nb copy RUN --to ...`` and ``durable_nb.copy_run``.

A run started against a directory journal is stopped at an approval, copied (or moved) to the
test PostgreSQL server, approved there and executed there: its steps replay from the copy,
nothing journaled runs again, and it goes on. And back from PostgreSQL to a directory.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

import durable_nb as dn
from durable_nb import Status
from durable_nb.cli import main
from durable_nb.errors import JournalError, RunLeased
from durable_nb.journal import open_journal
from durable_nb.execution.lease import Lease
from tests.test_journal_conformance import Backend, backend, pg_backend  # noqa: F401 (fixture)

REPO = Path(__file__).resolve().parents[1]


def _agent(calls: list[str]):
    def agent(ctx):
        report = ctx.run("draft", lambda: calls.append("draft") or "report v1")
        if not ctx.approval("send", {"report": report}).approved:
            return "not sent"
        return ctx.run("send", lambda: calls.append("send") or f"sent {report}")
    return agent


def _cli(capsys, *args: str) -> tuple[int, str, str]:
    capsys.readouterr()
    code = main(list(args))
    out, err = capsys.readouterr()
    return code, out, err


@pytest.mark.postgres
def test_a_parked_run_moved_to_postgresql_resumes_there_without_running_steps_again(
        tmp_path: Path, pg_backend: Backend, postgres_server, capsys):  # noqa: F811
    disk, calls = str(tmp_path / "journal"), []
    with_password = f"{postgres_server.password_url}?schema={pg_backend.schema}"
    assert dn.execute("report", _agent(calls), journal=disk, on_approval="park") is None
    assert dn.get_run("report", journal=disk).status is Status.WAITING_APPROVAL

    code, out, err = _cli(capsys, "copy", "report", "--from", disk, "--to", with_password,
                          "--move")
    assert (code, err) == (0, "")
    assert "s3cret" not in out
    assert out.startswith("moved run report (1 step, WAITING_APPROVAL) to ")
    assert dn.runs(journal=disk) == []  # moved: gone from the directory

    dn.approve("report", "ok", journal=pg_backend.location)
    assert dn.execute("report", _agent(calls), journal=pg_backend.location) == "sent report v1"
    assert calls == ["draft", "send"]  # the draft replayed from the copy
    info = dn.get_run("report", journal=pg_backend.location)
    assert [(e.kind, e.name) for e in info.steps] == [("run", "draft"), ("approval", "send"),
                                                     ("run", "send")]

    # ... and back to a directory, under another id; the source keeps its run.
    back = str(tmp_path / "back")
    code, out, _ = _cli(capsys, "--journal", pg_backend.location, "copy", "report", "--to",
                        back, "--as", "report-copy")
    assert code == 0 and "copied run report (3 steps, DONE)" in out and "as report-copy" in out
    assert dn.execute("report-copy", _agent(calls), journal=back) == "sent report v1"
    assert calls == ["draft", "send"]
    assert dn.get_run("report", journal=pg_backend.location).status is Status.DONE


def test_a_decision_given_before_the_copy_goes_with_the_run(tmp_path: Path):
    source, target, calls = str(tmp_path / "a"), str(tmp_path / "b"), []
    dn.execute("r", _agent(calls), journal=source, on_approval="park")
    dn.reject("r", "not today", journal=source)
    record = dn.copy_run("r", target, journal=source)
    assert record.status is Status.WAITING_APPROVAL and record.run_id == "r"
    assert dn.execute("r", _agent(calls), journal=target) == "not sent"
    assert dn.get_run("r", journal=source).status is Status.WAITING_APPROVAL  # copied, kept


def test_copy_refuses_an_existing_id_and_a_run_that_is_executing(tmp_path: Path, capsys):
    source, target = str(tmp_path / "a"), str(tmp_path / "b")
    dn.execute("r", lambda ctx: ctx.run("s", lambda: 1), journal=source)
    dn.execute("r", lambda ctx: ctx.run("other", lambda: 2), journal=target)
    with pytest.raises(JournalError, match="already has a run 'r': copy it under another id "
                                           r"\(durable-nb copy r --as NEW\)"):
        dn.copy_run("r", target, journal=source)
    assert dn.get_run("r", journal=target).result == 2  # untouched

    lease = Lease.acquire(open_journal(source), "r", 30.0)  # an executor holds the run
    try:
        with pytest.raises(RunLeased, match="cancel it first"):
            dn.copy_run("r", str(tmp_path / "c"), journal=source, move=True)
        code, _, err = _cli(capsys, "--journal", source, "copy", "r", "--to",
                            str(tmp_path / "c"))
        assert code == 1 and err.startswith("durable-nb: error: ") and "cancel it first" in err
    finally:
        lease.release()
    assert dn.runs(journal=str(tmp_path / "c")) == []  # nothing written
    with pytest.raises(ValueError, match="already in"):
        dn.copy_run("r", source, journal=source)


# --- all or nothing, with child runs --------------------------------------------------------

_KILLED_COPY = """
import os, signal, sys
import durable_nb as dn
from durable_nb.journal import open_journal
source, target, kill_at = sys.argv[1], sys.argv[2], int(sys.argv[3])
journal = open_journal(target)
append = type(journal).append_step
written = []

def append_step(self, *args, **kwargs):
    written.append(1)
    if len(written) == kill_at:
        os.kill(os.getpid(), signal.SIGSTOP)  # part-way through the copy: killed there
    return append(self, *args, **kwargs)

type(journal).append_step = append_step
dn.copy_run("mail", target, journal=source, move=True)
"""


def _mailer(sent: list[int], count: int = 40):
    def agent(ctx):
        return sum(ctx.run(f"send {i}", lambda i=i: sent.append(i) or 1) for i in range(count))
    return agent


def test_a_copy_killed_part_way_leaves_no_run_and_copying_again_completes_it(
        tmp_path: Path, backend: Backend):  # noqa: F811
    source, sent = str(tmp_path / "source"), []
    target = backend.open()
    assert dn.execute("mail", _mailer(sent), journal=source) == 40
    copier = subprocess.Popen([sys.executable, "-c", _KILLED_COPY, source, backend.location,
                               "25"], cwd=REPO)
    try:
        _, status = os.waitpid(copier.pid, os.WUNTRACED)
        assert os.WIFSTOPPED(status), status
        # The copier holds the run's lease for the whole copy: the run cannot execute meanwhile.
        with pytest.raises(RunLeased, match="being executed by pid"):
            dn.execute("mail", _mailer(sent), journal=source)
    finally:
        copier.kill()
        copier.wait()
    assert copier.returncode == -signal.SIGKILL
    assert target.find_run("mail") is None  # no run to execute
    [staged] = target.list_runs()  # what is left says what it is, and never executes
    assert staged.status is Status.FAILED and "incomplete copy of run 'mail'" in staged.error
    assert f"durable-nb delete '{staged.run_id}'" in staged.error
    with pytest.raises(ValueError, match="invalid run id"):
        dn.execute(staged.run_id, _mailer(sent), journal=target)
    with pytest.raises(JournalError, match="a copy of it to here was cut short"):
        dn.execute("mail", _mailer(sent), journal=target)  # would send every email again
    assert target.list_runs() == [staged] and sent == list(range(40))
    assert dn.get_run("mail", journal=source).step_count == 40  # the move did not delete it
    record = dn.copy_run("mail", backend.location, journal=source, move=True)
    assert record.step_count == 40 and dn.runs(journal=source) == []
    assert [r.run_id for r in target.list_runs()] == ["mail"]  # the cut-short copy is gone
    assert target.count_steps(staged.run_id) == 0
    assert dn.execute("mail", _mailer(sent), journal=target) == 40
    assert sent == list(range(40))  # every email sent once


def _with_child(calls: list[str]):
    def helper(ctx, question):
        return ctx.run("answer", lambda: calls.append("answer") or f"answer to {question}")

    def agent(ctx):
        return ctx.child("helper", helper, ctx.run("ask", lambda: "q"))
    return agent


def test_child_runs_travel_with_a_move_under_another_id(tmp_path: Path,
                                                        backend: Backend):  # noqa: F811
    source, calls = str(tmp_path / "source"), []
    target = backend.open()
    assert dn.execute("job", _with_child(calls), journal=source) == "answer to q"
    dn.copy_run("job", backend.location, journal=source, new_id="job2", move=True)
    assert dn.runs(journal=source) == []  # parent and child moved: no orphan left
    assert sorted(r.run_id for r in target.list_runs()) == ["job2", "job2/helper-1"]
    assert target.get_run("job2/helper-1").parent == "job2"
    [child_step] = [e for e in target.steps("job2") if e.kind == "child"]
    assert child_step.meta["run_id"] == "job2/helper-1"
    assert dn.execute("job2", _with_child(calls), journal=target) == "answer to q"
    assert calls == ["answer"]  # replayed from the moved journal
    dn.reset("job2", 1, journal=target)
    assert target.find_run("job2/helper-1") is None  # its child step was reset with it
    assert dn.execute("job2", _with_child(calls), journal=target) == "answer to q"
    assert calls == ["answer", "answer"]
