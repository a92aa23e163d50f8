"""OpenTelemetry traces of runs, in the GenAI semantic conventions (semconv v1.38.0, whose
GenAI part is in development), honest about replay.

Off unless :func:`tracing` turns it on, or ``OTEL_EXPORTER_OTLP_ENDPOINT`` is set and
``opentelemetry-exporter-otlp-proto-http`` is installed. Off, nothing of OpenTelemetry is
imported and a run costs one check of a module variable; this module itself imports
nothing but the standard library until tracing is on.

On, every :class:`~durable_nb.runner.Runner` observes its execution through a
:class:`TraceObserver` wrapped around its own observer (the panel, or none), so every
execution is traced from one place. Per attempt (:mod:`durable_nb.execution.attempts`) one trace:

- ``invoke_agent {title or run id}`` (INTERNAL), from the attempt's start to its end, with
  ``durable_nb.attempt``, ``gen_ai.conversation.id`` (the run id: a viewer groups a run's
  attempts by it) and what replay answered: ``durable_nb.replayed_steps``,
  ``durable_nb.replayed_tokens``, ``durable_nb.replayed_cost`` (USD, where priced);
- per executed LLM call ``chat {model}`` (CLIENT), with usage, finish reasons, cost and the
  server it went to;
- per executed tool call ``execute_tool {name}`` (INTERNAL), its call id taken from the
  model's reply that asked for it;
- per decided approval ``approval {name}`` (INTERNAL), from the request to the decision,
  with who decided;
- per other executed step ``{kind} {name}`` (INTERNAL).

A replayed step is not reported as a call: no span, no token metric; it is counted on its
attempt's span, which links to the span of the attempt that executed it (the ids each
attempt record keeps from its start). The attempt's span is current in the thread executing
it, so other instrumentations' spans are its children; with the official openai
instrumentation on, chat completion CLIENT spans are left to it. Timestamps are the
journal's. Message content goes in chat spans (``gen_ai.input.messages``,
``gen_ai.output.messages``, read from the journal) only when
``OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT`` asks for it; API keys never (the
journal does not hold them). A child run's attempt is a child span of its parent's
attempt. The spans of an executed step are emitted when the step has finished
(the journal has it).

A process that dies (SIGKILL, a crash, a kernel restarted while busy) takes with it its
attempt's span, never ended, and the spans of its finished steps the exporter had not sent
yet (a batch processor holds them for up to 5 s). The attempt that resumes the run closes
the dead one as ``died`` (:mod:`durable_nb.execution.attempts`) and sends them again from the
journal: the dead attempt's ``invoke_agent`` span under the ids it journaled when it began,
status ERROR, ended at its last step's end; the span of each step it executed, never of one
it replayed. A step's span id is derived from its attempt's span id and its position, alike
live and sent again, so a collector that keeps one span per id (Phoenix does) holds each
step once, whichever copy reached it first. They are sent, the exporter flushed, and only
then noted on the dead attempt (``spans_resent``) in the record that opens the new attempt:
a resume killed in between sends them again under the same ids, never loses them; once
noted, no resume sends them again. Not sent again: the GenAI metrics of those calls (a
metric has no id to keep it once) and, with the official openai instrumentation on, the
chat spans it made (their ids are its own). Choosing ids needs the OpenTelemetry SDK's
tracer; with another, spans keep the provider's ids and nothing is sent again.
"""

from __future__ import annotations

import hashlib
import os
import sys
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from .errors import DurableError
from .execution import NullObserver, attempts
from .version import __version__

__all__ = ["TraceObserver", "attempt_begun", "export_run", "send_run", "traced", "tracing",
           "workflow"]

# None: not decided yet (the environment is read at the first run); False: off; else the
# (tracer, meter) runs report to.
_state: Any = None
_lock = threading.Lock()


def tracing(tracer_provider: Any = None, meter_provider: Any = None, *,
            enabled: bool = True) -> None:
    """Trace every run from now on to ``tracer_provider`` (and its metrics to
    ``meter_provider``); the global providers when not given. ``enabled=False`` turns
    tracing off (the environment is not read again). Needs ``durable-nb[otel]``."""
    global _state
    if not enabled:
        _state = False
        return
    try:
        from opentelemetry import metrics, trace
    except ImportError:
        raise DurableError("tracing needs OpenTelemetry: pip install 'durable-nb[otel]'"
                           ) from None

    tracer = trace.get_tracer("durable_nb", __version__, tracer_provider,
                              schema_url=SCHEMA_URL)
    _chosen_ids(tracer)
    meter = metrics.get_meter("durable_nb", __version__, meter_provider, schema_url=SCHEMA_URL)
    _state = (tracer, _Metrics(meter))


