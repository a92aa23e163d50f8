"""Every error durable_nb raises, in one tree.

::

    DurableError                      anything durable_nb raises on purpose
    ├── JournalError                  the journal cannot be used as asked
    │   ├── CorruptEntry              a stored entry cannot be read back
    │   ├── IncompatibleJournal       written by a newer, incompatible format version
    │   ├── NoJournal                 inspection asked for a journal where there is none
    │   ├── JournalNotWritable        the journal cannot be written (read-only directory, copy)
    │   ├── JournalWriteError         a write failed (disk full, database down): the run stopped
    │   ├── DatabaseError             the journal's database failed a query (also an OSError)
    │   │   └── JournalUnavailable    ... or cannot be reached (also a ConnectionError)
    │   └── UnknownRun                no run with that id
    ├── SerializationError            a value cannot be stored as JSON
    │   └── UnserializableResult      ... and it is a step's result (its side effect already ran)
    ├── JournalMismatch               the code asks for a different step than the journal holds
    │   └── InputChanged              ... the same step, asked with other inputs (an edited cell)
    ├── ReplayDiverged                a pure replay (verify_replay) did not reproduce the run
    ├── ContextNotActive              ctx used outside its run's execution (a later cell, a thread)
    ├── CellSyntaxError               a %%durable_agent cell's body is not valid Python
    ├── RunLeased                     another live executor holds the run (or took it over)
    ├── RunExpired                    the run passed its deadline (timeout)
    ├── RunCancelled                  the run was cancelled
    ├── BudgetExhausted               max_iterations, max_tokens or the context window would be passed
    ├── ApprovalPolicyError           an approval's timeout or on_timeout is wrong (a ValueError)
    ├── NoPendingApproval             approve/reject on a run that waits for nothing
    │   ├── ApprovalChanged           ... for the request that was seen: it waits for another
    │   └── DecisionExists            ... more: its request was decided already (who, when, how)
    ├── NotAllowedToDecide            this person may not decide this request (approvers, four-eyes)
    │   └── RefusedByHub              on a JupyterHub, only its durable-nb service writes decisions
    ├── StepFailed                    a journaled step failure whose type cannot be rebuilt
    │   └── EndpointError             an LLM call failed at its endpoint (URL, step, what to do)
    ├── McpServerUnavailable          an MCP server cannot be reached, or died mid-call
    ├── InvalidAnswer                 an edit, a message or an MCP answer that does not fit
    ├── NotJournaled                  refused: it would reach the world without a journaled step
    │   └── UnsupportedClientCall     ... a durable openai client method durable_nb does not journal
    ├── TerminalError                 raise it from a step: journaled, never retried
    ├── DecisionNeeded                a notebook stops until a person decides (Run All halts)
    ├── MissingExtra                  a feature's extra is not installed (also an ImportError)
    ├── NotifyConfigError             the notification configuration is wrong (also a ValueError)
    ├── RetentionError                a prune's options or a retention policy are wrong (a ValueError)
    ├── PruneRefused                  on a JupyterHub, only its durable-nb service prunes runs
    └── DeliveryFailed                one attempt to send a notification failed (recorded, never raised)

This module imports nothing else from the package, so any module can import it.
"""

from __future__ import annotations

import time

__all__ = [
    "ApprovalChanged",
    "ApprovalPolicyError",
    "BudgetExhausted",
    "CellSyntaxError",
    "ContextNotActive",
    "CorruptEntry",
    "DatabaseError",
    "DecisionExists",
    "DecisionNeeded",
    "DeliveryFailed",
    "DurableError",
    "EndpointError",
    "IncompatibleJournal",
    "InputChanged",
    "JournalError",
    "JournalMismatch",
    "JournalNotWritable",
    "JournalUnavailable",
    "JournalWriteError",
    "InvalidAnswer",
    "McpServerUnavailable",
    "MissingExtra",
    "NoJournal",
    "NoPendingApproval",
    "NotAllowedToDecide",
    "NotJournaled",
    "RefusedByHub",
    "NotifyConfigError",
    "PruneRefused",
    "ReplayDiverged",
    "RetentionError",
    "RunCancelled",
    "RunExpired",
    "RunLeased",
    "SerializationError",
    "StepFailed",
    "TerminalError",
    "UnknownRun",
    "UnsupportedClientCall",
    "UnserializableResult",
]


