"""Recorded runs checked against edited code by a dry replay (durable_nb.checking): runs
recorded by tests/check_agent.py in a child process with the real openai client over HTTP to
the loopback server, on a real diskcache journal and a real PostgreSQL; the checks send no
request (the server's counters), run no tool (effects.txt), and leave the journal as it was
(its files hashed; PostgreSQL's rows read before and after)."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

import durable_nb
from durable_nb import Status
from durable_nb.checking.handlers import load_object
from durable_nb.journal import open_journal
from durable_nb.testing import Echo, LoopbackServer

AGENT = Path(__file__).with_name("check_agent.py")
REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def server():
    with LoopbackServer(Echo()) as srv:
        yield srv


@pytest.fixture(params=["diskcache", "postgresql"])
def recorded(request, tmp_path, server):
    """A work folder with sales_agent.py and a journal (by location) where it recorded
    its runs in a child process: (folder, journal location)."""
    if request.param == "diskcache":
        location = str(tmp_path / "journal")
    else:
        pg = request.getfixturevalue("postgres_server")
        location = f"{pg.url}?schema=check_{uuid.uuid4().hex[:10]}"
    shutil.copy(AGENT, tmp_path / "sales_agent.py")
    env = {**os.environ, "OPENAI_BASE_URL": server.url, "OPENAI_API_KEY": "offline",
           "PYTHONPATH": str(REPO)}
    done = subprocess.run([sys.executable, "sales_agent.py", location], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout.splitlines()[-1])["sales-q3"] == "WAITING_APPROVAL"
    return tmp_path, location


def edit(folder: Path, old: str, new: str) -> None:
    path = folder / "sales_agent.py"
    text = path.read_text()
    assert old in text
    path.write_text(text.replace(old, new))


def handler(folder: Path, name: str = "handler"):
    return load_object(f"{folder / 'sales_agent.py'}:{name}")


class Untouched:
    """What must not change while runs are checked: the model server's request count, the
    tools' effects, the journal (its files' bytes; PostgreSQL's records and steps)."""

    def __init__(self, folder: Path, location: str, server: LoopbackServer) -> None:
        self.folder, self.location, self.server = folder, location, server
        self.before = self.snapshot()

    def snapshot(self) -> tuple:
        effects = (self.folder / "effects.txt").read_text()
        return self.server.stats()["total"], effects, self.journal_state()

    def journal_state(self) -> dict:
        if not self.location.startswith("postgresql"):
            return {p.name: hashlib.sha256(p.read_bytes()).hexdigest()
                    for p in sorted(Path(self.location).rglob("*")) if p.is_file()}
        journal = open_journal(self.location)
        return {r.run_id: (r.to_json(), [e.__dict__ for e in journal.steps(r.run_id)])
                for r in journal.list_runs()}

    def assert_untouched(self) -> None:
        calls, effects, state = self.snapshot()
        assert (calls, effects) == self.before[:2]
        before = self.before[2]
        # SQLite read-only beside live writers may add its companion files (no data);
        # every file that was there is byte for byte what it was.
        assert {name: state[name] for name in before} == before
        assert set(state) - set(before) <= {"cache.db-wal", "cache.db-shm"}


def test_unchanged_code_replays_and_nothing_is_called_or_written(recorded, server):
    folder, location = recorded
    untouched = Untouched(folder, location, server)
    report = durable_nb.check(handler(folder), journal=location, prefix="sales-")
    untouched.assert_untouched()
    verdicts = {run.run_id: run.verdict for run in report}
    assert verdicts == {"sales-q1": "replays", "sales-q2": "replays", "sales-q3": "would execute",
                        "sales-q4": "replays"}
    assert report.ok and report.counts == {"replays": 3, "would execute": 1, "diverges": 0}
    parked = report["sales-q3"]
    assert (parked.position, parked.step, parked.approval, parked.status) == (
        2, "approval 'send_report'", "send_report", Status.WAITING_APPROVAL)
    assert "parked, waiting for approval of 'send_report'" in parked.change


def test_an_edited_prompt_diverges_at_the_model_call_of_every_run_in_one_line(recorded, server):
    folder, location = recorded
    untouched = Untouched(folder, location, server)
    edit(folder, "in one line.", "in one short line.")
    report = durable_nb.check(handler(folder), journal=location, prefix="sales-")
    untouched.assert_untouched()
    assert [run.verdict for run in report] == ["diverges"] * 4
    for run in report:
        assert (run.position, run.key, run.step, run.matched) == (1, "1", "chat 'loopback-1'", 1)
        assert run.change == ("step 1 (chat 'loopback-1'): messages[0].content changed from "
                              "...'ales figures in one line.' to ...'ales figures in one "
                              "short line.'")
        assert "\n" not in run.line()
        diff = run.diff()
        assert '-      "content": "Summarise the sales figures in one line.",' in diff
        assert '+      "content": "Summarise the sales figures in one short line.",' in diff
    assert not report.ok


