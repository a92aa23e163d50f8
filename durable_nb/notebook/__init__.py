"""Running ``%%durable_agent`` cells in a kernel: the cell as a handler (:mod:`.cell`), where
its prints go (:mod:`.output`), its run with panel and watcher (:mod:`.session`), a batch cell
with its panel and watcher (:mod:`.batch`), and the report of runs a dead kernel left behind
(:mod:`.scan`)."""

from .batch import NotebookBatch, active_batch, batch_of_run, wait_for_batch
from .cell import CTX, compile_cell, compile_item_cell
from .scan import describe_unfinished
from .session import NotebookRun, active_run, stop_for_decision

__all__ = ["CTX", "NotebookBatch", "NotebookRun", "active_batch", "active_run", "batch_of_run",
           "compile_cell", "compile_item_cell", "describe_unfinished", "stop_for_decision",
           "wait_for_batch"]
