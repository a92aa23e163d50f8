"""The benchmark runner still runs end to end (``python -m benchmarks --quick``).

Speed is not asserted here; the numbers live in benchmarks/RESULTS.md. DBOS and LangGraph
are optional: when they are not installed, the report must say they were skipped.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


# About 100 s alone on two cores (a fresh interpreter per workload); a loaded machine (the
# suite's other process, other work) takes minutes: the bound is for a hung run only.
@pytest.mark.timeout(900)
def test_quick_run_writes_a_report_with_every_section(tmp_path: Path) -> None:
    env = dict(os.environ, PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    proc = subprocess.run([sys.executable, "-m", "benchmarks", "--quick", "--out", str(tmp_path)],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=840)
    assert proc.returncode == 0, proc.stdout + proc.stderr

    runs = json.loads((tmp_path / "results.json").read_text())["runs"]
    for key in ("first/plain/50", "first/diskcache/50", "first/durable_nb/50",
                "replay/durable_nb/50", "chat/bare/5", "chat/ctx.chat/5",
                "transcript/durable_nb/4"):
        assert runs.get(key), f"no result for {key}"
    # A resumed run answers every completed step from the journal.
    assert runs["replay/durable_nb/50"][0]["executed"] == 0

    report = (tmp_path / "RESULTS.md").read_text()
    assert "## Targets" in report and "### 1. First run" in report
    assert "| durable_nb |" in report.split("### 4. Bytes per step")[1]
    for peer, module in (("dbos", "dbos"), ("langgraph", "langgraph")):
        if importlib.util.find_spec(module) is None:
            assert f"{peer}: skipped, not installed" in report
        else:
            assert runs.get(f"replay/{peer}/50"), f"{peer} is installed but was not measured"

    # The batch, the registry, PostgreSQL (one server the runner starts) and Dask, tiny.
    assert runs.get("batch/durable_nb/4") and runs.get("batch_rerun/durable_nb/4")
    assert "### 8. A batch" in report and "### 9. The registry" in report
    sys.path.insert(0, str(ROOT))
    try:
        from tests.postgres import postgres_bin
    finally:
        sys.path.remove(str(ROOT))
    if postgres_bin() is None or importlib.util.find_spec("psycopg") is None:
        assert "postgres: skipped" in report
    else:
        for system in ("durable_nb_pg", "durable_nb"):
            assert runs.get(f"pg_first/{system}/20") and runs.get(f"pg_replay/{system}/20")
            assert runs[f"pg_replay/{system}/20"][0]["executed"] == 0
        assert "### 10. PostgreSQL" in report
        if importlib.util.find_spec("distributed") is None:
            assert "dask: skipped" in report
        else:
            assert runs.get("dask/w1/2") and runs.get("dask/threads/2")
            assert "### 11. A batch on a Dask cluster" in report


def test_the_check_benchmark_runs_end_to_end() -> None:
    """benchmarks/check.py (1,000 recorded runs of 10 steps checked; here 5): it records,
    checks twice and reports both checks; the figures are not asserted."""
    env = dict(os.environ, PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    proc = subprocess.run([sys.executable, "-m", "benchmarks.check", "--runs", "5"], cwd=ROOT,
                          env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    lines = proc.stdout.splitlines()
    assert lines[1].startswith("unchanged code: 5 runs of 10 steps checked in ")
    assert lines[1].endswith("{'replays': 5, 'would execute': 0, 'diverges': 0}")
    assert lines[2].endswith("{'replays': 0, 'would execute': 0, 'diverges': 5}")


# The start-up, journal-size and control-plane benchmarks (issue 42), each tiny: they run
# and print their tables; their figures are read in docs/pages/performance.md, not here.
@pytest.mark.timeout(600)
@pytest.mark.parametrize("module, args, expected", [
    ("benchmarks.startup", ["--repeats", "1", "--only", "import durable_nb",
                            "--only", "durable-nb runs (20 runs)"],
     ["| import durable_nb |", "| durable-nb runs (20 runs) |", "bare `python -c pass`"]),
    ("benchmarks.journal_size", ["--steps", "4", "--runs", "5"],
     ["| ctx.run, 4 KiB results | 4 |", "| ctx.chat loop, 4 KiB replies |",
      "| 5 runs of 2 small steps |"]),
    ("benchmarks.control_plane", ["--runs", "300", "--waiting", "5", "--repeats", "2",
                                  "--no-postgres"],
     ["300 runs, 5 waiting", "| runs (50 newest) |", "| waiting list |", "| tick |",
      "| REST runs (page 1) |", "| REST summary |"]),
])
def test_the_issue_42_benchmarks_print_their_tables(module: str, args: list[str],
                                                     expected: list[str]) -> None:
    env = dict(os.environ, PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    proc = subprocess.run([sys.executable, "-m", module, *args], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=540)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    for text in expected:
        assert text in proc.stdout, proc.stdout
