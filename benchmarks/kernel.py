"""The notebook workloads: a real IPython kernel driven by jupyter_client.

- :func:`widget`: the same N-step loop, alternating with the ``%%durable_agent`` panel
  displayed and as a plain ``durable_nb.execute`` without any panel; the loop is timed inside
  the kernel. No frontend is attached, so this counts the kernel's side of the panel (observer
  calls, redraws, comm messages), which is what slows the loop.
- :func:`restart`: a ``%%durable_agent`` cell dies (``os._exit``) after N journaled steps; the
  kernel is restarted, the setup cell and then the agent cell re-run, and the time from sending
  the agent cell to the start of its first new step is taken.
"""

from __future__ import annotations

import os
import shutil
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

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
    root = str(Path(__file__).resolve().parent.parent)
    env["PYTHONPATH"] = root + os.pathsep + env.get("PYTHONPATH", "")
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