SCHEMA_URL = "https://opentelemetry.io/schemas/1.38.0"


def _from_environment() -> None:
    """Tracing on when ``OTEL_EXPORTER_OTLP_ENDPOINT`` is set (and ``OTEL_SDK_DISABLED`` is
    not ``true``) and the OTLP exporter is installed: a batch exporter to that endpoint
    (``OTEL_SERVICE_NAME`` and the rest of the standard variables as the SDK reads them),
    unless the program set a tracer provider of its own.
    Otherwise off, silently."""
    global _state
    if not os.environ.get("OTEL_EXPORTER_OTLP_ENDPOINT") \
            or os.environ.get("OTEL_SDK_DISABLED", "").strip().lower() == "true":
        _state = False
        return
    try:
        from opentelemetry import trace
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import BatchSpanProcessor
    except ImportError:
        _state = False
        return
    provider = trace.get_tracer_provider()
    if not isinstance(provider, TracerProvider):  # the program set none: ours
        provider = TracerProvider()
        provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter()))
        trace.set_tracer_provider(provider)
    tracing(provider)


def _on() -> bool:
    if _state is None:
        with _lock:
            if _state is None:
                _from_environment()
    return bool(_state)


def traced(observer: Any, run_id: str, journal: Any) -> Any:
    """``observer``, or a :class:`TraceObserver` around it while tracing is on. An attempt's
    span is a child of the span current where the run executes (a batch's, or one of the
    program's own); a child run's, of its parent's attempt (it gets its parent's observer)."""
    if not _on():
        return observer
    tracer, meter = _state
    content = _capture_content() and journal
    if isinstance(observer, TraceObserver):
        return TraceObserver(observer.inner, run_id, tracer, meter, observer.attempt_span,
                             content)
    return TraceObserver(observer, run_id, tracer, meter, None, content)


def attempt_begun(observer: Any, record: Any, attempt: dict, journal: Any) -> None:
    """An attempt of the run begins (before the record that opens it is written): while
    traced, its span starts, and its ids go in the attempt (so that a later attempt can
    link to it from its trace); the spans of earlier attempts that died are sent again
    from ``journal`` (see the module docstring), and noted on them."""
    if not isinstance(observer, TraceObserver):
        return
    with observer._lock:
        observer._open(record, attempt, _traced_attempts(record))
        observer._make_current()
        observer._openai_spans = _openai_instrumented()
    context = observer.attempt_span.get_span_context()
    if context.is_valid and context.trace_flags.sampled:
        parent = getattr(observer.attempt_span, "parent", None)
        attempts.note_trace(attempt, f"{context.trace_id:032x}", f"{context.span_id:016x}",
                            f"{parent.span_id:016x}" if parent is not None else None)
        if observer._openai_spans:
            attempt["chat_spans_by"] = "openai-v2"
    _resend_died(observer, record, attempt, journal)


#: How long a resume waits for the exporter to send the spans of an attempt that died.
_FLUSH_MILLIS = 10_000


def _resend_died(observer: "TraceObserver", record: Any, attempt: dict, journal: Any) -> None:
    """Send the spans of the record's attempts that died traced and were not sent again yet,
    flush the exporter, and note them sent (the caller writes the record)."""
    due = [a for a in record.attempts or () if a is not attempt and a.get("end") == "died"
           and _recorded_ids(a) is not None and not a.get("spans_resent")]
    if not due or observer._ids is None:
        return
    from opentelemetry.metrics import NoOpMeter
    owners = _executors(record, attempt["n"])
    dead = {a["n"] for a in due}
    stop = max((end for _, end, n in owners if n in dead), default=0)
    entries = []
    for entry in journal.steps(record.run_id) if stop else ():
        if entry.position >= stop:
            break
        entries.append(entry)
    contexts = _traced_attempts(record)
    for died in due:
        sender = TraceObserver(NullObserver(), record.run_id, observer._tracer,
                               _Metrics(NoOpMeter("-")), None)
        sender._openai_spans = died.get("chat_spans_by") == "openai-v2"
        _send_attempt(sender, record, died, entries, contexts,
                      [(first, end) for first, end, n in owners if n == died["n"]])
    if _flush(observer._tracer):
        for died in due:
            attempts.note_spans_resent(died)


