"""The package's shape: its public names, and a core that needs no Jupyter."""

import ast
import subprocess
import sys
from collections.abc import Iterator

import durable_nb


def test_exported_names_are_exactly_the_public_api():
    assert set(durable_nb.__all__) == {
        "ApprovalChanged", "ApprovalPolicyError", "CellSyntaxError", "DecisionNeeded", "DeliveryFailed", "InvalidAnswer", "McpServerUnavailable",
        "MissingExtra", "NotifyConfigError",
        "Batch", "BudgetExhausted", "CheckReport", "Context", "ContextNotActive", "CorruptEntry",
        "DatabaseError", "Decision", "DecisionExists", "DiskJournal", "DurableError", "DurableState",
        "EndpointError", "IncompatibleJournal", "InputChanged", "ItemResult", "Journal",
        "JournalError", "JournalMismatch", "JournalNotWritable", "JournalUnavailable",
        "JournalWriteError", "NoJournal", "NoPendingApproval", "NotAllowedToDecide", "NotJournaled",
        "Price", "PruneRefused", "PruneResult", "RefusedByHub", "RetentionError",
        "RetentionPolicy", "ReplayDiverged", "RetryPolicy", "RunCancelled", "RunCheck", "RunExpired",
        "RunInfo", "RunLeased",
        "RunOptions", "RunRecord", "SerializationError", "Status", "StepEntry", "StepFailed",
        "TerminalError", "TokenUsage", "Tool", "UnknownRun", "UnserializableResult",
        "UnsupportedClientCall", "approve", "assistant_message",
        "batch", "cancel", "check", "copy_run", "delete", "execute", "get_run", "item_keys",
        "load_ipython_extension", "map", "open_journal", "prune",
        "register_type", "reject", "rerun_from", "reset", "runs", "tool", "tracing",
        "unload_ipython_extension"}
    for name in durable_nb.__all__:
        assert getattr(durable_nb, name).__doc__, f"{name} has no docstring"


def test_every_error_is_a_durable_error():
    errors = [getattr(durable_nb, n) for n in durable_nb.__all__
              if isinstance(getattr(durable_nb, n), type)
              and issubclass(getattr(durable_nb, n), Exception)]
    assert len(errors) == 40
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
from collections.abc import Iterator

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


def _imports_at_run_time(tree: ast.Module) -> Iterator[ast.Import | ast.ImportFrom]:
    """The import statements of a module that run (at its import or in a function), not
    those under ``if TYPE_CHECKING:``."""
    def walk(node: ast.AST) -> Iterator[ast.Import | ast.ImportFrom]:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.If) and "TYPE_CHECKING" in ast.unparse(child.test):
                yield from (n for c in child.orelse for n in walk_one(c))
                continue
            yield from walk_one(child)

    def walk_one(node: ast.AST) -> Iterator[ast.Import | ast.ImportFrom]:
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            yield node
        yield from walk(node)

    yield from walk(tree)


def package_import_graph() -> dict[str, set[str]]:
    """Each module of durable_nb -> the modules of durable_nb it imports when it runs (at
    its import or lazily in a function; a package's ``__init__`` stands for the package)."""
    from pathlib import Path

    package = Path(durable_nb.__file__).parent
    modules: dict[str, Path] = {}
    for path in package.rglob("*.py"):
        parts = ("durable_nb",) + path.relative_to(package).with_suffix("").parts
        modules[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    graph: dict[str, set[str]] = {name: set() for name in modules}
    for name, path in modules.items():
        here = name if path.name == "__init__.py" else name.rpartition(".")[0]
        for node in _imports_at_run_time(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            else:
                base = node.module or ""
                if node.level:
                    anchor = here.split(".")[:len(here.split(".")) - node.level + 1]
                    base = ".".join(anchor + ([base] if base else []))
                targets = [f"{base}.{alias.name}" if f"{base}.{alias.name}" in modules
                           else base for alias in node.names]
            graph[name] |= {t for t in targets if t in modules and t != name}
    return graph


def test_the_package_imports_have_no_cycle():
    """Layers import downward: no chain of imports of the package's modules (lazy ones in
    functions included; ``TYPE_CHECKING`` ones, never run, left out) comes back to where it
    started. A cycle found is printed as its modules, each importing the next."""
    graph = package_import_graph()
    cycles, done = [], set()

    def visit(module: str, path: list[str]) -> None:
        for imported in sorted(graph[module]):
            if imported in path:
                cycles.append(path[path.index(imported):] + [imported])
            elif imported not in done:
                visit(imported, path + [imported])
        done.add(module)

    for module in sorted(graph):
        if module not in done:
            visit(module, [module])
    assert [" -> ".join(c) for c in cycles] == []