def test_an_edit_after_the_approval_leaves_parked_runs_to_execute_and_finished_ones_diverge(
        recorded, server):
    folder, location = recorded
    untouched = Untouched(folder, location, server)
    edit(folder, "-- the sales bot", "-- the sales team")
    report = durable_nb.check(handler(folder), journal=location, prefix="sales-")
    untouched.assert_untouched()
    assert {run.run_id: run.verdict for run in report} == {
        "sales-q1": "diverges", "sales-q2": "diverges",  # emailed with the old signature
        "sales-q3": "would execute",                     # parked before it: resumes at it
        "sales-q4": "replays"}                           # rejected: never emailed
    sent = report["sales-q1"]
    assert (sent.position, sent.step) == (3, "run 'send_email'")
    assert "args[0] changed from" in sent.change and sent.change.endswith("-- the sales team'")
    assert report["sales-q3"].approval == "send_report"


def test_a_done_run_whose_code_returns_another_result_diverges_at_its_result(recorded, server):
    folder, location = recorded
    edit(folder, "    return summary\n", "    return summary.upper()\n")
    report = durable_nb.check(handler(folder), journal=location, runs=["sales-q1", "sales-q3"])
    done, parked = report["sales-q1"], report["sales-q3"]
    assert done.verdict == "diverges" and done.position is None and done.matched == 4
    assert done.change.startswith("its result: result changed from 'echo: ")
    assert [line[0] for line in done.diff().splitlines()[3:]] == ["-", "+"]
    assert parked.verdict == "would execute"  # it has no result yet


def test_a_batch_is_checked_by_prefix_with_its_items(recorded, server):
    folder, location = recorded
    untouched = Untouched(folder, location, server)
    items = ["q1", "q2", "q3", "q4", "q5"]
    report = durable_nb.check(handler(folder, "item_handler"), journal=location,
                              prefix="quarters", items=items)
    assert [run.verdict for run in report] == ["replays"] * 4 + ["would execute"]
    assert report.runs[4].change == "item 4 was not started: every step is new"
    edit(folder, "in one line.", "in two lines.")
    edited = durable_nb.check(handler(folder, "item_handler"), journal=location,
                              prefix="quarters/", items=items[:4])
    untouched.assert_untouched()
    assert [(run.verdict, run.position) for run in edited] == [("diverges", 1)] * 4
    assert all(run.run_id.startswith("quarters/") for run in edited)


def test_the_command_checks_without_an_api_key_and_exits_1_when_a_run_diverges(recorded, server):
    folder, location = recorded
    untouched = Untouched(folder, location, server)
    env = {k: v for k, v in os.environ.items() if not k.startswith("OPENAI_")}
    env["PYTHONPATH"] = str(REPO)

    def command(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-m", "durable_nb.cli", "--journal", location,
                               "check", *args], cwd=folder, env=env, capture_output=True,
                              text=True, timeout=120)

    fits = command("--handler", "sales_agent:handler", "--prefix", "sales-")
    assert fits.returncode == 0, fits.stderr
    assert fits.stdout.splitlines()[-1] == "4 runs checked: 3 replays, 1 would execute, 0 diverges"
    edit(folder, "in one line.", "in one short line.")
    diverges = command("--handler", "sales_agent:handler", "sales-q1", "sales-q3", "--diff")
    assert diverges.returncode == 1, diverges.stderr
    lines = diverges.stdout.splitlines()
    assert lines[0].startswith("sales-q1  diverges  step 1 (chat 'loopback-1'): messages[0]")
    assert '+      "content": "Summarise the sales figures in one short line.",' in lines
    batch = command("--handler", "sales_agent:item_handler", "--prefix", "quarters",
                    "--items", "sales_agent:QUARTERS", "--json")
    assert batch.returncode == 1
    assert [json.loads(line)["step"] for line in batch.stdout.splitlines()] == [1] * 4
    untouched.assert_untouched()