def _flush(tracer: Any) -> bool:
    """Export what the tracer's span processors hold; whether they say they did."""
    flush = getattr(getattr(tracer, "span_processor", None), "force_flush", None)
    return bool(flush(_FLUSH_MILLIS)) if callable(flush) else False


def _recorded_ids(attempt: dict) -> tuple[int, int, int | None] | None:
    """The trace id, span id and parent span id an attempt journaled; None if it has none
    (or the journal holds something else there)."""
    try:
        parent = attempt.get("parent_span_id")
        return (int(attempt["trace_id"], 16), int(attempt["span_id"], 16),
                int(parent, 16) if parent else None)
    except (KeyError, TypeError, ValueError):
        return None


def _traced_attempts(record: Any) -> dict[int, Any]:
    """The span context of each of the record's attempts that was traced (its ids kept)."""
    from opentelemetry.trace import SpanContext, TraceFlags
    contexts = {}
    for attempt in record.attempts or ():
        ids = _recorded_ids(attempt)
        if ids is not None:
            contexts[attempt["n"]] = SpanContext(ids[0], ids[1], is_remote=True,
                                                 trace_flags=TraceFlags(TraceFlags.SAMPLED))
    return contexts


class _ChosenIds:
    """The id generator of durable_nb's tracer: the provider's own, except for a span whose
    ids durable_nb chose just before starting it, in the same thread (a step's span, or the
    span of an attempt sent again under its journaled ids)."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self._chosen = threading.local()

    def choose(self, span_id: int, trace_id: int | None = None) -> None:
        """The ids of the next span this thread starts (``trace_id`` for a root span)."""
        self._chosen.ids = (span_id, trace_id)

    def clear(self) -> None:
        """Forget a choice the tracer did not take (it started no span)."""
        self._chosen.ids = None

    def generate_trace_id(self) -> int:
        ids = getattr(self._chosen, "ids", None)
        return ids[1] if ids is not None and ids[1] is not None \
            else self.inner.generate_trace_id()

    def generate_span_id(self) -> int:
        ids = getattr(self._chosen, "ids", None)
        if ids is None:
            return self.inner.generate_span_id()
        self._chosen.ids = None
        return ids[0]

    def is_trace_id_random(self) -> bool:
        random = getattr(self.inner, "is_trace_id_random", None)
        return bool(random()) if callable(random) else False


def _chosen_ids(tracer: Any) -> _ChosenIds | None:
    """The tracer's id generator, made one durable_nb can choose ids with (once per tracer);
    None for a tracer that is not the OpenTelemetry SDK's (it has no id generator)."""
    ids = getattr(tracer, "id_generator", None)
    if ids is None or isinstance(ids, _ChosenIds):
        return ids
    tracer.id_generator = ids = _ChosenIds(ids)
    return ids


def _step_ids_seed(trace_id: int, span_id: int) -> int:
    """What the span ids of an attempt's steps are derived from: a digest of its span's ids
    (once per attempt: a step's id then costs an addition)."""
    digest = hashlib.blake2b(trace_id.to_bytes(16, "big") + span_id.to_bytes(8, "big"),
                             digest_size=8)
    return int.from_bytes(digest.digest(), "big")


def _step_span_id(seed: int, position: int) -> int:
    """The span id of the step at ``position`` of the attempt whose steps' ``seed`` it is:
    the same each time it is sent, so a collector can keep it once; distinct per position."""
    return (seed + (position + 1) * 0x9E3779B97F4A7C15) & 0xFFFFFFFFFFFFFFFF or 1


def _executors(record: Any, before: int) -> list[tuple[int, int, int]]:
    """``(first, stop, n)``: the attempt ``n`` (of those before attempt ``before``) that
    executed the steps at positions ``first`` to ``stop - 1``. An attempt that executed from
    an earlier position replaced the steps after it."""
    owners: list[tuple[int, int, int]] = []
    for attempt in record.attempts or ():
        start, stop = attempt.get("from_step") or 0, attempt.get("at_step")
        if attempt["n"] >= before or stop is None or stop <= start:
            continue
        owners = [(first, min(end, start), n) for first, end, n in owners if first < start]
        owners.append((start, stop, attempt["n"]))
    return owners


