"""Recorded DONE runs as regression tests of an agent's code: a pytest plugin.

Installed with durable_nb (entry point ``pytest11``) and off until asked: with neither
option nor ini setting below, it adds nothing, changes nothing and imports nothing more.
Turned on by naming the handler, in ``pytest.ini`` / ``pyproject.toml``'s
``[tool.pytest.ini_options]``::

    durable_nb_handler = my_agent:handler
    durable_nb_journal = tests/recorded
    durable_nb_prefix = sales-

or on the command line (``--durable-nb-handler``, ``--durable-nb-journal``,
``--durable-nb-prefix``). Every DONE run of the journal (whose id starts with the prefix)
becomes one test, ``durable_nb[RUN]``: a dry replay of the handler against it
(:mod:`durable_nb.checking`), which passes when the run replays, and fails with the step
that diverges and the diff of its inputs (or of the result). Nothing is executed: no API key,
no network, no tool; the journal is opened read-only.
"""

from __future__ import annotations

from typing import Any

import pytest

__all__ = ["RecordedRun", "pytest_addoption", "pytest_collection_modifyitems"]

_OPTIONS = (("handler", "the handler recorded DONE runs are checked against, as "
                        "module:function (turns the durable_nb plugin on)"),
            ("journal", "the journal that holds the recorded runs (a directory or a "
                        "postgresql:// URL; default: DURABLE_NB_JOURNAL or ./.durable_nb)"),
            ("prefix", "only the runs whose id starts with this"))


def pytest_addoption(parser: Any) -> None:
    group = parser.getgroup("durable_nb", "recorded durable_nb runs as tests")
    for name, text in _OPTIONS:
        group.addoption(f"--durable-nb-{name}", dest=f"durable_nb_{name}", default=None,
                        metavar=name.upper(), help=text)
        parser.addini(f"durable_nb_{name}", text, default=None)


def _setting(config: Any, name: str) -> str | None:
    value = config.getoption(f"durable_nb_{name}") or config.getini(f"durable_nb_{name}")
    return str(value).strip() or None if value else None


@pytest.hookimpl(tryfirst=True)  # before -k and -m deselect: they apply to these tests too
def pytest_collection_modifyitems(session: Any, config: Any, items: list) -> None:
    spec = _setting(config, "handler")
    if spec is None:
        return
    from ..errors import DurableError
    from ..journal import Status
    from . import read_only
    from .handlers import load_object

    try:
        handler = load_object(spec, "durable_nb_handler")
        journal = read_only(_setting(config, "journal"))
        records = journal.list_runs(_setting(config, "prefix") or "", status=Status.DONE)
    except (DurableError, ValueError, ImportError) as exc:
        raise pytest.UsageError(f"durable_nb plugin: {exc}") from None
    for record in records:
        if record.parent is None:
            name = f"durable_nb[{record.run_id}]"
            items.append(RecordedRun.from_parent(session, name=name, nodeid=name, record=record,
                                                 journal=journal, handler=handler))


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
        from ..options import RunOptions
        from .dry import dry_replay

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
