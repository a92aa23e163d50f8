"""The benchmark runner: ``python -m benchmarks [--quick] [--out DIR] [--no-peers]``.

Runs every workload of :mod:`benchmarks.workloads` in its own subprocess with a fresh temporary
directory, alternating systems run by run (the order rotates each repeat), and writes
``RESULTS.md``, ``results.json`` and ``cost_per_step.png`` into ``--out`` (default: this
directory). Peers that are not installed are skipped with a note.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from . import report

ROOT = Path(__file__).resolve().parent.parent
STEP_SYSTEMS = ("plain", "diskcache", "durable_nb", "dbos", "langgraph")
DURABLE = ("durable_nb", "dbos", "langgraph")
PEERS = {"dbos": "dbos", "langgraph": "langgraph.checkpoint.sqlite"}


@dataclass
class Plan:
    """What to measure, and how often."""

    ns: dict[str, tuple[int, ...]]
    repeats: dict[int, int]
    chat_calls: int
    chat_repeats: int
    transcript_rounds: int
    widget_steps: int
    widget_repeats: int
    restart_steps: int
    restart_repeats: int
    timeout: float

    @classmethod
    def full(cls) -> "Plan":
        ours = (1_000, 10_000, 100_000)
        peers = (1_000, 10_000)
        return cls(ns={"plain": ours, "diskcache": ours, "durable_nb": ours, "dbos": peers,
                       "langgraph": peers},
                   repeats={1_000: 5, 10_000: 3, 100_000: 3}, chat_calls=300, chat_repeats=5,
                   transcript_rounds=50, widget_steps=10_000, widget_repeats=7,
                   restart_steps=1_000, restart_repeats=3, timeout=600)

    @classmethod
    def quick(cls) -> "Plan":
        return cls(ns={s: (50,) for s in STEP_SYSTEMS}, repeats={50: 1}, chat_calls=5,
                   chat_repeats=1, transcript_rounds=4, widget_steps=50, widget_repeats=1,
                   restart_steps=20, restart_repeats=1, timeout=120)


@dataclass
class Results:
    """Raw results of every run, keyed ``section/system/n``; notes for skipped parts."""

    runs: dict[str, list[dict]] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)

    def add(self, section: str, system: str, n: int, result: dict) -> None:
        self.runs.setdefault(f"{section}/{system}/{n}", []).append(result)

    def get(self, section: str, system: str, n: int) -> list[dict]:
        return self.runs.get(f"{section}/{system}/{n}", [])


def workload(spec: dict, timeout: float) -> dict:
    """Run one workload in a fresh interpreter and return its result."""
    env = dict(os.environ, PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""),
               DBOS__CLOUD="false")
    proc = subprocess.run([sys.executable, "-m", "benchmarks.workloads", json.dumps(spec)],
                          cwd=spec.get("dir") or ROOT, env=env, capture_output=True, text=True,
                          timeout=timeout)
    lines = [line for line in proc.stdout.splitlines() if line.startswith("BENCH_RESULT ")]
    if not lines:
        raise RuntimeError(f"workload {spec} failed (exit {proc.returncode}):\n"
                           f"{proc.stdout[-2000:]}\n{proc.stderr[-4000:]}")
    return json.loads(lines[-1][len("BENCH_RESULT "):])


def _rotated(items: list[str], by: int) -> list[str]:
    by %= max(len(items), 1)
    return items[by:] + items[:by]


def available_systems(peers: bool, results: Results) -> list[str]:
    systems = []
    for system in STEP_SYSTEMS:
        module = PEERS.get(system)
        if module is not None:
            if not peers:
                results.notes.append(f"{system}: skipped (--no-peers).")
                continue
            if importlib.util.find_spec(module.split(".")[0]) is None \
                    or importlib.util.find_spec(module) is None:
                results.notes.append(f"{system}: skipped, not installed "
                                     f"(pip install -e '.[bench]').")
                continue
        systems.append(system)
    return systems


def step_costs(plan: Plan, systems: list[str], results: Results, log: Any) -> None:
    """Sections 1, 2, 4 and 5: first run, replay in a fresh process, bytes, RSS."""
    all_ns = sorted({n for s in systems for n in plan.ns[s]})
    for n in all_ns:
        here = [s for s in systems if n in plan.ns[s]]
        for r in range(plan.repeats[n]):
            for system in _rotated(here, r):
                directory = tempfile.mkdtemp(prefix=f"bench-{system}-")
                try:
                    spec = {"system": system, "mode": "first", "n": n, "dir": directory}
                    results.add("first", system, n, workload(spec, plan.timeout))
                    if system in DURABLE:
                        replay = workload({**spec, "mode": "replay"}, plan.timeout)
                        results.add("replay", system, n, replay)
                finally:
                    shutil.rmtree(directory, ignore_errors=True)
                log(f"  N={n} repeat {r + 1}: {system} done")


def chat_cost(plan: Plan, results: Results, log: Any) -> None:
    """Section 3: ctx.chat against the bare client, same loopback server in another process."""
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    # Without TCP_NODELAY the server's separate header and body writes meet the client's
    # delayed ACK: every reply stalled ~40 ms, hiding what is measured (reported to the lead).
    serve = ("import durable_nb.testing as t; t._Handler.disable_nagle_algorithm = True; "
             "t.main()")
    server = subprocess.Popen([sys.executable, "-c", serve], env=env, stdout=subprocess.PIPE,
                              text=True)
    try:
        assert server.stdout is not None
        url = server.stdout.readline().strip().split("=", 1)[1]
        for r in range(plan.chat_repeats):
            for variant in _rotated(["bare", "ctx.chat"], r):
                directory = tempfile.mkdtemp(prefix="bench-chat-")
                try:
                    spec = {"system": "chat", "n": plan.chat_calls, "url": url,
                            "durable": variant == "ctx.chat", "dir": directory}
                    results.add("chat", variant, plan.chat_calls, workload(spec, plan.timeout))
                finally:
                    shutil.rmtree(directory, ignore_errors=True)
            log(f"  chat repeat {r + 1} done")
    finally:
        server.terminate()
        server.wait()


def transcript(plan: Plan, results: Results) -> None:
    """Section 4b: journal growth over an agent transcript."""
    directory = tempfile.mkdtemp(prefix="bench-transcript-")
    try:
        spec = {"system": "transcript", "n": plan.transcript_rounds, "dir": directory}
        results.add("transcript", "durable_nb", plan.transcript_rounds,
                    workload(spec, plan.timeout))
    finally:
        shutil.rmtree(directory, ignore_errors=True)


def notebook(plan: Plan, results: Results, log: Any) -> None:
    """Sections 6 and 7: the panel's cost and restart latency in a real kernel."""
    if importlib.util.find_spec("jupyter_client") is None:
        results.notes.append("widget and restart: skipped, jupyter_client is not installed.")
        return
    if importlib.util.find_spec("durable_nb.magics") is None:
        results.notes.append("TODO widget and restart: durable_nb.magics is not there yet.")
        return
    spec = {"system": "widget", "n": plan.widget_steps, "repeats": plan.widget_repeats}
    results.add("widget", "durable_nb", plan.widget_steps, workload(spec, plan.timeout))
    log("  widget done")
    for _ in range(plan.restart_repeats):
        spec = {"system": "restart", "n": plan.restart_steps}
        results.add("restart", "durable_nb", plan.restart_steps, workload(spec, plan.timeout))
    log("  restart done")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m benchmarks", description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true",
                        help="tiny N and one repeat: a smoke run of seconds")
    parser.add_argument("--no-peers", action="store_true", help="skip DBOS and LangGraph")
    parser.add_argument("--out", type=Path, default=Path(__file__).resolve().parent,
                        help="where RESULTS.md, results.json and the plot go")
    args = parser.parse_args(argv)
    plan = Plan.quick() if args.quick else Plan.full()
    results = Results()
    started = time.time()

    def log(text: str) -> None:
        print(f"[{time.time() - started:6.1f}s] {text}", flush=True)

    systems = available_systems(not args.no_peers, results)
    log(f"step costs: {', '.join(systems)}")
    step_costs(plan, systems, results, log)
    log("ctx.chat against the bare client")
    chat_cost(plan, results, log)
    log("agent transcript")
    transcript(plan, results)
    log("notebook kernel")
    notebook(plan, results, log)
    command = "python -m benchmarks" + "".join(f" {a}" for a in (argv if argv is not None
                                                                  else sys.argv[1:]))
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "results.json").write_text(json.dumps(
        {"runs": results.runs, "notes": results.notes}, indent=1))
    plot = report.plot(results.runs, args.out / "cost_per_step.png")
    if plot is None:
        results.notes.append("plot: skipped, matplotlib is not installed.")
    markdown = report.markdown(results.runs, results.notes, command=command,
                               wall_seconds=time.time() - started, plot=plot)
    (args.out / "RESULTS.md").write_text(markdown)
    log(f"wrote {args.out / 'RESULTS.md'}")
    print(report.headline(results.runs))
