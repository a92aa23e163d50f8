"""What the agent loop sees: ``ctx``, the contract user code programs against.

Rule of thumb: anything that touches the world (an LLM, a tool, the clock, randomness, a
person) goes through a ``ctx`` method, because those are journaled. Code between them runs
again on every replay and must take the same path given the same step results.
"""

from __future__ import annotations

import random as _random
import time
import uuid as _uuid
from collections.abc import Iterable, Iterator, MutableMapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable, TypeVar

from . import serde
from .errors import ContextNotActive, SerializationError
from .execution import Execution, canonical, current_scope
from .approvals.decision import Decision
from .approvals.policy import approvers_list
from .approvals.policy import ApprovalPolicy, Duration
from .execution.retry import RetryPolicy
from .llm.toolcalls import call_tools

# The methods that talk to a model import durable_nb.llm's openai-based modules when first
# called: `import durable_nb` (every command, every kernel) does not pay for importing openai.
if TYPE_CHECKING:  # durable_nb.mcp needs the mcp extra: imported when used
    from .llm.durable_client import DurableAsyncOpenAI, DurableOpenAI
    from .llm.tools import Tool
    from .mcp.connection import Server as McpServer

__all__ = ["Context", "DurableState", "TokenUsage", "current_context"]

T = TypeVar("T")


@dataclass(frozen=True)
class TokenUsage:
    """Tokens the run's LLM calls used so far (each journaled call counted once)."""

    prompt: int
    completion: int

    @property
    def total(self) -> int:
        return self.prompt + self.completion


class DurableState(MutableMapping):
    """A per-run mapping of JSON values that survives restarts.

    Every assignment or deletion is a journaled step (kind ``state``, named by the key), so
    the mapping is rebuilt by replay. An assignment stores a copy of the value (the copy
    replay would rebuild), so changing the assigned object afterwards changes nothing here.
    Reads are free.
    """

    def __init__(self, execution: Execution) -> None:
        self._ex = execution

    def __getitem__(self, key: str) -> Any:
        return self._ex.state[key]

    def __setitem__(self, key: str, value: Any) -> None:
        # A copy, as replay gets one: changing the caller's object afterwards changes neither
        # the state nor what this step was asked.
        try:
            copy = serde.decode(serde.encode(value))
        except SerializationError as exc:
            raise SerializationError(f"ctx.state[{key!r}] cannot hold this value: {exc}") from None
        self._change(key, {"set": copy})

    def __delitem__(self, key: str) -> None:
        if key not in self._ex.state:
            raise KeyError(key)
        self._change(key, {"delete": True})

    def _change(self, key: str, change: dict) -> None:
        if not isinstance(key, str):
            raise TypeError(f"ctx.state keys are str, not {type(key).__name__}")
        applied = self._ex.step("state", key, lambda: change, inputs=canonical(change))
        with self._ex.lock:
            if "set" in applied:
                self._ex.state[key] = applied["set"]
            else:
                self._ex.state.pop(key, None)

    def __iter__(self) -> Iterator[str]:
        return iter(self._ex.state)

    def __len__(self) -> int:
        return len(self._ex.state)

    def __repr__(self) -> str:
        return f"DurableState({self._ex.state!r})"


