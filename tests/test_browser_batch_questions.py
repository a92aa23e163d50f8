"""A batch item that asks an MCP server's question, in the notebook's batch panel in
JupyterLab and headless Chromium: its row offers Answer (its form), never a plain Approve
that would cancel it, and the form answers it."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from durable_nb.journal import DiskJournal, Status
from tests.harness import wait_until
from tests.harness.lab import (JupyterLab, LabPage, element_shot, require_chromium,
                               write_notebook)

pytestmark = pytest.mark.browser

_SETUP = """\
import os
os.environ.pop("DURABLE_NB_DIR", None)  # the journal goes to ./.durable_nb next to this notebook
%load_ext durable_nb
print("setup ok")"""

# Item "ask" is asked a question the way durable_nb.mcp asks one (details of kind
# "elicitation"), the others a plain approval.
_BATCH = """\
%%durable_agent trip --over ['plain', 'ask'] --key item
if item == 'ask':
    decision = ctx.approval('book asks', {
        'kind': 'elicitation', 'server': 'hotels', 'tool': 'book', 'message': 'Nights?',
        'schema': {'type': 'object', 'properties': {'nights': {'type': 'integer'}},
                   'required': ['nights']}})
    outcome = decision.answer
else:
    outcome = ctx.approval('publish', {'n': 1}).approved
outcome"""


@pytest.fixture(scope="module")
def lab(tmp_path_factory: pytest.TempPathFactory) -> Iterator[JupyterLab]:
    require_chromium()
    with JupyterLab(tmp_path_factory.mktemp("lab")) as server:
        yield server


def _item(folder: Path, key: str) -> tuple[Status | None, object]:
    journal = DiskJournal(folder / ".durable_nb")
    try:
        record = journal.find_run(f"trip/{key}")
        return (record.status, record.result) if record else (None, None)
    finally:
        journal.close()


def test_a_question_in_a_batch_is_answered_in_its_form_not_approved(
        lab: JupyterLab, tmp_path: Path) -> None:
    shots = Path(os.environ.get("DURABLE_NB_SHOTS") or tmp_path)
    shots.mkdir(parents=True, exist_ok=True)
    folder = lab.root_dir / "questions"
    folder.mkdir()
    write_notebook(folder / "trip.ipynb", [_SETUP, _BATCH])
    with LabPage(lab, timeout=60) as page:
        page.page.set_viewport_size({"width": 1400, "height": 1600})
        page.open_notebook("questions/trip.ipynb")
        page.wait_kernel_idle()
        page.run_cell(0)
        page.wait_for_text("setup ok", cell_index=0)
        page.run_cell(1)
        output = page.cell(1).locator(".jp-Cell-outputArea")
        output.locator(".dnb-live").first.get_by_text("WAITING_APPROVAL", exact=True) \
            .first.wait_for(state="visible", timeout=120_000)
        rows = output.locator(".dnb-approval-row")
        rows.nth(1).wait_for(state="visible")
        head = output.locator(".dnb-live").first.inner_text()
        assert "1 item waiting for approval and 1 question waiting for its answer" in head
        assert "Approve all 1 shown" in head
        asked = rows.filter(has_text="book asks")
        assert asked.locator("button").all_inner_texts() == ["Answer", "Decline"]
        assert "durable-nb answer trip/ask" in asked.inner_text()
        element_shot(output, shots / "batch-question-row.png")

        asked.locator("button", has_text="Answer").click()
        field = output.locator(".dnb-question-field input")
        field.wait_for(state="visible")
        assert "Nights?" in output.inner_text()
        element_shot(output, shots / "batch-question-form.png")
        field.fill("3")
        output.locator("button", has_text="Accept").click()
        wait_until(lambda: _item(folder, "ask")[0] is Status.DONE, 60, "trip/ask DONE")
        assert _item(folder, "ask")[1] == {"action": "accept", "content": {"nights": 3}}
        assert _item(folder, "plain")[0] is Status.WAITING_APPROVAL
        element_shot(output, shots / "batch-question-answered.png")
