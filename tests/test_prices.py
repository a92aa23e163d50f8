"""Where a price comes from (issue 26): your overrides, then genai-prices (a maintained
database of many providers' prices, shipped with its wheel, so offline), then the built-in
table; unknown else. What shows a cost says where its prices came from, and a free local model
says "free" once instead of "$0" on every step.

The runs are real: the openai client over HTTP to the loopback server, a diskcache journal on
disk, ``durable-nb show`` in another process.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import openai
import pytest

import durable_nb
from durable_nb import DiskJournal, Price
from durable_nb.export import export_data, export_notebook
from durable_nb.llm.pricing import BUILT_IN, OVERRIDE, quote_for
from durable_nb.notebook.panel import RunPanel
from durable_nb.summary import format_cost
from durable_nb.testing import LoopbackServer

genai_prices = pytest.importorskip("genai_prices")  # Python 3.11+; 3.10 has the table only

REPO = Path(__file__).resolve().parents[1]
DATABASE = f"genai-prices {genai_prices.__version__}"


def test_a_price_comes_from_the_override_then_genai_prices_then_the_built_in_table():
    claude = quote_for("claude-3-5-sonnet-latest")  # not in the built-in OpenAI table
    assert claude is not None and claude.source == f"{DATABASE}, Anthropic"
    assert claude.price.input > 0 and claude.price.output > claude.price.input
    gemini = quote_for("gemini-2.5-flash", endpoint="https://generativelanguage.googleapis.com")
    assert gemini is not None and gemini.source == f"{DATABASE}, Google"
    dated = quote_for("gpt-4o-2024-08-06")
    assert dated is not None and dated.source == f"{DATABASE}, OpenAI"
    mine = Price(1.0, 0.5, 2.0)
    assert quote_for("gpt-4o", {"gpt-4o": mine}).price == mine  # your override wins
    assert quote_for("gpt-4o-mini", {"gpt-4o": mine}).source == OVERRIDE  # as a family
    assert quote_for("my-local-model") is None and quote_for("loopback-1") is None


def _python(code: str) -> dict:
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=120, env={"PYTHONPATH": str(REPO), "PATH": "/usr/bin:/bin"})
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.splitlines()[-1])


def test_genai_prices_answers_offline_from_the_data_its_wheel_ships():
    """No connection is opened: every socket refuses, and the price is there."""
    found = _python(
        "import json, socket\n"
        "def refuse(*a, **k): raise OSError('network is off in this test')\n"
        "socket.socket.connect = socket.socket.connect_ex = refuse\n"
        "socket.create_connection = socket.getaddrinfo = refuse\n"
        "from durable_nb.llm.pricing import quote_for\n"
        "q = quote_for('claude-3-5-haiku-latest')\n"
        "print(json.dumps([q.source, q.price.input]))")
    assert found[0] == f"{DATABASE}, Anthropic" and found[1] > 0


def test_without_genai_prices_the_built_in_table_prices_openai_models():
    found = _python(
        "import json, sys\n"
        "sys.modules['genai_prices'] = None  # as on Python 3.10, where it cannot install\n"
        "from durable_nb.llm.pricing import quote_for\n"
        "q = quote_for('gpt-4o-mini-2024-07-18')\n"
        "print(json.dumps([q.source, q.price.input, quote_for('claude-3-5-sonnet') is None]))")
    assert found == [BUILT_IN, 0.15, True]


def _chat(ctx, client, model: str, question: str) -> str:
    return ctx.chat(client=client, model=model, messages=[
        {"role": "user", "content": question}]).choices[0].message.content


def _markdown(info, journal: DiskJournal) -> str:
    """The exported notebook's text (its markdown cells)."""
    cells = export_notebook(export_data(info, journal=journal)).cells
    return "\n".join(c.source for c in cells if c.cell_type == "markdown")


def _show(journal: DiskJournal, run_id: str) -> str:
    done = subprocess.run([sys.executable, "-m", "durable_nb.cli", "--journal",
                           str(journal.directory), "show", run_id], capture_output=True,
                          text=True, timeout=120, env={"PYTHONPATH": str(REPO),
                                                       "PATH": "/usr/bin:/bin"})
    assert done.returncode == 0, done.stderr
    return done.stdout