def _openai_instrumented() -> bool:
    """Whether the official openai instrumentation (``opentelemetry-instrumentation-openai-v2``)
    is on in this process: it then reports each chat completion request as a CLIENT span, with
    the GenAI metrics, itself."""
    module = sys.modules.get("opentelemetry.instrumentation.openai_v2")
    return module is not None and module.OpenAIInstrumentor().is_instrumented_by_opentelemetry


def _capture_content() -> bool:
    """``OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT`` asks for messages in spans
    (``true``, ``span_only`` or ``span_and_event``)."""
    asked = os.environ.get("OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT", "")
    return asked.strip().lower() in ("true", "span_only", "span_and_event")


@contextmanager
def workflow(name: str, batch_id: str) -> Iterator[Callable[[Callable], Callable]]:
    """While tracing is on, an ``invoke_workflow {name}`` span current around a batch's
    execution. Gives ``carry``: a function that runs what it wraps (an item, on a pool's
    thread) with that span current, so that the attempts of the items are its children."""
    if not _on():
        yield lambda fn: fn
        return
    from opentelemetry import context, trace
    with _state[0].start_as_current_span(
            f"invoke_workflow {name}", kind=trace.SpanKind.INTERNAL, attributes={
                "gen_ai.operation.name": "invoke_workflow", "durable_nb.batch_id": batch_id}):
        current = context.get_current()

        def carry(fn: Callable) -> Callable:
            def in_span(*args: Any) -> Any:
                token = context.attach(current)
                try:
                    return fn(*args)
                finally:
                    context.detach(token)
            return in_span
        yield carry


class _Metrics:
    """The GenAI client metrics, for executed calls only."""

    def __init__(self, meter: Any) -> None:
        self.tokens = meter.create_histogram(
            "gen_ai.client.token.usage", unit="{token}",
            description="Number of input and output tokens used")
        self.duration = meter.create_histogram(
            "gen_ai.client.operation.duration", unit="s",
            description="GenAI operation duration")


def _ns(ts: float) -> int:
    return int(ts * 1e9)


