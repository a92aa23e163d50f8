"""In a real kernel, each run's ``ctx`` is its own: a cell resumed in the background and a
cell running in the foreground never mix steps, and ``ctx`` outside a running cell refuses."""

from __future__ import annotations

import ast
import os
import subprocess
import sys
from pathlib import Path

import pytest

from durable_nb import Status, get_run, open_journal
from tests.harness import start_kernel, wait_until

pytestmark = pytest.mark.kernel
REPO = Path(__file__).resolve().parents[1]

# The two cells wait for each other halfway (files as signals), so their steps interleave
# for sure, whatever the machine's speed.
_SIGNALS = """
import os, time
def wait_for(name):
    deadline = time.monotonic() + 60
    while not os.path.exists(name):
        assert time.monotonic() < deadline, f'no {name}'
        time.sleep(0.01)
def step(tag, i, signal=None, wait=None):
    if wait:
        wait_for(wait)
    if signal:
        open(signal, 'w').close()
    return f'{tag} {i}'
"""

_BACKGROUND = """%%durable_agent A
decision = ctx.approval('go', {'why': 'test'})
[ctx.run(f'a-{i}', step, 'A', i, wait='b-started' if i == 10 else None,
         signal='a-halfway' if i == 11 else None) for i in range(40)]
"""

_FOREGROUND = """%%durable_agent B
[ctx.run(f'b-{i}', step, 'B', i, signal='b-started' if i == 0 else None,
         wait='a-halfway' if i == 10 else None) for i in range(40)]
"""


def _env() -> dict[str, str]:
    return {"PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))}


def _status(tmp_path: Path, run_id: str) -> Status | None:
    record = open_journal(tmp_path / ".durable_nb").find_run(run_id)
    return None if record is None else record.status


def test_a_run_resumed_in_the_background_and_a_foreground_cell_keep_their_own_steps(
        tmp_path: Path) -> None:
    with start_kernel(tmp_path, env=_env()) as k:
        k.execute("%load_ext durable_nb").raise_for_error()
        k.execute(_SIGNALS).raise_for_error()
        k.execute(_BACKGROUND).raise_for_error()  # parks at the approval; the cell ends
        assert _status(tmp_path, "A") is Status.WAITING_APPROVAL
        subprocess.run([sys.executable, "-m", "durable_nb.cli", "--journal",
                        str(tmp_path / ".durable_nb"), "approve", "A"], check=True,
                       capture_output=True, timeout=60, env={**os.environ, **_env()})
        # A goes on in the watcher thread while B runs in the foreground, both using `ctx`.
        foreground = k.execute(_FOREGROUND, timeout=120).raise_for_error()
        assert ast.literal_eval(foreground.text) == [f"B {i}" for i in range(40)]
        wait_until(lambda: _status(tmp_path, "A") is Status.DONE, 60, "A done")
    journal = open_journal(tmp_path / ".durable_nb")
    a_steps = get_run("A", journal=journal).steps
    b_steps = get_run("B", journal=journal).steps
    assert [s.name for s in a_steps] == ["go"] + [f"a-{i}" for i in range(40)]
    assert [s.name for s in b_steps] == [f"b-{i}" for i in range(40)]
    assert get_run("A", journal=journal).result == [f"A {i}" for i in range(40)]


def test_ctx_in_a_later_cell_refuses_instead_of_writing_into_a_finished_run(tmp_path: Path):
    with start_kernel(tmp_path, env=_env()) as k:
        k.execute("%load_ext durable_nb").raise_for_error()
        k.execute("%%durable_agent parked\nctx.approval('go', None)").raise_for_error()
        late = k.execute("ctx.run('late', lambda: 1)")
        assert late.status == "error" and late.error["ename"] == "ContextNotActive"
        assert "only available inside a %%durable_agent cell" in late.traceback
    steps = get_run("parked", journal=open_journal(tmp_path / ".durable_nb")).steps
    assert steps == []  # the parked run got no step from the later cell
