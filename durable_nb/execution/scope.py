"""Step identity: which key a step gets, whatever the timing of concurrent work.

Every step is asked for in a *scope*, and gets the scope's next key. A scope belongs to one
*flow*, the thread or asyncio task that runs it, and only that flow may ask for steps in it:

- the run's root scope, keys ``0``, ``1``, ``2`` ...;
- the scope of a step's own function, so that steps made inside step ``3`` are ``3.0``,
  ``3.1`` ... (replay skips a journaled step's function, and with it these keys);
- the scope of each asyncio task created while a run executes, named after its coroutine and
  numbered per name in the creating scope: the first ``fetch`` task's steps are
  ``fetch#0.0``, ``fetch#0.1`` ... (Temporal and Restate scope commands the same way).

Tasks are numbered in the order they are created, which is program order in the flow that
creates them (``asyncio.gather(a(), b())`` creates its tasks before any of them runs), so the
numbering does not depend on which task finishes first. A task created by asyncio machinery
or a library gets its own name, so it does not shift the numbers of the user's tasks.

A task that asyncio creates on behalf of a caller that awaits it (``asyncio.wait_for`` on
3.10 and 3.11, ``asyncio.shield``) is *transparent*: it takes its steps and numbers its tasks
in the caller's scope, as the caller would have itself, so a step gets the same key whether
or not the standard library of this Python version wraps it in a task. The caller is
suspended meanwhile, so the numbering stays program order; a caller that goes on while the
task still runs (a cancelled ``shield``) may take no step until it ends.

The current scope lives in a context variable: each task and each thread that durable_nb
starts sees its own, and nobody else can rebind it.
"""

from __future__ import annotations

import asyncio
import contextvars
import re
import sys
import threading
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .cursor import Execution

__all__ = ["Scope", "current_flow", "current_scope", "enter", "install_task_numbering", "leave",
           "task_factory"]

_current: contextvars.ContextVar["Scope | None"] = contextvars.ContextVar(
    "durable_nb_scope", default=None)

_NAME_UNSAFE = re.compile(r"[^A-Za-z0-9_]+")


def current_flow() -> object:
    """The asyncio task running this code, or else this thread's id."""
    # _get_running_loop() answers None where current_task() would raise: this runs per step.
    loop = asyncio._get_running_loop()
    task = asyncio.current_task(loop) if loop is not None else None
    return task if task is not None else threading.get_ident()


def current_scope() -> "Scope | None":
    """The scope of the flow running this code, if it belongs to a run's execution."""
    return _current.get()


class _Numbers:
    """A scope's step and task counters, shared with its transparent scopes; ``holder`` is
    the scope whose flow may take steps with them now."""

    __slots__ = ("next", "tasks", "lock", "holder")

    def __init__(self, holder: "Scope") -> None:
        self.next = 0
        self.tasks: dict[str, int] = {}
        self.lock = threading.Lock()
        self.holder = holder


