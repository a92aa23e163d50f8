"""Where an MCP server is (:func:`stdio`, :func:`http`) and the one connection to it a
process keeps open (:func:`connection`).

The official ``mcp`` SDK is async and ties a connection to the task that opened it. A
kernel's cells come and go, sync or async, so each connection lives on a thread of its own
with its own event loop, opened on first use and kept until :func:`close` (or the
``with`` block of its server, or the process's exit). Any flow calls it synchronously:
the call is handed to that loop and its reply awaited, and a question the server asks
during the call (elicitation) is handed back to the calling flow, which journals the
answer (see :mod:`durable_nb.mcp.tools`).
"""

from __future__ import annotations

import asyncio
import atexit
import concurrent.futures
import contextvars
import dataclasses
import os
import queue
import sys
import threading
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Literal
from urllib.parse import urlsplit

from ..errors import McpServerUnavailable

__all__ = ["DEFAULT_PROTOCOL", "Connection", "ElicitHandler", "ProtocolMode", "Server", "close",
           "connection", "http", "stdio"]

#: ``(message, requested JSON schema) -> (action, content)``: answers a server's question
#: in the calling flow.
ElicitHandler = Callable[[str, dict], tuple[str, "dict | None"]]

#: How the client agrees on a protocol with a server: ``"legacy"``, the initialize handshake
#: (protocol 2025-11-25 and before); ``"auto"``, the SDK's own default (the 2026 protocol where
#: the server offers it, else the handshake); or a 2026-era version to speak without asking
#: (``"2026-07-28"``).
ProtocolMode = Literal["legacy", "auto"] | str

#: The handshake: the one protocol in which every server can ask its questions, whether it
#: asks with ``await ctx.elicit(...)`` (which needs a channel from the server to the client,
#: which the 2026 protocol does not have) or with the SDK's newer ``Elicit``/``Resolve`` form;
#: and the only one ``mcp`` 1.x servers speak.
DEFAULT_PROTOCOL: ProtocolMode = "legacy"

_CONNECT_TIMEOUT = 30.0
_CANCEL_TIMEOUT = 5.0
# How often a caller waiting for a reply looks whether the connection's thread still runs.
_LIVENESS_POLL = 1.0


@dataclasses.dataclass(frozen=True)
class Server:
    """Where an MCP server is: a command to start (:func:`stdio`) or a streamable-HTTP URL
    (:func:`http`). ``name`` names it in the journal and in error messages; the command's
    environment, the URL's query and the headers (credentials) are never journaled.

    Used as a context manager (``with durable_nb.mcp.stdio(...) as server:``), its
    connection is closed at the end of the block; otherwise it stays open for the process
    (a kernel) until :func:`close`."""

    name: str
    command: str | None = None
    args: tuple[str, ...] = ()
    env: Mapping[str, str] | None = dataclasses.field(default=None, compare=False, repr=False)
    cwd: str | None = None
    url: str | None = dataclasses.field(default=None, repr=False)  # may hold a credential
    headers: Mapping[str, str] | None = dataclasses.field(default=None, compare=False,
                                                           repr=False)
    protocol: ProtocolMode = DEFAULT_PROTOCOL

    @property
    def identity(self) -> tuple:
        """What makes two descriptions the same server (one connection for both)."""
        return (self.command, self.args, self.cwd, self.url,
                tuple(sorted((self.env or {}).items())),
                tuple(sorted((self.headers or {}).items())), self.protocol)

    def __enter__(self) -> Server:
        return self

    def __exit__(self, *exc: Any) -> None:
        close(self)