class TraceObserver:
    """An observer that passes everything on to ``inner`` and turns the run's attempts and
    executed steps into spans (see the module docstring)."""

    def __init__(self, inner: Any, run_id: str, tracer: Any, metrics: _Metrics,
                 parent_span: Any, content_from: Any = None) -> None:
        self.inner = inner
        self._content_from = content_from  # the journal, when messages go in chat spans
        self.run_id = run_id
        self._tracer = tracer
        self._metrics = metrics
        self._parent_span = parent_span
        self.attempt_span: Any = None
        self._attempt_n: int | None = None
        # Choosing the ids of the spans it starts (None: the tracer is not the SDK's), and
        # the attempt span's ids that its steps' span ids are derived from.
        self._ids = _chosen_ids(tracer)
        self._steps_seed = 0
        self._lock = threading.Lock()
        self._replayed = [0, 0, 0.0, False]  # steps, tokens, dollars, any priced
        # The earlier attempts that executed what this one replays, and their spans.
        self._executors: list[tuple[int, int, int]] = []
        self._contexts: dict[int, Any] = {}
        self._linked: set[int] = set()
        # Live, with the official openai instrumentation on: its spans are the chat calls'.
        self._openai_spans = False
        self._current: tuple[Any, int] | None = None  # (context token, thread) made current
        self._tool_calls: list[tuple[str, str]] = []  # (name, call id) asked, not yet run

    def __getattr__(self, name: str) -> Any:
        # on_note, on_text ...: what the inner observer has, it keeps.
        return getattr(self.inner, name)

    # -- the observer protocol ------------------------------------------------------------

    def on_record(self, record: Any) -> None:
        self.inner.on_record(record)
        if record.run_id == self.run_id:
            with self._lock:
                self._follow_attempt(record)

    def on_step(self, entry: Any, replayed: bool) -> None:
        self.inner.on_step(entry, replayed)
        with self._lock:
            if replayed:
                self._count_replayed(entry)
            elif self.attempt_span is not None:
                self._emit(entry)

    # -- attempts ---------------------------------------------------------------------------

    def _follow_attempt(self, record: Any) -> None:
        attempt = record.attempts[-1] if record.attempts else None
        if self.attempt_span is not None and attempt is not None \
                and attempt["n"] == self._attempt_n and attempt.get("end") is not None:
            self._close(attempt)

    def _open(self, record: Any, attempt: dict, contexts: dict[int, Any],
              again: bool = False) -> None:
        """Start the attempt's span; ``contexts``: the spans of earlier attempts, by number,
        for the links of the steps it replays. ``again``: the attempt ran before; its span
        keeps the ids (and parent) it journaled, if it did."""
        from opentelemetry import trace
        name = record.title or record.run_id
        context = trace.set_span_in_context(self._parent_span) \
            if self._parent_span is not None else None
        ids = _recorded_ids(attempt) if again and self._ids is not None else None
        if ids is not None:
            context = _parent_context(ids)
            self._ids.choose(ids[1], ids[0])
        self._attempt_n = attempt["n"]
        self._replayed = [0, 0, 0.0, False]
        self._executors, self._contexts, self._linked = (
            _executors(record, attempt["n"]), contexts, set())
        try:
            self.attempt_span = self._tracer.start_span(
                f"invoke_agent {name}", context=context, kind=trace.SpanKind.INTERNAL,
                start_time=_ns(attempt["started_at"]), attributes={
                    "gen_ai.operation.name": "invoke_agent", "gen_ai.agent.name": name,
                    "gen_ai.conversation.id": record.run_id,
                    "durable_nb.run_id": record.run_id, "durable_nb.attempt": attempt["n"],
                    "durable_nb.attempt.from_step": attempt.get("from_step", 0)})
        finally:
            if ids is not None:
                self._ids.clear()
        opened = self.attempt_span.get_span_context()
        self._steps_seed = _step_ids_seed(opened.trace_id, opened.span_id)

    def _make_current(self) -> None:
        """The attempt's span is current in the thread that executes it until it ends: spans
        made meanwhile (the official openai instrumentation's, the program's own) are its
        children."""
        from opentelemetry import context, trace
        token = context.attach(trace.set_span_in_context(self.attempt_span))
        self._current = (token, threading.get_ident())

    def _close(self, attempt: dict, end_time: float | None = None) -> None:
        """End the attempt's span at ``end_time``, else when the attempt ended."""
        from opentelemetry import context
        from opentelemetry.trace import Status, StatusCode
        span, self.attempt_span = self.attempt_span, None
        if self._current is not None:
            token, thread = self._current
            self._current = None
            if thread == threading.get_ident():  # else that thread's context is not ours
                context.detach(token)
        steps, tokens, dollars, priced = self._replayed
        span.set_attributes({"durable_nb.replayed_steps": steps,
                             "durable_nb.replayed_tokens": tokens,
                             "durable_nb.executed_steps": attempt.get("executed", 0),
                             "durable_nb.attempt.end": str(attempt["end"])})
        if priced:
            span.set_attribute("durable_nb.replayed_cost", dollars)
        if attempt["end"] == "died":
            span.set_status(Status(StatusCode.ERROR, f"died: {attempts.END_WORDS['died']}"))
        elif attempt["end"] not in ("completed", "parked"):
            span.set_status(Status(StatusCode.ERROR, attempt.get("error") or attempt["end"]))
        span.end(end_time=_ns(end_time or attempt.get("ended_at") or attempt["started_at"]))

    def _count_replayed(self, entry: Any) -> None:
        counts = self._replayed
        counts[0] += 1
        counts[1] += entry.prompt_tokens + entry.completion_tokens
        cost = (entry.meta or {}).get("cost")
        if isinstance(cost, (int, float)) and not isinstance(cost, bool):
            counts[2] += cost
            counts[3] = True
        if entry.kind == "run":
            self._tool_call_id(entry.name, take=True)
        self._note_tool_calls(entry)  # a resumed attempt runs the calls a replayed reply asked
        self._link_executor(entry.position)

    def _link_executor(self, position: int) -> None:
        """Link the attempt's span to the span of the attempt that executed the replayed
        step at ``position`` (once per attempt; none when that one was not traced)."""
        for first, stop, n in self._executors:
            if first <= position < stop:
                if n not in self._linked and n in self._contexts \
                        and self.attempt_span is not None:
                    self._linked.add(n)
                    self.attempt_span.add_link(self._contexts[n], {
                        "durable_nb.attempt": n, "durable_nb.link": "replayed_steps_from"})
                return

    # -- executed steps ---------------------------------------------------------------------

    def _emit(self, entry: Any) -> None:
        meta = entry.meta or {}
        if entry.kind in ("chat", "respond", "model") or (entry.kind == "compact"
                                                          and "model" in meta):
            # openai's instrumentation reported chat calls already; a Pydantic AI model step
            # (kind "model") is any provider's, which it does not see.
            if not (self._openai_spans and entry.kind in ("chat", "compact")):
                self._chat(entry, meta)
            self._note_tool_calls(entry)
        elif entry.kind == "approval":
            result = entry.result if isinstance(entry.result, dict) else {}
            self._span(entry, f"approval {entry.name}", {
                "durable_nb.approval.approved": bool(result.get("approved")),
                "durable_nb.approval.by": str(result.get("by") or "")})
        elif entry.kind == "run" and self._tool_call_id(entry.name) is not None:
            call_id = self._tool_call_id(entry.name, take=True)
            self._span(entry, f"execute_tool {entry.name}", {
                "gen_ai.operation.name": "execute_tool", "gen_ai.tool.name": entry.name,
                "gen_ai.tool.type": "function",
                **({"gen_ai.tool.call.id": call_id} if call_id else {})})
        else:
            self._span(entry, f"{entry.kind} {entry.name}", {})

    def _span(self, entry: Any, name: str, attributes: dict, kind: Any = None) -> Any:
        from opentelemetry import trace
        from opentelemetry.trace import Status, StatusCode
        ids = self._ids
        if ids is not None:  # the same id each time this step's span is sent
            ids.choose(_step_span_id(self._steps_seed, entry.position))
        try:
            span = self._tracer.start_span(
                name, context=trace.set_span_in_context(self.attempt_span),
                kind=kind or trace.SpanKind.INTERNAL, start_time=_ns(entry.started_at),
                attributes={"durable_nb.step.key": entry.key,
                            "durable_nb.step.kind": entry.kind,
                            "durable_nb.step.position": entry.position, **attributes})
        finally:
            if ids is not None:
                ids.clear()
        if not entry.ok:
            error = entry.error or {}
            span.set_attribute("error.type", str(error.get("type") or "error"))
            span.set_status(Status(StatusCode.ERROR, str(error.get("message") or "")[:300]))
        span.end(end_time=_ns(max(entry.finished_at, entry.started_at)))
        return span

    def _chat(self, entry: Any, meta: dict) -> None:
        from opentelemetry import trace

        from .summary import llm_reply, plain
        request = entry.request if isinstance(entry.request, dict) else {}
        # A compaction's call is to its summary model.
        requested = str(request.get("summary_model") or request.get("model") or entry.name)
        attributes: dict[str, Any] = {
            "gen_ai.operation.name": "chat",
            # A Pydantic AI model step names its provider; "_OTHER" (the conventions' value
            # for one they do not list) when it has none (a FunctionModel).
            "gen_ai.provider.name": str(meta.get("provider") or (
                "_OTHER" if entry.kind == "model" else "openai")),
            "gen_ai.request.model": requested,
            "gen_ai.usage.input_tokens": entry.prompt_tokens,
            "gen_ai.usage.output_tokens": entry.completion_tokens}
        if entry.kind != "model":
            attributes["openai.api.type"] = ("responses" if entry.kind == "respond"
                                             else "chat_completions")
        if meta.get("model"):
            attributes["gen_ai.response.model"] = str(meta["model"])
        attributes.update(_server(meta.get("endpoint")))
        for key, name in (("cached", "gen_ai.usage.cache_read.input_tokens"),
                          ("reasoning", "durable_nb.usage.reasoning_tokens"),
                          ("cost", "gen_ai.usage.cost")):
            if isinstance(meta.get(key), (int, float)):
                attributes[name] = meta[key]
        for key, name in (("temperature", "gen_ai.request.temperature"),
                          ("max_tokens", "gen_ai.request.max_tokens"),
                          ("max_completion_tokens", "gen_ai.request.max_tokens"),
                          ("max_output_tokens", "gen_ai.request.max_tokens")):
            if isinstance(request.get(key), (int, float)):
                attributes[name] = request[key]
        if meta.get("estimated"):
            attributes["durable_nb.usage.estimated"] = True
        if entry.ok and entry.kind != "compact":
            result = plain(entry.result)
            reply = llm_reply(entry.kind, result)
            if reply is not None and reply.get("finish_reason"):
                attributes["gen_ai.response.finish_reasons"] = [str(reply["finish_reason"])]
            response_id = (result.get("provider_response_id") if entry.kind == "model"
                           else result.get("id")) if isinstance(result, dict) else None
            if response_id:
                attributes["gen_ai.response.id"] = str(response_id)
        if self._content_from and entry.kind != "compact":
            attributes.update(self._messages(entry))
        self._span(entry, f"chat {requested}", attributes, kind=trace.SpanKind.CLIENT)
        self._record_metrics(entry, attributes)

    def _messages(self, entry: Any) -> dict[str, str]:
        """``gen_ai.input.messages`` and ``gen_ai.output.messages`` of a chat (or respond)
        entry, as the conventions' JSON: the request's messages read from the journal."""
        import json

        from .summary import item_messages, llm_reply, load_chat_request, plain, request_items
        request, _ = load_chat_request(entry.kind, entry.request, lambda digest:
                                       self._content_from.get_blob(self.run_id, digest))
        messages = [_message_parts(m) for item in request_items(entry.kind, plain(request))
                    for m in item_messages(entry.kind, item) if isinstance(m, dict)]
        out = {"gen_ai.input.messages": json.dumps(messages, default=str)}
        reply = llm_reply(entry.kind, plain(entry.result)) if entry.ok else None
        if reply is not None:
            parts = [{"type": "text", "content": reply["content"]}] if reply["content"] else []
            parts += [{"type": "tool_call", "id": call["id"], "name": call["name"],
                       "arguments": call["arguments"]} for call in reply["tool_calls"]]
            out["gen_ai.output.messages"] = json.dumps([{
                "role": "assistant", "parts": parts,
                "finish_reason": str(reply["finish_reason"] or "")}], default=str)
        return out

    def _record_metrics(self, entry: Any, attributes: dict) -> None:
        common = {key: attributes[key] for key in (
            "gen_ai.operation.name", "gen_ai.provider.name", "gen_ai.request.model",
            "gen_ai.response.model") if key in attributes}
        if not entry.ok:
            common["error.type"] = str((entry.error or {}).get("type") or "error")
        self._metrics.duration.record(entry.duration, common)
        if entry.ok:
            self._metrics.tokens.record(entry.prompt_tokens,
                                        {**common, "gen_ai.token.type": "input"})
            self._metrics.tokens.record(entry.completion_tokens,
                                        {**common, "gen_ai.token.type": "output"})

    # -- tool call ids: a tool step is a ``run`` step named after a tool the model asked for

    def _note_tool_calls(self, entry: Any) -> None:
        if entry.kind not in ("chat", "respond", "model") or not entry.ok:
            return
        from .summary import llm_reply, plain
        reply = llm_reply(entry.kind, plain(entry.result)) or {}
        self._tool_calls = [(str(call.get("name")), str(call.get("id") or ""))
                            for call in reply.get("tool_calls") or ()]

    def _tool_call_id(self, name: str, take: bool = False) -> str | None:
        for i, (asked, call_id) in enumerate(self._tool_calls):
            if asked == name:
                if take:
                    del self._tool_calls[i]
                return call_id
        return None


