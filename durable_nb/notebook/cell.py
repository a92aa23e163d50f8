"""A ``%%durable_agent`` cell as a run's handler, and the notebook's ``ctx``.

The cell body runs in the notebook's namespace (the variables it sets stay). Its ``ctx`` is
one object, :data:`CTX`, that stands for the Context of whichever run executes in the calling
flow: the cell resumed in the background after an approval and another cell running in the
foreground each see their own run, and ``ctx`` used in a later cell, when no run executes,
raises :class:`~durable_nb.errors.ContextNotActive` instead of writing into a finished run.

A batch cell (``%%durable_agent BATCH --over ITEMS``) runs its body once per item, many items
at once on threads: each execution of an item gets a namespace of its own, a shallow copy of
the notebook's namespace as it was when the cell started, with ``item``, ``index`` and ``ctx``
set (:func:`compile_item_cell`). Reading the notebook's variables works; what the body assigns
stays in the item's namespace, so items in flight never overwrite each other's variables.
"""

from __future__ import annotations

import ast
import inspect
import linecache
from typing import Any, Callable

from ..context import Context, current_context
from ..errors import ContextNotActive
from .output import route_of_this_thread, route_output

__all__ = ["CTX", "CurrentContext", "compile_cell", "compile_item_cell"]

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


def _compile(source: str, filename: str) -> Any:
    """The cell body as code whose final expression is stored in ``__durable_result__``."""
    # Registered so that tracebacks show the cell's lines.
    linecache.cache[filename] = (len(source), None, source.splitlines(True), filename)
    tree = ast.parse(source, filename)
    if tree.body and isinstance(tree.body[-1], ast.Expr):
        last = tree.body[-1]
        tree.body[-1] = ast.copy_location(
            ast.Assign(targets=[ast.Name(_RESULT_NAME, ast.Store())], value=last.value), last)
        ast.fix_missing_locations(tree)
    return compile(tree, filename, "exec", flags=ast.PyCF_ALLOW_TOP_LEVEL_AWAIT)


def _run(code: Any, namespace: dict) -> Any:
    """Execute the compiled body in ``namespace``: its final value, or for a body with
    top-level ``await`` a coroutine that the runner awaits."""
    namespace.pop(_RESULT_NAME, None)
    if code.co_flags & inspect.CO_COROUTINE:  # top-level await: the runner awaits it
        route = route_of_this_thread()

        async def run_async_cell() -> Any:
            # The runner may await this on a thread of its own: print where the cell does.
            restore = route_output(route) if route is not None else None
            try:
                await eval(code, namespace)
            finally:
                if restore is not None:
                    restore()
            return namespace.pop(_RESULT_NAME, None)

        return run_async_cell()
    exec(code, namespace)
    return namespace.pop(_RESULT_NAME, None)


def compile_cell(source: str, run_id: str, namespace: dict) -> Callable[[Any], Any]:
    """The cell body as a handler: it runs in ``namespace`` (the user's) with ``ctx`` set,
    and returns the value of a final expression, as a cell would display it."""
    code = _compile(source, f"<durable_agent {run_id}>")
    namespace["ctx"] = CTX
    return lambda _ctx: _run(code, namespace)


def compile_item_cell(source: str, batch_id: str, namespace: dict,
                      items: list[Any]) -> Callable[[Any, int], Any]:
    """The cell body as a batch handler ``handler(ctx, index)`` for ``items[index]``.

    Each call runs in a new dict: a shallow copy of ``namespace`` as it is now (when the
    cell starts), with ``item``, ``index`` and ``ctx`` set. So the body reads the notebook's
    variables, and its own assignments (``item``, loop variables, ``messages`` ...) stay with
    the item: items running at once on several threads never see each other's. Objects
    reached through the notebook's variables are shared, not copied: mutating them from
    several items at once is a data race (return values instead; the batch collects them).
    """
    code = _compile(source, f"<durable_agent {batch_id}>")
    snapshot = dict(namespace)

    def handler(_ctx: Any, index: int) -> Any:
        local = dict(snapshot)
        local.update(item=items[index], index=index, ctx=CTX)
        return _run(code, local)

    return handler