class Context:
    """The durable context of one run, handed to the agent loop as ``ctx``.

    Steps are matched with the journal by key: the n-th ``ctx`` call of the handler (or of an
    asyncio task, or of a step's function) on replay must be the same kind and name, with the
    same inputs, as the n-th such call of the first execution, or replay stops with
    :class:`~durable_nb.errors.JournalMismatch` / :class:`~durable_nb.errors.InputChanged`
    before returning anything stale. A Context works only in the flows of its execution
    (the handler, its tasks, the steps' functions); elsewhere it raises
    :class:`~durable_nb.errors.ContextNotActive`.
    """

    #: What ctx is as a step's input (``ctx.run(name, fn, ctx)``): the same on every replay
    #: (and the text that fingerprinted it by type before inputs were compared by value).
    __durable_input__ = "<durable_nb.context.Context>"

    def __init__(self, execution: Execution) -> None:
        self._ex = execution
        self.state = DurableState(execution)

    # -- identity and accounting -----------------------------------------------------------

    @property
    def run_id(self) -> str:
        """The run's id."""
        return self._ex.run_id

    @property
    def step_id(self) -> str:
        """A key unique to the current step and stable across replays and restarts: inside a
        ``ctx.run`` function, that step's; elsewhere, the next step's. Hand it to external
        APIs as an idempotency key so that a step retried after a crash is not applied twice."""
        return f"{self._ex.run_id}:{self._ex.step_key()}"

    @property
    def iteration(self) -> int:
        """How many LLM calls (``ctx.chat``, ``ctx.respond``) the run made so far, replayed
        ones included."""
        return self._ex.iteration

    @property
    def tokens(self) -> TokenUsage:
        """Tokens used by the run's LLM calls so far, replayed ones included."""
        return TokenUsage(self._ex.prompt_tokens, self._ex.completion_tokens)

    @property
    def replaying(self) -> bool:
        """True while steps are answered from the journal."""
        return self._ex.replaying

    # -- steps -------------------------------------------------------------------------

    def run(self, name: str, fn: Callable[..., T], *args: Any, retry: RetryPolicy | None = None,
            **kwargs: Any) -> T:
        """Run ``fn(*args, **kwargs)`` as a durable step named ``name``.

        The first time, ``fn`` runs and its result is journaled before it is returned; on
        replay the journaled result is returned and ``fn`` is not called. An exception is
        retried under ``retry`` (default: one attempt); a :class:`TerminalError` or an
        exception not retried is journaled and raised again, same type and message, on
        replay. The result must be JSON data, a pydantic model or a registered type.

        The arguments are the step's inputs, compared by value: called again with other
        arguments (an edited cell), or with arguments where it had none, replay stops with
        :class:`~durable_nb.errors.InputChanged` rather than return the old result. An
        argument that has no value to compare (a client, a data frame) is refused with
        :class:`~durable_nb.errors.SerializationError` before ``fn`` runs: pass its data, or
        hand it to ``fn`` through a closure.
        ``ctx`` calls inside ``fn`` are steps of their own, replayed with it.
        """
        return self._ex.step("run", name, fn, args, kwargs, retry=retry,
                             inputs=_call_inputs(args, kwargs))

    async def run_async(self, name: str, fn: Callable[..., Any], *args: Any,
                        retry: RetryPolicy | None = None, **kwargs: Any) -> Any:
        """:meth:`run` for a coroutine function: ``await ctx.run_async(name, fn, ...)``.

        Steps in tasks started together (``asyncio.gather``) run concurrently; each task's
        steps have keys of their own, so a replay matches whatever order they finish in.
        """
        return await self._ex.step_async("run", name, fn, args, kwargs, retry=retry,
                                         inputs=_call_inputs(args, kwargs))

    @property
    def openai(self) -> DurableOpenAI:
        """An ``openai.OpenAI`` stand-in for libraries that take a client:
        ``chat.completions.create`` is :meth:`chat` and ``responses.create`` is
        :meth:`respond` (streamed or not); anything else raises
        :class:`~durable_nb.errors.UnsupportedClientCall` rather than go unjournaled. It
        wraps the run's ``client=`` when that is a sync client, else one from the
        environment (see :mod:`durable_nb.llm.durable_client`)."""
        from .llm.durable_client import DurableOpenAI

        client = self._ex.options.client
        return DurableOpenAI(self._ex, None if _is_async(client) else client)

    @property
    def async_openai(self) -> DurableAsyncOpenAI:
        """:attr:`openai` as an ``openai.AsyncOpenAI`` stand-in (what the OpenAI Agents SDK
        and Pydantic AI take): its live streams yield the server's chunks as they arrive. It
        wraps the run's ``client=`` when that is an async client, else one from the
        environment."""
        from .llm.durable_client import DurableAsyncOpenAI

        client = self._ex.options.client
        return DurableAsyncOpenAI(self._ex, client if _is_async(client) else None)

    async def chat_async(self, **kwargs: Any) -> Any:
        """:meth:`chat` with an ``openai.AsyncOpenAI`` (or ``AsyncAzureOpenAI``) client
        (default: one from the environment): ``await ctx.chat_async(model=..., messages=...)``,
        streamed or not."""
        from .llm.chat import chat_async

        return await chat_async(self._ex, kwargs)

    def chat(self, **kwargs: Any) -> Any:
        """A journaled ``client.chat.completions.create(**kwargs)``; returns the real
        ``ChatCompletion`` (rebuilt from the journal on replay).

        ``client=`` picks the client: any OpenAI-compatible one (``openai.OpenAI``,
        ``AzureOpenAI``, a custom ``base_url``); default ``openai.OpenAI()`` (or
        ``AzureOpenAI()``) from the environment, or the run's client. ``model`` defaults to
        the run's model. Counts one iteration and adds the response's usage to the run's
        tokens and cost. Append the reply to the history with
        :func:`durable_nb.assistant_message`.

        Transient failures (connection errors, timeouts, 408, 409, 429, 502-504, a 500 that
        is not about the request) are retried: at most 4 attempts, 60 s of waiting in all,
        the client's own retries turned off; ``retry=RetryPolicy(...)`` changes the attempts
        and delays. A request the server refuses fails at once. Either way the error is an
        :class:`~durable_nb.llm.endpoints.EndpointError` naming the URL and the step to continue
        from. Stops the run (FAILED, resumable) before a call that could pass
        max_iterations, max_tokens or max_cost (see :mod:`durable_nb.llm.budget`).

        With ``stream=True`` the reply's text is shown in the panel as it arrives and the
        assembled ``ChatCompletion`` is journaled and returned, the same as without
        streaming: a reply cut at its token cap comes back with ``finish_reason="length"``;
        tool calls are assembled even from servers that repeat ids and names in every
        delta; without usage from the server, the usage is estimated (the entry's meta says
        ``estimated``). A replay returns it at once.

        The request (model, messages, tools and the options that change the answer) is
        journaled, each message once per run; replayed with another request (an edited
        prompt), it stops with :class:`~durable_nb.errors.InputChanged` naming what changed.
        """
        from .llm.chat import chat

        return chat(self._ex, kwargs)

    def respond(self, **kwargs: Any) -> Any:
        """A journaled ``client.responses.create(**kwargs)`` (the Responses API); returns
        the real ``openai.types.responses.Response``, rebuilt from the journal on replay.

        Like :meth:`chat`: one iteration, usage (input, output, cached and reasoning tokens)
        counted, budgets, retries, errors, ``client=``, ``retry=``, the run's model; with
        ``stream=True`` the text is shown as it arrives and the final ``Response`` is
        journaled. Tool calls: ``input += response.output`` then
        ``input += ctx.call_tools(response, tools)``.
        """
        from .llm.responses import respond

        return respond(self._ex, kwargs)

    async def respond_async(self, **kwargs: Any) -> Any:
        """:meth:`respond` with an async client: ``await ctx.respond_async(...)``."""
        from .llm.responses import respond_async

        return await respond_async(self._ex, kwargs)

    def compact(self, messages: Any, keep_last: int = 4, threshold: float = 0.6,
                model: str | None = None, summary_model: str | None = None, *,
                tools: Any = None, client: Any = None) -> list[Any]:
        """Return ``messages``, or when their estimated prompt tokens (with ``tools``) pass
        ``threshold`` of ``model``'s context window, a shorter list: the system messages and
        the user's goal (everything up to the first user message), a user message with a
        summary of the older rounds, and the last ``keep_last`` rounds verbatim.

        A round is an assistant message with the tool messages that answer it (and the user
        messages just before it); rounds are never split. The summary is written by one
        journaled LLM call (a ``compact`` step, ``summary_model`` defaulting to ``model``,
        which defaults to the run's model; ``client`` as for :meth:`chat`) that folds a
        previous summary in; its tokens count toward the run, and it becomes the run's
        ``context_summary``. Below the threshold nothing is journaled. On replay the
        journaled summary rebuilds the same list without a call. The default threshold
        leaves room for the summary call itself (see ``durable_nb.llm.compaction``).
        Messages may be dicts or openai message objects; a compacted list holds dicts.
        """
        from .llm.compaction import compact

        return compact(self._ex, messages, keep_last=keep_last, threshold=threshold,
                       model=model, summary_model=summary_model, tools=tools, client=client)

    def call_tools(self, message: Any, tools: Any, *, parallel: bool = False) -> list[dict]:
        """Run every tool call of an assistant ``message`` (or of a Responses API
        ``Response``: its ``function_call`` output items) with the matching function of
        ``tools`` (``@durable_nb.tool`` objects or plain functions) and return the answers
        to append, in call order: ``tool`` messages for a chat message,
        ``function_call_output`` items for a Response.

        Each call is a journaled step named after its tool; tools that need approval ask for
        it first, and a rejection becomes an answer telling the model so. Unknown tools,
        bad JSON, arguments that do not fit the schema and exceptions raised by the tool come
        back as error messages for the model. ``parallel=True`` runs the calls concurrently,
        each with its own step key. A tool that raises :class:`~durable_nb.errors.TerminalError`
        fails the run.
        """
        return call_tools(self._ex, self, message, tools, parallel=parallel)

    def mcp_tools(self, server: McpServer, *,
                  needs_approval: bool | str | Iterable[str] = False,
                  prefix: str = "") -> list[Tool]:
        """The tools of an MCP server (``durable_nb.mcp.stdio(...)``, ``durable_nb.mcp.http(...)``)
        for :meth:`call_tools`, their schemas as the server gave them. The list is a journaled
        step: a replay offers the model what it saw, and a server whose tools changed since
        stops it with :class:`~durable_nb.errors.InputChanged`. Each call is a journaled step
        named after the tool, its step id sent in ``_meta`` (``durable-nb/step-id``);
        ``needs_approval``: True, or tool names or glob patterns (``["delete_*"]``) that ask
        for approval first. Needs ``pip install "durable-nb[mcp]"``; see
        :mod:`durable_nb.mcp`."""
        from .mcp import mcp_tools

        return mcp_tools(self._ex, server, needs_approval=needs_approval, prefix=prefix)

    def approval(self, name: str, details: Any = None, timeout: Duration | None = None,
                 on_timeout: str = "reject", escalate_to: str | Sequence[str] | None = None,
                 remind: Duration | Sequence[Duration] | None = None, *,
                 approvers: str | Iterable[str] | None = None,
                 schema: dict | None = None) -> Decision:
        """Ask a person to approve ``name`` (``details`` is shown to them, JSON data).

        The run is WAITING_APPROVAL until someone decides: the panel's buttons,
        ``durable_nb.approve/reject``, ``%durable approve``, ``durable-nb approve`` from any
        process. The decision is journaled; on replay it is returned at once.

        ``timeout`` (seconds, a ``timedelta``, or ``"90s"``, ``"30m"``, ``"2h"``, ``"1d"``)
        is a deadline kept in the journal: with no decision by then, ``on_timeout`` decides
        (``by="timeout"``), whether or not a kernel is alive: ``"reject"`` (the default),
        ``"approve"``, or ``"escalate"`` to the approvers ``escalate_to`` (names or e-mail
        addresses), who get a second deadline as long, after which it is rejected.
        ``remind``: a duration, or several, before the deadline at which a reminder is sent
        through the notification channels. Bad values: :class:`ApprovalPolicyError`.

        ``approvers`` (Jupyter user names or e-mail addresses) are the only people who may
        decide this request, in place of the run's (``RunOptions.approvers``); anyone else
        is refused with :class:`~durable_nb.errors.NotAllowedToDecide`.

        ``schema``: the JSON schema of ``details["arguments"]`` (a tool call's): a person
        may then approve with edited arguments that fit it (:attr:`Decision.args`); a
        rejection may carry a message for the model (:attr:`Decision.message`).
        """
        policy = ApprovalPolicy.of(timeout, on_timeout, escalate_to, remind)
        decision = self._ex.approval(name, serde.encode(details), policy,
                                     approvers_list(approvers), schema)
        return Decision(bool(decision.get("approved")), decision.get("note"), decision.get("by"),
                        decision.get("args"), decision.get("message"), decision.get("answer"))

    def now(self) -> float:
        """The current Unix time, journaled: the same value on replay."""
        return self._ex.step("now", "now", time.time)

    def uuid(self) -> str:
        """A random UUID4 string, journaled: the same value on replay."""
        return self._ex.step("uuid", "uuid", lambda: str(_uuid.uuid4()))

    def random(self) -> float:
        """A random float in [0, 1), journaled: the same value on replay."""
        return self._ex.step("random", "random", _random.random)

    def sleep(self, seconds: float) -> None:
        """Sleep durably: the wake-up time is journaled first, so after a restart only the
        remainder is slept. Cancelling the run interrupts the sleep."""
        self._ex.sleep(seconds)

    def child(self, name: str, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        """Run ``fn(child_ctx, *args, **kwargs)`` as a sub-agent with its own journal.

        The child run's id is derived from this run's (``PARENT/NAME-POSITION``); its result
        is journaled here as one step, and its tokens count toward this run. A crash inside
        the child replays the child's completed steps when this run resumes.
        """
        return self._ex.child(name, fn, args, kwargs, _call_inputs(args, kwargs))

    def __repr__(self) -> str:
        return f"<durable_nb.Context run_id={self.run_id!r}>"


def _is_async(client: Any) -> bool:
    import openai

    return isinstance(client, openai.AsyncOpenAI)  # AsyncAzureOpenAI too


def _call_inputs(args: tuple, kwargs: dict) -> dict | None:
    if not args and not kwargs:
        return None
    return {"args": args, "kwargs": kwargs}


def current_context() -> Context:
    """The Context of the run executing in this flow (thread or asyncio task)."""
    scope = current_scope()
    if scope is None:
        raise ContextNotActive(
            "ctx is only available inside a %%durable_agent cell (or a handler given to "
            "durable_nb.execute) while its run executes: this code runs outside any run "
            "(a later cell, or a thread durable_nb did not start).")
    return Context(scope.execution)
