"""Behaviours of real OpenAI-compatible servers that the loopback server can imitate."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

__all__ = ["Quirks"]


@dataclass(frozen=True)
class Quirks:
    """Behaviours of real OpenAI-compatible servers that clients must survive.

    ``Quirks()`` is OpenAI's own behaviour. Measured on llama-cpp-python 0.3.36 (its
    ``llama_cpp.server``) and on llama.cpp's ``llama-server`` (see
    ``shared/real-llm/README.md``). All but ``loading_for``, ``extra_prompt_tokens``,
    ``sparse_replies`` and ``no_usage`` affect chat completions only.
    """

    no_stream_usage: bool = False
    """llama-cpp-python: streams never carry usage (no ``usage`` field, no usage chunk),
    whatever ``stream_options.include_usage`` says."""

    chunk_per_token: bool = False
    """A streamed chat reply's text one token per chunk, as OpenAI and both llama servers
    send it (off: about three chunks per text, which keeps the tests' streams short)."""

    repeat_tool_call_ids: bool = False
    """llama-cpp-python: every streamed tool-call delta piece repeats the call's ``id``,
    ``type`` and ``function.name`` (OpenAI sends them in the first piece only), so an
    accumulator that concatenates strings, such as the openai SDK's
    ``chat.completions.stream()``, ends up with ``"call_0_0call_0_0..."``."""

    require_content: bool = False
    """llama-cpp-python: a request with an assistant message that has no ``content`` key
    (a tool-call-only message dumped with ``exclude_none=True``) makes its chat template
    fail: HTTP 500 ``internal_server_error`` "'dict object' has no attribute 'content'",
    every time the same request is sent."""

    require_string_content: bool = False
    """llama-cpp-python: its request model wants every assistant message's ``content`` to be
    a string, so ``"content": null`` (a tool-call-only message as OpenAI returns it) fails the
    request's validation: HTTP 500 ``internal_server_error`` "... Input should be a valid
    string ...", every time the same request is sent. With ``require_content`` too, a missing
    ``content`` gives the template failure instead."""

    ignore_completion_caps: bool = False
    """llama-cpp-python (which ignores ``max_completion_tokens``; this switch ignores
    ``max_tokens`` too): the full scripted reply is sent, ``finish_reason`` never "length"."""

    loading_for: int = 0
    """llama-server while it loads its model: the first ``loading_for`` POST requests
    (chat completions or responses, valid or not, counted from server start) are answered
    503 ``{"error": {"code": 503, "message": "Loading model", "type": "unavailable_error"}}``
    before the request is parsed or validated; the client's ``e.body`` is the inner
    object. ``GET /v1/models``
    answers meanwhile, as llama-server's does. Counted as ``kind="failure"``, round None."""

    extra_prompt_tokens: int = 0
    """A server with a chat template of its own (llama.cpp's and llama-cpp-python's): it
    counts this many prompt tokens more than OpenAI's rule (:mod:`durable_nb.llm.tokens`) for
    every request, chat or responses, as SmolLM2's template does with the default system
    prompt it adds (measured: 31 prompt tokens for a lone "hi" that OpenAI's rule counts as
    8), so an offline estimate undercounts."""

    final_empty_choices_usage: bool = True
    """With ``stream_options.include_usage``: a last chunk with ``choices: []`` and the usage
    (OpenAI and llama-server), every other chunk with ``"usage": null``. On by default since
    it is OpenAI's behaviour; ``False`` puts the usage on the finish-reason chunk instead,
    as some other servers do."""

    sparse_replies: bool = False
    """Replies leave out fields OpenAI always sends and a client can do without, some of
    which the openai client's types mark required (it builds replies without validating
    them, so they work). Responses (as llama.cpp's llama-server answers, measured): a
    response holds only ``id``, ``object``, ``created_at``, ``completed_at``, ``status``,
    ``model``, ``output`` and ``usage``, whose ``input_tokens_details`` holds
    ``cached_tokens`` alone (openai 3.57 requires ``cache_write_tokens`` too) and which has
    no ``output_tokens_details``; streamed events carry such responses. Chat completions and
    their chunks: no ``created``, ``system_fingerprint``, ``refusal`` or ``logprobs``, and a
    usage without ``*_details``."""

    no_usage: bool = False
    """The server reports no usage at all: chat completions and chunks have no ``usage``
    (whatever ``stream_options`` says), Responses replies and events ``"usage": null``,
    Messages API replies zero tokens."""

    def __post_init__(self) -> None:
        for name in ("loading_for", "extra_prompt_tokens"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 0:
                raise ValueError(f"{name} must be a whole number >= 0, got {value!r}")

    @classmethod
    def parse(cls, spec: str) -> Quirks:
        """``"no_stream_usage,loading_for=2,final_empty_choices_usage=false"``: a bare name
        switches a quirk on; ``name=value`` sets it (a whole number or true/false)."""
        fields = {f.name: f for f in dataclasses.fields(cls)}
        values: dict[str, Any] = {}
        for entry in filter(None, (e.strip() for e in spec.split(","))):
            name, _, value = entry.partition("=")
            name = name.strip().replace("-", "_")
            if name not in fields:
                raise ValueError(f"unknown quirk {name!r}; known: {', '.join(fields)}")
            if fields[name].type in (int, "int"):
                try:
                    values[name] = int(value) if value else 1
                except ValueError:
                    raise ValueError(f"quirk {name} needs a whole number, got {value!r}") from None
            elif value.strip().lower() in ("", "1", "true", "on", "yes"):
                values[name] = True
            elif value.strip().lower() in ("0", "false", "off", "no"):
                values[name] = False
            else:
                raise ValueError(f"quirk {name} needs true or false, got {value!r}")
        return cls(**values)
