"""Where the model and tool calls of a LangGraph task take their step keys, whatever thread or
asyncio task LangGraph runs the task on.

A graph run through :func:`~durable_nb.integrations.langgraph.invoke` (or its siblings) is an
:class:`Invocation`: a scope of the caller's (``langgraph#N``, the N-th invocation there), with
one scope per LangGraph task inside it, named after what LangGraph itself makes deterministic:
the node (with the subgraph nodes above it), the superstep and, for the tasks a ``Send`` or a
functional ``@task`` call pushes, their path. So the first model call of node ``agent`` at step
1 is step ``langgraph#0.agent_1#0.0``, the tool call after it ``langgraph#0.tools_2#0.0``, the
same keys at every execution, in a thread pool or on an event loop.

LangGraph runs a node again from its start after an ``interrupt()`` is answered and when its
``RetryPolicy`` retries it. The calls its earlier attempt made in this execution are handed
back in order, without a step (:meth:`TaskCalls.take`); its calls past them are new steps. So a
side effect before ``interrupt()`` happens once. A tool call that stopped at its own
``interrupt()`` is journaled as that stop but not handed back: the next attempt makes the call
again, as the next step of its scope, in a live execution and in a replay alike.
"""

from __future__ import annotations

import hashlib
import re
import threading
import types
from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import Any

from ...execution import Scope, current_scope
from ...execution.scope import current_flow

__all__ = ["Invocation", "TaskCalls", "current_invocation", "task_calls"]

_NAME_UNSAFE = re.compile(r"[^A-Za-z0-9_]+")

#: The invocation whose graph runs in this flow (LangGraph copies the context into the
#: threads and tasks that run its nodes).
_INVOCATION: ContextVar["Invocation | None"] = ContextVar("durable_nb_langgraph", default=None)


@dataclass
class TaskCalls:
    """The journaled calls of one LangGraph task in this execution, and where its current
    attempt is among them."""

    scope: Scope
    attempt: Any  # the Runtime LangGraph gives each attempt of the task
    outcomes: list[tuple[Any, bool, Any]] = field(default_factory=list)
    position: int = 0

    def take(self, what: Any) -> tuple[bool, Any] | None:
        """The outcome of the next call of a re-run attempt, if its earlier attempt made it
        (``what``: the call's kind, name and inputs; another call there is a new step)."""
        if self.position >= len(self.outcomes) or self.outcomes[self.position][0] != what:
            return None
        _, ok, value = self.outcomes[self.position]
        self.position += 1
        return ok, value

    def keep(self, what: Any, ok: bool, value: Any) -> None:
        """Note a call's outcome for a later attempt of the task."""
        del self.outcomes[self.position:]
        self.outcomes.append((what, ok, value))
        self.position += 1


class Invocation:
    """One graph invocation in a run: its scope in the caller's and its tasks' scopes."""

    def __init__(self, execution: Any) -> None:
        caller = execution.scope()
        self.execution = execution
        self.scope = caller.task_scope(types.SimpleNamespace(__name__="langgraph"))
        execution.task_created(self.scope)
        execution.opened(self.scope)
        self.lock = threading.Lock()
        self.scopes: dict[tuple, Scope] = {}
        self.tasks: dict[tuple[str, str | None], TaskCalls] = {}
        self.token: Any = None

    def __enter__(self) -> Invocation:
        self.token = _INVOCATION.set(self)
        return self

    def __exit__(self, *exc: Any) -> None:
        try:
            _INVOCATION.reset(self.token)
        except ValueError:  # a stream closed in another context (collected unfinished)
            pass
        for scope in [*self.scopes.values(), self.scope]:
            scope.closed = True  # a straggling thread's call is refused, not keyed by timing
            self.execution.ended(scope)

    def _child(self, parent: Scope, base: str, number: int) -> Scope:
        scope = Scope(self.execution, f"{parent.path}.{base}#{number}", None, parent=parent)
        numbers = parent.numbers
        with numbers.lock:
            numbers.tasks[base] = max(numbers.tasks.get(base, 0), number + 1)
        self.execution.task_created(scope)
        self.execution.opened(scope)
        return scope

    def _scope(self, names: tuple[str, ...], step: int, path: tuple, sub: str | None) -> Scope:
        identity = (names, step, repr(path), sub)
        scope = self.scopes.get(identity)
        if scope is not None:
            return scope
        if sub is not None:  # a tool call of the task, keyed by the model's id for it
            scope = self._child(self._scope(names, step, path, None),
                                _NAME_UNSAFE.sub("_", sub).strip("_") or "call", 0)
        else:
            base = _NAME_UNSAFE.sub("_", "_".join((*names, str(step)))).strip("_") or "task"
            # A node's pulled task is #0; tasks pushed to it (Send, @task calls) by their path.
            number = 0 if path[:1] == ("__pregel_pull",) else int(
                hashlib.sha256(repr(path).encode()).hexdigest()[:6], 16) + 1
            scope = self._child(self.scope, base, number)
        self.scopes[identity] = scope
        return scope

    def task(self, config: Any, sub: str | None = None) -> TaskCalls | None:
        """The calls of the LangGraph task running this code (``config`` its runnable
        config), or of its tool call ``sub`` (the model's id for it: a ToolNode runs a
        message's tool calls on threads at once, each keyed by its id); None outside a task
        of this invocation's graph."""
        from langgraph.runtime import get_runtime

        metadata = (config or {}).get("metadata") or {}
        if "langgraph_step" not in metadata:
            return None
        try:
            runtime = get_runtime()
        except RuntimeError:  # no runnable context in this flow
            return None
        info = getattr(runtime, "execution_info", None)
        if info is None:
            return None
        names = tuple(part.split(":")[0] for part in info.checkpoint_ns.split("|") if part)
        with self.lock:
            calls = self.tasks.get((info.task_id, sub))
            if calls is None:
                scope = self._scope(names, int(metadata["langgraph_step"]),
                                    tuple(metadata.get("langgraph_path") or ()), sub)
                calls = self.tasks[(info.task_id, sub)] = TaskCalls(scope, runtime)
            elif calls.attempt is not runtime:  # resumed after an interrupt, or retried
                calls.attempt = runtime
                calls.position = 0
        calls.scope.owner = current_flow()
        return calls


def current_invocation() -> Invocation | None:
    """The invocation whose graph runs in this flow, if any."""
    invocation = _INVOCATION.get()
    scope = current_scope()
    if invocation is None or scope is None or scope.execution is not invocation.execution:
        return None
    return invocation


def task_calls(config: Any) -> TaskCalls | None:
    """The calls of the LangGraph task running in this flow, when it belongs to a graph a
    durable run invoked."""
    invocation = current_invocation()
    return None if invocation is None else invocation.task(config)
