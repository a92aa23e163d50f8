"""Batch cells in a real IPython kernel, driven through jupyter_client (tests/harness): a
batch of 50 items with approvals against the loopback server, SIGKILLed mid-batch,
restarted, re-run, approved from the CLI, paying every journaled LLM round and running
every journaled tool once; the stop button stopping a batch cleanly; a click on an item's
Approve; the traffic of a 1,000-item batch's panel, counted in comm messages.

Progress is read from the journal on disk, requests at the loopback server (which keeps
every request body: the item is in its first message, the round is the number of assistant
turns), tools' effects from a log file each effect appends a line to.
"""

from __future__ import annotations

import html
import os
import re
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import pytest

from durable_nb import DiskJournal, Status
from durable_nb.testing import LoopbackServer
from tests.harness import KernelSession, start_kernel, wait_until

pytestmark = pytest.mark.kernel

REPO = Path(__file__).resolve().parents[1]

SETUP = """\
import os, openai, durable_nb
client = openai.OpenAI(base_url=os.environ['OPENAI_BASE_URL'], api_key='loopback',
                       max_retries=0)
tickets = [{'id': f'T{i:02d}', 'text': f'the printer on floor {i} is broken'} for i in range(50)]
def effect(run_id, name):
    with open('effects.log', 'a') as f:
        f.write(f'{run_id} {name}\\n')
    return name
"""

# Two LLM rounds per item, a tool after the first, an approval for every tenth ticket.
TRIAGE = """\
%%durable_agent triage --over tickets --key item['id'] --concurrency 8
messages = [{'role': 'user', 'content': f"classify {item['id']}: {item['text']}"}]
first = ctx.chat(model='gpt-4o-mini', client=client, messages=messages, max_tokens=20)
messages.append(durable_nb.assistant_message(first.choices[0].message))
ctx.run('label', effect, ctx.run_id, 'label')
if int(item['id'][1:]) % 10 == 0:
    if ctx.approval('escalate', {'ticket': item['id']}).approved:
        ctx.run('escalate', effect, ctx.run_id, 'escalate')
messages.append({'role': 'user', 'content': 'summarise it in one line'})
second = ctx.chat(model='gpt-4o-mini', client=client, messages=messages, max_tokens=20)
second.choices[0].message.content
"""
NEEDS_APPROVAL = [f"T{i:02d}" for i in range(0, 50, 10)]


def _value(cell) -> str:
    """The batch cell's value as the cell shows it: a display of its own (with a display id,
    so that it follows the batch after the cell returned), not an execute_result."""
    shown = [d.get("text/plain", "") for d in cell.displays
             if d.get("text/plain", "").startswith("<Batch ")]
    assert len(shown) == 1 and cell.text == "", (shown, cell.text)
    return shown[0]

def _env(server: LoopbackServer | None = None) -> dict[str, str]:
    env = {"PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))}
    env.pop("DURABLE_NB_DIR", None)
    if server is not None:
        env.update(OPENAI_BASE_URL=server.url, OPENAI_API_KEY="loopback")
    return env


def _journal(tmp_path: Path) -> DiskJournal:
    return DiskJournal(tmp_path / ".durable_nb")


def _steps(journal: DiskJournal, prefix: str) -> dict[str, list[tuple[str, str]]]:
    """Each item run's journaled steps as (kind, name)."""
    return {r.run_id: [(e.kind, e.name) for e in journal.steps(r.run_id)]
            for r in journal.list_runs(prefix)}


def _requests(server: LoopbackServer) -> Counter:
    """Chat requests the server answered or was answering, by (ticket, round)."""
    counts: Counter = Counter()
    for body in server.requests:
        ticket = re.search(r"classify (T\d\d)", body["messages"][0]["content"]).group(1)
        counts[(ticket, sum(1 for m in body["messages"] if m["role"] == "assistant"))] += 1
    return counts


def _effects(tmp_path: Path) -> Counter:
    log = tmp_path / "effects.log"
    return Counter(tuple(line.split()) for line in
                   (log.read_text().splitlines() if log.exists() else []))


def _htmls(k: KernelSession) -> list[str]:
    k.drain(0.3)
    return [m.state.get("value", "") for m in k.widgets.values() if m.model_name == "HTMLModel"]


def _batch_summary(k: KernelSession, batch_id: str) -> str:
    """The batch panel's summary as a person reads it (tags, styles and the note shown only
    when the kernel stopped left out)."""
    values = [v for v in _htmls(k) if f"<b>batch {batch_id}</b>" in v]
    assert values, f"no batch panel for {batch_id!r}"
    shown = re.sub(r"<div class='dnb-dead'>.*?</div>", "", values[-1].split("</style>")[-1])
    return " ".join(html.unescape(re.sub(r"<[^>]+>", " ", shown)).split())


def _cli(tmp_path: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "durable_nb.cli", *args], cwd=tmp_path,
                          env={**os.environ, **_env()}, capture_output=True, text=True,
                          timeout=120)