class DurableError(Exception):
    """Base class of every error durable_nb raises on purpose."""


class JournalError(DurableError):
    """The journal on disk cannot be used as asked."""


class CorruptEntry(JournalError):
    """A stored entry cannot be read back (truncated, edited by hand, or hostile).

    Only the named entry is affected; other steps and other runs stay readable.
    """

    def __init__(self, key: str, reason: str, *, run_id: str | None = None,
                 position: int | None = None) -> None:
        self.key = key
        self.run_id = run_id
        self.position = position
        where = f"run {run_id!r} step {position}" if position is not None else f"entry {key!r}"
        advice = ""
        if run_id is not None and position is not None:
            advice = (f" Other steps and runs are intact. To run from this step again: "
                      f"`durable-nb reset {run_id} --from {position}`.")
        elif run_id is not None:
            advice = (f" Other runs are intact. Remove this run with `durable-nb delete {run_id}`"
                      f" or start a new run id.")
        super().__init__(f"the journal entry for {where} cannot be read: {reason}.{advice}")


class IncompatibleJournal(JournalError):
    """The journal was written by a newer durable_nb with an incompatible format."""


class NoJournal(JournalError):
    """Inspection asked for a journal where there is none (nothing is created there)."""

    def __init__(self, location: str) -> None:
        self.location = location
        super().__init__(
            f"there is no journal at {location}: no run was ever recorded there. Point "
            f"--journal (or DURABLE_NB_DIR, DURABLE_NB_JOURNAL) at the directory or "
            f"postgresql:// URL that holds your runs; the default is ./.durable_nb in the "
            f"folder where the notebook or script ran.")


class JournalNotWritable(JournalError):
    """The journal cannot be written (a read-only directory, file system or copy)."""

    def __init__(self, location: str, reason: str) -> None:
        self.location = location
        super().__init__(
            f"the journal at {location} is not writable ({reason}). Executing, approving or "
            f"resetting a run writes to it: make the directory writable by you, or use another "
            f"one (--journal DIR or DURABLE_NB_DIR). `durable-nb runs`, `show` and `export` "
            f"work on a read-only journal.")


class DatabaseError(JournalError, OSError):
    """The journal's database failed a query (psycopg's error, password cut out). An
    :class:`OSError`, as a failed disk write is, so that an executing run treats a failed
    write the same on both backends: the run stops (or, with
    ``on_journal_error="continue"``, goes on not durable and retries the write)."""


class JournalUnavailable(DatabaseError, ConnectionError):
    """The journal's database cannot be reached (still, after a lost connection was tried
    again for the journal's ``retry_for``), or refused for lack of resources (disk full,
    too many connections, a lock or statement timeout)."""


class JournalWriteError(JournalError):
    """A journal write failed, and the run stopped there (``on_journal_error="stop"``, the
    default): executing it again resumes it from its journal."""


class UnknownRun(JournalError, KeyError):
    """No run with this id exists in the journal."""

    def __init__(self, run_id: str, directory: str) -> None:
        self.run_id = run_id
        super().__init__(
            f"no run {run_id!r} in the journal at {directory}. "
            f"List the runs with `durable-nb runs` (or `%durable runs`), or check DURABLE_NB_DIR."
        )

    __str__ = Exception.__str__  # KeyError would quote the message


class SerializationError(DurableError, TypeError):
    """A value cannot be stored as JSON in the journal."""


class UnserializableResult(SerializationError):
    """A step returned a value that cannot be journaled.

    The step's side effect already happened; nothing was journaled for it, so the step
    runs again when the run resumes.
    """

    def __init__(self, run_id: str, step: str, name: str, detail: str) -> None:
        self.run_id = run_id
        self.step = step
        self.name = name
        super().__init__(
            f"step {step} ({name!r}) of run {run_id!r} returned a value that cannot be "
            f"journaled: {detail}. The step's side effect already ran, but its result was not "
            f"recorded, so it will run again when the run resumes. Return JSON data (dict, list, "
            f"str, numbers), a pydantic model, or register the type with "
            f"durable_nb.register_type()."
        )


def _step_words(position: int, key: str | None) -> str:
    """"step 4", or "step 4 (key 2.1)" when the step's identity differs from its position."""
    return f"step {position}" if key in (None, str(position)) else f"step {position} (key {key})"


