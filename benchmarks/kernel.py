"""The notebook workloads: a real IPython kernel driven by jupyter_client.

- :func:`widget`: the same N-step loop, alternating with the ``%%durable_agent`` panel
  displayed and as a plain ``durable_nb.execute`` without any panel; the loop is timed inside
  the kernel. No frontend is attached, so this counts the kernel's side of the panel (observer
  calls, redraws, comm messages), which is what slows the loop.
- :func:`restart`: a ``%%durable_agent`` cell dies (``os._exit``) after N journaled steps; the
  kernel is restarted, the setup cell and then the agent cell re-run, and the time from sending
  the agent cell to the start of its first new step is taken.
- :func:`browser`: the same ``%%durable_agent`` cell, alternating between a kernel whose panel a
  real JupyterLab shows in headless Chromium (the cell run with Shift+Enter) and a kernel with
  no frontend; the loop is timed inside the kernel, and the browser must end up showing the
  run's exact final counts.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent

_SETUP = """\
import os, time, durable_nb
%load_ext durable_nb
TIMES = []
def noop(i):
    return {"step": i, "tool": "lookup", "status": "ok", "score": 0.5, "tags": ["a", "b", "c"],
            "text": "lorem ipsum dolor sit amet, " * 5}
"""

_LOOP = """\
t0 = time.perf_counter()
for i in range({n}):
    ctx.run("noop", noop, i)
TIMES.append(time.perf_counter() - t0)
"""

_PLAIN = """\
def _bench_handler(ctx):
{body}
durable_nb.execute({run_id!r}, _bench_handler, journal={journal!r})
"""

_RESTART_STEP = """\
def step(i):
    if i == {n}:
        if os.path.exists({flag!r}):
            os.remove({flag!r})
            os._exit(1)
        with open({mark!r}, "w") as f:
            f.write(repr(time.time()))
    return noop(i)
"""

_RESTART_CELL = """\
%%durable_agent restart-bench --journal {journal}
for i in range({total}):
    ctx.run("step", step, i)
