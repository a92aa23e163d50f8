"""``durable_nb.export``: a run as a valid notebook or JSON, from a real journal.

The runs are real: the demo sales agent against the loopback server through the real openai
client, with the email approved from another thread as a person would.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import threading
import warnings
from pathlib import Path

import nbformat
import openai
import pytest
from jupyter_client.kernelspec import KernelSpecManager

import durable_nb
from durable_nb import DiskJournal, Status, StepEntry, TerminalError
from durable_nb.demo import SALES_CSV, make_tools, sales_agent
from durable_nb.export import export_data, export_notebook, export_run
from durable_nb.testing import LoopbackServer

REPO = Path(__file__).resolve().parents[1]
SECRET = "sk-test-SECRET123"
RUN = "sales"


def _decide_when_asked(journal: DiskJournal, run_id: str, decide, note: str, by: str,
                       stop: threading.Event) -> None:
    """Decide the run's approval once it waits for one, as a person would from elsewhere."""
    while not stop.is_set():
        record = journal.find_run(run_id)
        if record is not None and record.status is Status.WAITING_APPROVAL:
            decide(run_id, note, by=by, journal=journal)
            return
        stop.wait(0.02)


@pytest.fixture(scope="module")
def demo_run(tmp_path_factory):
    """A finished demo-agent run in a fresh journal: (journal directory, journal)."""
    root = tmp_path_factory.mktemp("export")
    (root / "sales.csv").write_text(SALES_CSV)
    journal = DiskJournal(root / "journal")
    stop = threading.Event()
    approver = threading.Thread(target=_decide_when_asked,
                                args=(journal, RUN, durable_nb.approve, "ok to send", "ana", stop))
    with LoopbackServer() as server:
        client = openai.OpenAI(base_url=server.url, api_key=SECRET, max_retries=0)
        tools = make_tools(root)
        approver.start()
        try:
            durable_nb.execute(RUN, lambda ctx: sales_agent(ctx, tools, client=client),
                               title="Q3 sales report", journal=journal, poll_interval=0.02,
                               timeout=60)
        finally:
            stop.set()
            approver.join()
    yield root / "journal", journal
    journal.close()