class JournalMismatch(DurableError):
    """The code asks for a different step than the journal holds for this step's key.

    Replay matches steps by key (for steps made one after another: by position); a
    different name or kind means the code changed, or is not deterministic. The journal is
    left untouched.
    """

    def __init__(self, run_id: str, position: int, journaled: str, requested: str,
                 reason: str = "", *, key: str | None = None) -> None:
        self.run_id = run_id
        self.position = position
        self.key = key
        self.journaled = journaled
        self.requested = requested
        where = _step_words(position, key)
        why = reason or (f"the journal holds {journaled} at {where}, "
                         f"but the code now asks for {requested}")
        super().__init__(
            f"run {run_id!r} no longer matches its journal: {why}. The journal was not changed. "
            f"To execute again from that step, keeping the old steps as a fork of the run, "
            f"re-run with --on-change rerun (on_change=\"rerun\"), or reset the run "
            f"(`durable-nb reset {run_id} --from {position}`); or use a new run id. If the "
            f"change is not intended, make the code take the same steps with the same inputs "
            f"as before (no branching on time, randomness or data read outside ctx)."
        )


class InputChanged(JournalMismatch):
    """A step asks with other inputs than the journaled step (an edited prompt, other
    arguments): replaying its journaled result would return a stale answer. ``change``
    says where the inputs first differ, with the old and the new value, shortened
    (``messages[1].content changed from 'Summarise Q3.' to 'Summarise Q4.'``)."""

    def __init__(self, run_id: str, position: int, step: str, change: str, *,
                 key: str | None = None) -> None:
        self.change = change
        super().__init__(run_id, position, step, step, key=key,
                         reason=f"{_step_words(position, key)}, {step}: {change}")


class ReplayDiverged(DurableError):
    """A pure replay of a finished run (``verify_replay``, ``DURABLE_NB_VERIFY_REPLAY=1``)
    did not reproduce what the first execution observed."""


class ContextNotActive(DurableError):
    """``ctx`` was used where no execution of its run is active: after the cell or handler
    ended, from a later cell, or from a thread or task durable_nb does not number."""


class CellSyntaxError(DurableError):
    """The body of a ``%%durable_agent`` cell is not valid Python: nothing ran. A notebook
    shows it as Python shows a syntax error in a plain cell, the line and a caret.
    ``syntax_error`` is the :class:`SyntaxError`, its line numbered as in the cell (the
    magic's line is line 1)."""

    def __init__(self, syntax_error: SyntaxError) -> None:
        super().__init__(f"line {syntax_error.lineno} of the cell: {syntax_error.msg}")
        self.syntax_error = syntax_error


class RunLeased(DurableError):
    """Another live executor holds this run's lease, or took it over from this one."""

    def __init__(self, run_id: str, holder: dict, advice: str | None = None) -> None:
        self.run_id = run_id
        self.holder = holder
        age = time.time() - float(holder.get("heartbeat") or time.time())
        super().__init__(
            f"run {run_id!r} is being executed by pid {holder.get('pid')} on "
            f"{holder.get('host')!r} (heartbeat {age:.1f} s ago). Only one "
            f"executor may run it: "
            + (advice or "stop that kernel or process, or wait for it to finish; a dead "
                         "holder's lease is taken over automatically.")
        )


class RunExpired(DurableError):
    """The run passed its deadline; it is marked FAILED and never resumed."""


class RunCancelled(DurableError):
    """The run was cancelled (panel button, ``cancel()``, CLI)."""


class BudgetExhausted(DurableError):
    """Going on would pass max_iterations, max_tokens or the model's context window."""


class NoPendingApproval(DurableError):
    """approve() or reject() was called on a run that waits for no approval."""


class ApprovalChanged(NoPendingApproval):
    """approve() or reject() was given the digest of a request the run no longer waits for
    (its cell was edited, or it went on): nothing was decided."""