def test_a_failed_run_would_execute_its_failed_step_again(tmp_path):
    journal = str(tmp_path / "journal")
    calls = []

    def flaky(ctx):
        ctx.run("first", lambda: 1)
        return ctx.run("second", lambda: calls.append(1) or 1 / 0)

    with pytest.raises(ZeroDivisionError):
        durable_nb.execute("flaky", flaky, journal=journal)
    report = durable_nb.check(flaky, journal=journal)
    assert calls == [1]
    run = report["flaky"]
    assert (run.verdict, run.position, run.step) == ("would execute", 1, "run 'second'")
    assert run.change == "step 1 (run 'second') failed the run; resuming executes it again"


def test_a_handler_that_raises_now_diverges_and_a_run_asking_fewer_steps_too(tmp_path):
    journal = str(tmp_path / "journal")
    durable_nb.execute("two", lambda ctx: [ctx.run("a", lambda: 1), ctx.run("b", lambda: 2)],
                       journal=journal)
    fewer = durable_nb.check(lambda ctx: ctx.run("a", lambda: 1), journal=journal)["two"]
    assert (fewer.verdict, fewer.position) == ("diverges", 1)
    assert fewer.change == "step 1: the code ended without asking for journaled steps 1 (run 'b')"

    def broken(ctx):
        ctx.run("a", lambda: 1)
        raise KeyError("gone")

    raised = durable_nb.check(broken, journal=journal)["two"]
    assert raised.verdict == "diverges"
    assert raised.change == "the code raised KeyError: 'gone' after 1 journaled steps"


@pytest.mark.timeout(120)
def test_a_run_killed_in_a_long_sleep_is_checked_without_sleeping(tmp_path):
    journal = str(tmp_path / "journal")
    child = subprocess.Popen([sys.executable, "-c", (
        "import durable_nb, sys; durable_nb.execute('nap', lambda ctx: ctx.sleep(3600) or "
        "'woke', journal=sys.argv[1])"), journal], env={**os.environ, "PYTHONPATH": str(REPO)})
    try:
        deadline = time.monotonic() + 60
        while not (Path(journal).exists() and durable_nb.runs(journal=journal)
                   and durable_nb.get_run("nap", journal=journal).step_count):
            assert time.monotonic() < deadline and child.poll() is None
            time.sleep(0.05)
    finally:
        child.kill()
        child.wait()
    run = durable_nb.check(lambda ctx: ctx.sleep(3600) or "woke", journal=journal)["nap"]
    assert (run.verdict, run.status) == ("would execute", Status.RUNNING)
    assert run.change == "every step replays (1); resuming ends the run DONE, no step executed"


def test_unknown_runs_are_named(tmp_path):
    journal = str(tmp_path / "journal")
    durable_nb.execute("some", lambda ctx: None, journal=journal)
    with pytest.raises(durable_nb.UnknownRun, match="no run 'nope'"):
        durable_nb.check(lambda ctx: None, journal=journal, runs=["nope"])


def test_recorded_done_runs_are_pytest_tests_that_fail_on_an_edit_with_the_step_and_diff(
        recorded, server):
    folder, location = recorded
    if location.startswith("postgresql"):
        pytest.skip("the plugin reads either journal through check(); one is enough here")
    (folder / "pytest.ini").write_text(
        f"[pytest]\ndurable_nb_handler = sales_agent:handler\ndurable_nb_journal = {location}\n"
        f"durable_nb_prefix = sales-\n")
    (folder / "test_nothing.py").write_text("def test_nothing():\n    pass\n")
    env = {k: v for k, v in os.environ.items() if not k.startswith("OPENAI_")}
    env["PYTHONPATH"] = str(REPO)

    def pytest_run(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider",
                               "-rA", *args], cwd=folder, env=env, capture_output=True,
                              text=True, timeout=300)

    passing = pytest_run("-q")
    assert passing.returncode == 0, passing.stdout + passing.stderr
    for run_id in ("sales-q1", "sales-q2", "sales-q4"):  # the DONE ones; q3 is parked
        assert f"PASSED durable_nb[{run_id}]" in passing.stdout
    assert "4 passed" in passing.stdout
    edit(folder, "in one line.", "in one short line.")
    failing = pytest_run("-q", "-k", "q1")
    assert failing.returncode == 1
    assert ("sales-q1  diverges  step 1 (chat 'loopback-1'): messages[0].content changed from"
            in failing.stdout)
    assert '+      "content": "Summarise the sales figures in one short line.",' in failing.stdout
    assert "1 failed, 3 deselected" in failing.stdout