def _server(endpoint: Any) -> dict[str, Any]:
    """``server.address`` and ``server.port`` of the endpoint the entry's call went to (its
    client's base URL, journaled without credentials); none for an entry journaled before
    the endpoint was."""
    import urllib.parse
    try:
        parts = urllib.parse.urlsplit(str(endpoint or ""))
        port = parts.port or {"https": 443, "http": 80}.get(parts.scheme)
    except ValueError:
        return {}
    if not parts.hostname:
        return {}
    return {"server.address": parts.hostname, **({"server.port": port} if port else {})}


def _message_parts(message: dict) -> dict[str, Any]:
    """One chat message in the conventions' shape: a role and its parts."""
    content = message.get("content")
    if message.get("role") == "tool":
        return {"role": "tool", "parts": [{"type": "tool_call_response",
                                           "id": message.get("tool_call_id"),
                                           "response": content}]}
    if isinstance(content, list):  # content parts: their text
        parts = [{"type": "text", "content": part.get("text")} for part in content
                 if isinstance(part, dict) and isinstance(part.get("text"), str)]
    else:
        parts = [{"type": "text", "content": content}] if content else []
    parts += [{"type": "tool_call", "id": call.get("id"),
               "name": (call.get("function") or {}).get("name"),
               "arguments": (call.get("function") or {}).get("arguments")}
              for call in message.get("tool_calls") or () if isinstance(call, dict)]
    return {"role": message.get("role"), "parts": parts}