class DecisionExists(NoPendingApproval):
    """approve() or reject() on a request that was decided already: a decision is written
    once, and the first one stands. ``decision`` is the one that stands (``approved``,
    ``by``, ``via``: how it was given, ``at``, ``note``); ``taken`` is True once the run
    took it (went on past the approval), after which it can never change; before that
    ``replace=True`` (``--replace``) changes it on purpose."""

    def __init__(self, run_id: str, name: str, decision: dict, *, taken: bool, words: str,
                 timed: str) -> None:
        self.run_id = run_id
        self.name = name
        self.decision = decision
        self.taken = taken
        #: ``approved by ana via panel``: who decided and how, for a short refusal. ``words``
        #: and ``timed`` (the same with when: ``... at 2026-12-03 10:02:11``) are written by
        #: :func:`durable_nb.approvals.wording.decision_words` and passed by the raiser, so
        #: that a decision has one wording and this module imports nothing of the package.
        self.words = words
        if taken:
            tail = ("; the run has taken that decision and went on, so it can never change. "
                    "Nothing was changed.")
        else:
            tail = ("; nothing was changed. To change it before the run takes it, decide "
                    "again with --replace (replace=True in Python).")
        super().__init__(f"run {run_id!r}: {name!r} was already {timed}{tail}")


class NotAllowedToDecide(DurableError):
    """approve() or reject() by someone the pending request does not allow: not on its
    approvers' list, or, under four-eyes, the person who started the run. Nothing was decided;
    the refusal is in the run's history. ``by`` is who tried, ``approvers`` who may decide
    (None: anyone but the starter), ``started_by`` the starter when four-eyes refused them."""

    def __init__(self, run_id: str, name: str, by: str, approvers: list[str] | None, *,
                 started_by: str | None = None, shared: bool = False,
                 four_eyes: bool = False) -> None:
        self.run_id = run_id
        self.name = name
        self.by = by
        self.approvers = approvers
        self.started_by = started_by
        #: True: refused because the decider came by a link not bound to one person (a
        #: Slack channel's, a webhook's) where an approvers' list or four-eyes applies.
        self.shared = shared
        if shared:
            rule = ("four-eyes applies" if four_eyes and approvers is None else
                    f"only {', '.join(approvers or ())} may decide" +
                    (" (and four-eyes applies)" if four_eyes else ""))
            why = (f"a link sent to {by} does not say who clicked it, and {rule}: sign in to "
                   f"Jupyter and decide there")
        elif started_by is not None:
            others = ("ask someone else to decide" if approvers is None else
                      f"ask {' or '.join(approvers)}" if approvers else
                      "nobody else is on its approvers' list")
            why = (f"{by} started the run, and under four-eyes nobody decides a request of "
                   f"a run they started: {others}")
        else:
            why = (f"{by} is not on its approvers' list; only {', '.join(approvers or ())} "
                   f"may decide")
        super().__init__(f"run {run_id!r}: {name!r} was not decided: {why}. Nothing was "
                         f"written.")

    @property
    def reason(self) -> str:
        """``"four-eyes"`` or ``"not an approver"``: why, as data."""
        if self.shared:
            return "shared link"
        return "four-eyes" if self.started_by is not None else "not an approver"

    @property
    def brief(self) -> str:
        """Why, in a few words: ``bo is not on the approvers' list (ana)``, ``ana started
        the run (four-eyes)``."""
        if self.shared:
            return f"a link sent to {self.by} does not say who decides (sign in)"
        if self.started_by is not None:
            return f"{self.by} started the run (four-eyes)"
        return f"{self.by} is not on the approvers' list ({', '.join(self.approvers or ())})"


class RefusedByHub(NotAllowedToDecide):
    """Under JupyterHub (:mod:`durable_nb.hub`), a decision this process may not write: only
    the hub's durable-nb service writes decisions in the journal, as the hub user who asked
    it; the service refused (``brief`` says why), or could not be asked. Nothing was
    written; the refusal is in the run's history."""

    def __init__(self, run_id: str, name: str, by: str, why: str) -> None:
        self.run_id = run_id
        self.name = name
        self.by = by
        self.approvers = None
        self.started_by = None
        self.shared = False
        self.why = why
        DurableError.__init__(self, f"run {run_id!r}: {name!r} was not decided: {why}. "
                                    f"Nothing was written.")

    @property
    def reason(self) -> str:
        return "hub"

    @property
    def brief(self) -> str:
        return self.why


class DecisionNeeded(DurableError):
    """A notebook stops here until a person decides a pending approval
    (:func:`durable_nb.notebook.stop_for_decision`): Run All halts with this one message."""

    def _render_traceback_(self) -> list[str]:  # IPython: the message, no traceback
        return [f"\x1b[0;33m{type(self).__name__}\x1b[0m: {self}"]