def test_the_pytest_plugin_adds_nothing_to_a_suite_that_does_not_ask(tmp_path):
    (tmp_path / "test_other.py").write_text("def test_other():\n    pass\n")
    (tmp_path / "journal").mkdir()
    durable_nb.execute("some-run", lambda ctx: ctx.run("a", lambda: 1),
                       journal=tmp_path / ".durable_nb")
    done = subprocess.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-q",
                           "--collect-only"], cwd=tmp_path, capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "test_other.py::test_other" in done.stdout and "durable_nb[" not in done.stdout
    assert "1 test collected" in done.stdout


def test_the_pytest_plugin_off_imports_nothing_of_durable_nb(tmp_path):
    """Every pytest session where durable_nb is installed loads the plugin's entry point:
    while the plugin is off, that costs no import of durable_nb (issue 43 review)."""
    (tmp_path / "test_other.py").write_text(
        "import sys\n"
        "def test_other():\n"
        "    loaded = sorted(m for m in sys.modules if m.split('.')[0] == 'durable_nb')\n"
        "    assert loaded == [], loaded\n")
    done = subprocess.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-q",
                           "--trace-config"], cwd=tmp_path, capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "<module 'pytest_durable_nb'" in done.stdout  # loaded, and imports nothing
    assert "1 passed" in done.stdout


def test_a_done_run_whose_code_asks_a_new_step_diverges_as_executing_it_would_refuse(tmp_path):
    journal = str(tmp_path / "journal")
    durable_nb.execute("short", lambda ctx: ctx.run("a", lambda: 1), journal=journal)

    def longer(ctx):
        ctx.run("a", lambda: 1)
        return ctx.run("b", lambda: 2)

    run = durable_nb.check(longer, journal=journal)["short"]
    assert (run.verdict, run.position, run.step) == ("diverges", 1, "run 'b'")
    assert run.change == ("step 1: the run is DONE with 1 steps, but the code now asks for a "
                          "new step 1 (run 'b')")
    with pytest.raises(durable_nb.JournalMismatch):
        durable_nb.execute("short", longer, journal=journal)


def test_a_parked_approval_asked_with_other_details_says_resuming_asks_again(tmp_path):
    journal = str(tmp_path / "journal")
    durable_nb.execute("ask", lambda ctx: ctx.approval("deploy", {"to": "staging"}),
                       journal=journal, on_approval="park")
    same = durable_nb.check(lambda ctx: ctx.approval("deploy", {"to": "staging"}),
                            journal=journal)["ask"]
    other = durable_nb.check(lambda ctx: ctx.approval("deploy", {"to": "production"}),
                             journal=journal)["ask"]
    assert (same.verdict, same.approval, other.verdict) == (
        "would execute", "deploy", "would execute")
    assert same.change == ("step 0 (approval 'deploy'): parked, waiting for approval of "
                           "'deploy'; resuming goes on from it")
    assert "the code now asks it with other details; resuming asks again" in other.change
    assert durable_nb.get_run("ask", journal=journal).pending_approval["details"] == {
        "to": "staging"}


def test_a_run_held_by_a_live_executor_is_checked_without_taking_its_lease(tmp_path):
    from durable_nb.execution.lease import Lease

    journal = open_journal(str(tmp_path / "journal"))
    durable_nb.execute("busy", lambda ctx: ctx.run("a", lambda: 1), journal=journal)
    lease = Lease.acquire(journal, "busy", 60)
    try:
        held = journal.lease("busy")
        run = durable_nb.check(lambda ctx: ctx.run("a", lambda: 1), journal=journal)["busy"]
        assert run.verdict == "replays"
        assert journal.lease("busy") == held and lease.renew()
    finally:
        lease.release()


def test_the_pytest_plugin_names_a_journal_that_is_not_there(tmp_path):
    (tmp_path / "pytest.ini").write_text(
        "[pytest]\ndurable_nb_handler = json:loads\ndurable_nb_journal = missing\n")
    done = subprocess.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-q"],
                          cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert done.returncode == 4  # pytest's usage error
    assert "durable_nb plugin: " in done.stderr and "missing" in done.stderr


def test_a_handler_named_as_a_module_leaves_sys_path_as_it_was(tmp_path, monkeypatch):
    """``module:function`` is imported from the current folder without adding that folder
    to the ``sys.path`` of the process (a user's pytest session) for good (issue 43 review)."""
    (tmp_path / "handler_here.py").write_text("def handler(ctx):\n    return 1\n")
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "path", [p for p in sys.path if p not in ("", str(tmp_path))])
    monkeypatch.setitem(sys.modules, "handler_here", None)  # removed again after the test
    monkeypatch.delitem(sys.modules, "handler_here")
    before = list(sys.path)
    assert load_object("handler_here:handler").__module__ == "handler_here"
    assert sys.path == before