def export_run(record: Any, entries: list, tracer: Any) -> int:
    """Send a run's finished attempts to ``tracer`` as the spans tracing would have made
    when they ran (the same names, attributes and journal timestamps; no metrics): for runs
    from before tracing was on, or from a machine without a collector. An attempt that was
    traced keeps its ids, and its steps' spans the ids they had, so a collector that keeps
    one span per id holds each once however often it is sent. An attempt still open
    (running, or whose process died before the next attempt closed it) is left out.
    Returns the number of attempts sent."""
    from opentelemetry.metrics import NoOpMeter
    sent = 0
    exported: dict[int, Any] = {}  # the spans sent here: what the later attempts link to
    for attempt in record.attempts or ():
        if attempt.get("end") is None:
            continue
        observer = TraceObserver(NullObserver(), record.run_id, tracer, _Metrics(NoOpMeter("-")),
                                 None)
        start, stop = attempt.get("from_step", 0), attempt.get("at_step", len(entries))
        exported[attempt["n"]] = _send_attempt(observer, record, attempt, entries,
                                               dict(exported), [(start, stop)])
        sent += 1
    return sent


def _send_attempt(observer: TraceObserver, record: Any, attempt: dict, entries: list,
                  contexts: dict[int, Any], executed: list[tuple[int, int]]) -> Any:
    """Send a finished attempt's spans through ``observer`` after the fact (its journaled
    ids kept): its span, and a span per step it executed at the positions ``executed``
    (``(first, stop)`` ranges) of ``entries``; one that died ends at its last step's end.
    Returns its span's context."""
    observer._open(record, attempt, contexts, again=True)
    start = attempt.get("from_step", 0)
    for entry in entries[:min(start, attempt.get("replayed", start))]:
        observer._count_replayed(entry)
    last_end = None
    for first, stop in executed:
        for entry in entries[first:stop]:
            observer._emit(entry)
            last_end = max(last_end or 0.0, entry.finished_at)
    context = observer.attempt_span.get_span_context()
    observer._close(attempt, last_end if attempt["end"] == "died" else None)
    return context


