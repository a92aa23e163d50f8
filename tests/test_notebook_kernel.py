"""The notebook integration in a real IPython kernel, driven through jupyter_client.

Each test starts its own kernel in a temp dir (journal in ./.durable_nb there) and, where it
needs a model, a loopback OpenAI server in this process that the kernel's real ``openai``
client talks to. Progress is read from the journal on disk, the panel from the widget states
the kernel published, clicks are sent as JupyterLab sends them.
"""

from __future__ import annotations

import html
import os
import re
import shutil
import subprocess
import sys
import textwrap
import time
from collections import Counter
from pathlib import Path
from typing import Any

import openai
import pytest

from durable_nb import DiskJournal, Status, approve, execute, get_run, serde
from durable_nb.demo import SALES_CSV, make_tools, sales_agent
from durable_nb.testing import DEMO_SCRIPT, LoopbackServer
from tests.harness import KernelSession, start_kernel, wait_until

pytestmark = pytest.mark.kernel

REPO = Path(__file__).resolve().parents[1]

SETUP_CELL = "from durable_nb.demo import make_tools, sales_agent\ntools = make_tools('.')"
AGENT_CELL = '%%durable_agent sales --title "Q3 sales report" --max-iterations 10\n' \
             "sales_agent(ctx, tools)"


# -- helpers --------------------------------------------------------------------------------

