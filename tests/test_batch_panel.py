"""The batch panel and the hooks it hangs on, from real batches on a real journal (no kernel,
no browser): what the summary, the table, the filters and the approvals say and do, that
redraws are throttled, and the text summary."""

from __future__ import annotations

import html
import re
import threading
import time

import pytest

import durable_nb as dn
from durable_nb import Status
from durable_nb.batch import BatchObserver, prepare
from durable_nb.batch_panel import BatchPanel


def _text(fragment: str) -> str:
    return html.unescape(re.sub(r"<[^>]+>", "", fragment))


class _Recorder(BatchObserver):
    def __init__(self):
        self.starts = []
        self.items = []

    def on_start(self, items, todo):
        self.starts.append(([(i.key, i.state, i.replayed) for i in items], list(todo)))

    def on_item(self, item):
        self.items.append((item.key, item.state))


# -- the hooks in durable_nb.batch -----------------------------------------------------------

def test_the_observer_is_told_the_plan_before_any_item_runs(journal) -> None:
    work = lambda ctx, x: ctx.run("double", lambda: x * 2)  # noqa: E731
    first = _Recorder()
    dn.map(work, [1, 2], batch_id="b", key="index", journal=journal, observer=first)
    assert first.starts == [([("0", "PENDING", False), ("1", "PENDING", False)], [0, 1])]
    again = _Recorder()
    dn.map(work, [1, 2, 3], batch_id="b", key="index", journal=journal, observer=again)
    assert again.starts == [([("0", "DONE", True), ("1", "DONE", True),
                              ("2", "PENDING", False)], [2])]
    assert again.items == [("2", "RUNNING"), ("2", "DONE")]


def test_an_interrupted_item_resumes_even_with_retry_failed_false(journal) -> None:
    ran = []

    def handler(ctx, x):
        ctx.run("first", lambda: ran.append((x, "first")))
        if x == 1 and not ran.count((1, "interrupt")):
            ran.append((1, "interrupt"))
            raise KeyboardInterrupt  # what the stop button raises in the item's flow
        return ctx.run("second", lambda: ran.append((x, "second")) or x)

    stopped = dn.map(handler, [0, 1], batch_id="b", key="index", journal=journal,
                     retry_failed=False)
    assert stopped[1].status is Status.FAILED and stopped[1].error.startswith("interrupted")
    again = dn.map(handler, [0, 1], batch_id="b", key="index", journal=journal,
                   retry_failed=False)
    assert again.results() == [0, 1]
    assert ran.count((1, "first")) == 1  # its journaled step was not run again


def test_prepare_plans_and_execute_runs_what_it_planned(journal) -> None:
    execution, todo = prepare(lambda ctx, x: ctx.approval("go").approved, ["a", "b"],
                              batch_id="b", key=lambda x: x, journal=journal)
    assert todo == [0, 1]
    execution.execute(todo)
    assert [r.status for r in execution.results] == [Status.WAITING_APPROVAL] * 2
    assert execution.decided() == []
    dn.approve("b/a", journal=journal)
    assert execution.decided() == [0]
    execution.execute(execution.decided())
    assert execution.batch().counts == {"DONE": 1, "WAITING_APPROVAL": 1}
