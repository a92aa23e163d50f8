"""The test harnesses work against real parts: a real kernel, real JupyterLab, real Chromium.

The browser tests also pin down two facts the approval design relies on: a worker thread started
by a click callback (after the cell returned) updates an Output widget live in the page, and a
click on another button reaches the kernel while that worker runs.
"""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

from tests.harness import HarnessError, start_kernel, wait_until
from tests.harness.lab import JupyterLab, LabPage, require_chromium, write_notebook


def _lines(path: Path) -> list[str]:
    return path.read_text().splitlines() if path.exists() else []


@pytest.mark.kernel
def test_kernel_survives_sigkill_mid_cell_and_restarts_without_state(tmp_path: Path) -> None:
    with start_kernel(tmp_path, env={"DURABLE_NB_DIR": str(tmp_path / "journal")}) as k:
        first = k.execute("import os; x = 41; print(os.getcwd(), os.environ['DURABLE_NB_DIR']); x + 1")
        assert first.raise_for_error().text == "42"
        assert first.stdout.split() == [str(tmp_path), str(tmp_path / "journal")]

        started = tmp_path / "started"
        killed_cell = k.execute_async(
            f"import time; open({str(started)!r}, 'w').close(); time.sleep(30)"
        )
        wait_until(started.exists, what="the sleeping cell to start")
        old_pid = k.pid
        k.kill()
        assert not k.is_alive
        with pytest.raises(HarnessError, match="died"):
            k.wait_for(killed_cell, timeout=10)

        k.restart()
        assert k.pid != old_pid
        assert k.execute("'x' in globals()").raise_for_error().text == "False"


@pytest.mark.kernel
def test_headless_click_runs_button_callback_after_cell_returned(tmp_path: Path) -> None:
    clicks = tmp_path / "clicks.txt"
    code = textwrap.dedent(
        f"""
        import ipywidgets as w
        from IPython.display import display
        button = w.Button(description="Approve")
        def on_click(_):
            with open({str(clicks)!r}, "a") as f:
                f.write("approved\\n")
        button.on_click(on_click)
        display(button)
        """
    )
    with start_kernel(tmp_path) as k:
        result = k.execute(code).raise_for_error()
        assert any("application/vnd.jupyter.widget-view+json" in d for d in result.displays)

        k.click_widget_button(k.find_button("Approve"))
        wait_until(lambda: _lines(clicks) == ["approved"], what="the click callback's file line")


_CLICK_CELL = """\
import ipywidgets as w
button = w.Button(description="Press me")
def on_click(_):
    with open("clicks.txt", "a") as f:
        f.write("pressed\\n")
    button.description = "clicked"
button.on_click(on_click)
button"""

# The worker ticks every 0.2 s for at least 2 s, and keeps ticking until the Second click was
# handled (cap 30 s), so "the click arrived while the worker ran" does not depend on CI speed.
_WORKER_CELL = """\
import ipywidgets as w, threading, time
out = w.Output()
second_seen = threading.Event()
worker = None
def work():
    for i in range(150):
        out.append_stdout(f"tick {i}\\n")
        if i >= 10 and second_seen.is_set():
            break
        time.sleep(0.2)
    out.append_stdout("worker done\\n")
def on_start(_):
    global worker
    worker = threading.Thread(target=work, name="worker")
    worker.start()
def on_second(_):
    alive = worker is not None and worker.is_alive()
    with open("events.txt", "a") as f:
        f.write(f"second worker_alive={alive} thread={threading.current_thread().name}\\n")
    second_seen.set()
start = w.Button(description="Start"); start.on_click(on_start)
second = w.Button(description="Second"); second.on_click(on_second)
w.VBox([start, second, out])"""


@pytest.mark.browser
def test_browser_click_runs_callback_and_page_shows_new_description(tmp_path: Path) -> None:
    require_chromium()
    write_notebook(tmp_path / "click.ipynb", [_CLICK_CELL])
    with JupyterLab(tmp_path) as lab, LabPage(lab) as page:
        page.open_notebook("click.ipynb")
        page.wait_kernel_idle()
        page.run_cell(0)
        page.click_button("Press me", cell_index=0)

        page.wait_for_text("clicked", cell_index=0)
        wait_until(lambda: _lines(tmp_path / "clicks.txt") == ["pressed"], what="callback file")


@pytest.mark.browser
def test_browser_worker_thread_updates_page_live_and_clicks_reach_kernel_meanwhile(
    tmp_path: Path,
) -> None:
    require_chromium()
    write_notebook(tmp_path / "worker.ipynb", [_WORKER_CELL])
    with JupyterLab(tmp_path) as lab, LabPage(lab) as page:
        page.open_notebook("worker.ipynb")
        page.wait_kernel_idle()
        page.run_cell(0)
        page.click_button("Start", cell_index=0)

        # Live: the page shows an early tick while the worker is still far from done.
        page.wait_for_text("tick 1", cell_index=0)
        assert "worker done" not in page.cell_output_text(0)

        page.click_button("Second", cell_index=0)
        wait_until(lambda: bool(_lines(tmp_path / "events.txt")), what="the Second callback")
        assert _lines(tmp_path / "events.txt")[0].startswith("second worker_alive=True")

        page.wait_for_text("worker done", cell_index=0)
        assert "tick 9" in page.cell_output_text(0)
