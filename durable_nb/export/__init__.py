"""Exports of runs and batches, read from the journal alone: :mod:`.run` writes a run as a
notebook that tells its story (or as JSON), :mod:`.batch` a batch as JSON lines or a report;
:mod:`.markdown` holds what both write with."""

from __future__ import annotations

from ..summary import plain
from .batch import BATCH_FORMATS, batch_notebook, export_batch
from .markdown import EXPORT_VERSION
from .run import FORMATS, export_data, export_notebook, export_run

__all__ = ["BATCH_FORMATS", "EXPORT_VERSION", "FORMATS", "batch_notebook", "export_batch",
           "export_data", "export_notebook", "export_run", "plain"]
