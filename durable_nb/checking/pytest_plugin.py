"""The tests the durable_nb pytest plugin adds (``pytest_durable_nb``, which imports this
module only when the plugin is on): one per recorded DONE run, checked by a dry replay of
the handler (:mod:`durable_nb.checking`)."""

from __future__ import annotations

from typing import Any

import pytest

from ..errors import DurableError
from ..journal import Status
from ..options import RunOptions
from . import read_only
from .dry import dry_replay
from .handlers import load_object

__all__ = ["RecordedRun", "RunDiverged", "recorded_runs"]


def recorded_runs(session: Any, spec: str, journal: str | None,
                  prefix: str) -> list["RecordedRun"]:
    """One test per DONE top-level run of ``journal`` whose id starts with ``prefix``,
    checked against the handler ``spec`` names; pytest's usage error saying what is wrong
    when the handler or the journal cannot be opened."""
    try:
        handler = load_object(spec, "durable_nb_handler")
        source = read_only(journal)
        records = source.list_runs(prefix, status=Status.DONE)
    except (DurableError, ValueError, ImportError) as exc:
        raise pytest.UsageError(f"durable_nb plugin: {exc}") from None
    found = []
    for record in records:
        if record.parent is None:
            name = f"durable_nb[{record.run_id}]"
            found.append(RecordedRun.from_parent(session, name=name, nodeid=name, record=record,
                                                 journal=source, handler=handler))
    return found


class RunDiverged(Exception):
    """A recorded run that the code no longer reproduces (its check, with the diff)."""


class RecordedRun(pytest.Item):
    """One recorded DONE run, checked by a dry replay of the handler."""

    def __init__(self, *, record: Any, journal: Any, handler: Any, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.record = record
        self.journal = journal
        self.handler = handler

    def runtest(self) -> None:
        checked = dry_replay(self.journal, self.record, self.handler,
                             RunOptions(on_approval="park", verify_replay=False))
        if checked.verdict != "replays":
            raise RunDiverged(f"{checked.line()}\n{checked.diff()}".rstrip("\n"))

    def repr_failure(self, excinfo: Any, style: Any = None) -> str:
        if isinstance(excinfo.value, RunDiverged):
            return str(excinfo.value)
        return super().repr_failure(excinfo, style)

    def reportinfo(self) -> tuple[Any, int | None, str]:
        return self.journal.location, None, f"recorded run {self.record.run_id}"