def test_a_batch_killed_mid_way_restarted_rerun_and_approved_from_the_cli_pays_each_step_once(
        tmp_path: Path) -> None:
    journal = _journal(tmp_path)
    script = ["label: hardware", "The printer needs a new fuser."]
    with LoopbackServer(script, delay=0.3) as server, start_kernel(tmp_path, _env(server)) as k:
        k.execute("%load_ext durable_nb").raise_for_error()
        k.execute(SETUP).raise_for_error()
        k.execute_async(TRIAGE)  # never answered: the kernel dies mid-batch

        def mid_batch() -> bool:
            if journal.find_batch("triage") is None:
                return False
            steps = _steps(journal, "triage/")
            chats = sum(kind == "chat" for run in steps.values() for kind, _ in run)
            started = sum(1 for run in steps.values() if run)
            return started >= 12 and server.count() > chats  # calls in flight
        wait_until(mid_batch, 60, "12 items with journaled steps and LLM calls in flight")
        k.kill()
        at_kill = _steps(journal, "triage/")
        effects_at_kill = _effects(tmp_path)
        statuses = Counter(r.status for r in journal.list_runs("triage/"))
        assert statuses[Status.RUNNING] >= 1 and sum(statuses.values()) < 50
        done_at_kill = statuses[Status.DONE]

        k.restart()
        loaded = k.execute("%load_ext durable_nb").raise_for_error().stdout
        assert "triage: batch with " in loaded and "re-run its cell to finish it" in loaded
        k.execute(SETUP).raise_for_error()
        parked = k.execute(TRIAGE, timeout=120).raise_for_error()
        assert _value(parked) == "<Batch 'triage': 50 items (45 DONE, 5 WAITING_APPROVAL)>"
        summary = _batch_summary(k, "triage")
        assert summary.startswith("batch triage WAITING_APPROVAL 45 / 50 done")
        assert "5 waiting approval" in summary
        if done_at_kill:
            assert f"replay: {done_at_kill} item" in summary

        for ticket in NEEDS_APPROVAL:  # as a colleague in a terminal would
            decided = _cli(tmp_path, "approve", f"triage/{ticket}", "go ahead", "--by", "lead")
            assert decided.returncode == 0, decided.stderr
        wait_until(lambda: all(r.status is Status.DONE for r in journal.list_runs("triage/"))
                   and len(journal.list_runs("triage/")) == 50, 60, "all 50 items DONE")
        done = k.execute("%durable batch wait triage --timeout 60").raise_for_error()
        assert done.text == "<Batch 'triage': 50 items (50 DONE)>"
        wait_until(lambda: "DONE 50 / 50 done" in _batch_summary(k, "triage"), 10,
                   "the panel to show 50 / 50 done")
        final = _steps(journal, "triage/")
        requests = _requests(server)

    # Every LLM round journaled before the kill was paid once; a round in flight at the kill
    # (its entry not written) at most twice.
    journaled = {(run.split("/")[1], n) for run, steps in at_kill.items()
                 for n in range(sum(kind == "chat" for kind, _ in steps))}
    assert len(requests) == 100 and set(requests) == {(f"T{i:02d}", r) for i in range(50)
                                                      for r in (0, 1)}
    assert all(requests[key] == 1 for key in journaled), requests
    repeated = {key for key, n in requests.items() if n > 1}
    assert repeated <= set(requests) - journaled and all(n <= 2 for n in requests.values())
    assert len(repeated) <= 8  # at most one call in flight per item running at the kill
    # Every tool journaled before the kill ran once; each of the others at most twice
    # (a tool in flight at the kill), and in all every item labelled, the approved escalated.
    expected = {(f"triage/T{i:02d}", "label") for i in range(50)} | \
        {(f"triage/{t}", "escalate") for t in NEEDS_APPROVAL}
    effects = _effects(tmp_path)
    assert set(effects) == expected
    journaled_tools = {(run, name) for run, steps in at_kill.items() for kind, name in steps
                       if kind == "run"}
    assert all(effects[key] == 1 for key in journaled_tools)
    assert all(effects[key] == effects_at_kill[key] for key in journaled_tools)
    assert all(n <= 2 for n in effects.values())
    # The journal holds each item's steps once, in order.
    for ticket in (f"T{i:02d}" for i in range(50)):
        names = [name for _, name in final[f"triage/{ticket}"]]
        assert names == (["gpt-4o-mini", "label", "escalate", "escalate", "gpt-4o-mini"]
                         if ticket in NEEDS_APPROVAL else ["gpt-4o-mini", "label",
                                                           "gpt-4o-mini"]), names


SLOW_SETUP = """\
import time
numbers = list(range(12))
def slow(item, step):
    time.sleep(0.3)
    with open('work.log', 'a') as f:
        f.write(f'{item} {step}\\n')
    return step
"""
SLOW = """\
%%durable_agent slow --over numbers --key index --concurrency 3
[ctx.run(f'step {step}', slow, item, step) for step in range(3)]
"""


