"""The package's shape: its public names, and a core that needs no Jupyter."""

import subprocess
import sys

import durable_nb


def test_exported_names_are_exactly_the_public_api():
    assert set(durable_nb.__all__) == {
        "ApprovalChanged", "Batch", "BudgetExhausted", "Context", "ContextNotActive", "CorruptEntry",
        "DatabaseError", "Decision", "DecisionExists", "DiskJournal", "DurableError", "DurableState",
        "EndpointError", "IncompatibleJournal", "InputChanged", "ItemResult", "Journal",
        "JournalError", "JournalMismatch", "JournalNotWritable", "JournalUnavailable",
        "JournalWriteError", "NoJournal", "NoPendingApproval", "NotAllowedToDecide", "NotJournaled",
        "Price", "ReplayDiverged", "RetryPolicy", "RunCancelled", "RunExpired", "RunInfo", "RunLeased",
        "RunOptions", "RunRecord", "SerializationError", "Status", "StepEntry", "StepFailed",
        "TerminalError", "TokenUsage", "Tool", "UnknownRun", "UnserializableResult",
        "UnsupportedClientCall", "approve", "assistant_message",
        "batch", "cancel", "copy_run", "delete", "execute", "get_run", "item_keys",
        "load_ipython_extension", "map", "open_journal",
        "register_type", "reject", "rerun_from", "reset", "runs", "tool", "tracing",
        "unload_ipython_extension"}
    for name in durable_nb.__all__:
        assert getattr(durable_nb, name).__doc__, f"{name} has no docstring"


def test_every_error_is_a_durable_error():
    errors = [getattr(durable_nb, n) for n in durable_nb.__all__
              if isinstance(getattr(durable_nb, n), type)
              and issubclass(getattr(durable_nb, n), Exception)]
    assert len(errors) == 29
    assert all(issubclass(e, durable_nb.DurableError) for e in errors)


def test_core_runs_without_jupyter_dask_or_postgresql_packages(tmp_path):
    code = f"""
import sys
for blocked in ("IPython", "ipywidgets", "ipykernel", "nbformat", "comm", "distributed",
                "dask", "psycopg", "psycopg_pool"):
    sys.modules[blocked] = None  # any import of these now fails
import durable_nb
calls = []
def agent(ctx):
    return ctx.run("step", lambda: calls.append(1) or "ok")
assert durable_nb.execute("r", agent, journal={str(tmp_path)!r}) == "ok"
assert durable_nb.execute("r", agent, journal={str(tmp_path)!r}) == "ok"
assert calls == [1]
print("core ok")
"""
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=60)
    assert proc.stdout.strip() == "core ok", proc.stderr