def test_a_run_says_where_its_prices_came_from_in_show_export_and_panel(tmp_path):
    journal = DiskJournal(tmp_path / "journal")
    with LoopbackServer(["Fine.", "Sure."]) as server:
        client = openai.OpenAI(base_url=server.url, api_key="any", max_retries=0)
        durable_nb.execute("claude", lambda ctx: _chat(ctx, client, "claude-3-5-sonnet-latest",
                                                       "How are you?"), journal=journal)
    info = durable_nb.get_run("claude", journal=journal)
    chat = next(e for e in info.steps if e.kind == "chat")
    assert chat.meta["price_source"] == f"{DATABASE}, Anthropic" and chat.meta["cost"] > 0

    shown = _show(journal, "claude")
    cost_line = next(line for line in shown.splitlines() if line.startswith("cost"))
    assert cost_line == (f"cost       {format_cost(info.cost)} (prices: {DATABASE}, "
                         f"Anthropic)")
    data = export_data(info, journal=journal)
    assert data["result"]["cost"]["sources"] == [f"{DATABASE}, Anthropic"]
    assert data["rounds"][0]["chat"]["cost"]["source"] == f"{DATABASE}, Anthropic"
    assert f"(prices: {DATABASE}, Anthropic)" in _markdown(info, journal)
    panel = RunPanel.load(info, journal=journal)
    assert f"title='prices: {DATABASE}, Anthropic'" in panel.stats.value
    journal.close()


def test_a_free_local_model_says_free_once_and_no_dollars_per_step(tmp_path):
    """Priced at zero by an override (a local server): the run's cost line says "free" (and
    where that came from); no step shows "$0" or "$0.0000"."""
    journal = DiskJournal(tmp_path / "journal")
    with LoopbackServer(["One.", "Two.", "Three."]) as server:
        client = openai.OpenAI(base_url=server.url, api_key="any", max_retries=0)

        def three_calls(ctx):
            return [_chat(ctx, client, "llama3.2", f"Question {n}?") for n in range(3)]

        durable_nb.execute("local", three_calls, journal=journal,
                           prices={"llama3.2": Price(0, 0, 0)})
    info = durable_nb.get_run("local", journal=journal)
    assert [e.meta["cost"] for e in info.steps if e.kind == "chat"] == [0, 0, 0]

    shown = _show(journal, "local")
    assert "cost       free (prices: override)" in shown
    step_lines = [line for line in shown.splitlines() if re.match(r"\s+\d+\s+chat\s", line)]
    assert len(step_lines) == 3 and not any("$" in line for line in step_lines)

    markdown = _markdown(info, journal)
    assert "- cost: free (prices: override)" in markdown
    assert not re.search(r"\$0(\.0+)?\b", markdown)
    assert export_data(info, journal=journal)["result"]["cost"]["free"] is True

    panel = RunPanel.load(info, journal=journal)
    assert "cost <b title='prices: override'>free</b>" in panel.stats.value
    assert "cost free" in panel.summary()
    timeline = panel.static_html()
    assert timeline.count("tok") >= 3 and "$0" not in timeline
    journal.close()


def test_an_unpriced_model_shows_no_cost_per_step_and_unknown_for_the_run(tmp_path):
    journal = DiskJournal(tmp_path / "journal")
    with LoopbackServer(["One."]) as server:
        client = openai.OpenAI(base_url=server.url, api_key="any", max_retries=0)
        durable_nb.execute("unpriced", lambda ctx: _chat(ctx, client, "llama3.2", "Hi?"),
                           journal=journal)
    shown = _show(journal, "unpriced")
    assert "cost       unknown (no price known for llama3.2)" in shown
    assert "prices:" not in shown and "free" not in shown
    panel = RunPanel.load(durable_nb.get_run("unpriced", journal=journal), journal=journal)
    assert "free" not in panel.stats.value and "$" not in panel.static_html()
    journal.close()


def test_a_tiny_cost_is_not_shown_as_zero():
    assert format_cost(0.000015) == "$0.000015" and format_cost(0.0000031) == "$0.0000031"
    assert format_cost(0.00009) == "$0.000090"
    assert format_cost(0.00021) == "$0.0002" and format_cost(0) == "$0"
