"""Screenshots of the tutorial's main screens, taken in a real JupyterLab in headless Chromium.

    python docs/screenshots.py [--out docs/pages/images]

Runs the tutorial's own cells (docs/pages/tutorial.md) in JupyterLab (tests/harness/lab.py,
Debian's /usr/bin/chromium) and writes three PNGs: ``panel-running.png`` (the panel while the
run executes), ``panel-approval.png`` (the run parked at the email, with Approve and Reject) and
``sidebar-inbox.png`` (the Durable runs sidebar and its approvals inbox). Two changes to the
tutorial, both for the camera: the kernel is not killed (the crash leaves nothing to see), and
``read_notes`` takes four seconds, so that the panel is caught running.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from tests.harness.lab import JupyterLab, LabPage, require_chromium, write_notebook  # noqa: E402
from tests.test_docs import blocks  # noqa: E402

SIDEBAR_TAB = ".jp-SideBar .lm-TabBar-tab[data-id='durable-nb-sidebar']"


def tutorial_cells() -> list[str]:
    """The tutorial's notebook cells up to the agent cell, as the camera needs them."""
    cells = [b.code for b in blocks((REPO / "docs/pages/tutorial.md").read_text())
             if b.lang == "python"]
    agent = next(i for i, code in enumerate(cells) if code.startswith("%%durable_agent"))
    slow = '    log(f"read_notes {path}")'
    tools = cells[agent - 1]
    assert slow in tools, "the tutorial's read_notes changed: update docs/screenshots.py"
    cells[agent - 1] = tools.replace(slow, "    __import__('time').sleep(4)\n" + slow)
    return cells[: agent + 1]


def take(out: Path) -> None:
    """Run the cells in JupyterLab and write the three screenshots to ``out``."""
    require_chromium()
    out.mkdir(parents=True, exist_ok=True)
    root = Path(tempfile.mkdtemp(prefix="durable-nb-shots-"))
    folder = root / "tutorial"
    folder.mkdir()
    (folder / "crashed-once").touch()  # no crash on camera
    cells = tutorial_cells()
    write_notebook(folder / "tutorial.ipynb", cells)
    env = {"PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")])),
           "HOME": str(root), "DURABLE_NB_INDEX": str(root / "index")}
    for name in ("OPENAI_API_KEY", "OPENAI_BASE_URL", "DURABLE_NB_DIR", "DURABLE_NB_JOURNAL"):
        os.environ.pop(name, None)
    agent = len(cells) - 1
    with JupyterLab(root, env=env) as lab, LabPage(lab, timeout=90) as page:
        page.page.set_viewport_size({"width": 1280, "height": 1200})
        page.open_notebook("tutorial/tutorial.ipynb")
        page.wait_kernel_idle()
        for index in range(agent):
            page.run_cell(index)
        page.run_cell(agent)
        live = page.cell(agent).locator(".dnb-panel.dnb-live")
        # Running: the first LLM call journaled, read_notes (four seconds) in flight.
        live.filter(has_text="1 executed").wait_for(state="visible")
        live.screenshot(path=str(out / "panel-running.png"))
        # Parked: the live panel's own Approve button.
        live.locator("button", has_text="Approve").wait_for(state="visible", timeout=60_000)
        live.screenshot(path=str(out / "panel-approval.png"))
        page.page.locator(SIDEBAR_TAB).click()
        page.page.locator(".dnr-sidebar .dnr-run[data-run='weekly-report']").wait_for(
            state="visible")
        page.page.locator(".dnr-inbox-button").click()
        page.page.locator(".dnr-inbox .dnr-card[data-run='weekly-report']").wait_for(
            state="visible")
        page.page.screenshot(path=str(out / "sidebar-inbox.png"))
    print(f"wrote {', '.join(sorted(p.name for p in out.glob('*.png')))} to {out}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=REPO / "docs/pages/images")
    take(parser.parse_args().out)


if __name__ == "__main__":
    main()