def stdio(command: str, *args: str, name: str | None = None, env: Mapping[str, str] | None = None,
          cwd: str | os.PathLike | None = None,
          protocol: ProtocolMode = DEFAULT_PROTOCOL) -> Server:
    """An MCP server started as ``command *args``, spoken to over its stdin and stdout.
    ``env`` is added to the kernel's environment for it (never journaled). ``protocol``:
    how the client agrees on a protocol with it (:data:`ProtocolMode`); the default, the
    handshake, lets the server ask its questions whichever way it asks them."""
    if not command:
        raise ValueError("durable_nb.mcp.stdio needs the command that starts the server, "
                         "e.g. stdio('python', 'server.py')")
    label = name or " ".join([os.path.basename(command), *(os.path.basename(a) for a in args)])
    return Server(name=label, command=command, args=tuple(str(a) for a in args),
                  env=dict(env) if env else None, cwd=os.fspath(cwd) if cwd else None,
                  protocol=_checked_protocol(protocol, "stdio"))


def http(url: str, *, name: str | None = None, headers: Mapping[str, str] | None = None,
         protocol: ProtocolMode = DEFAULT_PROTOCOL) -> Server:
    """An MCP server at a streamable-HTTP ``url`` (``http://host:port/mcp``). ``headers``
    (an ``Authorization`` token ...) are sent with every request and never journaled.
    ``protocol`` as for :func:`stdio`."""
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.netloc:
        raise ValueError(f"durable_nb.mcp.http needs an http(s) URL such as "
                         f"'http://127.0.0.1:8000/mcp', not {url!r}")
    host = parts.hostname or ""
    label = name or f"{host}{':' + str(parts.port) if parts.port else ''}{parts.path}"
    return Server(name=label, url=url, headers=dict(headers) if headers else None,
                  protocol=_checked_protocol(protocol, "http"))


def _checked_protocol(protocol: Any, where: str) -> ProtocolMode:
    """``protocol`` if the installed SDK can speak it; else a ValueError saying what can be."""
    from mcp_types.version import HANDSHAKE_PROTOCOL_VERSIONS, MODERN_PROTOCOL_VERSIONS

    choices = ("legacy", "auto", *MODERN_PROTOCOL_VERSIONS)
    if protocol in choices:
        return protocol
    hint = (f" ({protocol} is a version of the handshake: protocol='legacy' agrees on the "
            f"newest version both sides know)" if protocol in HANDSHAKE_PROTOCOL_VERSIONS
            else "")
    raise ValueError(f"durable_nb.mcp.{where}(protocol=...) takes "
                     f"{', '.join(repr(c) for c in choices)}, not {protocol!r}{hint}")


