"""Running ``%%durable_agent`` cells in a kernel: the cell as a handler (:mod:`.cell`), where
its prints go (:mod:`.output`), its run with panel and watcher (:mod:`.session`), and the
report of runs a dead kernel left behind (:mod:`.scan`)."""

from .cell import CTX, compile_cell
from .scan import describe_unfinished
from .session import NotebookRun, active_run

__all__ = ["CTX", "NotebookRun", "active_run", "compile_cell", "describe_unfinished"]
