"""Attempts: every execution of a run is journaled with how it ended, read back by the panel
(real widget objects), ``show``, ``%load_ext``'s scan and the export, on a real disk journal;
crashes and interrupts happen in real child processes (SIGKILL, SIGINT)."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import textwrap
import threading
from pathlib import Path

import pytest

import durable_nb
from durable_nb import DiskJournal, RunRecord, Status, get_run
from durable_nb.execution import attempts
from durable_nb.cli.show import format_run
from durable_nb.export import export_data, export_notebook
from durable_nb.notebook import describe_unfinished
from durable_nb.notebook.panel import RunPanel

REPO = Path(__file__).resolve().parents[1]
WHEN = r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d"  # local time, as every view writes it

# A run of 6 steps in a child process that dies (SIGKILL) or is interrupted (SIGINT, as the
# stop button does) inside step 3, after steps 0-2 were journaled.
_CHILD = textwrap.dedent("""\
    import os, signal, sys
    import durable_nb
    how = sys.argv[2]
    def handler(ctx):
        for i in range(6):
            if i == 3:
                ctx.run("stop", lambda: os.kill(os.getpid(), getattr(signal, how)))
            ctx.run(f"step {i}", lambda i=i: i)
        return "done"
    durable_nb.execute("r", handler, journal=sys.argv[1], source="code v1")
    """)


def _child(journal_dir: Path, how: str) -> int:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [
        str(REPO), os.environ.get("PYTHONPATH")]))}
    return subprocess.run([sys.executable, "-c", _CHILD, str(journal_dir), how], env=env,
                          capture_output=True, timeout=60).returncode


def _resume(journal: DiskJournal, observer=None, source: str = "code v1") -> object:
    def handler(ctx):
        for i in range(6):
            if i == 3:
                ctx.run("stop", lambda: None)
            ctx.run(f"step {i}", lambda i=i: i)
        return "done"
    options = durable_nb.RunOptions(source=source)
    return durable_nb.runner.Runner("r", handler, journal=journal, options=options,
                                    observer=observer).run()


def _text(fragment: str) -> str:
    return re.sub(r"<[^>]+>", "", fragment).replace("&#x27;", "'")


def test_a_killed_process_leaves_its_attempt_open_and_the_next_closes_it_as_died(
        tmp_path: Path) -> None:
    journal = DiskJournal(tmp_path / "j")
    assert _child(tmp_path / "j", "SIGKILL") == -9
    left = journal.get_run("r")
    assert left.status is Status.RUNNING
    assert [a.get("end") for a in left.attempts] == [None]

    outcome = _resume(journal)

    assert outcome.status is Status.DONE
    first, second = get_run("r", journal=journal).attempts
    assert first["end"] == "died" and first["at_step"] == 3 and first["executed"] == 3
    assert first["via"] == "script" and first["pid"] != os.getpid()
    assert second["end"] == "completed" and second["from_step"] == 3
    assert (second["replayed"], second["executed"], second["at_step"]) == (3, 4, 7)
    assert attempts.resumed_words(get_run("r", journal=journal)) == \
        "attempt 2: resumed after its process died at step 3"


def test_an_interrupt_is_an_interrupted_attempt_and_load_ext_lists_the_run(
        tmp_path: Path) -> None:
    journal = DiskJournal(tmp_path / "j")
    assert _child(tmp_path / "j", "SIGINT") != 0
    record = journal.get_run("r")
    assert record.status is Status.FAILED
    (attempt,) = record.attempts
    assert attempt["end"] == "interrupted" and attempt["at_step"] == 3

    # Listed as a crashed run is, since the process that ran it is gone.
    assert describe_unfinished(journal) == [
        "r: interrupted at iteration 0 (step 3); re-run its cell to continue"]

    _resume(journal)
    assert describe_unfinished(journal) == []
    shown = format_run(get_run("r", journal=journal))
    assert re.search(rf"attempts   2\n  attempt 1  {WHEN}  python \(pid \d+ on \S+\): "
                     r"replayed 0, executed 3; interrupted \(KeyboardInterrupt\) at step 3\n"
                     rf"  attempt 2  {WHEN}  \S+ \(pid \d+ on \S+\): replayed 3, executed 4; "
                     r"completed at step 7\n", shown), shown


def test_a_run_failed_by_a_kernel_restart_is_listed_as_such(tmp_path: Path) -> None:
    journal = DiskJournal(tmp_path / "j")
    _child(tmp_path / "j", "SIGINT")
    record = journal.get_run("r")
    record.attempts[-1]["end"] = "kernel-restarted"  # what the kernel's exit hook writes
    journal.put_run(record)
    assert describe_unfinished(journal) == [
        "r: interrupted by a kernel restart at iteration 0 (step 3); re-run its cell to "
        "continue"]
    _resume(journal)
    assert attempts.resumed_words(get_run("r", journal=journal)) == \
        "attempt 2: resumed after a kernel restart at step 3"


def test_the_panel_shows_running_during_a_resumed_execution_never_the_earlier_status(
        tmp_path: Path) -> None:
    journal = DiskJournal(tmp_path / "j")
    _child(tmp_path / "j", "SIGINT")
    panel = RunPanel(journal.get_run("r"), journal=journal, starting=True)
    # Before the execution takes the lease: not the FAILED of the interrupted execution.
    assert ">FAILED</span>" not in panel.header.value
    assert ">starting</span>" in panel.header.value
    seen: dict[str, str] = {}
    ticked = threading.Event()

    def handler(ctx):
        for i in range(6):
            if i == 3:
                ctx.run("stop", lambda: None)
            if i == 4:
                def look() -> None:
                    seen["header"], seen["stats"] = panel.header.value, panel.stats.value
                    seen["attempts"] = panel.attempts.value
                    # The elapsed time moves while a step takes long (redrawn every second).
                    ticked.wait(30)
                ctx.run("look", look)
            ctx.run(f"step {i}", lambda i=i: i)

    watcher = threading.Thread(target=lambda: _wait_for_tick(panel, seen, ticked))
    watcher.start()
    durable_nb.runner.Runner("r", handler, journal=journal,
                             options=durable_nb.RunOptions(source="code v1"),
                             observer=panel).run()
    watcher.join()
    header = _text(seen["header"])
    assert "RUNNING" in header and "FAILED" not in header and "starting" not in header
    tried = _text(seen["attempts"])
    assert "attempt 2: resumed after an interrupt at step 3" in tried
    assert "attempt 1" in tried  # the history, in the list opened by a click
    assert "interrupted at step" not in _text(seen["stats"])  # the old error is not current
    assert seen["ticked"] != seen["stats"]
    assert "DONE" in panel.header.value and panel.cancel_button.layout.display == "none"
    assert "attempt 2: resumed after an interrupt at step 3" in panel.summary()


def _wait_for_tick(panel: RunPanel, seen: dict, ticked: threading.Event) -> None:
    """Wait (a condition, no margin) until the stats line was redrawn with a later
    elapsed time than the one seen at the start of step "look"."""
    try:
        while "stats" not in seen or panel.stats.value == seen["stats"]:
            if ticked.wait(0.05):
                return
        seen["ticked"] = panel.stats.value
    finally:
        ticked.set()


def test_a_first_run_panel_ticks_from_the_moment_it_holds_the_lease(tmp_path: Path) -> None:
    journal = DiskJournal(tmp_path / "j")
    panel = RunPanel(RunRecord(run_id="fresh"), journal=journal, starting=True)
    seen: dict[str, str] = {}
    ticked = threading.Event()

    def handler(ctx):
        def look() -> None:
            seen["header"], seen["stats"] = panel.header.value, panel.stats.value
            ticked.wait(30)
        ctx.run("look", look)

    watcher = threading.Thread(target=lambda: _wait_for_tick(panel, seen, ticked))
    watcher.start()
    durable_nb.runner.Runner("fresh", handler, journal=journal, observer=panel).run()
    watcher.join()
    assert "RUNNING" in seen["header"] and "attempt" not in _text(seen["header"])
    assert re.search(r"elapsed [1-9]", _text(seen["ticked"])), seen["ticked"]


def test_attempts_are_bounded_and_the_rest_counted(tmp_path: Path) -> None:
    journal = DiskJournal(tmp_path / "j")

    def handler(ctx):
        ctx.run("a", lambda: 1)
        raise KeyboardInterrupt

    total = attempts.KEEP + 5
    for _ in range(total):
        with pytest.raises(KeyboardInterrupt):
            durable_nb.execute("b", handler, journal=journal)
    record = journal.get_run("b")
    assert len(record.attempts) == attempts.KEEP and record.attempts_dropped == 5
    assert [a["n"] for a in record.attempts] == list(range(6, total + 1))
    assert attempts.history_lines(record)[0] == "(5 earlier attempts not kept)"


def test_a_done_run_replayed_adds_no_attempt_and_a_parked_one_resumes_after_approval(
        tmp_path: Path) -> None:
    journal = DiskJournal(tmp_path / "j")

    def handler(ctx):
        ctx.run("a", lambda: 1)
        ctx.approval("ship", {"x": 1})
        return "shipped"

    assert durable_nb.execute("p", handler, journal=journal, on_approval="park") is None
    durable_nb.approve("p", journal=journal)
    durable_nb.execute("p", handler, journal=journal, on_approval="park")
    durable_nb.execute("p", handler, journal=journal, on_approval="park")  # replays only
    record = journal.get_run("p")
    assert [(a["end"], a["from_step"], a["at_step"]) for a in record.attempts] == [
        ("parked", 0, 1), ("completed", 1, 2)]
    assert attempts.resumed_words(record) == "attempt 2: resumed after the approval at step 1"


def test_a_record_journaled_before_attempts_loads_and_resumes(tmp_path: Path) -> None:
    old = RunRecord(run_id="old", status=Status.RUNNING, source="v0", source_hash="h0")
    wire = json.loads(old.to_json(complete=True))
    for name in ("attempts", "attempts_dropped", "sources"):
        del wire[name]
    record = RunRecord.from_json(json.dumps(wire))
    assert record.attempts is None and record.attempts_dropped == 0
    journal = DiskJournal(tmp_path / "j")
    assert journal.create_run(record)
    durable_nb.execute("old", lambda ctx: ctx.run("a", lambda: 1), journal=journal)
    (attempt,) = journal.get_run("old").attempts
    assert attempt["n"] == 1 and attempt["end"] == "completed"


def test_the_export_pairs_each_part_of_the_run_with_the_code_that_made_it(
        tmp_path: Path) -> None:
    journal = DiskJournal(tmp_path / "j")

    def handler_for(goal: str):
        def handler(ctx):
            ctx.run("load", lambda: "data")
            ctx.run("plan", lambda goal: f"plan for {goal}", goal)
            return ctx.run("act", lambda: "acted")
        return handler

    durable_nb.execute("e", handler_for("old goal"), journal=journal, source="goal = 'old'")
    # The cell edited: step 1's input changed; executed again from there.
    durable_nb.execute("e", handler_for("new goal"), journal=journal, source="goal = 'new'",
                       on_change="rerun")
    info = get_run("e", journal=journal)
    data = export_data(info, journal=journal)
    assert [(p["from_step"], p["source"]) for p in data["code"]] == [
        (0, "goal = 'old'"), (1, "goal = 'new'")]
    assert [a["end"] for a in data["attempts"]["list"]] == ["completed", "completed"]
    rerun = data["attempts"]["list"][1]
    assert (rerun["rerun_from"], rerun["replayed"], rerun["executed"]) == (1, 1, 2)
    assert "pid" not in data["attempts"]["list"][0]  # where it ran stays out of shared files

    nb = export_notebook(json.loads(json.dumps(data)))
    kinds = [(c.cell_type, c.source.splitlines()[0] if c.source else "") for c in nb.cells]
    code = [i for i, (t, _) in enumerate(kinds) if t == "code"]
    assert [nb.cells[i].source for i in code] == ["goal = 'old'", "goal = 'new'"]
    plan = next(i for i, c in enumerate(nb.cells) if "plan" in c.source and "Step" in c.source)
    load = next(i for i, c in enumerate(nb.cells) if "load" in c.source and "Step" in c.source)
    assert code[0] < load < code[1] < plan  # each part after the code that made it
    assert nb.cells[code[1] - 1].source.startswith("**The code changed here** (attempt 2")
    assert "The code changed while the run went on" in nb.cells[0].source


def test_a_child_runs_record_never_replaces_its_parents_in_the_panel(tmp_path: Path) -> None:
    journal = DiskJournal(tmp_path / "j")
    panel = RunPanel(RunRecord(run_id="parent"), journal=journal, starting=True)
    shown: list[str] = []

    def child(ctx):
        shown.append(_text(panel.header.value))
        return ctx.run("c", lambda: 1)

    durable_nb.runner.Runner("parent", lambda ctx: ctx.child("kid", child), journal=journal,
                             observer=panel).run()
    assert "parent" in shown[0] and "kid" not in shown[0] and "RUNNING" in shown[0]
    assert "kid" not in panel.header.value and "DONE" in panel.header.value


def test_batch_items_a_kernel_restart_stopped_are_counted_in_their_batchs_line(
        tmp_path: Path) -> None:
    from durable_nb.journal import BatchRecord

    journal = DiskJournal(tmp_path / "j")
    journal.put_batch(BatchRecord("b", keys=["x", "y"]))
    for key, end in (("x", "kernel-restarted"), ("y", "completed")):
        record = RunRecord(run_id=f"b/{key}", status=Status.FAILED if key == "x" else Status.DONE,
                           attempts=[{"n": 1, "pid": 1, "host": "elsewhere", "end": end}])
        journal.create_run(record)
    assert describe_unfinished(journal) == [
        "b: batch with 1 item interrupted; re-run its cell to finish it (`%durable batch show b` "
        "lists the items)"]


def test_a_reset_is_in_the_history_show_runs_and_the_panel_say_what_it_did(
        tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    from durable_nb.cli import main

    journal = DiskJournal(tmp_path / "j")
    _resume(journal)  # attempt 1: 7 steps, DONE
    capsys.readouterr()
    assert main(["--journal", str(tmp_path / "j"), "reset", "r", "--from", "4"]) == 0

    record = get_run("r", journal=journal)
    (reset,) = record.attempts[-1]["resets"]
    assert (reset["to_step"], reset["forgot"]) == (4, 3)
    capsys.readouterr()
    assert main(["--journal", str(tmp_path / "j"), "show", "r"]) == 0
    shown = capsys.readouterr().out
    assert re.search(rf"status     RUNNING: reset to step 4 at {WHEN}, 3 steps forgotten; "
                     r"re-run its cell \(or execute it again\) to execute from there", shown), shown
    assert re.search(rf"  attempt 1 .*completed at step 7; then reset to step 4 at {WHEN} "
                     r"\(3 steps forgotten\)", shown), shown
    assert main(["--journal", str(tmp_path / "j"), "runs"]) == 0
    listed = capsys.readouterr().out
    assert "INTERRUPTED" not in listed and ["r", "RUNNING"] in \
        [line.split()[:2] for line in listed.splitlines()]

    panel = RunPanel(record, journal=journal, starting=True)
    _resume(journal, observer=panel)
    tried = _text(panel.attempts.value)
    assert "attempt 2: executed again after a reset to step 4" in tried
    assert "then reset to step 4" in tried and "3 steps forgotten" in tried
    second = get_run("r", journal=journal).attempts[-1]
    assert (second["from_step"], second["executed"], second["end"]) == (4, 3, "completed")
