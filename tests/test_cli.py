"""``durable-nb`` as a person types it: a real child process on a real journal.

Inspection (``runs``, ``show``, ``export``) never creates or writes a journal; options are
never abbreviated and near misses get a suggestion; errors are one line with what to do.
"""

from __future__ import annotations

import inspect
import json
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

import durable_nb as dn
from durable_nb import DiskJournal, RunRecord, Status, StepEntry
from durable_nb.cli import main
from durable_nb.journal import open_journal, this_host
from durable_nb.execution.lease import this_place

REPO = Path(__file__).resolve().parents[1]


def cli(*args: str, cwd: Path | None = None, env: dict | None = None,
        prefix: list[str] | None = None) -> subprocess.CompletedProcess:
    """``durable-nb ARGS`` in a child process (``prefix`` e.g. runs it in a mount namespace)."""
    full_env = {**os.environ, "PYTHONPATH": str(REPO), **(env or {})}
    return subprocess.run([*(prefix or []), sys.executable, "-m", "durable_nb.cli", *args],
                          capture_output=True, text=True, timeout=120, cwd=cwd, env=full_env)


@pytest.fixture
def run(capsys, monkeypatch):
    """``durable-nb ARGS`` in this process (the same main() the command calls, without the
    second of imports a child pays): a CompletedProcess-like result."""
    def call(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess:
        if cwd is not None:
            monkeypatch.chdir(cwd)
        capsys.readouterr()
        try:
            code = main(list(args))
        except SystemExit as exc:
            code = exc.code
        out, err = capsys.readouterr()
        return subprocess.CompletedProcess(list(args), code, out, err)

    return call


def _done_run(directory: Path, run_id: str = "r", steps: int = 3) -> None:
    journal = DiskJournal(directory)
    dn.execute(run_id, lambda ctx: [ctx.run(f"s{i}", lambda i=i: i) for i in range(steps)],
               journal=journal)
    journal.close()


def _dead_pid() -> int:
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    return child.pid


def test_no_command_lists_the_commands(tmp_path: Path, run) -> None:
    proc = run(cwd=tmp_path)
    assert proc.returncode == 2
    for command in ("runs", "show", "approve", "reject", "cancel", "reset", "delete", "export",
                    "demo", "enable", "disable"):
        assert f"\n  {command} " in proc.stderr, command
    assert not (tmp_path / ".durable_nb").exists()


def test_runs_on_a_missing_journal_says_so_exits_1_and_creates_nothing(tmp_path: Path) -> None:
    missing = tmp_path / "nonexistent"
    for args in (["runs"], ["show", "r"], ["export", "r", "--to", str(tmp_path / "r.ipynb")]):
        proc = cli("--journal", str(missing), *args)
        assert proc.returncode == 1, proc
        assert proc.stderr == (f"durable-nb: error: there is no journal at {missing}: no run "
                               f"was ever recorded there. Point --journal (or DURABLE_NB_DIR, "
                               f"DURABLE_NB_JOURNAL) at the directory or postgresql:// URL that "
                               f"holds your runs; the default is ./.durable_nb in the folder "
                               f"where the notebook or script ran.\n")
    assert not missing.exists()
    # The default location too: nothing appears in the current directory.
    assert cli("runs", cwd=tmp_path, env={"DURABLE_NB_DIR": ""}).returncode == 1
    assert not (tmp_path / ".durable_nb").exists()


def test_abbreviated_options_are_refused_with_a_suggestion(tmp_path: Path, run) -> None:
    _done_run(tmp_path / "j")
    proc = run("--journal", str(tmp_path / "j"), "runs", "--stat", "DONE")
    assert proc.returncode == 2
    assert "unrecognized arguments: --stat DONE" in proc.stderr
    assert "--stat is not an option (options are never abbreviated): did you mean --status?" \
        in proc.stderr
    proc = run("--journal", str(tmp_path / "j"), "shwo", "r")
    assert proc.returncode == 2 and "did you mean 'show'?" in proc.stderr


def test_a_run_id_split_by_a_space_is_explained(tmp_path: Path, run) -> None:
    _done_run(tmp_path / "j", "sales-report")
    proc = run("--journal", str(tmp_path / "j"), "show", "sales", "report")
    assert proc.returncode == 2
    assert "unrecognized arguments: report" in proc.stderr
    assert "a run id is one word without spaces: did you mean 'sales-report'?" in proc.stderr


def test_status_is_case_insensitive(tmp_path: Path, run) -> None:
    _done_run(tmp_path / "j")
    for status in ("done", "Done", "DONE"):
        proc = run("--journal", str(tmp_path / "j"), "runs", "--status", status)
        assert proc.returncode == 0 and proc.stdout.splitlines()[1].startswith("r "), proc
    proc = run("--journal", str(tmp_path / "j"), "runs", "--status", "finished")
    assert proc.returncode == 2 and "unknown status 'finished': use one of RUNNING" in proc.stderr


def test_reset_outside_the_journal_is_refused_and_changes_nothing(tmp_path: Path, run) -> None:
    _done_run(tmp_path / "j")
    for step in ("-1", "3", "99"):
        proc = run("--journal", str(tmp_path / "j"), "reset", "r", "--from", step)
        assert proc.returncode == 1
        assert proc.stderr == (f"durable-nb: error: cannot reset run 'r' from step {step}: its "
                               f"steps are numbered 0 to 2. See `durable-nb show r`.\n")
    record = DiskJournal(tmp_path / "j").get_run("r")
    assert record.status is Status.DONE and record.result == [0, 1, 2]


def test_a_run_whose_process_died_shows_as_interrupted(tmp_path: Path, run) -> None:
    journal = DiskJournal(tmp_path / "j")
    now = time.time()
    record = RunRecord(run_id="crashed", status=Status.RUNNING, iteration=1, step_count=1,
                       created_at=now - 60, updated_at=now - 5,
                       owner={"pid": _dead_pid(), "host": this_host()})
    assert journal.create_run(record)
    journal.append_step("crashed", StepEntry(0, "0", "s", "run", result=1))
    journal.acquire_lease("crashed", {"token": "t", "pid": record.owner["pid"],
                                      **this_place(), "heartbeat": now - 1},
                          lambda h: False)
    journal.close()

    runs = run("--journal", str(tmp_path / "j"), "runs")
    assert runs.returncode == 0
    assert runs.stdout.splitlines()[1].split()[:2] == ["crashed", "INTERRUPTED"]
    assert "INTERRUPTED: stopped before it finished (its process died" in runs.stdout
    shown = run("--journal", str(tmp_path / "j"), "show", "crashed")
    assert (f"status     INTERRUPTED: RUNNING in the journal, but its process (pid "
            f"{record.owner['pid']} on {this_host()}) is gone; re-run its cell") in shown.stdout
    data = json.loads(run("--journal", str(tmp_path / "j"), "show", "crashed", "--json").stdout)
    assert data["status"] == "RUNNING" and data["interrupted"] is True


def test_every_status_runs_shows_can_be_asked_for(tmp_path: Path, run) -> None:
    _done_run(tmp_path / "j", "finished")
    journal = DiskJournal(tmp_path / "j")
    now = time.time()
    record = RunRecord(run_id="crashed", status=Status.RUNNING, iteration=1, step_count=1,
                       created_at=now - 60, updated_at=now - 5,
                       owner={"pid": _dead_pid(), "host": this_host()})
    assert journal.create_run(record)
    journal.append_step("crashed", StepEntry(0, "0", "s", "run", result=1))
    journal.close()
    shown = {line.split()[1] for line in run("--journal", str(tmp_path / "j"), "runs")
             .stdout.splitlines()[1:3]}
    assert shown == {"DONE", "INTERRUPTED"}

    for status in ("interrupted", "Interrupted", "INTERRUPTED"):
        proc = run("--journal", str(tmp_path / "j"), "runs", "--status", status)
        assert proc.returncode == 0, proc.stderr
        rows = proc.stdout.splitlines()[1:]
        assert rows[0].split()[:2] == ["crashed", "INTERRUPTED"]
        assert not any(row.startswith("finished") for row in rows)
    done = run("--journal", str(tmp_path / "j"), "runs", "--status", "done").stdout
    assert [row.split()[0] for row in done.splitlines()[1:]] == ["finished"]
    refused = run("--journal", str(tmp_path / "j"), "runs", "--status", "stopped")
    assert refused.returncode == 2 and (
        "unknown status 'stopped': use one of RUNNING, WAITING_APPROVAL, DONE, FAILED, "
        "CANCELLED, INTERRUPTED (any case)") in refused.stderr
    assert "running, waiting_approval, done, failed, cancelled, interrupted (any case)" in \
        " ".join(run("runs", "--help").stdout.split())


def test_show_tells_cost_replay_savings_and_approval_wait(tmp_path: Path, run) -> None:
    journal = DiskJournal(tmp_path / "j")
    now = time.time()
    assert journal.create_run(RunRecord(run_id="paid", status=Status.DONE, iteration=2,
                                        prompt_tokens=1200, completion_tokens=227, cost=0.0021,
                                        max_cost=1.0, created_at=now - 400, updated_at=now,
                                        finished_at=now - 300, step_count=3))
    for position, (kind, name, pt, ct, cost, took) in enumerate([
            ("chat", "gpt-4o-mini", 600, 100, 0.0009, 1.5),
            ("approval", "send_email", 0, 0, None, 185.0),
            ("chat", "gpt-4o-mini", 600, 127, 0.0012, 2.0)]):
        meta = {"model": name, "cost": cost, "cached": 0, "estimated": False} \
            if cost is not None else None
        journal.append_step("paid", StepEntry(position, str(position), name, kind,
                                              result={"approved": True, "by": "ana"},
                                              started_at=now - 350, finished_at=now - 350 + took,
                                              prompt_tokens=pt, completion_tokens=ct, meta=meta))
    journal.close()

    shown = run("--journal", str(tmp_path / "j"), "show", "paid").stdout
    assert "cost       $0.0021 of $1.00" in shown
    assert "replay     executing it again replays its 3 journaled steps: 1,427 tokens and " \
           "$0.0021 not spent again" in shown
    assert "took 1 min 40 s" in shown  # created .. finished, however often it was replayed
    assert "send_email                   waited 3 min 5 s  approved by ana" in shown
    runs = run("--journal", str(tmp_path / "j"), "runs").stdout
    assert runs.splitlines()[1].split()[:5] == ["paid", "DONE", "2", "1,427", "$0.0021"]


# -- journals that cannot be written --------------------------------------------------------------

def _read_only_mount_works() -> bool:
    return shutil.which("unshare") is not None and subprocess.run(
        ["unshare", "-m", "sh", "-c", "mount --bind -o ro / /mnt 2>/dev/null || "
                                      "mount --bind -o ro /tmp /tmp"],
        capture_output=True).returncode == 0


needs_read_only_mount = pytest.mark.skipif(
    not _read_only_mount_works(), reason="needs `unshare -m` and a read-only bind mount (root)")


def _in_read_only(directory: Path) -> list[str]:
    """A command prefix running the CLI where ``directory`` is a read-only file system."""
    return ["unshare", "-m", "sh", "-c", f'mount --bind -o ro "{directory}" "{directory}" && '
                                         f'exec "$@"', "sh"]


@needs_read_only_mount
def test_steering_a_read_only_journal_says_it_is_not_writable(tmp_path: Path) -> None:
    _done_run(tmp_path / "j")
    proc = cli("--journal", str(tmp_path / "j"), "cancel", "r", prefix=_in_read_only(tmp_path))
    assert proc.returncode == 1
    assert proc.stderr.startswith(f"durable-nb: error: the journal at {tmp_path / 'j'} is not "
                                  f"writable (")
    assert "make the directory writable by you, or use another one" in proc.stderr
    assert "IncompatibleJournal" not in proc.stderr and "format" not in proc.stderr


@needs_read_only_mount
@pytest.mark.skipif("read_only" not in inspect.signature(open_journal).parameters,
                    reason="needs open_journal(location, read_only=True) (journal/__init__.py)")
def test_runs_show_and_export_work_on_a_read_only_copy(tmp_path: Path) -> None:
    _done_run(tmp_path / "j")
    copy = tmp_path / "copy"
    shutil.copytree(tmp_path / "j", copy)
    before = {p: p.read_bytes() for p in copy.rglob("*") if p.is_file()}
    out = tmp_path / "out"
    out.mkdir()
    ro = _in_read_only(copy)
    runs = cli("--journal", str(copy), "runs", prefix=ro)
    assert runs.returncode == 0, runs.stderr
    assert runs.stdout.splitlines()[1].split()[:2] == ["r", "DONE"]
    shown = cli("--journal", str(copy), "show", "r", prefix=ro)
    assert shown.returncode == 0 and "steps      3" in shown.stdout, shown.stderr
    exported = cli("--journal", str(copy), "export", "r", "--to", str(out / "r.ipynb"),
                   prefix=ro)
    assert exported.returncode == 0, exported.stderr
    assert (out / "r.ipynb").is_file()
    assert {p: p.read_bytes() for p in copy.rglob("*") if p.is_file()} == before


# -- durable-nb enable ------------------------------------------------------------------------------

def test_enable_writes_the_profile_once_and_disable_removes_it(tmp_path: Path) -> None:
    env = {"IPYTHONDIR": str(tmp_path / "ipython")}
    config = tmp_path / "ipython" / "profile_default" / "ipython_config.py"
    first = cli("enable", env=env)
    assert first.returncode == 0, first.stderr
    assert str(config) in first.stdout
    assert cli("enable", env=env).returncode == 0
    text = config.read_text()
    assert text.count(
        'c.InteractiveShellApp.extensions.append("durable_nb.notebook.magics")') == 1
    assert "already" in cli("enable", env=env).stdout
    disabled = cli("disable", env=env)
    assert disabled.returncode == 0 and "durable_nb" not in config.read_text()
    assert "enabled durable_nb in" in cli("enable", env=env).stdout
    undone = cli("enable", "--undo", env=env)
    assert undone.returncode == 0, undone.stderr
    assert f"disabled durable_nb in {config}" in undone.stdout
    assert "durable_nb" not in config.read_text()
    assert "was not enabled" in cli("enable", "--undo", env=env).stdout


# -- runs at scale, batches ---------------------------------------------------------------------

def test_runs_lists_the_newest_first_a_page_at_a_time_with_filters(tmp_path: Path, run) -> None:
    journal = DiskJournal(tmp_path / "j")
    now = time.time()
    for i in range(7):
        run_id = f"eval/{i}" if i % 2 else f"single-{i}"
        assert journal.create_run(RunRecord(run_id=run_id, status=Status.DONE,
                                            created_at=now - 100 + i, updated_at=now))
    journal.close()
    page = run("--journal", str(tmp_path / "j"), "runs", "--limit", "3").stdout.splitlines()
    assert [line.split()[0] for line in page[1:4]] == ["single-6", "eval/5", "single-4"]
    assert page[4] == ("showing the newest 3 runs; there are more: `durable-nb runs --limit N` "
                       "(0: all), --status S or --prefix P for others")
    exact = run("--journal", str(tmp_path / "j"), "runs", "--limit", "7").stdout
    assert len(exact.splitlines()) == 8 and "showing" not in exact
    items = run("--journal", str(tmp_path / "j"), "runs", "--prefix", "eval/").stdout
    assert [line.split()[0] for line in items.splitlines()[1:]] == ["eval/5", "eval/3", "eval/1"]
    every = run("--journal", str(tmp_path / "j"), "runs", "--limit", "0").stdout
    assert len(every.splitlines()) == 8 and "showing" not in every
    data = json.loads(run("--journal", str(tmp_path / "j"), "runs", "--limit", "2",
                          "--json").stdout)
    assert [r["run_id"] for r in data] == ["single-6", "eval/5"]


def _batch_with_everything(directory: Path) -> None:
    """Batch 'b' of five items: three DONE, one FAILED, one waiting for approval."""
    journal = DiskJournal(directory)

    def handler(ctx, x):
        if x == 3:
            raise RuntimeError("tool broke")
        if x == 4:
            return ctx.approval("publish", {"n": x}).approved
        return ctx.run("work", lambda: f"result {x}")

    dn.map(handler, range(5), batch_id="b", key="index", title="five items", journal=journal,
           wait=False)
    journal.close()


def test_batches_and_batch_show_tell_counts_items_and_failures(tmp_path: Path, run) -> None:
    _batch_with_everything(tmp_path / "j")
    listed = run("--journal", str(tmp_path / "j"), "batches")
    assert listed.returncode == 0, listed.stderr
    assert listed.stdout.splitlines()[1].split()[:7] == ["b", "5", "3", "1", "1", "0", "0"]
    assert "five items" in listed.stdout.splitlines()[1]
    shown = run("--journal", str(tmp_path / "j"), "batch", "show", "b").stdout
    assert "batch      b  (five items)" in shown
    assert "items      5: 3 DONE, 1 FAILED, 1 WAITING_APPROVAL" in shown
    rows = [line.split() for line in shown.splitlines() if line[:1].isdigit()]
    assert [r[:3] for r in rows] == [["0", "0", "DONE"], ["1", "1", "DONE"], ["2", "2", "DONE"],
                                     ["3", "3", "FAILED"], ["4", "4", "WAITING_APPROVAL"]]
    assert "result 0" in shown and "RuntimeError: tool broke" in shown
    failed = run("--journal", str(tmp_path / "j"), "batch", "show", "b", "--status", "failed")
    assert [line for line in failed.stdout.splitlines() if line[:1].isdigit()][0].startswith("3")
    limited = run("--journal", str(tmp_path / "j"), "batch", "show", "b", "--limit", "2").stdout
    assert "showing 2 of 5 items: --limit N (0: all) or --status S for others" in limited
    data = json.loads(run("--journal", str(tmp_path / "j"), "batch", "show", "b",
                          "--json").stdout)
    assert data["counts"] == {"DONE": 3, "FAILED": 1, "WAITING_APPROVAL": 1}
    missing = run("--journal", str(tmp_path / "j"), "batch", "show", "nope")
    assert missing.returncode == 1 and "no batch 'nope'" in missing.stderr
    assert "`durable-nb batches`" in missing.stderr


def test_an_item_is_approved_like_any_run_and_the_batch_goes_on(tmp_path: Path) -> None:
    _batch_with_everything(tmp_path / "j")
    approved = cli("--journal", str(tmp_path / "j"), "approve", "b/4", "go", "--by", "lead")
    assert approved.returncode == 0 and "approved run b/4 (by lead)" in approved.stdout
    journal = DiskJournal(tmp_path / "j")
    again = dn.map(lambda ctx, x: ctx.approval("publish", {"n": x}).approved if x == 4 else
                   ctx.run("work", lambda: f"result {x}"), range(5), batch_id="b", key="index",
                   journal=journal, retry_failed=False)
    assert again[4].status is Status.DONE and again[4].result is True


def test_batch_export_writes_json_lines_or_a_notebook_report(tmp_path: Path, run) -> None:
    _batch_with_everything(tmp_path / "j")
    out = run("--journal", str(tmp_path / "j"), "batch", "export", "b", "--to",
              str(tmp_path / "b.jsonl"))
    assert out.returncode == 0 and out.stdout == f"wrote {tmp_path / 'b.jsonl'}\n"
    lines = [json.loads(line) for line in (tmp_path / "b.jsonl").read_text().splitlines()]
    assert [(r["key"], r["status"]) for r in lines] == [
        ("0", "DONE"), ("1", "DONE"), ("2", "DONE"), ("3", "FAILED"), ("4", "WAITING_APPROVAL")]
    assert lines[0]["result"] == "result 0" and lines[3]["error"].startswith("RuntimeError")

    assert run("--journal", str(tmp_path / "j"), "batch", "export", "b", "--to",
               str(tmp_path / "b.ipynb")).returncode == 0
    import nbformat

    nb = nbformat.read(tmp_path / "b.ipynb", as_version=4)
    nbformat.validate(nb)
    assert nb.metadata.kernelspec.name == "python3"  # opens without asking for a kernel
    text = "\n".join(cell.source for cell in nb.cells)
    assert "# Batch five items" in text and "| DONE | 3 |" in text and "| FAILED | 1 |" in text
    assert "| 3 | 3 | FAILED |" in text and "## Failures" in text and "tool broke" in text
    assert "## Waiting for approval" in text and "`b/4`: `publish`" in text
    assert nb.cells[-1].cell_type == "code" and not nb.cells[-1].outputs
    bad = run("--journal", str(tmp_path / "j"), "batch", "export", "b", "--to",
              str(tmp_path / "b.csv"))
    assert bad.returncode == 1 and "name it .jsonl (one line per item) or .ipynb" in bad.stderr


def test_batch_inspection_creates_no_journal(tmp_path: Path) -> None:
    missing = tmp_path / "nowhere"
    for args in (["batches"], ["batch", "show", "b"]):
        proc = cli("--journal", str(missing), *args)
        assert proc.returncode == 1 and "there is no journal at" in proc.stderr
    assert not missing.exists()


# -- text a person reads: words and times, one message per mistake --------------------------------

CLOCK = r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d"  # local time, as every view writes it


def test_an_option_value_with_a_space_is_explained_about_that_option(tmp_path: Path,
                                                                      run) -> None:
    _done_run(tmp_path / "j")
    proc = run("--journal", str(tmp_path / "j"), "runs", "--limit", "5", "runs")
    assert proc.returncode == 2
    assert ("'runs' is left over after --limit 5: an option's value is one word, and --limit "
            "'5 runs': '5 runs' is not a whole number") in proc.stderr
    assert "run id" not in proc.stderr
    proc = run("--journal", str(tmp_path / "j"), "runs", "--prefix", "sales", "report")
    assert ("'report' is left over after --prefix sales: an option's value is one word; quote "
            "a value with a space: --prefix 'sales report'") in proc.stderr


def test_a_run_id_not_found_gets_a_did_you_mean_among_the_runs(tmp_path: Path) -> None:
    _done_run(tmp_path / "j", "quickstart")
    _done_run(tmp_path / "j", "batch-report")
    proc = cli("--journal", str(tmp_path / "j"), "show", "quickstrat")
    assert proc.returncode == 1
    assert proc.stderr.rstrip().endswith("Did you mean 'quickstart'?")
    far = cli("--journal", str(tmp_path / "j"), "show", "zzz")
    assert far.returncode == 1 and "Did you mean" not in far.stderr


def test_show_into_a_pipe_its_reader_closed_ends_quietly(tmp_path: Path) -> None:
    _done_run(tmp_path / "j", steps=200)
    read, write = os.pipe()
    os.close(read)  # as `| head` does once it has its lines: every write fails (EPIPE)
    try:
        proc = subprocess.run([sys.executable, "-m", "durable_nb.cli", "--journal",
                               str(tmp_path / "j"), "show", "r"], stdout=write,
                              stderr=subprocess.PIPE, text=True, timeout=120,
                              env={**os.environ, "PYTHONPATH": str(REPO)})
    finally:
        os.close(write)
    assert proc.stderr == ""
    assert proc.returncode == 141  # as a Unix tool ended by SIGPIPE


def test_show_tells_a_fork_in_words_and_local_time(tmp_path: Path, run) -> None:
    _done_run(tmp_path / "j", steps=3)
    fork = dn.rerun_from("r", 1, journal=str(tmp_path / "j"))
    shown = run("--journal", str(tmp_path / "j"), "show", fork).stdout
    line = next(li for li in shown.splitlines() if li.startswith("forked"))
    assert re.fullmatch(rf"forked     from r at {CLOCK} \(step 1\): the run as it was when r "
                        rf"was executed again from step 1", line), line
    assert "{" not in shown and "run_id" not in shown
    assert re.search(rf"^created    {CLOCK}; took ", shown, re.M)


def _park_for_approval(directory: Path):
    journal = DiskJournal(directory)

    def handler(ctx):
        ctx.run("draft", lambda: "report")
        return ctx.approval("send_email", {"to": "team@example.com"}).approved

    assert dn.execute("mail", handler, journal=journal, on_approval="park") is None
    journal.close()
    return handler


def test_a_decision_given_with_no_kernel_running_shows_until_the_run_resumes(
        tmp_path: Path) -> None:
    handler = _park_for_approval(tmp_path / "j")
    before = cli("--journal", str(tmp_path / "j"), "show", "mail").stdout
    assert "status     WAITING_APPROVAL\n" in before
    assert re.search(r"^waiting    approval 'send_email' \(step 1, details digest "
                     r"[0-9a-f]{12}\): to: team@example.com$", before, re.M), before

    approved = cli("--journal", str(tmp_path / "j"), "approve", "mail", "--by", "ana")
    assert approved.returncode == 0 and "approved" in approved.stdout

    shown = cli("--journal", str(tmp_path / "j"), "show", "mail").stdout
    assert re.search(rf"^status     WAITING_APPROVAL: approved by ana via durable-nb at {CLOCK}, "
                     rf"waiting for the run to resume: re-run its cell \(or execute it "
                     rf"again\)$", shown, re.M), shown
    data = json.loads(cli("--journal", str(tmp_path / "j"), "show", "mail", "--json").stdout)
    assert (data["decision"]["approved"], data["decision"]["by"]) == (True, "ana")

    assert dn.execute("mail", handler, journal=str(tmp_path / "j")) is True  # the run resumes
    after = cli("--journal", str(tmp_path / "j"), "show", "mail").stdout
    assert "status     DONE\n" in after and "waiting for the run" not in after
    assert re.search(rf"approval send_email +waited (?:\d+ min )?[\d.]+ s  approved by ana "
                     rf"via durable-nb at {CLOCK} \(details digest [0-9a-f]{{12}}\)$", after,
                     re.M), after


def test_no_journal_here_points_to_the_journals_below(tmp_path: Path) -> None:
    # The bundled notebooks keep their journals in notebooks/work/NAME/, not in ./.durable_nb.
    _done_run(tmp_path / "notebooks" / "work" / "quickstart" / ".durable_nb")
    proc = cli("runs", cwd=tmp_path, env={"DURABLE_NB_DIR": "", "DURABLE_NB_JOURNAL": ""})
    assert proc.returncode == 1
    assert proc.stderr.rstrip().endswith(
        "Journals below this folder: notebooks/work/quickstart/.durable_nb (e.g. `durable-nb "
        "--journal notebooks/work/quickstart/.durable_nb runs`).")
    assert not (tmp_path / ".durable_nb").exists()


def test_journal_may_come_after_the_command_and_its_words(tmp_path: Path, run) -> None:
    """``--journal`` anywhere, as argparse users expect: before the command, after it, after
    the run id, between a sub-command's words."""
    _done_run(tmp_path / "j")
    where = str(tmp_path / "j")
    shown = run("show", "--json", "r", "--journal", where)
    assert shown.returncode == 0 and json.loads(shown.stdout)["run_id"] == "r", shown.stderr
    assert run("--journal", where, "show", "--json", "r").stdout == shown.stdout
    listed = run("runs", "--journal", where, "--limit", "1")
    assert listed.returncode == 0 and listed.stdout.splitlines()[1].startswith("r "), listed
    batch = run("batch", "show", "--journal", where, "nobatch")
    assert batch.returncode == 1 and f"no batch 'nobatch' in the journal at {where}" in \
        batch.stderr, batch.stderr
    exported = run("export", "r", "--journal", where, "--to", str(tmp_path / "r.json"))
    assert exported.returncode == 0 and (tmp_path / "r.json").exists(), exported.stderr


def test_a_note_may_follow_the_options_of_approve(tmp_path: Path) -> None:
    _park_for_approval(tmp_path / "j")
    approved = cli("approve", "mail", "--by", "ana", "looks right", "--journal",
                   str(tmp_path / "j"))
    assert approved.returncode == 0, approved.stderr
    data = json.loads(cli("--journal", str(tmp_path / "j"), "show", "mail", "--json").stdout)
    assert (data["decision"]["by"], data["decision"]["note"]) == ("ana", "looks right")


def test_an_option_of_another_command_says_which_commands_take_it(tmp_path: Path,
                                                                   run) -> None:
    _done_run(tmp_path / "j")
    proc = run("--journal", str(tmp_path / "j"), "runs", "--to", "x")
    assert proc.returncode == 2
    assert ("--to is not an option of this command; it is one of `durable-nb batch export`, "
            "`durable-nb export`, `durable-nb trace`, `durable-nb copy`") in proc.stderr
    assert "did you mean --to" not in proc.stderr


def _charge_twice(ctx: dn.Context) -> int:
    """Two requests that show the same thing: a second charge of the same amount."""
    charged = 0
    for _ in range(2):
        if ctx.approval("charge", {"card": "4242", "amount": 10}).approved:
            charged += ctx.run("charge", lambda: 10)
    return charged


def test_approve_with_request_never_decides_a_later_identical_request(tmp_path: Path) -> None:
    """`approve --request ID` run again (a script's retry) after the run took #1 and waits on an
    identical #2: refused, #2 still waits; `show` prints the id that decides #2."""
    where = str(tmp_path / "j")
    journal = DiskJournal(where)
    assert dn.execute("pay", _charge_twice, journal=journal, on_approval="park") is None
    first = journal.get_run("pay").pending_approval
    shown = cli("--journal", where, "show", "pay").stdout
    assert f"\n           request id {first['id']} " in shown, shown
    command = ("--journal", where, "approve", "pay", "--by", "ana", "--request", first["id"])
    assert cli(*command).returncode == 0
    assert dn.execute("pay", _charge_twice, journal=journal, on_approval="park") is None
    second = journal.get_run("pay").pending_approval
    assert second["digest"] == first["digest"] and second["id"] != first["id"]

    stale = cli(*command)
    assert stale.returncode == 1 and "has taken that decision" in stale.stderr, stale
    assert journal.get_run("pay").status is Status.WAITING_APPROVAL
    assert journal.get_request(f"decision.{second['id']}", "pay") is None
    refused = cli("--journal", where, "reject", "pay", "--request", first["id"])
    assert refused.returncode == 1 and journal.get_run("pay").status is \
        Status.WAITING_APPROVAL, refused

    assert f"request id {second['id']} " in cli("--journal", where, "show", "pay").stdout
    assert cli("--journal", where, "approve", "pay", "--request", second["id"]).returncode == 0
    assert dn.execute("pay", _charge_twice, journal=journal) == 20
    journal.close()


def test_version_prints_the_packages_version_and_exits_without_a_command(tmp_path) -> None:
    from durable_nb.version import __version__

    shown = cli("--version", cwd=tmp_path)
    assert (shown.returncode, shown.stdout, shown.stderr) == (0, f"durable-nb {__version__}\n",
                                                              "")
    assert "--version" in cli("--help", cwd=tmp_path).stdout
