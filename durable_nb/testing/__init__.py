"""A loopback OpenAI-compatible server with scripted, deterministic replies.

Used by the project's tests and its offline demo through the real ``openai`` client::

    with LoopbackServer([Reply(tool_calls=[ToolCall("read_csv", {"path": "a.csv"})]), "done"]) as srv:
        client = openai.OpenAI(base_url=srv.url, api_key="any")
        client.chat.completions.create(model="loopback-1", messages=[...])
        client.responses.create(model="loopback-1", input="...")

Endpoints: ``POST /v1/chat/completions``, ``POST /v1/responses``, ``GET /v1/models`` and
``GET /_stats`` (the counters of :meth:`LoopbackServer.stats`); and Anthropic's Messages API,
``POST /v1/messages`` (whole, or streamed as its events), answered from the same script
(:mod:`durable_nb.testing.anthropic`; a client's ``base_url`` is the server's root there),
counted with the chat requests by round, validated only for its required fields.

Guarantees:

- The reply depends on the request alone: its *round* is the number of assistant turns already
  in the request, and the reply is ``script[round]`` (past the end of the script, a plain
  final text ``"done"``). In ``messages`` every ``assistant`` message is a turn. In a
  Responses ``input`` a turn starts at every assistant message and at every ``function_call``
  item that does not directly follow an assistant message or another ``function_call``, so
  one response's output (an optional message, then its function calls) counts once. Ids
  (completion, response and item ids, tool-call ids ``call_{round}_{i}``) are derived from the
  request too, so a restarted server, or one in another process, answers the same request
  the same way.
- Requests are validated like the real API (missing model, messages or input, unknown roles
  or item types, tool results that answer no tool call, tool calls left unanswered, bad
  token caps, invalid JSON) and refused with HTTP 400 and the OpenAI error JSON, so the
  client raises ``openai.BadRequestError``.
- Every response carries ``usage``, counted with :mod:`durable_nb.llm.tokens` for the requested
  model (the API's billing rule, offline).
- Token caps are honoured like the real API: a reply longer than ``max_tokens`` /
  ``max_completion_tokens`` (chat) or ``max_output_tokens`` (responses) is cut to exactly
  the cap (text first, then tool calls, whose arguments may be cut to invalid JSON), with
  ``finish_reason="length"`` or ``status="incomplete"``.
- ``stream=True`` answers with ``chat.completion.chunk`` server-sent events ending in
  ``data: [DONE]`` (with a final ``choices: []`` usage chunk when
  ``stream_options.include_usage`` is set), or with the Responses event sequence
  (``response.created`` ... ``response.completed``).
- A request whose first system (or developer) message, or whose ``instructions``, contains
  ``summary_marker`` is a summarisation request: it gets a short deterministic summary and
  is counted apart.

A test can hold streams: :meth:`LoopbackServer.hold_streams` makes every streamed reply wait
after its first event until the returned :class:`StreamHold` is released, so a client can be
shown to see chunks before the server finished sending.

Faults, for testing retry logic: :meth:`LoopbackServer.fail_next` answers the next valid
requests with an HTTP error (any status >= 400, an optional body and ``retry-after``), and
:meth:`LoopbackServer.drop_next` resets the connection without answering.

Quirks of real OpenAI-compatible servers, each an explicit switch of :class:`Quirks` (all
off by default, so the default server behaves like OpenAI): ``no_stream_usage``,
``repeat_tool_call_ids``, ``require_content``, ``require_string_content`` and
``ignore_completion_caps`` (llama-cpp-python), ``loading_for`` and
``final_empty_choices_usage`` (llama-server), ``extra_prompt_tokens`` (both),
``chunk_per_token`` (streamed text one token per chunk, as all of them send it),
``sparse_replies`` (fields a client can do without left out, as llama-server leaves them
out of Responses replies) and ``no_usage``. They apply to chat completions; of them only
``loading_for``, ``extra_prompt_tokens``, ``sparse_replies`` and ``no_usage`` apply to
``/v1/responses`` too. Requests are answered at ``/v1/...`` and at Azure OpenAI's paths
(``/openai/deployments/NAME/chat/completions?api-version=...``, ``/openai/responses``).

What answers (:mod:`.scripts`): a script of replies taken round by round (:data:`DEMO_SCRIPT`,
the offline demo's, is ``LoopbackServer()``'s default), or :data:`ECHO`, the generic mode for
your own cells (:class:`Echo`: the last user message echoed, the first offered tool called with
arguments made from its schema, a final text after tool results). The replies are scripted,
not a model's: every response says so in the ``X-Loopback-Script`` header (``echo``, ``demo``
or ``script``), and ``/v1/models`` in ``owned_by``.

Run ``python -m durable_nb.testing [--port P] [--script echo|demo|FILE.json] [--quirks a,b=2]``
to serve in the foreground (``echo`` unless told); the first stdout line is
``LOOPBACK_URL=http://127.0.0.1:PORT/v1``, the second says what answers.

The modules: :mod:`.scripts` (what is answered), :mod:`.requests` (what is read and refused),
:mod:`.replies` (what is sent), :mod:`.quirks` (real servers' behaviours), :mod:`.server` (the
HTTP server, its faults and counters), :mod:`.command` (the command line).
"""

from __future__ import annotations

from .command import main
from .quirks import Quirks
from .scripts import DEMO_SCRIPT, ECHO, Echo, Reply, ToolCall, example_arguments, load_script
from .server import SCRIPT_HEADER, LoopbackServer, StreamHold

__all__ = [
    "DEMO_SCRIPT",
    "ECHO",
    "SCRIPT_HEADER",
    "Echo",
    "LoopbackServer",
    "Quirks",
    "Reply",
    "StreamHold",
    "ToolCall",
    "example_arguments",
    "load_script",
    "main",
]
