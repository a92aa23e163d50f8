"""The documentation says what the code does: the tutorial and the README's example run as
written, the README stays short and its links resolve, the API reference lists every public
name, and the CLI reference covers every command.

The convention for code blocks (docs/pages/development.md): a ``python`` block is a notebook
cell, run in a real kernel in order; a ``bash`` block is a terminal command, run in the
notebook's folder; a ``console`` block is a command for the reader that no test runs (installs,
starting Jupyter); a ``text`` block is what the block before it prints, each of its lines
expected in that output. Two comments steer the tutorial's run:
``<!-- docs-test: the kernel dies -->`` before a block that kills its kernel (it is restarted,
as JupyterLab does), and ``<!-- docs-test: run the python blocks above again -->``.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

import durable_nb

REPO = Path(__file__).resolve().parents[1]
DOCS = REPO / "docs" / "pages"
README = REPO / "README.md"
LANGUAGES = {"python", "bash", "console", "text"}
README_MAX_LINES = 250

_FENCE = re.compile(r"^```(\S*)[^\n]*\n(.*?)^```[ \t]*$", re.S | re.M)
_DIRECTIVE = re.compile(r"^<!-- docs-test: (.+?) -->[ \t]*$", re.M)
_LINK = re.compile(r"\]\(([^)\s]+)\)")


@dataclass
class Block:
    """A fenced code block, or a docs-test directive (``lang == "directive"``)."""

    lang: str
    code: str


def blocks(markdown: str) -> list[Block]:
    """The page's code blocks and docs-test directives, in page order."""
    found = [(m.start(), Block(m.group(1), m.group(2))) for m in _FENCE.finditer(markdown)]
    found += [(m.start(), Block("directive", m.group(1))) for m in _DIRECTIVE.finditer(markdown)]
    return [block for _, block in sorted(found, key=lambda pair: pair[0])]


def _clean_env() -> dict[str, str]:
    """The reader's environment: no API key, no journal chosen, this checkout importable and
    its ``durable-nb`` on PATH."""
    env = {k: v for k, v in os.environ.items()
           if k not in ("OPENAI_API_KEY", "OPENAI_BASE_URL", "DURABLE_NB_DIR",
                        "DURABLE_NB_JOURNAL", "DURABLE_NB_MODEL")}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")]))
    env["PATH"] = os.pathsep.join([str(Path(sys.executable).parent), env.get("PATH", "")])
    return env