"""


def _start(cwd: str) -> tuple[Any, Any]:
    from jupyter_client.manager import KernelManager

    manager = KernelManager(kernel_name="python3")
    env = dict(os.environ)
    env["PYTHONPATH"] = str(ROOT) + os.pathsep + env.get("PYTHONPATH", "")
    manager.start_kernel(cwd=cwd, env=env)
    client = manager.client()
    client.start_channels()
    client.wait_for_ready(timeout=60)
    return manager, client


def _run(client: Any, code: str, timeout: float = 600) -> None:
    errors: list[str] = []

    def hook(msg: dict) -> None:
        if msg["msg_type"] == "error":
            errors.append("\n".join(msg["content"]["traceback"]))

    reply = client.execute_interactive(code, timeout=timeout, output_hook=hook)
    if reply["content"]["status"] != "ok" or errors:
        raise RuntimeError(f"cell failed in the kernel:\n{code}\n" + "\n".join(errors))


def _value(client: Any, expression: str) -> Any:
    found: list[str] = []

    def hook(msg: dict) -> None:
        if msg["msg_type"] == "execute_result":
            found.append(msg["content"]["data"]["text/plain"])

    client.execute_interactive(expression, timeout=60, output_hook=hook)
    return eval(found[-1])  # a repr of floats from our own kernel


def widget(spec: dict) -> dict:
    """Loop seconds per variant, alternating variants run by run."""
    n, repeats = spec["n"], spec["repeats"]
    work = tempfile.mkdtemp(prefix="bench-kernel-")
    manager, client = _start(work)
    try:
        _run(client, _SETUP)
        variants = {"panel": [], "no_panel": []}
        for r in range(repeats):
            order = ["panel", "no_panel"] if r % 2 == 0 else ["no_panel", "panel"]
            for variant in order:
                journal = tempfile.mkdtemp(dir=work)
                loop = _LOOP.format(n=n)
                if variant == "panel":
                    code = f"%%durable_agent w{r} --journal {journal}\n{loop}"
                else:
                    body = "".join(f"    {line}\n" for line in loop.splitlines())
                    code = _PLAIN.format(body=body, run_id=f"w{r}", journal=journal)
                _run(client, code)
                variants[variant].append(_value(client, "TIMES[-1]"))
    finally:
        client.stop_channels()
        manager.shutdown_kernel(now=True)
        shutil.rmtree(work, ignore_errors=True)
    return {"n": n, "seconds": variants,
            "overhead": statistics.median(variants["panel"])
            / statistics.median(variants["no_panel"]) - 1}


def restart(spec: dict) -> dict:
    """Seconds for: the kernel restart, the setup cell, the agent cell to its first new step."""
    n = spec["n"]
    work = tempfile.mkdtemp(prefix="bench-restart-")
    journal, flag, mark = (os.path.join(work, name) for name in ("journal", "crash", "mark"))
    Path(flag).touch()
    setup = _SETUP + _RESTART_STEP.format(n=n, flag=flag, mark=mark)
    cell = _RESTART_CELL.format(journal=journal, total=n + 5)
    manager, client = _start(work)
    try:
        _run(client, setup)
        client.execute(cell)
        deadline = time.time() + 600
        while manager.is_alive():
            if time.time() > deadline:
                raise RuntimeError("the kernel did not die at the crash step")
            time.sleep(0.02)
        client.stop_channels()
        t0 = time.time()
        manager.restart_kernel(now=True)
        client = manager.client()
        client.start_channels()
        client.wait_for_ready(timeout=60)
        t1 = time.time()
        _run(client, setup)
        t2 = time.time()
        _run(client, cell)
        first_new = float(Path(mark).read_text())
    finally:
        client.stop_channels()
        manager.shutdown_kernel(now=True)
        shutil.rmtree(work, ignore_errors=True)
    return {"n": n, "kernel_restart": t1 - t0, "setup_cell": t2 - t1,
            "to_first_new_step": first_new - t2}


# The browser workload's cells. NEXT names the next run (a fresh run id and journal, so each
# run executes all its steps); the agent cell takes them through IPython's {} expansion of a
# magic's line, so one cell is run again and the page shows one panel, as a person's would.
_BROWSER_SETUP = """\
import json
RUNS = iter({runs!r})
print("setup ok")
"""
_BROWSER_NEXT = "RUN_ID, JOURNAL = next(RUNS); print('next', RUN_ID)"
_BROWSER_CELL = """\
%%durable_agent {{RUN_ID}} --journal {{JOURNAL}}
t0, c0 = time.perf_counter(), time.process_time()
for i in range({n}):
    ctx.run("noop", noop, i)
with open({out!r}, "a") as f:
    f.write(json.dumps({{"run": RUN_ID, "seconds": time.perf_counter() - t0,
                        "kernel_cpu": time.process_time() - c0, "ended_at": time.time()}}) + "\\n")
