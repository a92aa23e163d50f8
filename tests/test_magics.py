"""``%%durable_agent`` and ``%durable`` in IPython without a kernel: options, usage errors, help,
and the scan ``%load_ext`` makes for runs a dead kernel left behind."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import IPython
import pytest
from IPython.core.error import UsageError
from IPython.testing.globalipapp import start_ipython

from durable_nb import DiskJournal, RunRecord, Status, StepEntry
from durable_nb.execution.lease import Lease, this_place
from durable_nb import EndpointError, NoJournal
from durable_nb.notebook.magics import DurableMagics

CELL = "ctx.run('a', lambda: 41) + 1"


@pytest.fixture
def ip(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    """The test IPython shell with the extension loaded and its journal in a fresh dir."""
    monkeypatch.setenv("DURABLE_NB_DIR", str(tmp_path / "journal"))
    start_ipython()  # once per process; returns None when called again
    shell = IPython.get_ipython()
    shell.run_line_magic("load_ext", "durable_nb")
    return shell


def _usage_error(call, *args) -> str:
    with pytest.raises(UsageError) as info:
        call(*args)
    return str(info.value)


@pytest.mark.parametrize("value", ["soon", "10 parsecs", "5 weeks", ""])
def test_bad_timeout_is_a_usage_error_showing_the_duration_format(ip, value: str) -> None:
    message = _usage_error(ip.run_cell_magic, "durable_agent", f"r --timeout '{value}'", CELL)
    assert f"--timeout {value!r} is not a duration" in message
    assert "90s, 30m, 2h or 1d" in message


@pytest.mark.parametrize("value, problem", [("-1", "'-1' must be 0 or more"),
                                            ("many", "'many' is not a whole number"),
                                            ("2.5", "'2.5' is not a whole number")])
def test_bad_max_iterations_is_a_usage_error(ip, value: str, problem: str) -> None:
    for option in ("--max-iterations", "--max-tokens"):
        message = _usage_error(ip.run_cell_magic, "durable_agent", f"r {option} {value}", CELL)
        assert problem in message


def test_unknown_options_and_extra_words_are_usage_errors(ip) -> None:
    assert "unrecognized arguments: --retries" in _usage_error(
        ip.run_cell_magic, "durable_agent", "r --retries 3", CELL)
    assert "unrecognized arguments: extra" in _usage_error(
        ip.run_cell_magic, "durable_agent", "r extra", CELL)
    assert "invalid choice: 'skip'" in _usage_error(
        ip.run_cell_magic, "durable_agent", "r --on-change skip", CELL)
    assert "cannot parse the options" in _usage_error(
        ip.run_cell_magic, "durable_agent", "r --title 'unclosed", CELL)


def test_invalid_or_missing_run_id_is_a_usage_error(ip) -> None:
    assert "invalid run id" in _usage_error(ip.run_cell_magic, "durable_agent", "x" * 201, CELL)
    # Without RUN_ID the cell id names the run; a frontend that sends none needs a RUN_ID.
    magics = next(m for m in ip.magics_manager.registry.values() if isinstance(m, DurableMagics))
    magics.cell_id = None
    assert "needs a RUN_ID" in _usage_error(ip.run_cell_magic, "durable_agent", "", CELL)


def test_options_reach_the_run(ip, tmp_path: Path) -> None:
    line = "opts --title 'my run' --max-iterations 7 --max-tokens 900 --timeout 2h"
    assert ip.run_cell_magic("durable_agent", line, CELL) == 42
    record = DiskJournal(tmp_path / "journal").get_run("opts")
    assert (record.title, record.max_iterations, record.max_tokens) == ("my run", 7, 900)
    assert record.deadline == pytest.approx(record.created_at + 7200, abs=1)
    assert record.source == CELL and record.status is Status.DONE


def test_a_run_records_the_notebook_and_cell_that_started_it(ip, tmp_path: Path,
                                                              monkeypatch) -> None:
    # ipykernel sets __session__ from JPY_SESSION_NAME, which Jupyter Server gives the
    # kernel of a notebook (the notebook's path); the cell id comes with the execute request.
    monkeypatch.setitem(ip.user_ns, "__session__", "/home/ana/reports/weekly.ipynb")
    result = ip.run_cell(f"%%durable_agent nb-run\n{CELL}", cell_id="0a1b2c3d-cell")
    assert result.result == 42
    record = DiskJournal(tmp_path / "journal").get_run("nb-run")
    assert (record.notebook, record.cell_id) == ("/home/ana/reports/weekly.ipynb",
                                                 "0a1b2c3d-cell")


def test_durable_with_missing_arguments_is_a_usage_error(ip) -> None:
    for command in ("show", "cancel", "delete", "wait"):
        assert "required: RUN_ID" in _usage_error(ip.run_line_magic, "durable", command)
    for verb in ("approve", "reject"):
        message = _usage_error(ip.run_line_magic, "durable", verb)
        assert message.endswith("required: RUN_ID")  # the note is optional
    assert "required: --from" in _usage_error(ip.run_line_magic, "durable", "reset r1")
    assert "required: RUN_ID, PATH" in _usage_error(ip.run_line_magic, "durable", "export")
    assert "invalid choice: 'frob'" in _usage_error(ip.run_line_magic, "durable", "frob")


def test_durable_alone_lists_its_commands(ip, capsys) -> None:
    assert ip.run_line_magic("durable", "") is None
    out = capsys.readouterr().out
    for command in ("runs", "show", "approve", "reject", "cancel", "reset", "delete", "wait",
                    "export", "enable", "disable"):
        assert f"\n  {command} " in out, command


def test_options_are_never_abbreviated_and_near_misses_get_a_suggestion(ip) -> None:
    message = _usage_error(ip.run_cell_magic, "durable_agent", "r --max-iteration 3", CELL)
    assert "unrecognized arguments: --max-iteration 3" in message
    assert "did you mean --max-iterations?" in message
    message = _usage_error(ip.run_line_magic, "durable", "runs --stat done")
    assert "did you mean --status?" in message
    message = _usage_error(ip.run_line_magic, "durable", "shwo r1")
    assert "invalid choice: 'shwo'" in message and "did you mean 'show'?" in message


def test_an_unquoted_run_id_with_a_space_is_explained(ip) -> None:
    message = _usage_error(ip.run_cell_magic, "durable_agent", "sales report --title x", CELL)
    assert "a run id is one word without spaces: did you mean 'sales-report'?" in message
    message = _usage_error(ip.run_line_magic, "durable", "show sales report")
    assert "did you mean 'sales-report'?" in message
    assert "invalid run id" in _usage_error(ip.run_cell_magic, "durable_agent", "'a b'", CELL)


def test_an_option_value_with_a_space_is_explained_about_that_option(ip) -> None:
    message = _usage_error(ip.run_cell_magic, "durable_agent", "r --timeout 5 minutes", CELL)
    assert ("'minutes' is left over after --timeout 5: an option's value is one word, and "
            "--timeout '5 minutes' is not a duration: write e.g. 90s, 30m, 2h or 1d") in message
    assert "run id" not in message
    message = _usage_error(ip.run_cell_magic, "durable_agent", "r --title my run", CELL)
    assert "quote a value with a space: --title 'my run'" in message
    message = _usage_error(ip.run_line_magic, "durable", "wait r --timeout 5 minutes")
    assert "left over after --timeout 5" in message


def test_a_run_id_not_found_gets_a_did_you_mean(ip) -> None:
    assert ip.run_cell_magic("durable_agent", "quickstart", CELL) == 42
    message = _usage_error(ip.run_line_magic, "durable", "show quickstrat")
    assert message.endswith("Did you mean 'quickstart'?")


def test_status_names_are_case_insensitive(ip, capsys) -> None:
    assert ip.run_cell_magic("durable_agent", "lower", CELL) == 42
    capsys.readouterr()
    for status in ("done", "Done", "DONE"):
        ip.run_line_magic("durable", f"runs --status {status}")
        assert "\nlower " in capsys.readouterr().out
    assert "unknown status 'finished'" in _usage_error(
        ip.run_line_magic, "durable", "runs --status finished")


def test_reset_outside_the_journal_is_a_usage_error_numbering_the_steps(ip) -> None:
    assert ip.run_cell_magic("durable_agent", "three", "[ctx.run(n, str, n) for n in 'abc']") \
        == ["a", "b", "c"]
    for step in ("-1", "3", "99"):
        message = _usage_error(ip.run_line_magic, "durable", f"reset three --from {step}")
        assert f"cannot reset run 'three' from step {step}: its steps are numbered 0 to 2" \
            in message


def test_max_cost_reaches_the_run(ip, tmp_path: Path) -> None:
    assert ip.run_cell_magic("durable_agent", "budget --max-cost $0.50", CELL) == 42
    assert DiskJournal(tmp_path / "journal").get_run("budget").max_cost == 0.5
    assert "is not an amount" in _usage_error(ip.run_cell_magic, "durable_agent",
                                              "budget --max-cost lots", CELL)


def test_inspection_never_creates_a_journal(ip, tmp_path: Path) -> None:
    missing = tmp_path / "nowhere"
    for line in (f"runs --journal {missing}", f"show r --journal {missing}",
                 f"export r {tmp_path / 'r.ipynb'} --journal {missing}"):
        with pytest.raises(NoJournal) as info:
            ip.run_line_magic("durable", line)
        assert f"there is no journal at {missing}" in str(info.value)
    assert not missing.exists()


def test_export_to_a_missing_folder_names_the_folder_not_a_temp_file(ip, tmp_path: Path) -> None:
    assert ip.run_cell_magic("durable_agent", "exported", CELL) == 42
    target = tmp_path / "no" / "such" / "run.ipynb"
    with pytest.raises(FileNotFoundError) as info:
        ip.run_line_magic("durable", f"export exported {target}")
    assert str(info.value) == (f"cannot write {target}: the folder {target.parent} does not "
                               f"exist. Create it first, or export to a path in an existing "
                               f"folder.")


@pytest.mark.parametrize("line", ["show ghost", "approve ghost ok", "reject ghost",
                                  "cancel ghost", "reset ghost --from 1", "delete ghost",
                                  "wait ghost --timeout 1s"])
def test_unknown_run_is_a_usage_error_naming_run_and_journal(ip, tmp_path: Path,
                                                             line: str) -> None:
    DiskJournal(tmp_path / "journal").close()  # a journal without that run
    message = _usage_error(ip.run_line_magic, "durable", line)
    assert f"no run 'ghost' in the journal at {tmp_path / 'journal'}" in message
    assert "%durable runs" in message


def test_help_lists_every_option_and_command(ip) -> None:
    agent_help = ip.object_inspect_text("%%durable_agent")
    parser = ip.find_cell_magic("durable_agent").parser
    options = [s for a in parser._actions for s in a.option_strings if s not in ("-h", "--help")]
    assert len(options) == 22  # --approvers and --four-eyes (issue 27), --check (43) among them
    for option in options + ["RUN_ID"]:
        assert option in agent_help, option
    durable_help = ip.object_inspect_text("%durable")
    for command in ("runs", "show", "approve", "reject", "cancel", "reset", "delete", "wait",
                    "export", "check", "batches", "batch show", "batch wait", "batch export",
                    "--journal"):
        assert f"%durable {command}" in durable_help or command in durable_help, command


def _dead_pid() -> int:
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    return child.pid


def test_load_ext_reports_interrupted_runs_and_fails_expired_ones(ip, tmp_path: Path,
                                                                  capsys) -> None:
    journal = DiskJournal(tmp_path / "journal")
    now = time.time()

    def record(run_id: str, status: Status, **fields) -> RunRecord:
        r = RunRecord(run_id=run_id, status=status, created_at=now - 60, updated_at=now - 5,
                      **fields)
        assert journal.create_run(r)
        return r

    record("crashed", Status.RUNNING, iteration=3, step_count=2, max_iterations=10)
    for position in range(7):  # a crash left the record's step count behind the journal
        journal.append_step("crashed", StepEntry(position, str(position), "s", "run"))
    journal.acquire_lease("crashed", {"token": "t", "pid": _dead_pid(), **this_place(),
                                      "started": None, "heartbeat": now - 1}, lambda h: False)
    record("expired", Status.RUNNING, iteration=1, step_count=2, deadline=now - 10)
    record("parked", Status.WAITING_APPROVAL, iteration=2, step_count=4,
           pending_approval={"key": "3", "name": "send email", "details": None})
    record("finished", Status.DONE, iteration=4, step_count=9)
    record("alive", Status.RUNNING, iteration=1, step_count=1)
    Lease.acquire(journal, "alive")  # held by this live process
    capsys.readouterr()

    ip.run_line_magic("reload_ext", "durable_nb")
    out = capsys.readouterr().out

    assert f"unfinished runs in {tmp_path / 'journal'}" in out
    assert "crashed: interrupted at iteration 3 (step 7); re-run its cell to continue" in out
    assert "expired: expired" in out and "marked FAILED" in out
    assert "parked: waiting for approval of 'send email' at iteration 2" in out
    assert "finished:" not in out
    assert "alive:" not in out  # its executor is still running
    expired = journal.get_run("expired")
    assert expired.status is Status.FAILED and expired.error.startswith("expired on resume")
    assert journal.get_run("crashed").status is Status.RUNNING  # resumed by re-running it


def test_a_first_error_in_a_cell_is_shown_once_as_its_message(ip, monkeypatch, capsys) -> None:
    for name in ("OPENAI_API_KEY", "OPENAI_BASE_URL", "OPENAI_API_TYPE", "AZURE_OPENAI_API_KEY",
                 "AZURE_OPENAI_ENDPOINT", "AZURE_OPENAI_AD_TOKEN"):
        monkeypatch.delenv(name, raising=False)
    capsys.readouterr()
    result = ip.run_cell("%%durable_agent first\n"
                         "ctx.chat(model='gpt-4o-mini', messages=[{'role': 'user', "
                         "'content': 'hi'}])")
    assert isinstance(result.error_in_exec, EndpointError)
    out = capsys.readouterr().out
    shown = out[out.rindex("EndpointError"):]  # the cell's error, after the panel's summary
    assert len(shown.splitlines()) <= 5, shown
    assert "Traceback" not in shown and "openai/" not in shown and "File " not in shown
    words = " ".join(shown.split())
    assert words.count("no API key for https://api.openai.com/v1") == 1
    assert "start the bundled model server (`python -m durable_nb.testing` in a terminal)" \
        in words


def test_durable_runs_and_show_read_a_passed_deadline_without_applying_it(
        ip, tmp_path: Path, capsys) -> None:
    """``%durable runs`` and ``show`` write nothing, even past a deadline (on 953f9b9 they
    applied it): they say what the run amounts to, rejected by its deadline."""
    import durable_nb as dn
    from durable_nb.approvals.request import find_decision
    journal = DiskJournal(tmp_path / "journal")
    assert dn.execute("due", lambda ctx: ctx.approval("deploy", timeout=1).approved,
                      journal=journal, on_approval="park") is None
    pending = journal.get_run("due").pending_approval
    while time.time() < pending["timeout_at"]:
        time.sleep(0.05)
    capsys.readouterr()
    ip.run_line_magic("durable", f"runs --journal {tmp_path / 'journal'}")
    ip.run_line_magic("durable", f"show due --journal {tmp_path / 'journal'}")
    shown = capsys.readouterr().out
    assert "REJECTED in effect: rejected by its deadline at" in shown, shown
    row = next(line for line in shown.splitlines() if line.startswith("due "))
    assert "REJECTED" in row and "WAITING_APPROVAL" not in row
    assert find_decision(journal, "due", pending) is None and journal.events("due") == []


def test_a_cell_checked_with_check_executes_nothing_and_says_how_its_run_fits(ip, capsys):
    """``%%durable_agent RUN --check``: the cell as written now against its run (issue 43)."""
    ip.user_ns["calls"] = []
    cell = "ctx.run('fetch', lambda q: calls.append(q) or 'figures', {quarter!r})\n"
    ip.run_cell_magic("durable_agent", "sales", cell.format(quarter="q1"))
    assert ip.user_ns["calls"] == ["q1"]
    capsys.readouterr()
    ip.run_cell_magic("durable_agent", "sales --check", cell.format(quarter="q1"))
    assert capsys.readouterr().out.splitlines()[0] == (
        "sales  replays  every step replays (1) and the result is the recorded one")
    ip.run_cell_magic("durable_agent", "sales --check", cell.format(quarter="q2"))
    assert capsys.readouterr().out.splitlines()[0] == (
        "sales  diverges  step 0 (run 'fetch'): args[0] changed from 'q1' to 'q2'")
    assert ip.user_ns["calls"] == ["q1"]
    message = _usage_error(ip.run_cell_magic, "durable_agent", "other --check", cell)
    assert "no run 'other'" in message and "run the cell without --check" in message


def test_check_never_executes_code_that_comes_from_the_journal(ip, tmp_path, capsys,
                                                                monkeypatch) -> None:
    """A shared journal is data: a run whose cell is not in this kernel's notebook is not
    checked by running the source its record holds, nor a cell of the notebook file its
    record names (issue 43 review)."""
    notebook = tmp_path / "mine.ipynb"
    notebook.write_text('{"nbformat": 4, "nbformat_minor": 5, "metadata": {}, "cells": []}')
    monkeypatch.setitem(ip.user_ns, "__session__", str(notebook))
    journal = DiskJournal(tmp_path / "journal")
    marker = tmp_path / "planted-code-ran"
    planted = f"open({str(marker)!r}, 'w').close()\n{CELL}"
    theirs = tmp_path / "elsewhere" / "theirs.ipynb"
    theirs.parent.mkdir()
    theirs.write_text(json.dumps({
        "nbformat": 4, "nbformat_minor": 5, "metadata": {}, "cells": [{
            "id": "cell-of-another-user", "cell_type": "code", "metadata": {}, "outputs": [],
            "source": f"%%durable_agent planted-in-file\n{planted}"}]}))
    for run_id, named in (("planted-source", None), ("planted-in-file", str(theirs))):
        ip.run_cell(f"%%durable_agent {run_id}\n{CELL}", cell_id="cell-of-another-user")
        record = journal.get_run(run_id)
        record.source, record.notebook = planted, named
        journal.put_run(record)
    capsys.readouterr()
    for line in ("check planted-source planted-in-file", "check --prefix planted"):
        ip.run_line_magic("durable", line)
        out = capsys.readouterr().out
        assert not marker.exists()
        for run_id in ("planted-source", "planted-in-file"):
            assert (f"{run_id}: not checked: cell not found in this notebook: run "
                    f"`%%durable_agent ... --check` in the cell") in out, out
