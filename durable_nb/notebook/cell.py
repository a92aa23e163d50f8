"""A ``%%durable_agent`` cell as a run's handler, and the notebook's ``ctx``.

The cell body runs in the notebook's namespace (the variables it sets stay). Its ``ctx`` is
one object, :data:`CTX`, that stands for the Context of whichever run executes in the calling
flow: the cell resumed in the background after an approval and another cell running in the
foreground each see their own run, and ``ctx`` used in a later cell, when no run executes,
raises :class:`~durable_nb.errors.ContextNotActive` instead of writing into a finished run.
"""

from __future__ import annotations

import ast
import inspect
import linecache
from typing import Any, Callable

from ..context import Context, current_context
from ..errors import ContextNotActive
from .output import route_of_this_thread, route_output

__all__ = ["CTX", "CurrentContext", "compile_cell"]

_RESULT_NAME = "__durable_result__"


class CurrentContext:
    """``ctx`` in a notebook: the Context of the run executing in this thread or task."""

    def __getattr__(self, name: str) -> Any:
        return getattr(current_context(), name)

    def __dir__(self) -> list[str]:
        return [name for name in dir(Context) if not name.startswith("_")]

    def __repr__(self) -> str:
        try:
            return repr(current_context())
        except ContextNotActive:
            return "<durable_nb ctx: no run executes here; use it inside a %%durable_agent cell>"


#: The ``ctx`` every ``%%durable_agent`` cell sees.
CTX = CurrentContext()


def compile_cell(source: str, run_id: str, namespace: dict) -> Callable[[Any], Any]:
    """The cell body as a handler: it runs in ``namespace`` (the user's) with ``ctx`` set,
    and returns the value of a final expression, as a cell would display it."""
    filename = f"<durable_agent {run_id}>"
    # Registered so that tracebacks show the cell's lines.
    linecache.cache[filename] = (len(source), None, source.splitlines(True), filename)
    tree = ast.parse(source, filename)
    if tree.body and isinstance(tree.body[-1], ast.Expr):
        last = tree.body[-1]
        tree.body[-1] = ast.copy_location(
            ast.Assign(targets=[ast.Name(_RESULT_NAME, ast.Store())], value=last.value), last)
        ast.fix_missing_locations(tree)
    code = compile(tree, filename, "exec", flags=ast.PyCF_ALLOW_TOP_LEVEL_AWAIT)
    namespace["ctx"] = CTX

    def handler(_ctx: Any) -> Any:
        namespace.pop(_RESULT_NAME, None)
        if code.co_flags & inspect.CO_COROUTINE:  # top-level await: the runner awaits it
            route = route_of_this_thread()

            async def run_async_cell() -> Any:
                # The runner may await this on a thread of its own: print where the cell does.
                restore = route_output(route[0], tee=route[1]) if route is not None else None
                try:
                    await eval(code, namespace)
                finally:
                    if restore is not None:
                        restore()
                return namespace.pop(_RESULT_NAME, None)

            return run_async_cell()
        exec(code, namespace)
        return namespace.pop(_RESULT_NAME, None)

    return handler