def _cli(journal_dir: Path, *args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    return subprocess.run([sys.executable, "-m", "durable_nb.cli", "--journal", str(journal_dir),
                           *args], capture_output=True, text=True, env=env, timeout=60)


def _text(nb: nbformat.NotebookNode) -> str:
    return "\n".join(cell.source for cell in nb.cells)


def test_notebook_export_validates_and_tells_tools_approval_tokens_and_result(demo_run, tmp_path):
    journal_dir, journal = demo_run
    info = durable_nb.get_run(RUN, journal=journal)

    path = export_run(RUN, tmp_path / "run.ipynb", journal=journal)

    nb = nbformat.read(path, as_version=4)
    nbformat.validate(nb)
    text = _text(nb)
    assert text.startswith("# Q3 sales report")
    for name in ("read_csv", "analyse", "write_report", "send_email"):
        assert f"`{name}`" in text
    assert '"to": "team@example.com"' in text  # tool-call arguments as JSON
    assert "approved by ana via Python: ok to send" in text
    assert f"{info.prompt_tokens} prompt + {info.completion_tokens} completion = {info.tokens}" \
        in text
    assert info.result.startswith("The Q3 sales report is done")
    assert info.result in nb.cells[-1].source
    assert sum(cell.source.startswith("## Round") for cell in nb.cells) == info.iteration


def test_notebook_has_no_outputs_and_structured_metadata_in_every_cell(demo_run, tmp_path):
    _, journal = demo_run
    nb = nbformat.read(export_run(RUN, tmp_path / "run.ipynb", journal=journal), as_version=4)

    for cell in nb.cells:
        assert cell.cell_type in ("markdown", "code")
        assert "outputs" not in cell or cell.outputs == []
        assert cell.get("execution_count") is None
        assert "durable_nb" in cell.metadata
    assert nb.cells[0].metadata["durable_nb"]["run_id"] == RUN
    assert nb.cells[-1].metadata["durable_nb"]["status"] == "DONE"


def test_json_export_is_the_notebooks_data(demo_run, tmp_path):
    _, journal = demo_run
    info = durable_nb.get_run(RUN, journal=journal)

    data = json.loads(export_run(RUN, tmp_path / "run.json", journal=journal).read_text())

    assert set(data) == {"export_version", "run", "rounds", "result", "attempts", "code",
                         "notifications", "history"}
    assert data["notifications"] == []  # no channel configured: nothing was sent
    assert [(e["kind"], e["by"], e["via"]) for e in data["history"]] == \
        [("decided", "ana", "Python")]
    assert data == json.loads(json.dumps(export_data(info, journal=journal)))
    assert [r["round"] for r in data["rounds"]] == [1, 2, 3, 4, 5]
    assert data["result"]["tokens"] == {"prompt": info.prompt_tokens,
                                        "completion": info.completion_tokens,
                                        "total": info.tokens}
    round4 = data["rounds"][3]
    assert [c["name"] for c in round4["chat"]["tool_calls"]] == ["send_email"]
    approval, sent = round4["steps"]
    assert approval["kind"] == "approval"
    assert approval["result"]["by"] == "ana" and approval["result"]["approved"] is True
    assert sent["tool_call_id"] == round4["chat"]["tool_calls"][0]["id"]
    nb = export_notebook(data)
    assert nb.cells[-1].metadata["durable_nb"] == data["result"]


def test_format_comes_from_the_extension_and_unknown_ones_are_refused(demo_run, tmp_path):
    _, journal = demo_run

    with pytest.raises(ValueError, match=r"\.ipynb or \.json"):
        export_run(RUN, tmp_path / "run.txt", journal=journal)
    with pytest.raises(ValueError, match="unknown export format 'xml'"):
        export_run(RUN, tmp_path / "run.ipynb", format="xml", journal=journal)
    assert not list(tmp_path.iterdir())

    forced = export_run(RUN, tmp_path / "run.txt", format="json", journal=journal)
    assert json.loads(forced.read_text())["run"]["run_id"] == RUN
    nbformat.validate(nbformat.read(export_run(RUN, tmp_path / "RUN.IPYNB", journal=journal),
                                    as_version=4))


def test_cli_export_writes_a_valid_notebook(demo_run, tmp_path):
    journal_dir, _ = demo_run
    target = tmp_path / "x.ipynb"

    proc = _cli(journal_dir, "export", RUN, "--to", str(target))

    assert proc.returncode == 0, proc.stderr
    assert str(target) in proc.stdout
    nb = nbformat.read(target, as_version=4)
    nbformat.validate(nb)
    assert "approved by ana" in _text(nb)


def test_cli_export_of_an_unknown_run_exits_1(demo_run, tmp_path):
    journal_dir, _ = demo_run

    proc = _cli(journal_dir, "export", "no-such-run", "--to", str(tmp_path / "x.ipynb"))

    assert proc.returncode == 1
    assert "no-such-run" in proc.stderr
    assert not (tmp_path / "x.ipynb").exists()


def test_api_key_is_in_neither_the_journal_nor_the_exports(demo_run, tmp_path):
    journal_dir, journal = demo_run
    export_run(RUN, tmp_path / "run.ipynb", journal=journal)
    export_run(RUN, tmp_path / "run.json", journal=journal)

    journal_bytes = b"".join(p.read_bytes() for p in journal_dir.rglob("*") if p.is_file())
    export_bytes = b"".join(p.read_bytes() for p in tmp_path.iterdir())

    # The scan sees the journaled data, so the secret's absence means something.
    assert b"team@example.com" in journal_bytes and b"team@example.com" in export_bytes
    assert SECRET.encode() not in journal_bytes
    assert b"SECRET123" not in journal_bytes and b"SECRET123" not in export_bytes


def test_every_step_kind_gets_a_cell_unknown_kinds_a_generic_one(tmp_path):
    journal = DiskJournal(tmp_path / "journal")

    def agent(ctx):
        ctx.state["plan"] = ["read", "write"]
        ctx.now(), ctx.uuid(), ctx.random()
        ctx.sleep(0)
        try:
            ctx.run("flaky", _fail)
        except TerminalError:
            pass
        return ctx.child("helper", lambda child_ctx: child_ctx.run("lookup", lambda: 42))

    assert durable_nb.execute("kinds", agent, title="kinds", journal=journal) == 42
    # A compaction step as ctx.compact journals it, and a kind no version knows yet.
    n = journal.count_steps("kinds")
    journal.append_step("kinds", StepEntry(
        n, str(n), "loopback-1", "compact", result={"summary": "read it", "rounds_summarised": 3},
        prompt_tokens=900, completion_tokens=40,
        meta={"tokens_before": 1200, "tokens_after": 300, "rounds_summarised": 3}))
    journal.append_step("kinds", StepEntry(n + 1, str(n + 1), "thing", "future-kind",
                                           result={"x": 1}))

    nb = nbformat.read(export_run("kinds", tmp_path / "k.ipynb", journal=journal), as_version=4)
    journal.close()

    nbformat.validate(nb)
    text = _text(nb)
    assert "## Before the first model call" in text
    assert "**State** `plan` set" in text and '"write"' in text
    for kind in ("Now", "Uuid", "Random", "Sleep"):
        assert f"**{kind}**" in text
    assert "**Failed**: `durable_nb.errors.TerminalError`: the service said no" in text
    assert "**Child run `kinds/helper-" in text and ": DONE, 1 steps" in text
    assert "**Context compacted**: 1200 → 300 tokens, 3 rounds summarised" in text
    assert "900 + 40 tokens" in text and "read it" in text
    assert "**future-kind step `thing`**" in text and '"x": 1' in text


def test_a_rejection_names_who_rejected_it(tmp_path):
    journal = DiskJournal(tmp_path / "journal")
    stop = threading.Event()
    decider = threading.Thread(target=_decide_when_asked, args=(
        journal, "deploy", durable_nb.reject, "not today", "bob", stop))
    decider.start()
    try:
        decision = durable_nb.execute(
            "deploy", lambda ctx: ctx.approval("deploy", {"env": "prod"}).approved,
            journal=journal, poll_interval=0.02, timeout=60)
    finally:
        stop.set()
        decider.join()

    nb = nbformat.read(export_run("deploy", tmp_path / "d.ipynb", journal=journal),
                       as_version=4)
    journal.close()

    assert decision is False
    assert "**Approval `deploy`**: rejected by bob via Python: not today" in _text(nb)
    assert '"env": "prod"' in _text(nb)


def _fail() -> None:
    raise TerminalError("the service said no")


def test_export_tells_the_goal_and_the_prompt_each_round_sent(demo_run, tmp_path):
    _, journal = demo_run
    nb = nbformat.read(export_run(RUN, tmp_path / "run.ipynb", journal=journal), as_version=4)
    data = json.loads(export_run(RUN, tmp_path / "run.json", journal=journal).read_text())

    goal = "Write the Q3 sales report from sales.csv and email it to team@example.com."
    assert data["run"]["goal"] == goal
    assert f"**Goal** (the first user message):\n\n> {goal}" in nb.cells[0].source
    first, second = data["rounds"][0]["chat"]["request"], data["rounds"][1]["chat"]["request"]
    assert first["model"] == "loopback-1" and first["messages"] == 2
    assert [m["role"] for m in first["new_messages"]] == ["system", "user"]
    assert first["tools"] == ["read_csv", "analyse", "write_report", "send_email"]
    # Each message once: the second request repeats the first two, the export does not.
    assert second["messages"] == 4 and [m["role"] for m in second["new_messages"]] == \
        ["assistant", "tool"]
    rounds = [c.source for c in nb.cells if c.source.startswith("## Round")]
    assert "**Prompt**: 2 messages; tools `read_csv`, `analyse`" in rounds[0]
    assert f"> {goal}" in rounds[0]
    assert "**Prompt**: 4 messages (2 sent before, 2 new)" in rounds[1]


def test_export_tells_cost_and_what_replay_saves(demo_run, tmp_path):
    _, journal = demo_run
    info = durable_nb.get_run(RUN, journal=journal)
    data = json.loads(export_run(RUN, tmp_path / "run.json", journal=journal).read_text())
    text = _text(nbformat.read(export_run(RUN, tmp_path / "run.ipynb", journal=journal),
                               as_version=4))

    # The loopback model has no price: the cost is said to be unknown, not $0.
    assert data["result"]["cost"]["unpriced_models"] == ["loopback-1"]
    assert "- cost: unknown (no price known for loopback-1)" in text
    assert data["result"]["replay"] == (f"{len(info.steps)} steps from the journal: "
                                        f"{info.tokens:,} tokens")
    assert (f"a re-run replays {len(info.steps)} steps from the journal: {info.tokens:,} "
            f"tokens") in text


def _priced_run(journal: DiskJournal, text: str = "The answer is 42.") -> None:
    from durable_nb.llm.pricing import Price

    with LoopbackServer([text]) as server:
        client = openai.OpenAI(base_url=server.url, api_key=SECRET, max_retries=0)
        durable_nb.execute("priced", lambda ctx: ctx.chat(
            client=client, model="loopback-1",
            messages=[{"role": "user", "content": "What is the answer?"}]
        ).choices[0].message.content, journal=journal, title="Price check",
            prices={"loopback-1": Price(input=1000.0, cached_input=0.0, output=2000.0)})


def test_dollars_in_the_markdown_are_escaped_and_the_replay_line_reads(tmp_path):
    # JupyterLab renders the text between two dollar signs as maths: the cost and the replay
    # line of one cell became one formula. Code keeps its dollar signs as they are.
    # (What JupyterLab shows: the next test.)
    journal = DiskJournal(tmp_path / "journal")
    _priced_run(journal, "It costs $5, or $7 with `$HOME` set.")
    info = durable_nb.get_run("priced", journal=journal)
    nb = nbformat.read(export_run("priced", tmp_path / "run.ipynb", journal=journal),
                       as_version=4)
    journal.close()
    cost = export_data(info)["result"]["cost"]["dollars"]
    money = (f"<span>\\$</span>{cost:.3f}" if cost >= 0.01 else
             f"<span>\\$</span>{cost:.4f}")
    title = nb.cells[0].source
    assert f"- cost: {money}" in title
    assert (f"- steps: 1; a re-run replays 1 step from the journal: {info.tokens:,} tokens, "
            f"{money} not spent again") in title
    reply = next(c.source for c in nb.cells if c.source.startswith("## Round"))
    assert "It costs <span>\\$</span>5, or <span>\\$</span>7 with `$HOME` set." in reply
    for cell in nb.cells:
        if cell.cell_type == "markdown":
            outside_code = re.sub(r"(?ms)^(`{3,}).*?^\1$|`[^`\n]*`", "", cell.source)
            assert "$" not in outside_code.replace("<span>\\$</span>", ""), cell.source


def test_export_of_a_priced_run_shows_dollars(tmp_path):
    from durable_nb.llm.pricing import Price

    journal = DiskJournal(tmp_path / "journal")
    with LoopbackServer(["The answer is 42."]) as server:
        client = openai.OpenAI(base_url=server.url, api_key=SECRET, max_retries=0)
        durable_nb.execute("priced", lambda ctx: ctx.chat(
            client=client, model="loopback-1",
            messages=[{"role": "user", "content": "What is the answer?"}]
        ).choices[0].message.content, journal=journal,
            prices={"loopback-1": Price(input=1000.0, cached_input=0.0, output=2000.0)})
    info = durable_nb.get_run("priced", journal=journal)
    data = export_data(info, journal=journal)
    journal.close()

    expected = (info.prompt_tokens * 1000.0 + info.completion_tokens * 2000.0) / 1_000_000
    assert data["result"]["cost"]["dollars"] == pytest.approx(expected)
    assert data["rounds"][0]["chat"]["cost"]["dollars"] == pytest.approx(expected)
    assert data["run"]["goal"] == "What is the answer?"


def test_the_exported_notebook_names_its_kernel_and_validates_without_warnings(demo_run,
                                                                               tmp_path):
    _, journal = demo_run
    path = export_run(RUN, tmp_path / "run.ipynb", journal=journal)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # nbformat warns (missing ids, unknown fields) on read
        nb = nbformat.read(path, as_version=4)
        nbformat.validate(nb)
    assert nb.metadata.kernelspec == {"name": "python3", "display_name": "Python 3 (ipykernel)",
                                      "language": "python"}
    assert nb.metadata.language_info.name == "python"
    # The name is the one Jupyter resolves where ipykernel is installed: no kernel dialog.
    spec = KernelSpecManager().get_kernel_spec(nb.metadata.kernelspec.name)
    assert spec.language == "python"


def test_jupyterlab_shows_the_exported_dollars_as_text_not_maths(tmp_path):
    from tests.harness.lab import JupyterLab, LabPage, require_chromium

    require_chromium()
    journal = DiskJournal(tmp_path / "journal")
    _priced_run(journal, "It costs $5, or $7 with a coupon.")  # two in one paragraph
    root = tmp_path / "lab"
    root.mkdir()
    export_run("priced", root / "run.ipynb", journal=journal)
    journal.close()
    with JupyterLab(root) as lab, LabPage(lab, timeout=60) as page:
        page.open_notebook("run.ipynb")
        rendered = page.panel.locator(".jp-RenderedMarkdown")
        rendered.filter(has_text="It costs").first.wait_for(state="visible")
        page.screenshot(tmp_path / "export.png")
        title = rendered.first.inner_text()
        reply = rendered.filter(has_text="It costs").first.inner_text()
        formulas = page.panel.locator("mjx-container, .MathJax, .jp-RenderedLatex").count()
    assert formulas == 0
    assert "It costs $5, or $7 with a coupon." in reply
    cost = re.search(r"cost: (\$[0-9.]+)", title)
    assert cost and f"a re-run replays 1 step from the journal" in title
    assert f"tokens, {cost.group(1)} not spent again" in title
