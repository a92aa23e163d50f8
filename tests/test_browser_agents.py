"""An OpenAI Agents SDK approval decided by a click, as a user sees it: JupyterLab in headless
Chromium.

A notebook starts the loopback model server in its kernel and runs an Agents SDK agent whose
``charge_card`` tool has ``needs_approval=True`` in a ``%%durable_agent`` cell (through
:func:`durable_nb.integrations.openai_agents.run`). The SDK's interruption parks the run at
the approval; the test clicks the panel's Approve, and the SDK gets it as its own
``state.approve``: the tool runs once and the agent finishes. Screenshots of the panel are
saved in the test's tmp dir (or in $DURABLE_NB_SHOTS).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Iterator

import pytest

from durable_nb import serde
from durable_nb.journal import DiskJournal, Status
from durable_nb.registry import get_run
from tests.harness.lab import JupyterLab, LabPage, require_chromium, write_notebook

pytestmark = pytest.mark.browser

RUN_ID = "charge"
FINAL = "Charged your card 5."

_SETUP_CELL = f"""\
import os
from agents import Agent, function_tool
from durable_nb.testing import LoopbackServer, Reply, ToolCall
from durable_nb.integrations.openai_agents import run
server = LoopbackServer([Reply(tool_calls=[ToolCall("charge_card", {{"amount": 5}})]),
                         {FINAL!r}]).start()
os.environ["OPENAI_BASE_URL"] = server.url
os.environ["OPENAI_API_KEY"] = "offline-test"
os.environ.pop("DURABLE_NB_DIR", None)  # the journal goes to ./.durable_nb next to this notebook
%load_ext durable_nb

@function_tool(needs_approval=True)
async def charge_card(amount: int) -> str:
    \"\"\"Charge the card.\"\"\"
    with open("effects.log", "a") as f:
        f.write(f"charge {{amount}}\\n")
    return f"charged {{amount}}"

agent = Agent(name="shop", instructions="Charge the card when asked.", model="loopback-1",
              tools=[charge_card])
print("setup ok")"""

_AGENT_CELL = f"""\
%%durable_agent {RUN_ID} --title "charge the card"
result = await run(ctx, agent, "Charge my card 5.")
print("final:", result.final_output)"""

_SERVER_CELL = """print("model calls:", server.stats()["chat"])"""

SETUP, AGENT, SERVER = 0, 1, 2


@pytest.fixture(scope="module")
def lab(tmp_path_factory: pytest.TempPathFactory) -> Iterator[JupyterLab]:
    require_chromium()
    with JupyterLab(tmp_path_factory.mktemp("lab")) as server:
        yield server


def _badge(page: LabPage, status: Status) -> Any:
    return page.cell(AGENT).locator(".dnb-live").get_by_text(str(status), exact=True)


def _effects(folder: Path) -> list[str]:
    log = folder / "effects.log"
    return log.read_text().splitlines() if log.exists() else []


def test_approve_click_lets_the_sdk_run_the_tool_once_and_finish(lab: JupyterLab,
                                                                   tmp_path: Path) -> None:
    shots = Path(os.environ.get("DURABLE_NB_SHOTS") or tmp_path)
    shots.mkdir(parents=True, exist_ok=True)
    folder = lab.root_dir / "agents"
    folder.mkdir()
    write_notebook(folder / "agents.ipynb", [_SETUP_CELL, _AGENT_CELL, _SERVER_CELL])
    with LabPage(lab, timeout=60) as page:
        page.open_notebook("agents/agents.ipynb")
        page.wait_kernel_idle()
        page.run_cell(SETUP)
        page.wait_for_text("setup ok", cell_index=SETUP)
        page.run_cell(AGENT)
        try:
            _badge(page, Status.WAITING_APPROVAL).wait_for(state="visible")
        except Exception as exc:
            raise AssertionError(f"no pending approval in the panel; the agent cell shows: "
                                 f"{page.cell_output_text(AGENT)!r}") from exc
        approve = page.cell(AGENT).locator("button.jupyter-button", has_text="Approve").first
        approve.wait_for(state="visible")
        waiting = page.cell_output_text(AGENT)
        page.cell(AGENT).locator(".jp-Cell-outputArea").screenshot(
            path=str(shots / "agents-waiting-approval.png"))
        assert _effects(folder) == []  # parked before the tool ran

        approve.click()

        _badge(page, Status.DONE).wait_for(state="visible")
        page.wait_for_text(f"final: {FINAL}", cell_index=AGENT)
        page.cell(AGENT).locator(".jp-Cell-outputArea").screenshot(
            path=str(shots / "agents-done.png"))
        page.run_cell(SERVER)
        page.wait_for_text("model calls:", cell_index=SERVER)
        calls = page.cell_output_text(SERVER)

    assert "charge_card" in waiting
    assert _effects(folder) == ["charge 5"]
    assert "model calls: 2" in calls  # the tool round and the final answer, each once
    journal = DiskJournal(folder / ".durable_nb")
    try:
        info = get_run(RUN_ID, journal=journal)
    finally:
        journal.close()
    assert info.status is Status.DONE, f"journal says {info.status}: {info.error}"
    (approval,) = [e for e in info.steps if e.kind == "approval"]
    decision = serde.decode(approval.result)
    assert approval.name == "charge_card" and decision["approved"] is True
    assert decision["by"].endswith(" (notebook)")
    assert [e.name for e in info.steps if e.kind == "run"] == ["charge_card"]