class Connection:
    """One open MCP client session to a server, on its own thread and event loop."""

    def __init__(self, server: Server) -> None:
        self.server = server
        self._loop = asyncio.new_event_loop()
        self._ready: concurrent.futures.Future = concurrent.futures.Future()
        self._closing: asyncio.Event | None = None
        # The calls in flight, by their handler: where a question the server asks goes.
        self._handlers: list[Callable[[Any], Any]] = []
        self._handler: contextvars.ContextVar = contextvars.ContextVar("durable_nb_mcp_call")
        self._thread = threading.Thread(target=self._loop.run_until_complete,
                                        args=(self._main(),), daemon=True,
                                        name=f"durable-nb-mcp {server.name}")
        self._thread.start()
        try:
            self.client = self._ready.result(_CONNECT_TIMEOUT)
        except concurrent.futures.TimeoutError:
            self.close()
            raise McpServerUnavailable(
                f"MCP server {server.name!r} did not answer within {_CONNECT_TIMEOUT:.0f} s "
                f"of starting: check that it runs on its own") from None

    async def _main(self) -> None:
        from mcp import Client

        self._closing = asyncio.Event()
        try:
            async with Client(self._target(), elicitation_callback=self._elicit,
                              mode=self.server.protocol) as client:
                self._ready.set_result(client)
                await self._closing.wait()
        except BaseException as exc:  # noqa: BLE001 - reported to whoever waits
            if not self._ready.done():
                self._ready.set_exception(McpServerUnavailable(
                    f"cannot connect to MCP server {self.server.name!r}: "
                    f"{_reason(exc)}"))
        finally:
            # Calls still in flight end now (McpServerUnavailable for their callers): once
            # this returns, the loop runs no more, and they would wait forever.
            rest = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
            for task in rest:
                task.cancel()
            await asyncio.gather(*rest, return_exceptions=True)

    def _target(self) -> Any:
        if self.server.url is not None:
            if not self.server.headers:
                return self.server.url
            import httpx
            from mcp.client.streamable_http import streamable_http_client

            return streamable_http_client(
                self.server.url, http_client=httpx.AsyncClient(headers=dict(self.server.headers)))
        from mcp.client.stdio import StdioServerParameters, stdio_client

        env = {**os.environ, **self.server.env} if self.server.env else None
        params = StdioServerParameters(command=self.server.command or "",
                                       args=list(self.server.args), env=env, cwd=self.server.cwd)
        return stdio_client(params, errlog=_server_log())

    async def _elicit(self, context: Any, params: Any) -> Any:
        import mcp_types as types

        handler = self._handler.get(None)
        if handler is None and len(self._handlers) == 1:
            # Sent mid-call outside the call's task: every question under the handshake.
            handler = self._handlers[0]
        if handler is None or getattr(params, "mode", "form") != "form":
            # Nobody to ask (several calls in flight), or a URL to open: not answered here.
            return types.ElicitResult(action="cancel")
        return await handler(params)

    @property
    def alive(self) -> bool:
        """Whether the connection's thread still serves it (False once the server went)."""
        return self._thread.is_alive() and not self._loop.is_closed()

    def list_tools(self) -> list[dict[str, Any]]:
        """Every tool the server offers now, as the server describes them (JSON data)."""
        async def listing() -> list[dict[str, Any]]:
            tools: list[dict[str, Any]] = []
            cursor = None
            while True:
                page = await self.client.list_tools(cursor=cursor, cache_mode="refresh")
                tools += [t.model_dump(mode="json", by_alias=True, exclude_none=True)
                          for t in page.tools]
                cursor = page.next_cursor
                if not cursor:
                    return tools

        return self._wait(asyncio.run_coroutine_threadsafe(listing(), self._loop), "tools/list")

    def call_tool(self, name: str, arguments: dict[str, Any], meta: dict[str, Any],
                  on_elicit: ElicitHandler) -> Any:
        """Call tool ``name``; its ``CallToolResult``. A question the server asks meanwhile
        is answered by ``on_elicit`` in this (the calling) flow; if ``on_elicit`` raises
        (the run parks, stops), the call is cancelled (the server is told so) first.
        An ``MCPError`` the server returns is raised as it is; a broken connection is
        :class:`~durable_nb.errors.McpServerUnavailable`."""
        questions: queue.SimpleQueue = queue.SimpleQueue()

        async def ask(params: Any) -> Any:
            reply: concurrent.futures.Future = concurrent.futures.Future()
            questions.put((params, reply))
            return await asyncio.wrap_future(reply)

        tasks: list[asyncio.Task] = []

        async def call() -> Any:
            tasks.append(asyncio.current_task())  # type: ignore[arg-type]
            self._handler.set(ask)
            self._handlers.append(ask)
            try:
                return await self.client.call_tool(name, arguments, meta=meta)
            finally:
                self._handlers.remove(ask)

        future = asyncio.run_coroutine_threadsafe(call(), self._loop)
        future.add_done_callback(lambda _: questions.put(None))
        while (question := self._next(questions, future, name)) is not None:
            params, reply = question
            try:
                action, content = on_elicit(params.message, dict(params.requested_schema or {}))
            except BaseException:
                self._abandon(tasks[0], reply)
                raise
            reply.set_result(_elicit_result(action, content))
        return self._wait(future, f"tools/call {name}")

    def _next(self, questions: queue.SimpleQueue, call: concurrent.futures.Future,
              name: str) -> Any:
        """The next question of a call in flight, or None once it ended; a connection whose
        thread ended meanwhile (it never will answer) is McpServerUnavailable."""
        while True:
            try:
                return questions.get(timeout=_LIVENESS_POLL)
            except queue.Empty:
                if not self._thread.is_alive() and not call.done():
                    self._wait(call, f"tools/call {name}")

    def _abandon(self, task: asyncio.Task, reply: concurrent.futures.Future) -> None:
        """Cancel a call whose question will not be answered now (the run parks or stops):
        the server is told the call is cancelled before its question gets an error, so the
        tool never goes on with an answer nobody gave."""
        import mcp_types as types

        async def cancel() -> None:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)

        try:
            asyncio.run_coroutine_threadsafe(cancel(), self._loop).result(_CANCEL_TIMEOUT)
        except BaseException:  # noqa: BLE001 - the connection is going away anyway
            pass
        if not reply.done():  # (a question asked inside the call's task ended with it)
            reply.set_result(types.ErrorData(code=types.INTERNAL_ERROR,
                                             message="the call was cancelled: nobody answers now"))

    def _wait(self, future: concurrent.futures.Future, what: str) -> Any:
        """The reply to a request: an error the server answered with is raised as it is (the
        step's outcome); a connection that broke is McpServerUnavailable (no outcome)."""
        from mcp.shared.exceptions import MCPError
        from mcp_types import CONNECTION_CLOSED

        try:
            while True:
                try:
                    return future.result(_LIVENESS_POLL)
                except concurrent.futures.TimeoutError:
                    if not self._thread.is_alive():  # its loop ended: nothing will answer
                        raise ConnectionError("the connection closed") from None
        except MCPError as exc:
            if exc.code != CONNECTION_CLOSED:
                raise  # the server's answer to this request: the step's outcome
            broken: BaseException = exc
        except Exception as exc:  # noqa: BLE001 - the transport's errors are many
            broken = exc
        # The connection broke: nothing answered the request.
        forget(self)
        raise McpServerUnavailable(
            f"MCP server {self.server.name!r} failed during {what}: {_reason(broken)}. "
            f"Nothing was journaled for it; run the cell again to reconnect and resume"
        ) from None

    def close(self) -> None:
        """Close the session (a stdio server's process ends) and stop the thread."""
        closing = self._closing
        if closing is not None and not self._loop.is_closed():
            self._loop.call_soon_threadsafe(closing.set)
        self._thread.join(10)


