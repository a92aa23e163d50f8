"""The package's shape: its public names, and a core that needs no Jupyter."""

import subprocess
import sys

import durable_nb


def test_exported_names_are_exactly_the_public_api():
    assert set(durable_nb.__all__) == {
        "ApprovalChanged", "ApprovalPolicyError", "CellSyntaxError", "DecisionNeeded", "DeliveryFailed", "InvalidAnswer", "McpServerUnavailable",
        "MissingExtra", "NotifyConfigError",
        "Batch", "BudgetExhausted", "Context", "ContextNotActive", "CorruptEntry",
        "DatabaseError", "Decision", "DecisionExists", "DiskJournal", "DurableError", "DurableState",
        "EndpointError", "IncompatibleJournal", "InputChanged", "ItemResult", "Journal",
        "JournalError", "JournalMismatch", "JournalNotWritable", "JournalUnavailable",
        "JournalWriteError", "NoJournal", "NoPendingApproval", "NotAllowedToDecide", "NotJournaled",
        "Price", "RefusedByHub", "ReplayDiverged", "RetryPolicy", "RunCancelled", "RunExpired", "RunInfo", "RunLeased",
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
    assert len(errors) == 38
    assert all(issubclass(e, durable_nb.DurableError) for e in errors)


def test_every_error_of_the_tree_is_exported_and_drawn():
    """The errors the docs name are importable from the package (``from durable_nb import
    ApprovalPolicyError``), as httpx exports its whole exception tree: every class of
    durable_nb.errors, each drawn in that module's tree, each the package's own object."""
    from durable_nb import errors

    tree = errors.__doc__
    for name in errors.__all__:
        cls = getattr(errors, name)
        assert issubclass(cls, errors.DurableError)
        assert getattr(durable_nb, name) is cls, f"{name} is not exported by durable_nb"
        assert f" {name} " in tree, f"{name} is not drawn in durable_nb.errors' tree"
    classes = {n for n, v in vars(errors).items()
               if isinstance(v, type) and issubclass(v, errors.DurableError)}
    assert classes == set(errors.__all__)


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


def test_the_version_is_the_one_pyproject_gives_the_package():
    from pathlib import Path

    try:
        import tomllib
    except ImportError:  # Python 3.10
        import tomli as tomllib

    pyproject = tomllib.loads((Path(__file__).resolve().parents[1] / "pyproject.toml").read_text())
    assert durable_nb.__version__ == pyproject["project"]["version"]


def test_no_module_imports_another_ones_private_names():
    """Layering and names: no module of the package takes a ``_name`` of another (a name
    another module needs is part of its module's interface)."""
    import ast
    from pathlib import Path

    package = Path(durable_nb.__file__).parent
    found = []
    for path in sorted(package.rglob("*.py")):
        where = path.relative_to(package).as_posix()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and (node.level or (node.module or "")
                                                     .startswith("durable_nb")):
                found += [f"{where}:{node.lineno} {a.name}" for a in node.names
                          if a.name.startswith("_") and not a.name.startswith("__")]
    assert found == []