"""


def browser(spec: dict) -> dict:
    """Loop seconds of an N-step ``%%durable_agent`` cell with its panel shown in JupyterLab in
    headless Chromium, and of the same cell in a kernel with no frontend, alternating run by
    run (both kernels, the server and the browser stay up throughout, so the machine carries
    the same processes for both). For each browser run: how long after the loop ended the
    page showed DONE, and the step counts it showed (they must be the run's exact ones)."""
    sys.path.insert(0, str(ROOT))
    from tests.harness.lab import JupyterLab, LabPage, write_notebook

    n, repeats = spec["n"], spec["repeats"]
    work = Path(tempfile.mkdtemp(prefix="bench-browser-"))
    runs = {v: [f"{v}-{r:02d}" for r in range(repeats)] for v in ("browser", "no-browser")}
    out = {v: str(work / f"{v}.jsonl") for v in runs}
    journals = {v: [(run, str(work / run)) for run in runs[v]] for v in runs}
    seen: list[dict] = []
    loads: list[float] = []
    cpu: dict[str, list[dict]] = {v: [] for v in runs}
    (work / "lab").mkdir()
    manager, client = _start(str(work))
    try:
        with JupyterLab(work / "lab", timeout=120) as lab, LabPage(lab, timeout=600) as page:
            page.page.set_viewport_size({"width": 1400, "height": 1600})  # the whole panel
            write_notebook(lab.root_dir / "panel.ipynb", [
                _SETUP + _BROWSER_SETUP.format(runs=journals["browser"]), _BROWSER_NEXT,
                _BROWSER_CELL.format(n=n, out=out["browser"])])
            page.open_notebook("panel.ipynb")
            page.wait_kernel_idle()
            page.run_cell(0)
            page.wait_for_text("setup ok", cell_index=0)
            _run(client, _SETUP + _BROWSER_SETUP.format(runs=journals["no-browser"]))
            for r in range(repeats):
                order = ["browser", "no-browser"] if r % 2 == 0 else ["no-browser", "browser"]
                for variant in order:
                    loads.append(os.getloadavg()[0])
                    before = _cpu_seconds()
                    if variant == "browser":
                        seen.append(_browser_run(page, runs["browser"][r],
                                                 Path(out["browser"])))
                    else:
                        _run(client, _BROWSER_NEXT)
                        _run(client, _BROWSER_CELL.format(n=n, out=out["no-browser"]))
                    after = _cpu_seconds()
                    cpu[variant].append({k: after[k] - before.get(k, 0.0) for k in after})
    finally:
        client.stop_channels()
        manager.shutdown_kernel(now=True)
    try:
        timed = {v: {json.loads(line)["run"]: json.loads(line)
                     for line in Path(out[v]).read_text().splitlines()} for v in runs}
    finally:
        shutil.rmtree(work, ignore_errors=True)
    wrong = [s for s in seen if s["counts"] != f"0 replayed, {n:,} executed"]
    if wrong or len(seen) != repeats:
        raise RuntimeError(f"the browser did not show the final counts of {n:,} steps: {wrong}")
    seconds = {v: [timed[v][run]["seconds"] for run in runs[v]] for v in runs}
    kernel_cpu = {v: [timed[v][run]["kernel_cpu"] for run in runs[v]] for v in runs}
    lag = [s["done_seen_at"] - timed["browser"][s["run"]]["ended_at"] for s in seen]
    return {"n": n, "seconds": seconds, "done_shown_after": lag, "loadavg_1min": loads,
            "kernel_cpu": kernel_cpu, "cpu_seconds": cpu,
            "overhead": statistics.median(seconds["browser"])
            / statistics.median(seconds["no-browser"]) - 1}


def _cpu_seconds() -> dict[str, float]:
    """CPU seconds used so far by the processes this one started: the kernels, and the rest
    (the JupyterLab server, Chromium, playwright's driver): what the browser costs the machine.
    A process that ended is no longer counted (Chromium's renderers live as long as the page)."""
    import psutil  # a dependency of ipykernel

    used = {"kernels": 0.0, "server and browser": 0.0}
    for process in psutil.Process().children(recursive=True):
        try:
            times = process.cpu_times()
            kernel = "ipykernel_launcher" in " ".join(process.cmdline())
        except psutil.Error:
            continue
        used["kernels" if kernel else "server and browser"] += times.user + times.system
    return used


def _browser_run(page: Any, run_id: str, out: Path) -> dict:
    """Run the agent cell in the page (after naming the next run); once the loop wrote its time
    to ``out``, wait until the panel shows the run DONE; return when it did and the step counts
    it shows. Not waiting in the page during the loop: playwright polls a page at every
    animation frame, which cost Chromium about 1 CPU s a run, more than the panel's updates."""
    page.run_cell(1)
    page.wait_for_text(f"next {run_id}", cell_index=1)
    page.run_cell(2)
    deadline = time.monotonic() + 600
    while not out.exists() or f'"run": "{run_id}"' not in out.read_text():
        if time.monotonic() > deadline:
            raise RuntimeError(f"run {run_id} did not end its loop; the cell shows: "
                               f"{page.cell_output_text(2)[-2000:]}")
        time.sleep(0.05)
    live = page.cell(2).locator(".dnb-live").filter(has_text=run_id)
    live.get_by_text("DONE", exact=True).first.wait_for(state="visible")
    done_seen_at = time.time()
    shown = re.search(r"steps ([\d,]+) replayed, ([\d,]+) executed", live.first.inner_text())
    return {"run": run_id, "done_seen_at": done_seen_at,
            "counts": shown.group(0)[len("steps "):] if shown else None}
