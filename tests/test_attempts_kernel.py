"""Attempts and the live status in a real IPython kernel: a run stopped with the stop button
(SIGINT), by Kernel > Restart (an interrupt, then a shutdown) and by a SIGKILL, then re-run.
During the resumed execution the panel the kernel published says RUNNING and which attempt
it is; the journal holds how each attempt ended."""

from __future__ import annotations

import html
import os
import re
import textwrap
from pathlib import Path

import pytest

from durable_nb import DiskJournal, Status
from durable_nb.cli import main
from tests.harness import KernelSession, start_kernel, wait_until

pytestmark = pytest.mark.kernel

REPO = Path(__file__).resolve().parents[1]

CELL = textwrap.dedent("""\
    %%durable_agent slow
    import time
    def slow(i):
        time.sleep(0.25)
        return i
    sum(ctx.run(f'step {i}', slow, i) for i in range(12))
    """)


def _env() -> dict[str, str]:
    return {"PYTHONPATH": os.pathsep.join(filter(None, [str(REPO),
                                                        os.environ.get("PYTHONPATH")]))}


def _steps(journal: DiskJournal) -> int:
    return len(list(journal.steps("slow"))) if journal.find_run("slow") else 0


def _start_and_wait(k: KernelSession, journal: DiskJournal, steps: int) -> str:
    msg_id = k.execute_async(CELL)
    wait_until(lambda: _steps(journal) >= steps, 30, f"{steps} journaled steps")
    return msg_id


_BADGE = re.compile(r'<span style="background:[^"]*">([^<]*)</span>')


def _published(k: KernelSession, ids: list[str]) -> list[str]:
    """Every value the kernel published for these widgets, in order."""
    values = []
    for msg in k.iopub_log:
        content = msg["content"]
        if msg["msg_type"] in ("comm_open", "comm_msg") and content.get("comm_id") in ids:
            value = (content["data"].get("state") or {}).get("value")
            if value:  # the widget is created empty, then drawn
                values.append(value)
    return values


def _text(value: str) -> str:
    return html.unescape(re.sub(r"<style>.*?</style>|<[^>]+>", " ", value, flags=re.S))


def _headers_of_rerun(k: KernelSession) -> tuple[list[tuple[str, str]], list[str]]:
    """Re-run the cell to its end; every value the kernel published for the new panel's
    header, in order: (badge, text); and for its attempts (text)."""
    before = set(k.widgets)
    k.execute(CELL, timeout=60).raise_for_error()
    k.drain(0.3)
    new = {key: m for key, m in k.widgets.items() if key not in before
           and m.model_name == "HTMLModel"}
    ids = [key for key, m in new.items() if "<b>slow</b>" in m.state.get("value", "")]
    assert len(ids) == 1, "no panel header published by the re-run"
    tried = [key for key, m in new.items()
             if "class='dnb-history-head'" in m.state.get("value", "")]
    return ([(_BADGE.search(v).group(1), _text(v)) for v in _published(k, ids)],
            [_text(v) for v in _published(k, tried)])


def _running_then_done(shown: tuple[list[tuple[str, str]], list[str]],
                       attempt_line: str) -> None:
    """The header said RUNNING from the execution's start to its end, and never the status
    the earlier execution left; the attempts said which attempt it is."""
    headers, tried = shown
    badges = [badge for badge, _ in headers]
    assert badges[-1] == "DONE" and "FAILED" not in badges, badges
    assert tried and all(attempt_line in text for text in tried), tried
    assert set(badges[:badges.index("RUNNING")]) <= {"starting"}, badges
    done = badges.index("DONE")
    assert set(badges[badges.index("RUNNING"):done]) == {"RUNNING"}, badges
    assert set(badges[done:]) == {"DONE"}, badges


def _ends(journal: DiskJournal) -> list[tuple[str | None, int | None]]:
    return [(a.get("end"), a.get("at_step")) for a in journal.get_run("slow").attempts]