def _env(server: LoopbackServer | None = None) -> dict[str, str]:
    env = {"PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))}
    env.pop("DURABLE_NB_DIR", None)
    if server is not None:
        env.update(OPENAI_BASE_URL=server.url, OPENAI_API_KEY="loopback")
    return env


def _journal(tmp_path: Path) -> DiskJournal:
    return DiskJournal(tmp_path / ".durable_nb")


def _status(tmp_path: Path, run_id: str) -> Status | None:
    record = _journal(tmp_path).find_run(run_id)
    return None if record is None else record.status


def _wait_status(tmp_path: Path, run_id: str, status: Status, timeout: float = 30) -> None:
    wait_until(lambda: _status(tmp_path, run_id) is status, timeout,
               f"run {run_id!r} to be {status}")


def _htmls(k: KernelSession) -> list[str]:
    k.drain(0.3)
    return [m.state.get("value", "") for m in k.widgets.values() if m.model_name == "HTMLModel"]


def _panel_html(k: KernelSession, marker: str) -> str:
    """The newest HTML widget value of the panel containing ``marker``."""
    values = [v for v in _htmls(k) if marker in v]
    assert values, f"no panel HTML containing {marker!r}"
    return values[-1]


_ROW = re.compile(r"<summary><span>(\d+)</span><span>([^<]*)</span><span class='dnb-name'[^>]*>"
                  r"([^<]*)</span><span>[^<]*</span><span><span[^>]*>(replayed|executed)</span>")


def _timeline(k: KernelSession) -> list[tuple[int, str, str, str]]:
    """(position, kind, name, "replayed"|"executed") rows of the panel's step timeline."""
    table = _panel_html(k, "class='dnb-steps'")
    return [(int(p), kind, html.unescape(name), mark) for p, kind, name, mark in
            _ROW.findall(table)]


def _effects(workdir: Path) -> Counter:
    log = workdir / "side_effects.log"
    lines = log.read_text().splitlines() if log.exists() else []
    return Counter(line.split()[0] for line in lines)


def _lines(path: Path) -> list[str]:
    return path.read_text().splitlines() if path.exists() else []


def _load(k: KernelSession) -> str:
    return k.execute("%load_ext durable_nb").raise_for_error().stdout


# -- kernel restart ---------------------------------------------------------------------------

def _reference_tokens(tmp_path: Path) -> tuple[int, int, str]:
    """The token totals and result of the same agent run without a crash (in this process)."""
    workdir = tmp_path / "reference"
    workdir.mkdir()
    (workdir / "sales.csv").write_text(SALES_CSV)
    journal = DiskJournal(workdir / "journal")
    with LoopbackServer() as server:
        client = openai.OpenAI(base_url=server.url, api_key="loopback", max_retries=0)
        tools = make_tools(workdir)

        def agent(ctx):
            return sales_agent(ctx, tools, client=client)

        assert execute("ref", agent, journal=journal, on_approval="park") is None
        approve("ref", journal=journal)
        result = execute("ref", agent, journal=journal, on_approval="park")
    info = get_run("ref", journal=journal)
    assert info.status is Status.DONE
    return info.prompt_tokens, info.completion_tokens, result


def test_sigkill_mid_run_then_rerun_completes_without_repeating_llm_calls_or_tools(
        tmp_path: Path) -> None:
    (tmp_path / "sales.csv").write_text(SALES_CSV)
    journal = _journal(tmp_path)
    with LoopbackServer(delay=0.4) as server, start_kernel(tmp_path, env=_env(server)) as k:
        _load(k)
        k.execute(SETUP_CELL).raise_for_error()
        k.execute_async(AGENT_CELL)  # never answered: the kernel dies mid-cell

        def llm_call_in_flight() -> bool:
            steps = list(journal.steps("sales")) if journal.find_run("sales") else []
            chats = sum(1 for e in steps if e.kind == "chat")
            return len(steps) >= 3 and server.count(round=chats) >= 1

        # Killed while the model answers the next round, as an OOM kill mid-request would.
        wait_until(llm_call_in_flight, 30, "3 journaled steps and an LLM call in flight")
        k.kill()
        at_kill = list(journal.steps("sales"))
        rounds_done = sum(1 for e in at_kill if e.kind == "chat")
        effects_at_kill = _effects(tmp_path)
        assert len(at_kill) >= 3 and _status(tmp_path, "sales") is Status.RUNNING

        k.restart()
        load_text = _load(k)
        assert f"sales: interrupted at iteration {rounds_done}" in load_text
        k.execute(SETUP_CELL).raise_for_error()
        parked = k.execute(AGENT_CELL, timeout=60).raise_for_error()
        assert parked.text == ""  # the cell ended: the run waits for the email's approval
        assert _status(tmp_path, "sales") is Status.WAITING_APPROVAL
        assert "send_email" in _panel_html(k, "Approval needed")

        k.click_widget_button(k.find_button("Approve"))
        _wait_status(tmp_path, "sales", Status.DONE)
        k.drain(0.5)
        rows = _timeline(k)
        info = get_run("sales", journal=journal)

    # No completed LLM call was made again; the one in flight at the kill was (never answered).
    by_round = server.stats()["by_round"]
    for rnd in range(rounds_done):
        assert by_round[str(rnd)] == 1, by_round
    assert by_round[str(rounds_done)] == 2, by_round
    assert all(n == 1 for r, n in by_round.items() if int(r) > rounds_done), by_round
    # Every tool ran once, including those that ran before the kill.
    assert all(effects_at_kill[t] == 1 for t in effects_at_kill)
    assert _effects(tmp_path) == Counter(read_csv=1, analyse=1, write_report=1, send_email=1)

    # The panel shows each step once: the journaled ones replayed, the rest executed.
    assert [r[0] for r in rows] == list(range(len(info.steps)))
    assert [(r[1], r[2]) for r in rows] == [(e.kind, e.name) for e in info.steps]
    assert [r[3] for r in rows] == (["replayed"] * len(at_kill)
                                    + ["executed"] * (len(info.steps) - len(at_kill)))

    prompt, completion, result = _reference_tokens(tmp_path)
    assert (info.prompt_tokens, info.completion_tokens) == (prompt, completion)
    assert serde.decode(info.result) == result
    assert info.iteration == len(DEMO_SCRIPT)


def test_done_run_rerun_replays_with_no_llm_request_and_same_result(tmp_path: Path) -> None:
    (tmp_path / "sales.csv").write_text(SALES_CSV)
    script = [DEMO_SCRIPT[0], DEMO_SCRIPT[1], "Revenue is highest in the West."]
    cell = "%%durable_agent report\nsales_agent(ctx, tools[:3])"
    with LoopbackServer(script) as server, start_kernel(tmp_path, env=_env(server)) as k:
        _load(k)
        k.execute(SETUP_CELL).raise_for_error()
        first = k.execute(cell).raise_for_error()
        requests = server.stats()["total"]
        assert requests == 3 and _status(tmp_path, "report") is Status.DONE

        again = k.execute(cell).raise_for_error()
        assert server.stats()["total"] == requests
        assert again.text == first.text == repr("Revenue is highest in the West.")
        assert {mark for *_, mark in _timeline(k)} == {"replayed"}
    assert _effects(tmp_path) == Counter(read_csv=1, analyse=1)


# -- cell changes -------------------------------------------------------------------------------

_STEPS_CELL = """%%durable_agent steps {options}
def effect(name):
    with open('effects.txt', 'a') as f:
        f.write(name + '\\n')
    return name
[ctx.run(n, effect, n) for n in {names!r}]
"""


def test_changed_cell_stops_with_mismatch_and_on_change_rerun_reruns_from_divergence(
        tmp_path: Path) -> None:
    effects = tmp_path / "effects.txt"
    with start_kernel(tmp_path, env=_env()) as k:
        _load(k)
        done = k.execute(_STEPS_CELL.format(options="", names=["load", "clean", "save"]))
        assert done.raise_for_error().text == "['load', 'clean', 'save']"

        changed = _STEPS_CELL.format(options="", names=["load", "dedupe", "save"])
        mismatch = k.execute(changed)
        assert mismatch.status == "error" and mismatch.error["ename"] == "JournalMismatch"
        assert "holds run 'clean' at step 1" in mismatch.traceback
        assert "asks for run 'dedupe'" in mismatch.traceback
        assert _status(tmp_path, "steps") is Status.DONE  # the journal was not changed

        rerun = k.execute(_STEPS_CELL.format(options="--on-change rerun",
                                             names=["load", "dedupe", "save"]))
        assert rerun.raise_for_error().text == "['load', 'dedupe', 'save']"
    assert _lines(effects) == ["load", "clean", "save", "dedupe", "save"]
    journal = _journal(tmp_path)
    assert [e.name for e in get_run("steps", journal=journal).steps] == ["load", "dedupe", "save"]
    fork = get_run("steps@1", journal=journal)  # the old steps, kept
    assert [e.name for e in fork.steps] == ["load", "clean", "save"]



_CHAT_CELL = """%%durable_agent forked {options}
reply = ctx.chat(model="loopback-1", messages=[{{"role": "user", "content": "hi"}}])
[reply.choices[0].message.content, ctx.run("step", lambda v: v, {value!r})]
"""


def test_a_done_cell_edited_and_rerun_keeps_its_fork_done_not_cancelled(tmp_path: Path) -> None:
    from durable_nb.server import views
    from durable_nb.server.journals import KnownJournal

    with LoopbackServer(["hello"] * 3) as server, start_kernel(tmp_path, env=_env(server)) as k:
        _load(k)
        done = k.execute(_CHAT_CELL.format(options="", value="a")).raise_for_error()
        assert done.text == "['hello', 'a']" and _status(tmp_path, "forked") is Status.DONE
        before = _journal(tmp_path).get_run("forked")
        rerun = k.execute(_CHAT_CELL.format(options="--on-change rerun", value="b"))
        assert rerun.raise_for_error().text == "['hello', 'b']"
        assert server.stats()["total"] == 1  # the chat replayed
    journal = _journal(tmp_path)
    fork = journal.get_run("forked@1")
    assert (fork.status, fork.result, fork.error, fork.finished_at) == \
        (Status.DONE, before.result, None, before.finished_at)
    assert (fork.step_count, fork.iteration, fork.prompt_tokens, fork.completion_tokens) == \
        (2, 1, before.prompt_tokens, before.completion_tokens) and before.prompt_tokens > 0
    assert [e.result for e in journal.steps("forked@1")][1] == "a"
    # the sidebar's listing: the fork is with the DONE runs, nothing is cancelled
    known = KnownJournal(id="j", location=str(journal.directory), kind="disk")
    listing = views.list_runs([(known, known.open())], groups=views.GROUPS)
    assert {(r["run_id"], r["status"], r["interrupted"]) for r in listing.runs} == {
        ("forked", "DONE", False), ("forked@1", "DONE", False)}
    assert views.list_runs([(known, known.open())], groups=("CANCELLED",)).total == 0

# -- what the panel tells -------------------------------------------------------------------------

def _seen(fragment: str) -> str:
    """An HTML fragment as a person reads it: no style sheets, no tags, spaces collapsed."""
    fragment = re.sub(r"<style>.*?</style>", "", fragment, flags=re.S)
    fragment = re.sub(r"<div class='dnb-dead'>.*?</div>", "", fragment, flags=re.S)
    return " ".join(html.unescape(re.sub(r"<[^>]+>", " ", fragment)).split())


def test_a_run_refused_before_it_started_shows_the_refusal_and_no_run(tmp_path: Path) -> None:
    env = {**_env(), "HOME": str(tmp_path), "XDG_CONFIG_HOME": str(tmp_path / "config")}
    with start_kernel(tmp_path, env=env) as k:
        _load(k)
        refused = k.execute("%%durable_agent refused --notify slack\nctx.run('a', lambda: 1)")
        assert "NotifyConfigError" in refused.traceback
        header = _seen(_panel_html(k, "<b>refused</b>"))
        summary = k.execute("from durable_nb.notebook.session import active_run\n"
                            "print(active_run('refused').panel.summary())").stdout
    assert _status(tmp_path, "refused") is None  # no such run
    assert "not started durable_nb refused to start this run (NotifyConfigError" in header
    assert "nothing was executed or journaled" in header
    assert "RUNNING" not in header and "in the journal (unchanged)" not in header
    # what nbclient and papermill keep of it
    assert summary.startswith("durable run refused: not started (refused before it started")
    assert "RUNNING" not in summary and "NotifyConfigError" in summary, summary


_SEVEN_THEN_APPROVAL = """%%durable_agent seven
for i in range(7):
    ctx.run(f'step {i}', lambda i=i: i)
ctx.approval('go ahead', {'why': 'test'})
[ctx.run(f'after {i}', lambda i=i: i) for i in range(2)]
"""


def test_a_run_resumed_in_its_kernel_counts_each_step_once_and_each_attempt_apart(
        tmp_path: Path, capsys) -> None:
    """7 steps executed, parked, approved in the panel, resumed by the kernel's watcher: the
    resumed execution replayed the 7 and executed 3 (the approval and 2 steps), as
    `durable-nb show` tells the attempts; the panel counts the run, each step once (issue 41:
    it added the attempts up, 7 replayed + 10 executed for a run of 10 steps), all 10
    executed in this kernel."""
    from durable_nb.cli import main

    with start_kernel(tmp_path, env=_env()) as k:
        _load(k)
        k.execute(_SEVEN_THEN_APPROVAL).raise_for_error()
        k.click_widget_button(k.find_button("Approve"))
        _wait_status(tmp_path, "seven", Status.DONE)
        wait_until(lambda: "DONE" in _panel_html(k, "<b>seven</b>"), 10, "the panel to say DONE")
        stats = _seen(_panel_html(k, "replayed"))
    assert "steps 0 replayed, 10 executed" in stats, stats
    capsys.readouterr()
    assert main(["--journal", str(tmp_path / ".durable_nb"), "show", "seven"]) == 0
    shown = capsys.readouterr().out
    assert re.search(r"attempt 1 .*: replayed 0, executed 7; parked", shown), shown
    assert re.search(r"attempt 2 .*: replayed 7, executed 3; completed", shown), shown


def test_a_parked_approval_shows_its_deadline_and_what_happens_then(tmp_path: Path) -> None:
    with start_kernel(tmp_path, env=_env()) as k:
        _load(k)
        k.execute(_parking_cell("timed", timeout=", timeout='15m'")).raise_for_error()
        shown = _seen(_panel_html(k, "Approval needed"))
    pending = _journal(tmp_path).get_run("timed").pending_approval
    deadline = time.strftime("%H:%M", time.localtime(pending["timeout_at"]))
    assert re.search(rf"Decide by {deadline} \(in 1[45] min\), then rejected", shown), shown


# -- cancel, interrupt ----------------------------------------------------------------------------

_PARKING_CELL = """%%durable_agent {run_id}
import time
ctx.run('prepare', lambda: 'ready')
decision = ctx.approval('go ahead', {{'why': 'test'}}{timeout})
for i in range({n}):
    ctx.run(f'work {{i}}', lambda i=i: (time.sleep({pause}), open('work.txt', 'a').write(f'{{i}}\\n'))[1])
(decision.approved, decision.by, decision.note)
"""


def _parking_cell(run_id: str, n: int = 0, pause: float = 0.0, timeout: str = "") -> str:
    return _PARKING_CELL.format(run_id=run_id, n=n, pause=pause, timeout=timeout)


def test_cancel_button_while_parked_and_durable_cancel_while_resumed_in_background(
        tmp_path: Path) -> None:
    work = tmp_path / "work.txt"
    with start_kernel(tmp_path, env=_env()) as k:
        _load(k)

        k.execute(_parking_cell("parked")).raise_for_error()
        assert _status(tmp_path, "parked") is Status.WAITING_APPROVAL
        k.click_widget_button(k.find_button("Cancel run"))
        _wait_status(tmp_path, "parked", Status.CANCELLED)
        wait_until(lambda: "CANCELLED" in _panel_html(k, "<b>parked</b>"), 10,
                   "the panel to show CANCELLED")

        k.execute(_parking_cell("busy", n=40, pause=0.1)).raise_for_error()
        k.click_widget_button(k.find_button("Approve"))
        wait_until(lambda: len(_lines(work)) >= 3, 20, "the resumed run to do 3 work steps")
        out = k.execute("%durable cancel busy").raise_for_error()
        assert "cancel requested for run busy" in out.stdout
        _wait_status(tmp_path, "busy", Status.CANCELLED)
    info = get_run("busy", journal=_journal(tmp_path))
    work_steps = [e for e in info.steps if e.name.startswith("work ")]
    assert 3 <= len(work_steps) < 40
    # Stopped at a step boundary: every work step that ran is journaled, none ran after.
    assert len(_lines(work)) == len(work_steps)


def test_interrupt_fails_run_as_interrupted_and_rerun_continues_after_completed_steps(
        tmp_path: Path) -> None:
    log = tmp_path / "slow.txt"
    cell = textwrap.dedent("""\
        %%durable_agent slow
        import time
        def slow(i):
            time.sleep(0.25)
            with open('slow.txt', 'a') as f:
                f.write(f'{i}\\n')
            return i
        sum(ctx.run(f'step {i}', slow, i) for i in range(10))
        """)
    journal = _journal(tmp_path)
    with start_kernel(tmp_path, env=_env()) as k:
        _load(k)
        msg_id = k.execute_async(cell)
        wait_until(lambda: journal.find_run("slow") is not None
                   and len(list(journal.steps("slow"))) >= 3, 20, "3 slow steps")
        k.km.interrupt_kernel()
        interrupted = k.wait_for(msg_id, timeout=20)
        assert interrupted.status == "error" and interrupted.error["ename"] == "KeyboardInterrupt"

        record = journal.get_run("slow")
        assert record.status is Status.FAILED and "interrupted" in record.error
        kept = [e.name for e in journal.steps("slow")]
        assert kept == [f"step {i}" for i in range(len(kept))] and len(kept) >= 3
        assert _lines(log) == [str(i) for i in range(len(kept))]

        again = k.execute(cell, timeout=30).raise_for_error()
        assert again.text == str(sum(range(10)))
    assert _lines(log) == [str(i) for i in range(10)]
    assert _status(tmp_path, "slow") is Status.DONE


# -- approvals while parked ---------------------------------------------------------------------

def test_parked_approval_times_out_as_rejection_by_timeout(tmp_path: Path) -> None:
    with start_kernel(tmp_path, env=_env()) as k:
        _load(k)
        k.execute(_parking_cell("late", timeout=", timeout=1")).raise_for_error()
        assert _status(tmp_path, "late") is Status.WAITING_APPROVAL
        _wait_status(tmp_path, "late", Status.DONE, timeout=15)
        wait_until(lambda: "DONE" in _panel_html(k, "<b>late</b>"), 10,
                   "the panel to show DONE")
        shown = html.unescape(_panel_html(k, "Result:"))
        assert '"timeout"' in shown and "no decision within 1 s" in shown
    info = get_run("late", journal=_journal(tmp_path))
    assert serde.decode(info.result) == (False, "timeout", "no decision within 1 s")


def test_a_parked_run_in_a_live_kernel_takes_its_deadlines_approve_policy(
        tmp_path: Path) -> None:
    """The kernel stays alive and parked; at the deadline its watcher applies the policy
    (approve), which decides in the journal like anyone else, and the run resumes."""
    with start_kernel(tmp_path, env=_env()) as k:
        _load(k)
        k.execute(_parking_cell("policy", n=1, timeout=', timeout="1s", on_timeout="approve"')
                  ).raise_for_error()
        assert _status(tmp_path, "policy") is Status.WAITING_APPROVAL
        _wait_status(tmp_path, "policy", Status.DONE, timeout=60)
    info = get_run("policy", journal=_journal(tmp_path))
    note = "no decision within 1 s: approved by its on_timeout policy"
    assert serde.decode(info.result) == (True, "timeout", note)
    assert [e.name for e in info.steps] == ["prepare", "go ahead", "work 0"]
    assert (tmp_path / "work.txt").read_text() == "0\n"


def test_approval_from_another_process_resumes_parked_run_without_a_click(
        tmp_path: Path) -> None:
    with start_kernel(tmp_path, env=_env()) as k:
        _load(k)
        k.execute(_parking_cell("remote")).raise_for_error()
        assert _status(tmp_path, "remote") is Status.WAITING_APPROVAL

        cli = subprocess.run([sys.executable, "-m", "durable_nb.cli", "approve", "remote",
                              "fine by me", "--by", "lead"], cwd=tmp_path, env={
                                  **os.environ, **_env()}, capture_output=True, text=True,
                             timeout=60)
        assert cli.returncode == 0, cli.stderr
        _wait_status(tmp_path, "remote", Status.DONE)
        assert "DONE" in _panel_html(k, "<b>remote</b>")
    info = get_run("remote", journal=_journal(tmp_path))
    assert serde.decode(info.result) == (True, "lead", "fine by me")


def test_async_cell_runs_steps_concurrently_and_replays(tmp_path: Path) -> None:
    cell = ("%%durable_agent async-cell\n"
            "import asyncio\n"
            "async def fetch(i):\n"
            "    await asyncio.sleep(0.2)\n"
            "    return i * 10\n"
            "values = await asyncio.gather(*[ctx.run_async(f'fetch {i}', fetch, i) for i in range(3)])\n"
            "values")
    with start_kernel(tmp_path, env={"DURABLE_NB_DIR": str(tmp_path / "journal")}) as k:
        _load(k)
        first = k.execute(cell).raise_for_error()
        again = k.execute(cell).raise_for_error()
    assert first.text == again.text == "[0, 10, 20]"
    journal = DiskJournal(tmp_path / "journal")
    assert [s.name for s in journal.steps("async-cell")] == ["fetch 0", "fetch 1", "fetch 2"]


def test_wait_option_keeps_the_cell_running_until_a_decision_from_outside(tmp_path: Path) -> None:
    cell = ("%%durable_agent waited --wait\n"
            "d = ctx.approval('deploy', {'env': 'prod'})\n"
            "(d.approved, d.by)")
    with start_kernel(tmp_path, env=_env()) as k:
        _load(k)
        msg_id = k.execute_async(cell)
        _wait_status(tmp_path, "waited", Status.WAITING_APPROVAL)
        subprocess.run([sys.executable, "-m", "durable_nb.cli", "--journal",
                        str(tmp_path / ".durable_nb"), "approve", "waited", "--by", "ops"],
                       check=True, capture_output=True, timeout=60, env={**os.environ, **_env()})
        # The cell itself returns the decision: it waited instead of parking.
        assert k.wait_for(msg_id, timeout=60).raise_for_error().text == "(True, 'ops')"
    assert _status(tmp_path, "waited") is Status.DONE


# -- errors as a person reads them ---------------------------------------------------------------

def _one_line(result: Any) -> str:
    """The error the cell shows, asserting it is one line without any traceback frame
    (IPython prints a UsageError to stderr rather than as a traceback)."""
    shown = (result.traceback or result.stderr).strip()
    assert result.status == "error", result
    assert "File " not in shown and "Traceback" not in shown and "---" not in shown, shown
    if result.traceback:  # wrapped at word boundaries, at 100 columns
        assert all(len(line) <= 100 for line in shown.splitlines()), shown
    return " ".join(shown.splitlines())


def test_a_syntax_error_in_the_cell_shows_its_line_and_caret_as_python_shows_it(
        tmp_path: Path) -> None:
    with start_kernel(tmp_path, env=_env()) as k:
        _load(k)
        plain = k.execute("total = 1\nprices = (1, 2\n")
        cells = {"run": k.execute("%%durable_agent syntax\ntotal = 1\nprices = (1, 2\n"),
                 "batch": k.execute("%%durable_agent b --over [1, 2]\nprices = (item,\n")}
    assert plain.error["ename"] == "SyntaxError" and plain.traceback.startswith("  Cell In[")
    for kind, cell in cells.items():
        assert cell.status == "error", kind
        shown = cell.traceback
        lines = shown.strip("\n").splitlines()
        # As IPython shows a syntax error in a plain cell: where, the line, a caret, what.
        assert re.fullmatch(r"  Cell In\[\d+\], line \d+", lines[0]), shown
        assert lines[-1] == "SyntaxError: '(' was never closed", shown
        assert lines[-2].strip() == "^", shown
        assert "Traceback" not in shown and "File " not in shown
        assert not any(name in shown for name in ("durable_nb", "magics.py", "cell.py",
                                                  "ast.py", "interactiveshell")), shown
    # Numbered as in the cell, the magic's line being line 1.
    run, batch = (cells[kind].traceback.splitlines() for kind in ("run", "batch"))
    assert run[0].endswith(", line 3") and run[1] == "    prices = (1, 2"
    assert batch[0].endswith(", line 2") and batch[1] == "    prices = (item,"
    assert _status(tmp_path, "syntax") is None  # nothing ran


def test_durable_errors_show_as_their_message_with_what_to_do_and_the_badge_stops(
        tmp_path: Path) -> None:
    with start_kernel(tmp_path, env=_env()) as k:
        _load(k)
        k.execute("%%durable_agent e\nctx.run('a', str, 'x')").raise_for_error()
        changed = k.execute("%%durable_agent e\nctx.run('a', str, 'y')")
        assert changed.error["ename"] == "InputChanged"
        shown = _one_line(changed)
        assert shown.startswith("InputChanged: run 'e' no longer matches its journal: step 0, "
                                "run 'a': args[0] changed from 'x' to 'y'.")
        assert "`durable-nb reset e --from 0`" in shown and "--on-change rerun" in shown
        header = html.unescape(_panel_html(k, "stopped: input changed"))
        assert "The run is DONE in the journal (unchanged)" in header
        assert _status(tmp_path, "e") is Status.DONE

        assert _one_line(k.execute("%durable approve e")) == (
            "NoPendingApproval: run 'e' is not waiting for an approval (status DONE). Nothing "
            "was decided. See `durable-nb show e`.")
        assert _one_line(k.execute("%durable reset e --from 99")) == (
            "UsageError: cannot reset run 'e' from step 99: its steps are numbered 0 to 0. "
            "See `durable-nb show e`.")
        missing = tmp_path / "no" / "x.ipynb"
        assert _one_line(k.execute(f"%durable export e {missing}")) == (
            f"FileNotFoundError: cannot write {missing}: the folder {missing.parent} does not "
            f"exist. Create it first, or export to a path in an existing folder.")
        spaced = k.execute("%%durable_agent sales report\nctx.run('a', str, 'x')")
        assert spaced.stderr.strip() == (
            "UsageError: unrecognized arguments: report\n"
            "  a run id is one word without spaces: did you mean 'sales-report'?")


def test_a_user_exception_from_a_step_shows_the_users_frames_only(tmp_path: Path) -> None:
    with start_kernel(tmp_path, env=_env()) as k:
        _load(k)
        failed = k.execute("%%durable_agent u\n"
                           "def boom(x):\n"
                           "    raise ValueError('bad ' + x)\n"
                           "ctx.run('a', lambda: 1)\n"
                           "ctx.run('b', boom, 'y')")
        assert failed.status == "error" and failed.error["ename"] == "ValueError"
        shown = failed.traceback
        assert "ctx.run('b', boom, 'y')" in shown and "raise ValueError('bad ' + x)" in shown
        assert shown.rstrip().endswith("ValueError: bad y")
        assert "durable_nb/" not in shown and "run_cell_magic" not in shown, shown
        assert "FAILED" in _panel_html(k, "<b>u</b>")


def test_prints_reach_the_cells_output_and_not_the_panel_log_too(tmp_path: Path) -> None:
    with start_kernel(tmp_path, env=_env()) as k:
        _load(k)
        done = k.execute("%%durable_agent p\nprint('hello from the cell')\nctx.run('a', str, 1)")
        done.raise_for_error()
        # Printed once by the run and once by its pure-replay check (DURABLE_NB_VERIFY_REPLAY).
        assert done.stdout == "hello from the cell\n" * 2
        k.drain(0.3)
        logs = [m.state.get("outputs") for m in k.widgets.values()
                if m.model_name == "OutputModel"]
        assert logs and not any("hello from the cell" in str(out) for out in logs), logs


needs_ro_mount = pytest.mark.skipif(
    not shutil.which("unshare") or subprocess.run(
        ["unshare", "-m", "sh", "-c", "mount --bind -o ro /tmp /tmp"],
        capture_output=True).returncode != 0,
    reason="needs `unshare -m` and a read-only bind mount (root)")


@needs_ro_mount
def test_an_unwritable_journal_is_reported_as_not_writable(tmp_path: Path) -> None:
    readonly = tmp_path / "readonly"
    journal = DiskJournal(readonly / "j")
    execute("r", lambda ctx: ctx.run("a", lambda: 1), journal=journal)
    journal.close()
    wrapper = ["unshare", "-m", "sh", "-c",
               f'mount --bind -o ro "{readonly}" "{readonly}" && exec "$@"', "sh"]
    with start_kernel(tmp_path, env=_env(), argv_prefix=wrapper) as k:
        _load(k)
        shown = _one_line(k.execute(f"%%durable_agent r --journal {readonly / 'j'}\n"
                                    f"ctx.run('a', lambda: 1)"))
    assert shown.startswith(f"JournalNotWritable: the journal at {readonly / 'j'} is not "
                            f"writable (")
    assert "use another one (--journal DIR or DURABLE_NB_DIR)" in shown


def test_durable_nb_enable_makes_the_magic_exist_after_every_restart(tmp_path: Path) -> None:
    env = {**_env(), "IPYTHONDIR": str(tmp_path / "ipython")}

    def durable_nb(*args: str) -> str:
        done = subprocess.run([sys.executable, "-m", "durable_nb.cli", *args], env={
            **os.environ, **env}, capture_output=True, text=True, timeout=60)
        assert done.returncode == 0, done.stderr
        return done.stdout

    assert str(tmp_path / "ipython" / "profile_default" / "ipython_config.py") in \
        durable_nb("enable")
    cell = "%%durable_agent enabled\nctx.run('a', lambda: 41) + 1"
    with start_kernel(tmp_path, env=env) as k:
        assert k.execute(cell).raise_for_error().text == "42"  # no %load_ext
        k.restart()
        assert k.execute(cell).raise_for_error().text == "42"  # only the agent cell, replayed
        assert "disabled durable_nb in" in durable_nb("enable", "--undo")
        k.restart()
        gone = k.execute(cell)
        assert "Cell magic `%%durable_agent` not found" in gone.stderr + gone.traceback
    assert [e.name for e in _journal(tmp_path).steps("enabled")] == ["a"]


_EARLIER_BLOCK = """c = get_config()  # noqa

# >>> durable_nb: added by `durable-nb enable`; `durable-nb disable` removes it >>>
# %%durable_agent and %durable in every IPython kernel and shell of this profile.
c.InteractiveShellApp.extensions.append("durable_nb")
# <<< durable_nb <<<
"""


@pytest.mark.parametrize("written_by", ["this_version", "an_earlier_version"])
def test_load_ext_in_a_kernel_whose_profile_loads_durable_nb_prints_nothing(
        tmp_path: Path, written_by: str) -> None:
    """The README's first cell, ``%load_ext durable_nb``, in every notebook of a profile
    that ``durable-nb enable`` set up: silent, and the magic works (an enable written by an
    earlier version is brought up to date by enabling again)."""
    env = {**_env(), "IPYTHONDIR": str(tmp_path / "ipython")}
    if written_by == "an_earlier_version":
        config = tmp_path / "ipython" / "profile_default" / "ipython_config.py"
        config.parent.mkdir(parents=True)
        config.write_text(_EARLIER_BLOCK)
    enabled = subprocess.run([sys.executable, "-m", "durable_nb.cli", "enable"],
                             env={**os.environ, **env}, capture_output=True, text=True,
                             timeout=60)
    assert enabled.returncode == 0 and "enabled durable_nb in" in enabled.stdout, enabled
    with start_kernel(tmp_path, env=env) as k:
        loaded = k.execute("%load_ext durable_nb").raise_for_error()
        assert (loaded.stdout, loaded.stderr) == ("", "")
        cell = "%%durable_agent loaded\nctx.run('a', lambda: 41) + 1"
        assert k.execute(cell).raise_for_error().text == "42"
        # one panel, one cell-id tracker: the second load registered nothing
        trackers = k.execute(
            "from durable_nb.notebook.magics import DurableMagics\n"
            "sum(isinstance(getattr(c, '__self__', None), DurableMagics)"
            " for c in get_ipython().events.callbacks['pre_run_cell'])").raise_for_error()
        assert trackers.text == "1"


# Parks; after the approval it finishes, and the pure replay that checks a finished run
# (DURABLE_NB_VERIFY_REPLAY=1) runs this code again: there it waits for the file `go`, so the
# background execution is still ending while the journal already says DONE.
_ENDING_CELL = """%%durable_agent ending
import os, time
ctx.approval('go ahead', {'why': 'test'})
ctx.run('work', str, 'done')
if os.path.exists('finished once'):
    while not os.path.exists('go'):
        time.sleep(0.02)
open('finished once', 'w').close()
'result'"""


def test_the_cell_run_again_while_its_done_run_ends_in_the_background_waits_for_it(
        tmp_path: Path) -> None:
    """The panel says DONE as soon as the journal does; the background execution ends a moment
    later (its lease released, its replay check done). Running the cell again in that moment
    (as Run All right after a click does) waits for it rather than failing with RunLeased."""
    with start_kernel(tmp_path, env={**_env(), "DURABLE_NB_VERIFY_REPLAY": "1"}) as k:
        _load(k)
        k.execute(_ENDING_CELL).raise_for_error()
        k.click_widget_button(k.find_button("Approve"))
        _wait_status(tmp_path, "ending", Status.DONE)
        wait_until(lambda: (tmp_path / "finished once").exists(), 10, "the run to end once")

        again = k.execute_async(_ENDING_CELL)
        said = ""
        while "waiting for that execution to end" not in said:  # not a RunLeased error
            msg = k._next_iopub(30)
            assert msg is not None, "the cell neither waited nor failed"
            if msg["parent_header"].get("msg_id") == again:
                assert msg["msg_type"] != "error", "\n".join(msg["content"]["traceback"])
                said += msg["content"].get("text", "") if msg["msg_type"] == "stream" else ""
        (tmp_path / "go").touch()
        result = k.wait_for(again)
    assert said.strip() == ("run 'ending' finished in the background after its approval; "
                            "waiting for that execution to end")
    assert result.error is None, result.traceback
    assert result.text == "'result'"
