"""Running a compiled LangGraph graph as part of a durable run: :func:`invoke`, :func:`ainvoke`,
:func:`stream` and :func:`astream`, LangGraph's own four ways, with ``ctx`` first.

Each runs ``graph`` (a ``StateGraph`` compiled, an ``@entrypoint``, ``create_react_agent``'s or
``create_agent``'s graph) with the run's checkpointer (:func:`checkpointer_for`, in place of the
graph's own) on the thread ``ctx.run_id`` unless the config names another: a second invocation
on the thread goes on from the first's state. When the graph stops
at ``interrupt()``, each interrupt is asked as a request of the run
(:mod:`.interrupts`) and the graph resumes with the decisions
(``Command(resume={interrupt id: value})``), until it ends without one. Without a decision the
run parks (WAITING_APPROVAL; the cell ends) and executing it again after the decision replays
the journaled calls up to the interrupt and goes on.
"""

from __future__ import annotations

import weakref
from collections.abc import AsyncIterator, Iterator
from typing import Any

from .calls import install
from .interrupts import resume_value
from .state import ExecutionSaver
from .tasks import Invocation

__all__ = ["ainvoke", "astream", "checkpointer_for", "invoke", "stream"]

# Model and tool calls are journaled from the moment the integration is imported.
install()


#: The checkpointer of each execution of a run (see checkpointer_for).
_savers: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def checkpointer_for(ctx: Any) -> Any:
    """The checkpointer a graph runs with in ``ctx``'s run, the same for every graph this
    execution of the run invokes (a second ``invoke`` on the thread goes on from the first's
    state, as a conversation does). It holds, at each execution of the run, the graph's state
    as it was when the execution started, rebuilt by the replay (an in-memory saver per
    execution: every model and tool call replays from the journal), and keeps the run's
    thread on the run's journal once the execution is live, so that ``graph.get_state`` and
    the history can be read from the journal in any process (:class:`.state.ExecutionSaver`
    says why and when)."""
    saver = _savers.get(ctx._ex)
    if saver is None:
        saver = _savers[ctx._ex] = ExecutionSaver(ctx._ex)
    return saver


def _prepared(ctx: Any, graph: Any, config: dict | None, options: dict) -> tuple[Any, dict]:
    # Each checkpoint written before the next superstep makes a step: the journal position
    # noted with it is where a fork from it cuts the run (.state).
    options.setdefault("durability", "sync")
    durable = graph.copy(update={"checkpointer": checkpointer_for(ctx)})
    config = dict(config or {})
    config["configurable"] = {"thread_id": ctx.run_id, **(config.get("configurable") or {})}
    return durable, config


def _interrupted(state: Any) -> list[tuple[str, Any]]:
    """(node name, Interrupt) of each interrupt the graph stopped at, in task order."""
    return [(task.name, interrupt) for task in state.tasks for interrupt in task.interrupts]


def _resume(ctx: Any, interrupts: list[tuple[str, Any]]) -> Any:
    from langgraph.types import Command

    return Command(resume={interrupt.id: resume_value(ctx, node, interrupt.value,
                                                      getattr(interrupt, "response_schema", None))
                           for node, interrupt in interrupts})


def invoke(ctx: Any, graph: Any, input: Any, config: dict | None = None, **options: Any) -> Any:
    """``graph.invoke(input, config, **options)`` as part of ``ctx``'s run (see the module
    docstring): every model and tool call a journaled step, every interrupt a request.
    Returns what ``graph.invoke`` returns after the last interrupt."""
    durable, config = _prepared(ctx, graph, config, options)
    with Invocation(ctx._ex):
        result = durable.invoke(input, config, **options)
        while interrupts := _interrupted(durable.get_state(config)):
            result = durable.invoke(_resume(ctx, interrupts), config, **options)
    return result


async def ainvoke(ctx: Any, graph: Any, input: Any, config: dict | None = None,
                  **options: Any) -> Any:
    """:func:`invoke` for ``graph.ainvoke``, in an async cell or handler."""
    durable, config = _prepared(ctx, graph, config, options)
    with Invocation(ctx._ex):
        result = await durable.ainvoke(input, config, **options)
        while interrupts := _interrupted(await durable.aget_state(config)):
            result = await durable.ainvoke(_resume(ctx, interrupts), config, **options)
    return result


def stream(ctx: Any, graph: Any, input: Any, config: dict | None = None,
           **options: Any) -> Iterator[Any]:
    """``graph.stream(input, config, **options)`` as part of ``ctx``'s run: LangGraph's
    chunks, across interrupts (each asked when the stream before it ends). Replayed model
    calls yield their message at once."""
    durable, config = _prepared(ctx, graph, config, options)
    with Invocation(ctx._ex):
        yield from durable.stream(input, config, **options)
        while interrupts := _interrupted(durable.get_state(config)):
            yield from durable.stream(_resume(ctx, interrupts), config, **options)


async def astream(ctx: Any, graph: Any, input: Any, config: dict | None = None,
                  **options: Any) -> AsyncIterator[Any]:
    """:func:`stream` for ``graph.astream``, in an async cell or handler."""
    durable, config = _prepared(ctx, graph, config, options)
    with Invocation(ctx._ex):
        async for chunk in durable.astream(input, config, **options):
            yield chunk
        while interrupts := _interrupted(await durable.aget_state(config)):
            async for chunk in durable.astream(_resume(ctx, interrupts), config, **options):
                yield chunk