class Scope:
    """Where steps get their keys: a path and a counter, owned by one flow."""

    __slots__ = ("execution", "path", "owner", "parent", "is_step", "closed", "numbers")

    def __init__(self, execution: "Execution", path: str, owner: object,
                 parent: "Scope | None" = None, is_step: bool = False,
                 numbers: _Numbers | None = None) -> None:
        self.execution = execution
        self.path = path
        self.owner = owner
        self.parent = parent
        self.is_step = is_step
        self.closed = False
        self.numbers = numbers or _Numbers(self)

    def _child_path(self, part: str) -> str:
        return f"{self.path}.{part}" if self.path else part

    def next_key(self) -> str:
        """Take the next step key of this scope."""
        numbers = self.numbers
        with numbers.lock:
            number = numbers.next
            numbers.next += 1
        return self._child_path(str(number))

    def peek_key(self) -> str:
        """The key the next step of this scope will get."""
        return self._child_path(str(self.numbers.next))

    def step_scope(self, key: str) -> "Scope":
        """The scope of step ``key``'s function, owned by the flow that runs it."""
        return Scope(self.execution, key, current_flow(), parent=self, is_step=True)

    def task_scope(self, coroutine: Any) -> "Scope":
        """The scope of a new task running ``coroutine``, numbered per coroutine name."""
        name = _NAME_UNSAFE.sub("_", getattr(coroutine, "__name__", None) or "task") or "task"
        numbers = self.numbers
        with numbers.lock:
            number = numbers.tasks.get(name, 0)
            numbers.tasks[name] = number + 1
        return Scope(self.execution, self._child_path(f"{name}#{number}"), None, parent=self)

    def transparent_scope(self) -> "Scope":
        """A scope with this one's path and numbers, for a task its flow awaits."""
        return Scope(self.execution, self.path, None, parent=self, is_step=self.is_step,
                     numbers=self.numbers)

    def usable_here(self) -> str | None:
        """None if the running flow may take steps here, else why not."""
        if self.owner != current_flow():
            return "from a thread or task that durable_nb did not start for it"
        if self.numbers.holder is not self:
            return ("while a task it awaited (asyncio.shield, wait_for) still runs and takes "
                    "its step numbers")
        scope: Scope | None = self
        while scope is not None:
            if scope.closed:
                return f"in a task or thread that outlived its step {scope.path}"
            scope = scope.parent
        return None

    def __repr__(self) -> str:
        return f"<Scope {self.path or 'root'} of {self.execution.run_id!r}>"


#: asyncio functions that create a task for a caller that awaits it (the function called
#: from outside asyncio): its steps belong to the caller.
_AWAITED_FOR_CALLER = frozenset({"wait_for", "shield"})


def _created_for_awaiting_caller() -> bool:
    """Whether the task being created is made by asyncio for the code that called it, to
    await it (see the module docstring): the outermost of the asyncio frames creating it is
    ``wait_for`` or ``shield``, not ``gather``, ``create_task``, ``ensure_future`` ..."""
    frame = sys._getframe(2)  # the frame that called task_factory's caller
    outermost = None
    while frame is not None and frame.f_globals.get("__name__", "").startswith("asyncio."):
        outermost = frame.f_code.co_name
        frame = frame.f_back
    return outermost in _AWAITED_FOR_CALLER


def task_factory(loop: asyncio.AbstractEventLoop, coro: Any, **kwargs: Any) -> asyncio.Future:
    """An event loop task factory that gives each task created inside a run's scope a
    numbered scope of its own, or a transparent one (see the module docstring); other tasks
    pass through."""
    parent = _current.get()
    if parent is None:
        return asyncio.Task(coro, loop=loop, **kwargs)
    transparent = _created_for_awaiting_caller()
    scope = parent.transparent_scope() if transparent else parent.task_scope(coro)
    given = kwargs.pop("context", None)
    context = given.copy() if given is not None else contextvars.copy_context()
    context.run(_current.set, scope)
    # A Task copies the context current at its creation: created inside `context`, it runs
    # in (a copy of) it, on every Python version (3.10's Task takes no context argument).
    task = context.run(lambda: asyncio.Task(coro, loop=loop, **kwargs))
    scope.owner = task
    if transparent:
        _lend(scope, task)
    else:
        scope.execution.task_created(scope)
        scope.execution.opened(scope)
        task.add_done_callback(lambda _: scope.execution.ended(scope))
    return task


def _lend(scope: Scope, task: asyncio.Task) -> None:
    """Let ``task`` take steps with its caller's numbers until it ends."""
    numbers = scope.numbers
    lender = numbers.holder
    numbers.holder = scope

    def give_back(_: asyncio.Task) -> None:
        # Runs before the awaiting caller wakes (callbacks run in the order they were added).
        if numbers.holder is scope:
            numbers.holder = lender

    task.add_done_callback(give_back)


def install_task_numbering() -> None:
    """Number the tasks of the running event loop (durable_nb's own loops do this)."""
    asyncio.get_running_loop().set_task_factory(task_factory)


def enter(scope: "Scope") -> contextvars.Token:
    """Make ``scope`` current in this flow's context; returns the token to reset it."""
    return _current.set(scope)


def leave(token: contextvars.Token) -> None:
    _current.reset(token)
