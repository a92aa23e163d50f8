"""The batch cell, ``%%durable_agent BATCH --over ITEMS``, and the ``%durable batch...``
commands in IPython without a kernel (a real journal, real threads, the loopback server
where a model is needed): one run per item, each item's own namespace, keys, options, what
a re-run does, approvals, errors."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import IPython
import nbformat
import pytest
from IPython.core.error import UsageError
from IPython.testing.globalipapp import start_ipython

import durable_nb as dn
from durable_nb import DiskJournal, Status
from durable_nb.notebook.magics import split_options
from durable_nb.notebook import active_batch
from durable_nb.testing import LoopbackServer


@pytest.fixture
def ip(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    """The test IPython shell with the extension loaded and its journal in a fresh dir."""
    monkeypatch.setenv("DURABLE_NB_DIR", str(tmp_path / "journal"))
    start_ipython()
    shell = IPython.get_ipython()
    shell.run_line_magic("load_ext", "durable_nb")
    yield shell
    for name in ("tickets", "prefix", "numbers", "server_url", "model"):
        shell.user_ns.pop(name, None)


def _journal(tmp_path: Path) -> DiskJournal:
    return DiskJournal(tmp_path / "journal")


def _usage_error(ip, line: str, cell: str = "item") -> str:
    with pytest.raises(UsageError) as info:
        ip.run_cell_magic("durable_agent", line, cell)
    return str(info.value)


TICKETS = [{"id": f"T-{i}", "text": f"ticket number {i}"} for i in range(8)]


def test_each_item_is_a_run_and_the_cells_value_is_the_batch(ip, tmp_path: Path) -> None:
    ip.user_ns["tickets"] = TICKETS
    batch = ip.run_cell_magic("durable_agent", "triage --over tickets --key item['id']",
                              "ctx.run('upper', lambda: item['text'].upper())")
    assert isinstance(batch, dn.Batch) and batch.batch_id == "triage"
    assert [item.key for item in batch] == [t["id"] for t in TICKETS]
    assert batch.results() == [t["text"].upper() for t in TICKETS]
    journal = _journal(tmp_path)
    assert {r.run_id for r in journal.list_runs("triage/")} == {f"triage/T-{i}" for i in range(8)}


def test_items_in_flight_together_keep_their_own_variables(ip) -> None:
    # Every item assigns the same names and sleeps in between: with one shared namespace the
    # items would read each other's values. They also read a notebook variable.
    ip.user_ns["prefix"] = "seen"
    ip.user_ns["numbers"] = list(range(12))
    cell = ("import time\n"
            "mine = item * 100\n"
            "ctx.run('wait', time.sleep, 0.05)\n"
            "for step in range(3):\n"
            "    mine += 1\n"
            "    ctx.run(f'tick {step}', time.sleep, 0.01)\n"
            "(prefix, index, mine)")
    batch = ip.run_cell_magic("durable_agent", "own --over numbers --key index --concurrency 12",
                              cell)
    assert batch.results() == [("seen", i, i * 100 + 3) for i in range(12)]
    # What the body assigned stayed with the items: the notebook's namespace is unchanged.
    assert not {"mine", "item", "index", "step"} & set(ip.user_ns)


def test_keys_come_from_the_key_expression_the_index_or_the_items_content(ip) -> None:
    ip.user_ns["tickets"] = TICKETS[:3]
    by_expr = ip.run_cell_magic("durable_agent", 'k1 --over tickets --key f"{item[\'id\']}-{index}"',
                                "1")
    assert [i.key for i in by_expr] == ["T-0-0", "T-1-1", "T-2-2"]
    by_index = ip.run_cell_magic("durable_agent", "k2 --over tickets --key index", "1")
    assert [i.key for i in by_index] == ["0", "1", "2"]
    by_content = ip.run_cell_magic("durable_agent", "k3 --over tickets", "1")
    assert [i.key for i in by_content] == dn.item_keys(TICKETS[:3])
    quoted = ip.run_cell_magic("durable_agent", "k4 --over 'tickets[:2]' --key \"item['id']\"",
                               "1")
    assert [i.key for i in quoted] == ["T-0", "T-1"]


def test_expression_options_are_split_as_python_not_as_shell_words() -> None:
    assert split_options("b --over [t for t in xs if t['a'] > 1] --key item['id'] --title 'Q 3'") \
        == ["b", "--over", "[t for t in xs if t['a'] > 1]", "--key", "item['id']",
            "--title", "Q 3"]
    assert split_options("b --key=item['id'] --over=xs") == ["b", "--key=item['id']",
                                                             "--over=xs"]
    with pytest.raises(ValueError, match="unbalanced brackets"):
        split_options("b --over xs[1")


def test_a_rerun_answers_done_items_from_the_journal_and_runs_new_ones(ip) -> None:
    ran = []
    ip.user_ns["ran"] = ran
    ip.user_ns["tickets"] = TICKETS[:4]
    cell = "ctx.run('work', lambda: ran.append(item['id']) or item['id'])"
    ip.run_cell_magic("durable_agent", "again --over tickets --key item['id']", cell)
    ip.user_ns["tickets"] = TICKETS[:6]
    batch = ip.run_cell_magic("durable_agent", "again --over tickets --key item['id']", cell)
    assert [item.replayed for item in batch] == [True] * 4 + [False] * 2
    assert sorted(ran) == sorted(t["id"] for t in TICKETS[:6])  # nothing ran twice
    panel = active_batch("again").panel
    assert "4 items answered from the journal" in panel.summary()


def test_retry_failed_no_keeps_failed_items_and_yes_runs_them_again(ip) -> None:
    attempts = []
    ip.user_ns["attempts"] = attempts
    ip.user_ns["numbers"] = [1, 2]
    cell = ("attempts.append(item)\n"
            "if item == 2 and attempts.count(2) < 3:\n"
            "    raise ValueError(f'bad {item}')\n"
            "item")
    first = ip.run_cell_magic("durable_agent", "rf --over numbers --key index", cell)
    assert first[1].status is Status.FAILED and "ValueError: bad 2" in first[1].error
    kept = ip.run_cell_magic("durable_agent", "rf --over numbers --key index --retry-failed no",
                             cell)
    assert kept[1].status is Status.FAILED and attempts.count(2) == 1
    retried = ip.run_cell_magic("durable_agent", "rf --over numbers --key index", cell)
    assert retried[1].status is Status.FAILED and attempts.count(2) == 2  # tried again
    done = ip.run_cell_magic("durable_agent", "rf --over numbers --key index --retry-failed yes",
                             cell)
    assert done.results() == [1, 2]


def test_per_item_options_reach_each_items_run_and_the_title_names_the_batch(
        ip, tmp_path: Path) -> None:
    ip.user_ns["numbers"] = [1, 2]
    ip.run_cell_magic("durable_agent", "opts --over numbers --key index --title 'my batch' "
                      "--max-iterations 7 --max-tokens 900 --timeout 2h", "item")
    journal = _journal(tmp_path)
    assert journal.find_batch("opts").title == "my batch"
    for run_id in ("opts/0", "opts/1"):
        record = journal.get_run(run_id)
        assert (record.max_iterations, record.max_tokens) == (7, 900)
        assert record.deadline is not None and record.deadline - record.created_at == 7200


def test_a_batch_token_budget_stops_items_before_the_call_that_would_pass_it(ip) -> None:
    with LoopbackServer(["fine"]) as server:
        ip.user_ns.update(server_url=server.url, numbers=list(range(6)))
        cell = ("import openai\n"
                "client = openai.OpenAI(base_url=server_url, api_key='k', max_retries=0)\n"
                "r = ctx.chat(model='gpt-4o-mini', client=client, max_tokens=10,\n"
                "             messages=[{'role': 'user', 'content': f'item {item}'}])\n"
                "r.choices[0].message.content")
        batch = ip.run_cell_magic("durable_agent", "budget --over numbers --key index "
                                  "--concurrency 2 --max-total-tokens 60", cell)
        sent = server.count()
    done = [i for i in batch if i.status is Status.DONE]
    stopped = [i for i in batch if i.status is Status.FAILED]
    assert done and stopped and len(done) == sent
    assert all("batch's token budget" in i.error and "--max-total-tokens" in i.error
               for i in stopped)
    assert batch.tokens <= 60


def test_parked_items_are_resumed_by_the_watcher_when_decided_elsewhere(ip) -> None:
    ip.user_ns["numbers"] = [0, 1, 2, 3]
    cell = ("if item % 2:\n"
            "    d = ctx.approval('publish', {'n': item})\n"
            "    result = ('published' if d.approved else 'kept', d.by)\n"
            "else:\n"
            "    result = ('plain', None)\n"
            "result")
    parked = ip.run_cell_magic("durable_agent", "pub --over numbers --key index", cell)
    assert parked.counts == {"DONE": 2, "WAITING_APPROVAL": 2}
    summary = active_batch("pub").panel.summary()
    assert "waiting for approval" in summary and "pub/1: 'publish' {\"n\": 1}" in summary
    dn.approve("pub/1", by="ana")
    ip.run_line_magic("durable", "reject pub/3 not now")
    done = ip.run_line_magic("durable", "batch wait pub --timeout 30")
    assert done.results() == [("plain", None), ("published", "ana"), ("plain", None),
                              ("kept", done[3].result[1])]
    assert parked.counts == {"DONE": 4}  # the cell's Batch follows its items


def test_batch_wait_times_out_naming_the_items_that_wait(ip) -> None:
    ip.user_ns["numbers"] = [0]
    ip.run_cell_magic("durable_agent", "slow --over numbers --key index",
                      "ctx.approval('go').approved")
    with pytest.raises(dn.DurableError) as info:
        ip.run_line_magic("durable", "batch wait slow --timeout 0.5")
    message = str(info.value)
    assert "batch 'slow' is not finished after 0.5 s (1 WAITING_APPROVAL)" in message
    assert "`%durable approve slow/0`" in message
    active_batch("slow").stop()


def test_batch_options_without_over_are_refused(ip) -> None:
    message = _usage_error(ip, "r --concurrency 4")
    assert "--concurrency is an option of a batch: add --over ITEMS" in message
    assert "--retry-failed is an option of a batch" in _usage_error(ip, "r --retry-failed no")


@pytest.mark.parametrize("value, problem", [
    ("missing", "--over missing: NameError: name 'missing' is not defined"),
    ("str(123)", "--over str(123) is a string: give a list of items"),
    ("{'a': 1}", "is a dict: say what an item is"),
    ("3", "--over 3: a int is not a list of items"),
    ("1+", "--over 1+: not a Python expression (invalid syntax)"),
    ("[1,", "unbalanced brackets in the expression '[1,'"),
])
def test_bad_over_expressions_are_usage_errors(ip, value: str, problem: str) -> None:
    assert problem in _usage_error(ip, f"b --over {value}")


def test_a_key_that_fails_names_the_item(ip) -> None:
    ip.user_ns["tickets"] = [{"id": 1}, {"name": "x"}]
    message = _usage_error(ip, "b --over tickets --key item['id']")
    assert message == "--key item['id'] failed for item 1 ({'name': 'x'}): KeyError: 'id'"


def test_prints_go_to_the_cell_once_prefixed_with_the_items_key(ip, capsys) -> None:
    ip.user_ns["numbers"] = [7, 8]
    ip.run_cell_magic("durable_agent", "talk --over numbers --key item",
                      "print('working on', item)\nprint('half', end='')\nitem")
    out = capsys.readouterr().out
    assert out.count("[7] working on 7\n") == 1 and out.count("[8] half\n") == 1, out
    panel = active_batch("talk").panel
    assert panel.log.outputs == () and panel._log_kept == ""  # not a second time


def test_prints_of_items_resumed_in_the_background_go_to_the_panel_log(ip, tmp_path: Path,
                                                                       capsys) -> None:
    ip.user_ns["numbers"] = [1]
    ip.run_cell_magic("durable_agent", "later --over numbers --key item",
                      "ok = ctx.approval('go').approved\nprint('resumed', item)\nok")
    capsys.readouterr()
    dn.approve("later/1", journal=_journal(tmp_path))
    active_batch("later").wake()
    assert ip.run_line_magic("durable", "batch wait later --timeout 30").results() == [True]
    assert "resumed" not in capsys.readouterr().out  # the cell had ended
    assert "[1] resumed 1\n" in active_batch("later").panel._log_kept


def test_an_async_cell_body_runs_per_item(ip) -> None:
    ip.user_ns["numbers"] = [1, 2, 3]
    cell = ("import asyncio\n"
            "async def double(x):\n"
            "    await asyncio.sleep(0.01)\n"
            "    return 2 * x\n"
            "await ctx.run_async('double', double, item)")
    batch = ip.run_cell_magic("durable_agent", "async --over numbers --key index", cell)
    assert batch.results() == [2, 4, 6]


def test_durable_batches_show_and_export(ip, tmp_path: Path, capsys) -> None:
    ip.user_ns["numbers"] = [1, 2, 3]
    ip.run_cell_magic("durable_agent", "rep --over numbers --key index --title 'a report'",
                      "if item == 2:\n    raise RuntimeError('broken')\nitem * 10")
    capsys.readouterr()
    ip.run_line_magic("durable", "batches")
    listed = capsys.readouterr().out
    assert listed.splitlines()[1].split()[:7] == ["rep", "3", "2", "1", "0", "0", "0"]
    ip.run_line_magic("durable", "batch show rep --status failed")
    shown = capsys.readouterr().out
    assert "items      3: 2 DONE, 1 FAILED" in shown
    assert "rep" in shown and "RuntimeError: broken" in shown and "\n0 " not in shown
    ip.run_line_magic("durable", f"batch export rep {tmp_path / 'rep.ipynb'}")
    nb = nbformat.read(tmp_path / "rep.ipynb", as_version=4)
    nbformat.validate(nb)
    text = "\n".join(c.source for c in nb.cells)
    assert "# Batch a report" in text and "## Failures" in text and "RuntimeError: broken" in text
    ip.run_line_magic("durable", f"batch export rep {tmp_path / 'rep.jsonl'}")
    lines = (tmp_path / "rep.jsonl").read_text().splitlines()
    assert [line.count('"status": "DONE"') for line in lines] == [1, 0, 1]


def test_load_ext_tells_a_batch_left_behind_in_one_line(ip, tmp_path: Path, capsys) -> None:
    journal = _journal(tmp_path)
    dn.map(lambda ctx, x: ctx.approval("go").approved, [1, 2, 3], batch_id="left",
           key="index", journal=journal, wait=False)
    capsys.readouterr()
    ip.run_line_magic("reload_ext", "durable_nb")
    out = capsys.readouterr().out
    assert "left: batch with 3 waiting for approval; re-run its cell to finish it" in out
    assert "left/0" not in out


def test_after_the_stop_button_batch_wait_says_to_rerun_the_cell(ip, tmp_path: Path) -> None:
    # The first item presses the stop button (a KeyboardInterrupt in the main thread, where
    # the cell waits for its items) and goes on to its next step, where it stops.
    ip.user_ns["numbers"] = [0, 1, 2]
    ip.user_ns["stopped"] = []
    cell = ("import _thread, time\n"
            "if not stopped:\n"
            "    stopped.append(item)\n"
            "    _thread.interrupt_main()\n"
            "    time.sleep(0.5)\n"
            "ctx.run('work', lambda: item)")
    line = "halt --over numbers --key index --concurrency 1"
    with pytest.raises(KeyboardInterrupt) as info:
        ip.run_cell_magic("durable_agent", line, cell)
    assert " ".join(info.value._render_traceback_()[0].split()).endswith(
        "batch 'halt' stopped: 1 item in flight was interrupted and kept; re-run the cell to "
        "finish the batch (DONE items are answered from the journal, the others resume)")
    journal = _journal(tmp_path)
    assert journal.get_run("halt/0").error.startswith("interrupted at step")
    assert journal.find_run("halt/1") is None  # never started
    with pytest.raises(dn.DurableError) as waited:
        ip.run_line_magic("durable", "batch wait halt --timeout 30")
    assert "batch 'halt' will not finish by waiting: 2 of its items never ran or were " \
           "interrupted" in str(waited.value) and "Re-run the batch's cell" in str(waited.value)
    again = ip.run_cell_magic("durable_agent", line + " --retry-failed no", cell)
    assert again.results() == [0, 1, 2]  # the interrupted item resumed all the same


def test_the_wait_option_keeps_the_cell_until_decisions_come_from_elsewhere(
        ip, tmp_path: Path) -> None:
    journal = _journal(tmp_path)

    def approve_when_parked() -> None:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            record = journal.find_run("held/0")
            if record is not None and record.status is Status.WAITING_APPROVAL:
                dn.approve("held/0", by="ops", journal=journal)
                return
            time.sleep(0.02)

    ip.user_ns["numbers"] = [0]
    approver = threading.Thread(target=approve_when_parked)
    approver.start()
    batch = ip.run_cell_magic("durable_agent", "held --over numbers --key index --wait",
                              "ctx.approval('go').by")
    approver.join()
    assert batch.results() == ["ops"]  # the cell itself waited and resumed the item


class _Frame:
    """What the batch cell uses of a pandas DataFrame (pandas is not a test dependency)."""

    columns = ["id", "text"]

    def __init__(self, rows):
        self.rows = rows

    def to_dict(self, orient):
        assert orient == "records"
        return [dict(row) for row in self.rows]

    def __iter__(self):  # iterating a DataFrame gives its column names, never the rows
        return iter(self.columns)


def test_a_dataframe_gives_one_item_per_row(ip) -> None:
    ip.user_ns["frame"] = _Frame([{"id": "a", "text": "x"}, {"id": "b", "text": "y"}])
    batch = ip.run_cell_magic("durable_agent", "rows --over frame --key item['id']",
                              "item['text'] * 2")
    assert batch.results() == ["xx", "yy"]
    ip.user_ns.pop("frame")
