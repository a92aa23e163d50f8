"""durable_nb: durable AI-agent loops in Jupyter notebooks.

Every side effect of an agent loop goes through ``ctx`` (``ctx.run``, ``ctx.chat``,
``ctx.approval`` ...) and is journaled on local disk before the loop goes on; executing the
run again after a crash replays the completed steps and continues at the first unfinished one.

In a notebook: ``%load_ext durable_nb`` then a ``%%durable_agent RUN_ID`` cell. In Python:
:func:`execute`.
"""

from .batches.batch import Batch, ItemResult, batch, item_keys, map
from .approvals.decision import Decision
from .checking import CheckReport, RunCheck, check
from .context import Context, DurableState, TokenUsage
from .errors import (
    ApprovalChanged,
    ApprovalPolicyError,
    CellSyntaxError,
    DecisionNeeded,
    DeliveryFailed,
    InvalidAnswer,
    McpServerUnavailable,
    MissingExtra,
    NotifyConfigError,
    PruneRefused,
    RetentionError,
    BudgetExhausted,
    ContextNotActive,
    CorruptEntry,
    DatabaseError,
    DecisionExists,
    DurableError,
    EndpointError,
    IncompatibleJournal,
    InputChanged,
    JournalError,
    JournalMismatch,
    JournalNotWritable,
    JournalUnavailable,
    JournalWriteError,
    NoJournal,
    NoPendingApproval,
    NotAllowedToDecide,
    RefusedByHub,
    NotJournaled,
    ReplayDiverged,
    RunCancelled,
    RunExpired,
    RunLeased,
    SerializationError,
    StepFailed,
    TerminalError,
    UnknownRun,
    UnserializableResult,
    UnsupportedClientCall,
)
from .llm.messages import assistant_message
from .llm.pricing import Price
from .journal import DiskJournal, Journal, RunRecord, Status, StepEntry, open_journal
from .registry import (RunInfo, approve, cancel, copy_run, delete, get_run, reject, rerun_from,
                       reset, runs)
from .execution.retry import RetryPolicy
from .retention.policy import RetentionPolicy
from .retention.prune import prune
from .retention.sweep import PruneResult
from .runner import RunOptions, execute
from .serde import register_type
from .llm.tools import Tool, tool
from .telemetry import tracing
from .version import __version__

__all__ = [
    "ApprovalPolicyError",
    "CellSyntaxError",
    "DecisionNeeded",
    "DeliveryFailed",
    "InvalidAnswer",
    "McpServerUnavailable",
    "MissingExtra",
    "NotifyConfigError",
    "NoJournal",
    "JournalUnavailable",
    "JournalNotWritable",
    "DatabaseError",
    "ApprovalChanged",
    "Batch",
    "CheckReport",
    "ItemResult",
    "BudgetExhausted",
    "Context",
    "ContextNotActive",
    "CorruptEntry",
    "Decision",
    "DecisionExists",
    "DiskJournal",
    "DurableError",
    "DurableState",
    "EndpointError",
    "IncompatibleJournal",
    "InputChanged",
    "Journal",
    "JournalError",
    "JournalMismatch",
    "JournalWriteError",
    "NoPendingApproval",
    "NotAllowedToDecide",
    "RefusedByHub",
    "NotJournaled",
    "ReplayDiverged",
    "Price",
    "PruneRefused",
    "PruneResult",
    "RetentionError",
    "RetentionPolicy",
    "RetryPolicy",
    "RunCancelled",
    "RunExpired",
    "RunCheck",
    "RunInfo",
    "RunLeased",
    "RunOptions",
    "RunRecord",
    "SerializationError",
    "Status",
    "StepEntry",
    "StepFailed",
    "TerminalError",
    "TokenUsage",
    "Tool",
    "UnknownRun",
    "UnserializableResult",
    "UnsupportedClientCall",
    "approve",
    "assistant_message",
    "batch",
    "cancel",
    "check",
    "copy_run",
    "delete",
    "execute",
    "get_run",
    "item_keys",
    "load_ipython_extension",
    "map",
    "open_journal",
    "prune",
    "register_type",
    "reject",
    "rerun_from",
    "reset",
    "runs",
    "tool",
    "tracing",
    "unload_ipython_extension",
]


def load_ipython_extension(ipython):
    """``%load_ext durable_nb``: register the magics and report interrupted runs."""
    from .notebook.magics import load_ipython_extension as load

    load(ipython)


def unload_ipython_extension(ipython):
    """``%unload_ext durable_nb``: stop tracking cell ids."""
    from .notebook.magics import unload_ipython_extension as unload

    unload(ipython)


def _jupyter_labextension_paths() -> list[dict[str, str]]:
    """Where ``jupyter labextension develop --overwrite .`` finds the prebuilt JupyterLab
    extension in a checkout (``durable_nb/labextension``, built from ``labextension/``) and
    the name JupyterLab knows it by (``durable-nb dev-setup`` links the same build and adds
    the server config; a wheel installs both without either)."""
    return [{"src": "labextension", "dest": "durable-nb"}]
