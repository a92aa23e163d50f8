"""What starting durable_nb imports: the package and the inspection commands leave the heavy
packages (openai, jupyter_server, the agent frameworks) to the code that uses them.

Each case runs in a fresh interpreter and reports ``sys.modules`` at its end. How long start-up
takes is measured by ``python -m benchmarks.startup``, not asserted here.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent

#: Packages that no command which only reads a journal needs.
HEAVY = ("openai", "jupyter_server", "pydantic", "pydantic_ai", "agents", "langgraph",
         "langchain_core", "httpx", "psycopg")

#: Runs ``durable-nb ARGS...`` as the console script does, then prints the heavy packages loaded.
CLI_THEN_MODULES = """
import json, sys
from durable_nb.cli import main
heavy = json.loads(sys.argv[1])
sys.argv = ["durable-nb"] + sys.argv[2:]
try:
    code = main()
except SystemExit as exit:  # --help
    code = exit.code
print(json.dumps({"code": code or 0,
                  "heavy": sorted(m for m in heavy if m in sys.modules)}))
"""


def heavy_after(code: str, *args: str) -> dict:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    env.pop("DURABLE_NB_JOURNAL", None)
    done = subprocess.run([sys.executable, "-c", code, json.dumps(HEAVY), *args], env=env,
                          capture_output=True, text=True, timeout=120, cwd=REPO)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.strip().splitlines()[-1])


@pytest.fixture(scope="module")
def journal(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A directory journal with a finished run and one waiting for an approval."""
    import durable_nb

    where = tmp_path_factory.mktemp("journal")
    durable_nb.execute("done-run", lambda ctx: ctx.run("fetch", lambda: {"rows": 3}),
                       journal=str(where))
    assert durable_nb.execute("waiting-run",
                              lambda ctx: ctx.approval("send", {"to": "a@b.c"}).approved,
                              journal=str(where), on_approval="park") is None
    return where


def test_importing_the_package_imports_no_heavy_package():
    code = ("import json, sys, durable_nb\n"
            "print(json.dumps({'heavy': sorted(m for m in json.loads(sys.argv[1]) "
            "if m in sys.modules)}))")
    assert heavy_after(code) == {"heavy": []}


def test_every_public_name_still_imports_from_the_package():
    code = ("import json, sys, durable_nb\n"
            "missing = [n for n in durable_nb.__all__ if getattr(durable_nb, n, None) is None]\n"
            "print(json.dumps({'missing': missing, 'dir': sorted(set(durable_nb.__all__) "
            "- set(dir(durable_nb)))}))")
    assert heavy_after(code) == {"missing": [], "dir": []}


@pytest.mark.parametrize("args", [["--help"], ["runs", "--help"], ["show", "--help"],
                                  ["approve", "--help"]])
def test_the_commands_help_imports_no_heavy_package(args: list[str]):
    assert heavy_after(CLI_THEN_MODULES, *args) == {"code": 0, "heavy": []}


@pytest.mark.parametrize("args", [["runs"], ["runs", "--status", "waiting_approval"],
                                  ["show", "done-run"], ["show", "waiting-run"]])
def test_inspecting_a_journal_imports_no_heavy_package(journal: Path, args: list[str]):
    assert heavy_after(CLI_THEN_MODULES, *args, "--journal", str(journal)) == {
        "code": 0, "heavy": []}