def _elicit_result(action: str, content: dict | None) -> Any:
    import mcp_types as types

    return types.ElicitResult(action=action, content=content)


def _server_log() -> Any:
    """Where a stdio server's stderr goes: the process's own stderr (a kernel's is the
    Jupyter server's log; a kernel's ``sys.stderr`` is a stream without a file descriptor,
    which a child process cannot be given), else nowhere."""
    for stream in (sys.stderr, sys.__stderr__):
        try:
            if stream is not None and stream.fileno() >= 0:
                return stream
        except (OSError, ValueError, AttributeError):
            continue
    return open(os.devnull, "w")  # noqa: SIM115 - kept open as long as the process


def _reason(exc: BaseException) -> str:
    while isinstance(exc, BaseExceptionGroup) and exc.exceptions:
        exc = exc.exceptions[0]
    return f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__


_lock = threading.Lock()
_open: dict[tuple, Connection] = {}


def connection(server: Server) -> Connection:
    """The process's open connection to ``server``, opened now if there is none (or the
    last one broke)."""
    with _lock:
        found = _open.get(server.identity)
        if found is not None and found.alive:
            return found
        made = _open[server.identity] = Connection(server)
        return made


def forget(conn: Connection) -> None:
    """Drop a broken connection, so that the next use opens a new one."""
    with _lock:
        if _open.get(conn.server.identity) is conn:
            del _open[conn.server.identity]
    threading.Thread(target=conn.close, daemon=True).start()


def close(server: Server | None = None) -> None:
    """Close the connection to ``server`` (a stdio server's process ends), or, without a
    server, every MCP connection of this process."""
    with _lock:
        if server is None:
            closing: Sequence[Connection] = list(_open.values())
            _open.clear()
        else:
            found = _open.pop(server.identity, None)
            closing = [found] if found is not None else []
    for conn in closing:
        conn.close()


atexit.register(close)