class MissingExtra(DurableError, ImportError):
    """A feature needs packages of an extra that is not installed
    (:func:`durable_nb.integrations.require`): one line naming the ``pip install``."""

    def _render_traceback_(self) -> list[str]:  # IPython: the message, no traceback
        return [f"\x1b[0;33m{type(self).__name__}\x1b[0m: {self}"]


class ApprovalPolicyError(DurableError, ValueError):
    """An approval's deadline options (``timeout``, ``on_timeout``, ``escalate_to``,
    ``remind``) are wrong: the message says which and what forms are accepted."""

    def _render_traceback_(self) -> list[str]:  # IPython: the message, no traceback
        return [f"\x1b[0;33m{type(self).__name__}\x1b[0m: {self}"]


class NotifyConfigError(DurableError, ValueError):
    """The notification configuration (a notify.toml, DURABLE_NB_NOTIFY_*, a run's
    ``notify=``) is wrong: the message names the file or field."""


class RetentionError(DurableError, ValueError):
    """A prune's options or a journal's retention policy are wrong (``--older-than``, the
    statuses): the message says which and what is accepted."""


class PruneRefused(DurableError):
    """Pruning refused on a journal set up for a JupyterHub (:mod:`durable_nb.hub`): only
    the hub's durable-nb service removes history there, by the journal's retention policy.
    The message, one line, names its database role. Nothing was removed."""


class DeliveryFailed(DurableError):
    """One attempt of a channel's ``send`` failed (refused, an HTTP or SMTP error, no answer).
    Its message is short and holds no secret: it is what the delivery's record keeps. The
    sender records it and tries again by its retry policy; it never reaches a run."""


class StepFailed(DurableError):
    """A journaled step failure whose original exception type cannot be rebuilt.

    ``type_name`` is the original type, ``message`` its message.
    """

    def __init__(self, type_name: str, message: str) -> None:
        self.type_name = type_name
        self.message = message
        super().__init__(f"{type_name}: {message}")


class EndpointError(StepFailed):
    """An LLM call (``ctx.chat``, ``ctx.respond``, ``ctx.compact``) failed at its endpoint:
    a request the server refuses, or a transient failure that outlasted the retries.

    The message names the URL (never a key), the step and the server's answer, and says
    how to go on. Attributes: ``url``, ``status_code`` (None without an HTTP answer),
    ``code`` (the server's error code, e.g. ``"context_length_exceeded"``), ``step``
    (the journal position), ``attempts``, ``transient`` (True when retries ran out),
    ``type_name`` (the openai exception's type). The openai exception is ``__cause__``
    (on replay, where the error comes from the journal, there is none; nor when no request
    was made: no API key).
    """

    def __init__(self, message: str, *, url: str | None = None, status_code: int | None = None,
                 code: str | None = None, step: int | None = None, attempts: int = 1,
                 transient: bool = False, type_name: str = "") -> None:
        Exception.__init__(self, message)
        self.message = message
        self.type_name = type_name
        self.url = url
        self.status_code = status_code
        self.code = code
        self.step = step
        self.attempts = attempts
        self.transient = transient

    def __str__(self) -> str:
        return self.message


class McpServerUnavailable(DurableError, ConnectionError):
    """An MCP server could not be started or reached, or its connection broke during a call.
    Nothing is journaled for the call: it runs again when the run resumes (also a
    ``ConnectionError``)."""


class InvalidAnswer(DurableError, ValueError):
    """An answer that does not fit its request; nothing was written (also a ``ValueError``):
    edited arguments that the tool's JSON schema refuses (or on a request with none to
    edit), a message for the model on an approval, an answer to an MCP server's question
    (elicitation) that its schema refuses, or an action other than accept, decline and
    cancel."""


class NotJournaled(DurableError):
    """Refused before it ran: it would call a model or a tool without a journaled step (an
    agent given its own model object, a framework feature durable_nb does not wrap). The
    message says what to use instead."""


class UnsupportedClientCall(NotJournaled, AttributeError):
    """A method of the durable openai client (``ctx.openai``, ``ctx.async_openai``) that
    durable_nb does not journal. Also an ``AttributeError``, so that a library probing for
    an optional method with ``getattr(client, name, None)`` takes its other path."""


class TerminalError(DurableError):
    """Raise from a step to fail it for good: it is journaled, never retried, and raised
    again with the same message on replay."""