def test_stop_button_then_rerun_shows_running_and_the_attempt(tmp_path: Path) -> None:
    journal = DiskJournal(tmp_path / ".durable_nb")
    with start_kernel(tmp_path, env=_env()) as k:
        k.execute("%load_ext durable_nb").raise_for_error()
        msg_id = _start_and_wait(k, journal, 3)
        k.km.interrupt_kernel()
        assert k.wait_for(msg_id, timeout=20).error["ename"] == "KeyboardInterrupt"
        stopped_at = _steps(journal)

        headers = _headers_of_rerun(k)

    _running_then_done(headers, f"attempt 2: resumed after the stop button at step {stopped_at}")
    assert _ends(journal) == [("interrupted", stopped_at), ("completed", 12)]
    first = journal.get_run("slow").attempts[0]
    assert first["via"] == "kernel" and first["kernel"]


def test_kernel_restart_is_recorded_listed_by_load_ext_and_shown_on_rerun(
        tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    journal = DiskJournal(tmp_path / ".durable_nb")
    with start_kernel(tmp_path, env=_env()) as k:
        k.execute("%load_ext durable_nb").raise_for_error()
        _start_and_wait(k, journal, 3)
        k.restart(now=False)  # Kernel > Restart: interrupt, then ask it to shut down
        stopped_at = _steps(journal)
        assert _ends(journal) == [("kernel-restarted", stopped_at)]

        listed = k.execute("%load_ext durable_nb").raise_for_error().stdout
        assert (f"slow: interrupted by a kernel restart at iteration 0 (step {stopped_at}); "
                f"re-run its cell to continue") in listed
        # Listed as a SIGKILL leaves it: INTERRUPTED, not the FAILED the interrupt wrote.
        _assert_listed_interrupted(k.execute("%durable runs").raise_for_error().stdout)
        capsys.readouterr()
        assert main(["--journal", str(tmp_path / ".durable_nb"), "show", "slow"]) == 0
        assert (f"status     INTERRUPTED: stopped by a kernel restart at step {stopped_at} "
                f"(FAILED in the journal, no step failed); re-run its cell") in \
            capsys.readouterr().out
        headers = _headers_of_rerun(k)

    _running_then_done(headers, f"attempt 2: resumed after a kernel restart at step {stopped_at}")
    assert _ends(journal) == [("kernel-restarted", stopped_at), ("completed", 12)]


def _assert_listed_interrupted(table: str) -> None:
    rows = [line.split()[:2] for line in table.splitlines()]
    assert ["slow", "INTERRUPTED"] in rows, table
    assert "INTERRUPTED: stopped before it finished" in table


def test_sigkill_then_rerun_closes_the_dead_attempt_and_shows_running(
        tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    journal = DiskJournal(tmp_path / ".durable_nb")
    with start_kernel(tmp_path, env=_env()) as k:
        k.execute("%load_ext durable_nb").raise_for_error()
        _start_and_wait(k, journal, 3)
        k.kill()
        stopped_at = _steps(journal)
        capsys.readouterr()
        assert main(["--journal", str(tmp_path / ".durable_nb"), "runs"]) == 0
        _assert_listed_interrupted(capsys.readouterr().out)
        k.restart()
        k.execute("%load_ext durable_nb").raise_for_error()
        headers = _headers_of_rerun(k)

    _running_then_done(headers, f"attempt 2: resumed after its process died at step {stopped_at}")
    assert _ends(journal) == [("died", stopped_at), ("completed", 12)]
    assert journal.get_run("slow").status is Status.DONE


def test_an_attempt_killed_after_replaying_keeps_the_count_of_steps_it_replayed(
        tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    journal = DiskJournal(tmp_path / ".durable_nb")
    with start_kernel(tmp_path, env=_env()) as k:
        k.execute("%load_ext durable_nb").raise_for_error()
        _start_and_wait(k, journal, 3)
        k.kill()
        first_stop = _steps(journal)
        k.restart()
        k.execute("%load_ext durable_nb").raise_for_error()
        _start_and_wait(k, journal, first_stop + 2)  # it replayed, then executed two steps
        k.kill()
        second_stop = _steps(journal)
        k.restart()
        k.execute("%load_ext durable_nb").raise_for_error()
        k.execute(CELL, timeout=60).raise_for_error()

    died = journal.get_run("slow").attempts[1]
    assert (died["end"], died["from_step"], died["at_step"]) == ("died", first_stop, second_stop)
    assert died["replayed"] == first_stop  # every step attempt 1 journaled
    capsys.readouterr()
    assert main(["--journal", str(tmp_path / ".durable_nb"), "show", "slow"]) == 0
    assert (f"replayed {first_stop}, executed {second_stop - first_stop}; its process died"
            in capsys.readouterr().out)
