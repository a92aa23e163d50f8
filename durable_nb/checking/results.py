"""What a check of recorded runs says: one :class:`RunCheck` per run, gathered in a
:class:`CheckReport`.

A run's verdict is one of three words:

- ``replays``: the code asked for every journaled step, each with the same kind, name and
  inputs, and ended with the result the journal holds (a DONE run), or the failure it holds
  (a FAILED one). Resuming it changes nothing.
- ``would execute``: every journaled step matched, and the next step the code asks for is
  new: executing the run would start there (for a parked run, the approval it waits for).
- ``diverges``: a journaled step is asked otherwise (step N's inputs changed, another step
  in its place, steps the code no longer asks for), or a DONE run now returns another
  result. Executing it would stop with :class:`~durable_nb.errors.JournalMismatch` (or, with
  ``on_change="rerun"``, execute again from there).
"""

from __future__ import annotations

import difflib
import json
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, Literal

from ..journal import Status

__all__ = ["DIVERGES", "REPLAYS", "WOULD_EXECUTE", "CheckReport", "RunCheck", "Verdict"]

Verdict = Literal["replays", "would execute", "diverges"]
REPLAYS: Verdict = "replays"
WOULD_EXECUTE: Verdict = "would execute"
DIVERGES: Verdict = "diverges"

#: Stands for "nothing to show" on one side of a diff (a step the code no longer asks for).
_ABSENT = object()


@dataclass(frozen=True)
class RunCheck:
    """How one recorded run fits the code now, found by a dry replay (nothing executed,
    nothing written).

    ``position`` and ``key`` are the journal position and step key of the step that
    diverges or would execute (``position`` is the journal's size for a new step; None for
    a run that diverges at its result or replays); ``step`` is that step as ``kind 'name'``;
    ``change`` says in one line what differs (as :class:`~durable_nb.errors.InputChanged`
    says it) or what would execute; ``approval`` names the approval a parked run waits for
    there. ``matched`` counts the journaled steps the code asked for unchanged.
    """

    run_id: str
    verdict: Verdict
    status: Status | None
    matched: int
    change: str
    position: int | None = None
    key: str | None = None
    step: str | None = None
    approval: str | None = None
    journaled: Any = _ABSENT
    asked: Any = _ABSENT

    @property
    def diverges(self) -> bool:
        return self.verdict == DIVERGES

    def line(self) -> str:
        """One line: ``RUN  VERDICT  what``."""
        return f"{self.run_id}  {self.verdict}  {self.change}"

    def diff(self) -> str:
        """What the journal holds against what the code asks now, as a unified diff of
        their JSON (the inputs of the step that diverges, or the result); empty where the
        verdict is not ``diverges``."""
        if self.verdict != DIVERGES:
            return ""
        where = self.key if self.key is not None else "result"
        return "".join(difflib.unified_diff(
            _lines(self.journaled), _lines(self.asked),
            fromfile=f"{self.run_id} {where} (journal)", tofile=f"{self.run_id} {where} (code)"))

    def __str__(self) -> str:
        return self.line()


def _lines(value: Any) -> list[str]:
    if value is _ABSENT:
        return []
    text = json.dumps(value, indent=2, sort_keys=True, ensure_ascii=False, default=str)
    return [line + "\n" for line in text.splitlines()]


class CheckReport:
    """The checks of several runs, in the order they were checked. Iterable; ``ok`` is
    True when none diverges."""

    def __init__(self, runs: list[RunCheck]) -> None:
        self.runs = runs

    def __iter__(self) -> Iterator[RunCheck]:
        return iter(self.runs)

    def __len__(self) -> int:
        return len(self.runs)

    def __getitem__(self, run_id: str) -> RunCheck:
        """The check of run ``run_id``; KeyError if it was not checked."""
        for run in self.runs:
            if run.run_id == run_id:
                return run
        raise KeyError(run_id)

    @property
    def counts(self) -> dict[str, int]:
        """How many runs got each verdict."""
        found = Counter(run.verdict for run in self.runs)
        return {verdict: found[verdict] for verdict in (REPLAYS, WOULD_EXECUTE, DIVERGES)}

    @property
    def diverged(self) -> list[RunCheck]:
        return [run for run in self.runs if run.diverges]

    @property
    def ok(self) -> bool:
        """True when no run diverges."""
        return not self.diverged

    def summary(self) -> str:
        counts = self.counts
        total = len(self.runs)
        return (f"{total} run{'s' if total != 1 else ''} checked: "
                + ", ".join(f"{n} {verdict}" for verdict, n in counts.items()))

    def text(self, *, diff: bool = False) -> str:
        """One line per run and the summary; with ``diff``, each diverging run's diff
        after its line."""
        out = []
        for run in self.runs:
            out.append(run.line())
            if diff and run.diverges:
                out.append(run.diff().rstrip("\n"))
        out.append(self.summary())
        return "\n".join(out)

    def __str__(self) -> str:
        return self.text()

    def __repr__(self) -> str:
        return f"<CheckReport {self.summary()}>"

    def _repr_pretty_(self, printer: Any, cycle: bool) -> None:
        printer.text(self.text())
