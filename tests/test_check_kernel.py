"""``%durable check`` and ``%%durable_agent ... --check`` in a real IPython kernel (jupyter_client):
a cell's run and a batch cell's items, recorded with the real openai client over HTTP to the
loopback server, checked against the cell as saved in the notebook and against the cell as
written now; the server gets no request while they are checked."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from durable_nb import DiskJournal, Status
from durable_nb.testing import Echo, LoopbackServer
from tests.harness import KernelSession, start_kernel

pytestmark = pytest.mark.kernel

REPO = Path(__file__).resolve().parents[1]

SETUP = """\
%load_ext durable_nb
import os, openai
client = openai.OpenAI(base_url=os.environ['OPENAI_BASE_URL'], api_key='loopback',
                       max_retries=0)
PROMPT = 'Summarise the sales'
quarters = ['q1', 'q2', 'q3']
"""

REPORT = """\
%%durable_agent report-1
messages = [{'role': 'user', 'content': PROMPT + ' in one line'}]
ctx.chat(model='loopback-1', client=client, messages=messages).choices[0].message.content
"""

BATCH = """\
%%durable_agent qs --over quarters
messages = [{'role': 'user', 'content': PROMPT + ' of ' + item}]
ctx.chat(model='loopback-1', client=client, messages=messages).choices[0].message.content
"""


def run_cell(k: KernelSession, code: str, cell_id: str | None = None):
    """Execute ``code`` as the notebook cell ``cell_id`` (the id JupyterLab sends)."""
    msg = k.kc.session.msg("execute_request", {
        "code": code, "silent": False, "store_history": True, "user_expressions": {},
        "allow_stdin": False, "stop_on_error": True}, metadata={"cellId": cell_id} if cell_id else {})
    k.kc.shell_channel.send(msg)
    return k.wait_for(msg["header"]["msg_id"], 60).raise_for_error()


def save_notebook(path: Path, cells: dict[str, str]) -> None:
    path.write_text(json.dumps({
        "nbformat": 4, "nbformat_minor": 5, "metadata": {},
        "cells": [{"id": cell_id, "cell_type": "code", "metadata": {}, "outputs": [],
                   "execution_count": None, "source": source.splitlines(True)}
                  for cell_id, source in cells.items()]}))


def test_runs_are_checked_against_the_saved_cell_and_the_cell_as_written_now(tmp_path):
    notebook = tmp_path / "sales.ipynb"
    with LoopbackServer(Echo()) as server, start_kernel(tmp_path, {
            "OPENAI_BASE_URL": server.url, "JPY_SESSION_NAME": str(notebook),
            "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))
    }) as k:
        run_cell(k, SETUP)
        run_cell(k, REPORT, "cell-report")
        run_cell(k, BATCH, "cell-batch")
        run_cell(k, "%durable batch wait qs --timeout 60")
        journal = DiskJournal(tmp_path / ".durable_nb")
        assert [r.status for r in journal.list_runs()] == [Status.DONE] * 4
        save_notebook(notebook, {"cell-setup": SETUP, "cell-report": REPORT, "cell-batch": BATCH})
        requests = server.stats()["total"]

        fits = run_cell(k, "%durable check").stdout.splitlines()
        assert fits[0] == f"report-1: checked against the cell as saved in {notebook}"
        assert fits[1].startswith("qs/") and fits[1].endswith(f"the cell as saved in {notebook}")
        assert fits[-1] == "4 runs checked: 4 replays, 0 would execute, 0 diverges"

        # The report cell edited and saved: its run diverges at its model call.
        save_notebook(notebook, {"cell-report": REPORT.replace("in one line", "in two lines"),
                                 "cell-batch": BATCH})
        edited = run_cell(k, "%durable check report-1").stdout.splitlines()
        assert edited[1] == ("report-1  diverges  step 0 (chat 'loopback-1'): messages[0].content "
                             "changed from ...'marise the sales in one line' to ...'marise the "
                             "sales in two lines'")
        assert edited[-1] == "1 run checked: 0 replays, 0 would execute, 1 diverges"

        # The prompt edited in another cell; the batch cell checked as written, not run.
        run_cell(k, "PROMPT = 'Summarise the revenue'")
        checked = run_cell(k, BATCH.replace("--over quarters", "--over quarters --check"),
                           "cell-batch").stdout
        assert checked.count("  diverges  step 0 (chat 'loopback-1'): messages[0].content "
                             "changed from 'Summarise the sales of q") == 3
        assert "+      \"content\": \"Summarise the revenue of q1\"," in checked
        assert server.stats()["total"] == requests
        assert run_cell(k, "PROMPT").text == "'Summarise the revenue'"
    assert [r.status for r in journal.list_runs()] == [Status.DONE] * 4