def test_the_stop_button_stops_a_batch_cleanly_and_a_rerun_finishes_it(tmp_path: Path) -> None:
    journal = _journal(tmp_path)
    log = tmp_path / "work.log"
    with start_kernel(tmp_path, _env()) as k:
        k.execute("%load_ext durable_nb").raise_for_error()
        k.execute(SLOW_SETUP).raise_for_error()
        msg_id = k.execute_async(SLOW)
        wait_until(lambda: journal.find_batch("slow") is not None
                   and sum(1 for r in journal.list_runs("slow/")
                           if r.status is Status.DONE) >= 3, 60, "3 items DONE")
        k.km.interrupt_kernel()
        stopped = k.wait_for(msg_id, timeout=60)
        assert stopped.status == "error" and stopped.error["ename"] == "KeyboardInterrupt"
        shown = " ".join(stopped.traceback.split())  # wrapped at 100 columns
        assert "File " not in shown and "Traceback" not in shown
        assert shown.startswith("KeyboardInterrupt: batch 'slow' stopped: ")
        assert "re-run the cell to finish the batch" in shown

        records = {r.run_id: r for r in journal.list_runs("slow/")}
        assert not [r for r in records.values() if r.status is Status.RUNNING]
        interrupted = [r for r in records.values() if r.status is Status.FAILED]
        assert all(r.error.startswith("interrupted at step") for r in interrupted)
        assert len(records) < 12  # items not started were not started
        # Stopped at step boundaries: every step that ran is journaled, none ran after.
        ran = Counter(tuple(line.split()) for line in log.read_text().splitlines())
        journaled = Counter((run.split("/")[1], name.split()[1]) for run in records
                            for name in (e.name for e in journal.steps(run)))
        assert ran == journaled
        assert "stopped: interrupted" in _batch_summary(k, "slow")

        again = k.execute(SLOW, timeout=120).raise_for_error()
        assert _value(again) == "<Batch 'slow': 12 items (12 DONE)>"
    ran = Counter(tuple(line.split()) for line in log.read_text().splitlines())
    assert ran == Counter({(str(i), str(s)): 1 for i in range(12) for s in range(3)})


def test_an_items_approve_click_resumes_that_item_in_the_background(tmp_path: Path) -> None:
    cell = ("%%durable_agent clicks --over numbers --key index\n"
            "d = ctx.approval('publish', {'n': item}) if item in (1, 2) else None\n"
            "(item, d.approved if d else None)")
    with start_kernel(tmp_path, _env()) as k:
        k.execute("%load_ext durable_nb").raise_for_error()
        k.execute("numbers = [0, 1, 2]").raise_for_error()
        parked = k.execute(cell).raise_for_error()
        assert _value(parked) == "<Batch 'clicks': 3 items (1 DONE, 2 WAITING_APPROVAL)>"
        k.drain(0.5)
        approves = [w.model_id for w in k.widgets.values() if w.model_name == "ButtonModel"
                    and w.state.get("description") == "Approve"]
        assert len(approves) == 2  # one per pending item, in item order
        k.click_widget_button(approves[0])
        journal = _journal(tmp_path)
        wait_until(lambda: journal.get_run("clicks/1").status is Status.DONE, 30,
                   "item 1 DONE after its click")
        assert journal.get_run("clicks/2").status is Status.WAITING_APPROVAL
        wait_until(lambda: "1 waiting approval" in _batch_summary(k, "clicks"), 10,
                   "the panel to show one item still waiting")


def test_a_1000_item_batch_sends_a_few_panel_updates_a_second(tmp_path: Path) -> None:
    cell = ("%%durable_agent many --over numbers --key index --concurrency 16\n"
            "ctx.run('square', lambda: item * item)")
    with start_kernel(tmp_path, _env()) as k:
        k.execute("%load_ext durable_nb").raise_for_error()
        k.execute("numbers = list(range(1000))").raise_for_error()
        k.drain(0.3)
        before = len(k.iopub_log)
        started = time.monotonic()
        done = k.execute(cell, timeout=300).raise_for_error()
        took = time.monotonic() - started
        k.drain(1.0)  # the trailing redraw, if any
        messages = [m for m in k.iopub_log[before:] if m["msg_type"] in ("comm_msg", "comm_open")]
    assert _value(done) == "<Batch 'many': 1000 items (1000 DONE)>"
    # Throttled to two redraws a second, each a few messages (summary, table, log ...), and
    # the widgets' creation: about ten a second, not one per item or step.
    opened = sum(1 for m in messages if m["msg_type"] == "comm_open")
    # The controls are disabled while the cell runs and enabled at its end: twice each, once.
    toggles = [m for m in messages if m["msg_type"] == "comm_msg"
               and set(m["content"]["data"].get("state", {})) == {"disabled"}]
    assert len(toggles) <= 2 * len({m["content"]["comm_id"] for m in toggles}), toggles
    updates = len(messages) - opened - len(toggles)
    assert updates <= 10 * took + 20, (updates, took)
    assert updates < 200, (updates, took)