def _parent_context(ids: tuple[int, int, int | None]) -> Any:
    """The context to start an attempt's span in again: its journaled parent's, else an
    empty one (a root span, whatever span is current here)."""
    from opentelemetry import trace
    from opentelemetry.context import Context
    from opentelemetry.trace import SpanContext, TraceFlags
    trace_id, _, parent = ids
    if parent is None:
        return Context()
    return trace.set_span_in_context(trace.NonRecordingSpan(SpanContext(
        trace_id, parent, is_remote=True, trace_flags=TraceFlags(TraceFlags.SAMPLED))))



def send_run(record: Any, entries: list, url: str, timeout: float = 10.0) -> int:
    """``durable-nb trace RUN --to URL``: :func:`export_run` to the OTLP/HTTP collector at
    ``url`` (``/v1/traces`` added when missing; ``OTEL_SERVICE_NAME`` names the service,
    ``durable-nb`` by default), trying for ``timeout`` seconds. Returns the number of spans
    the collector took; raises :class:`DurableError` when it took none, or when the
    exporter is not installed."""
    try:
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
        from opentelemetry.sdk.resources import Resource
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import SimpleSpanProcessor, SpanExportResult
        from opentelemetry.sdk.trace.export.in_memory_span_exporter import (
            InMemorySpanExporter,
        )
    except ImportError as exc:
        raise DurableError(f"exporting a trace needs OpenTelemetry's OTLP exporter ({exc}): "
                           f"pip install 'durable-nb[otel]'") from None
    collected = InMemorySpanExporter()
    service = os.environ.get("OTEL_SERVICE_NAME") or "durable-nb"
    provider = TracerProvider(resource=Resource.create({"service.name": service}))
    provider.add_span_processor(SimpleSpanProcessor(collected))
    if not export_run(record, entries, provider.get_tracer("durable_nb", __version__,
                                                           schema_url=SCHEMA_URL)):
        raise DurableError(f"run {record.run_id!r} has no finished attempt to export (an "
                           f"attempt still running is exported once it ends)")
    spans = collected.get_finished_spans()
    endpoint = url if url.rstrip("/").endswith("/v1/traces") else url.rstrip("/") + "/v1/traces"
    exporter = OTLPSpanExporter(endpoint=endpoint, timeout=timeout)
    try:
        if exporter.export(spans) is not SpanExportResult.SUCCESS:
            raise DurableError(f"the collector at {endpoint} did not take the {len(spans)} "
                               f"spans of run {record.run_id!r}: is it running there?")
    finally:
        exporter.shutdown()
    return len(spans)