def _shell(code: str, folder: Path, env: dict[str, str]) -> str:
    proc = subprocess.run(["bash", "-euo", "pipefail", "-c", code], cwd=folder, env=env,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, f"{code!r} failed ({proc.returncode}):\n{proc.stdout}{proc.stderr}"
    return proc.stdout


def _expect(output: str, expected: str, code: str) -> None:
    missing = [line for line in expected.splitlines() if line.strip() and line not in output]
    assert not missing, f"{code!r} printed no {missing!r}; it printed:\n{output}"


def run_page(markdown: str, folder: Path) -> list[str]:
    """Run a page's blocks as a reader would; return the outputs of the blocks that ran."""
    from tests.harness import start_kernel, wait_until

    env = _clean_env()
    outputs: list[str] = []
    ran: list[str] = []
    dies = False
    with start_kernel(folder, env=env) as kernel:
        def cell(code: str) -> str:
            result = kernel.execute(code, timeout=120)
            assert result.status == "ok", f"cell failed:\n{code}\n{result.traceback}"
            return result.stdout + result.text

        last = ""
        for block in blocks(markdown):
            assert block.lang in LANGUAGES | {"directive"}, (
                f"a ```{block.lang} block: use one of {sorted(LANGUAGES)}")
            if block.lang == "directive":
                if block.code == "the kernel dies":
                    dies = True
                elif block.code == "run the python blocks above again":
                    outputs += [cell(code) for code in ran]
                else:
                    raise AssertionError(f"unknown docs-test directive {block.code!r}")
            elif block.lang == "python" and dies:
                kernel.execute_async(block.code)
                wait_until(lambda: not kernel.is_alive, 120, "the kernel's death")
                kernel.restart()
                ran.append(block.code)
                dies, last = False, ""
            elif block.lang == "python":
                last = cell(block.code)
                ran.append(block.code)
                outputs.append(last)
            elif block.lang == "bash":
                last = _shell(block.code, folder, env)
                outputs.append(last)
            elif block.lang == "text":
                _expect(last, block.code, "the block before it")
    return outputs


@pytest.mark.kernel
def test_the_tutorial_runs_as_written(tmp_path: Path) -> None:
    """Every block of the tutorial, crash and approval included, ends with each tool run once."""
    run_page((DOCS / "tutorial.md").read_text(), tmp_path)
    run = durable_nb.get_run("weekly-report", journal=str(tmp_path / ".durable_nb"))
    assert run.status is durable_nb.Status.DONE
    assert len(list((tmp_path / "outbox").iterdir())) == 1
    assert (tmp_path / "crashed-once").exists()  # the kernel did die in the middle


@pytest.mark.kernel
def test_the_readme_example_runs_as_written(tmp_path: Path) -> None:
    """The README's cells park at the email; approved as the README says, it is sent once."""
    markdown = README.read_text()
    python = "".join(f"```python\n{b.code}```\n" for b in blocks(markdown) if b.lang == "python")
    approve = "```bash\ndurable-nb approve q3-email\n```\n"
    wait = "```python\n%durable wait q3-email --timeout 60\n```\n"
    assert "durable-nb approve q3-email" in markdown
    run_page(python + approve + wait, tmp_path)
    run = durable_nb.get_run("q3-email", journal=str(tmp_path / ".durable_nb"))
    assert run.status is durable_nb.Status.DONE
    assert len(list((tmp_path / "outbox").iterdir())) == 1


def test_code_blocks_say_what_they_are() -> None:
    """Every fenced block of the README and the docs names one of the convention's languages
    (or another language shown but never run: sql, json, a Python fragment ```py)."""
    shown = LANGUAGES | {"sql", "json", "py", "toml", "yaml"}
    for page in [README, *DOCS.rglob("*.md")]:
        for block in blocks(page.read_text()):
            assert block.lang in shown | {"directive"}, (
                f"{page.relative_to(REPO)}: a ```{block.lang} block; use one of {sorted(shown)}")


def test_the_readme_is_short() -> None:
    lines = len(README.read_text().splitlines())
    assert lines <= README_MAX_LINES, f"README.md has {lines} lines: move the depth to docs/"


def test_the_readmes_links_resolve() -> None:
    """Every relative link of the README names a file of the repository (a page of the site)."""
    links = [link for link in _LINK.findall(README.read_text())
             if not re.match(r"[a-z]+:", link)]
    assert links, "the README links into docs/"
    for link in links:
        path = link.split("#", 1)[0]
        assert (REPO / path).is_file(), f"README.md links to {link}, which does not exist"


def test_the_api_reference_shows_every_public_name_once() -> None:
    text = (DOCS / "reference" / "api.md").read_text()
    shown = re.findall(r"^::: durable_nb\.(\w+)$", text, re.M)
    assert sorted(shown) == sorted(durable_nb.__all__)


def test_the_cli_reference_covers_every_command() -> None:
    sys.path.insert(0, str(REPO / "docs" / "hooks"))
    try:
        import cli_reference
    finally:
        sys.path.remove(str(REPO / "docs" / "hooks"))
    from durable_nb.cli.main import build_parser

    rendered = cli_reference.cli_reference()
    for name in cli_reference._subparsers(build_parser()):
        assert f"### `durable-nb {name}`" in rendered
    assert "usage: durable-nb show" in rendered
    assert "--max-iterations N" in cli_reference.magics_reference()


@pytest.mark.kernel
def test_the_notebook_guides_example_runs_as_written(tmp_path: Path) -> None:
    """guide/notebook.md's cells, offline as the page says (the bundled server's default
    script is the demo agent's): the run parks at the email and ends DONE once approved."""
    server = ("```python\nimport os\nfrom durable_nb.testing import LoopbackServer\n"
              "server = LoopbackServer().start()\nos.environ['OPENAI_BASE_URL'] = server.url\n"
              "os.environ['OPENAI_API_KEY'] = 'offline'\n```\n")
    page = (DOCS / "guide" / "notebook.md").read_text()
    python = [b.code for b in blocks(page) if b.lang == "python"][:4]
    assert python[2].startswith("%%durable_agent sales-report")
    cells = "".join(f"```python\n{code}```\n" for code in python)
    tail = ("```bash\ndurable-nb approve sales-report\n```\n"
            "```python\n%durable wait sales-report --timeout 60\n```\n")
    run_page(server + cells + tail, tmp_path)
    run = durable_nb.get_run("sales-report", journal=str(tmp_path / ".durable_nb"))
    assert run.status is durable_nb.Status.DONE
    assert (tmp_path / "side_effects.log").read_text().count("send_email") == 1


def test_the_outside_a_notebook_script_runs_as_written(tmp_path: Path) -> None:
    """guide/python.md's script against a model server: it waits for the approval, which
    another process gives, then sends the email once and prints the model's summary."""
    import time

    from durable_nb.demo import SALES_CSV
    from durable_nb.testing import LoopbackServer

    script = [b.code for b in blocks((DOCS / "guide" / "python.md").read_text())
              if b.lang == "python"][0]
    (tmp_path / "agent.py").write_text(script)
    (tmp_path / "sales.csv").write_text(SALES_CSV)
    with LoopbackServer(["Q3 revenue rose in every region."]) as server:
        env = {**_clean_env(), "OPENAI_BASE_URL": server.url, "OPENAI_API_KEY": "offline"}
        proc = subprocess.Popen([sys.executable, "agent.py"], cwd=tmp_path, env=env,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        try:
            journal = str(tmp_path / ".durable_nb")
            deadline = time.monotonic() + 60
            while not (tmp_path / ".durable_nb").exists() or not durable_nb.runs(
                    status="waiting_approval", journal=journal):
                assert proc.poll() is None, proc.communicate()
                assert time.monotonic() < deadline, "the script never asked for the approval"
                time.sleep(0.1)
            durable_nb.approve("sales-report", by="test", journal=journal)
            out, err = proc.communicate(timeout=60)
        finally:
            if proc.poll() is None:
                proc.kill()
    assert proc.returncode == 0, err
    assert "Q3 revenue rose in every region." in out
    assert len(list((tmp_path / "outbox").iterdir())) == 1


@pytest.mark.kernel
def test_the_batch_guides_example_runs_as_written(tmp_path: Path) -> None:
    """guide/batches.md's cells, against a model scripted to answer "billing": every item
    parks at its refund, and once each is approved from a terminal each refund is made once."""
    server = ("```python\nimport os\nfrom durable_nb.testing import LoopbackServer\n"
              "server = LoopbackServer(['billing']).start()\n"
              "os.environ['OPENAI_BASE_URL'] = server.url\n"
              "os.environ['OPENAI_API_KEY'] = 'offline'\n%load_ext durable_nb\n```\n")
    page = (DOCS / "guide" / "batches.md").read_text()
    python = [b.code for b in blocks(page) if b.lang == "python"][:2]
    assert python[1].startswith("%%durable_agent triage --over tickets")
    cells = "".join(f"```python\n{code}```\n" for code in python)
    approve = "".join(f"```bash\ndurable-nb approve triage/{key}\n```\n"
                      for key in ("T-101", "T-102", "T-103"))
    wait = "```python\n%durable batch wait triage --timeout 60\n```\n"
    run_page(server + cells + approve + wait, tmp_path)
    refunds = (tmp_path / "refunds.log").read_text().split()[::2]
    assert sorted(refunds) == ["T-101", "T-102", "T-103"]


@pytest.mark.kernel
@pytest.mark.parametrize("framework, run_id, first", [
    ("agents", "oslo-flight", 0), ("pydantic_ai", "oslo-flight-pydantic", 2)])
def test_the_framework_guides_examples_run_as_written(tmp_path: Path, framework: str,
                                                      run_id: str, first: int) -> None:
    """guide/frameworks.md's two agents, against a model scripted to call the flight tool and
    answer: each run ends DONE with the answer, the tool's step journaled."""
    pytest.importorskip(framework)
    server = ("```python\nimport os\n"
              "from durable_nb.testing import LoopbackServer, Reply, ToolCall\n"
              "server = LoopbackServer([Reply(tool_calls=[ToolCall('find_flights', "
              "{'city': 'Oslo'})]), 'SK4035 at 07:10.']).start()\n"
              "os.environ['OPENAI_BASE_URL'] = server.url\n"
              "os.environ['OPENAI_API_KEY'] = 'offline'\n%load_ext durable_nb\n```\n")
    page = (DOCS / "guide" / "frameworks.md").read_text()
    python = [b.code for b in blocks(page) if b.lang == "python"][first:first + 2]
    assert python[1].startswith(f"%%durable_agent {run_id}\n")
    outputs = run_page(server + "".join(f"```python\n{c}```\n" for c in python), tmp_path)
    assert "SK4035 at 07:10." in outputs[-1]
    run = durable_nb.get_run(run_id, journal=str(tmp_path / ".durable_nb"))
    assert run.status is durable_nb.Status.DONE
    assert "find_flights" in [step.name for step in run.steps]


@pytest.mark.kernel
def test_the_batch_guides_map_example_runs_as_written(tmp_path: Path) -> None:
    """guide/batches.md's `durable_nb.map` with its `classify`, over the page's tickets."""
    server = ("```python\nimport os\nfrom durable_nb.testing import LoopbackServer\n"
              "server = LoopbackServer(['question']).start()\n"
              "os.environ['OPENAI_BASE_URL'] = server.url\n"
              "os.environ['OPENAI_API_KEY'] = 'offline'\n```\n")
    python = [b.code for b in blocks((DOCS / "guide" / "batches.md").read_text())
              if b.lang == "python"]
    mapped = next(code for code in python if "durable_nb.map(classify" in code)
    cells = f"```python\n{python[0]}```\n```python\n{mapped}```\n"
    check = "```python\nprint(batch.results())\n```\n```text\n['question', 'question', 'question']\n```\n"
    run_page(server + cells + check, tmp_path)


@pytest.mark.kernel
def test_the_who_may_approve_example_runs_as_written(tmp_path: Path) -> None:
    """guide/approvals.md's "Who may approve": bo is refused, ana decides, as printed."""
    page = (DOCS / "guide" / "approvals.md").read_text()
    section = page.split("## Who may approve\n", 1)[1].split("\n## ", 1)[0]
    outputs = run_page(section, tmp_path)
    assert outputs and "only ana may decide" in outputs[-1]


@pytest.mark.kernel
def test_the_pydantic_ai_models_guide_runs_as_written(tmp_path: Path) -> None:
    """guide/pydantic-ai-models.md: an agent on Pydantic AI's AnthropicModel, against the
    loopback server's Messages API, ends DONE with the answer, its requests ``model`` steps."""
    pytest.importorskip("pydantic_ai")
    pytest.importorskip("anthropic")
    run_page((DOCS / "guide" / "pydantic-ai-models.md").read_text(), tmp_path)
    run = durable_nb.get_run("oslo-flight-claude", journal=str(tmp_path / ".durable_nb"))
    assert run.status is durable_nb.Status.DONE
    assert [step.kind for step in run.steps] == ["model", "run", "model"]


@pytest.mark.kernel
def test_the_langgraph_guide_runs_as_written(tmp_path: Path) -> None:
    """guide/langgraph.md: create_agent with the human-in-the-loop middleware parks, is
    approved with an edit, and ends DONE with the answer, its calls and the decision steps."""
    pytest.importorskip("langgraph")
    pytest.importorskip("langchain_openai")
    outputs = run_page((DOCS / "guide" / "langgraph.md").read_text(), tmp_path)
    run = durable_nb.get_run("q3-graph", journal=str(tmp_path / ".durable_nb"))
    assert run.status is durable_nb.Status.DONE
    assert [step.kind for step in run.steps] == ["model", "approval", "run", "model"]
    assert any("I emailed the team." in out for out in outputs)
