"""Recorded DONE runs of a durable_nb journal as regression tests of an agent's code: the
pytest plugin durable_nb installs (entry point ``pytest11``).

pytest loads this module in every session where durable_nb is installed, so it is kept apart
from the package: while the plugin is off it imports nothing but pytest (already loaded),
adds its options and changes nothing. Turned on by naming the handler, in ``pytest.ini`` /
``pyproject.toml``'s ``[tool.pytest.ini_options]``::

    durable_nb_handler = my_agent:handler
    durable_nb_journal = tests/recorded
    durable_nb_prefix = sales-

or on the command line (``--durable-nb-handler``, ``--durable-nb-journal``,
``--durable-nb-prefix``); only then is durable_nb imported. Every DONE run of the journal
(whose id starts with the prefix) becomes one test, ``durable_nb[RUN]``: a dry replay of the
handler against it (:mod:`durable_nb.checking.pytest_plugin`), which passes when the run
replays, and fails with the step that diverges and the diff of its inputs (or of the result).
Nothing is executed: no API key, no network, no tool; the journal is opened read-only.
"""

from __future__ import annotations

from typing import Any

import pytest

__all__ = ["pytest_addoption", "pytest_collection_modifyitems"]

_OPTIONS = (("handler", "the handler recorded DONE runs are checked against, as "
                        "module:function (turns the durable_nb plugin on)"),
            ("journal", "the journal that holds the recorded runs (a directory or a "
                        "postgresql:// URL; default: DURABLE_NB_JOURNAL or ./.durable_nb)"),
            ("prefix", "only the runs whose id starts with this"))


def pytest_addoption(parser: Any) -> None:
    """The plugin's options and ini settings (all unset: the plugin is off)."""
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
    """With a handler named, one test per recorded DONE run appended; else nothing."""
    spec = _setting(config, "handler")
    if spec is None:
        return
    from durable_nb.checking.pytest_plugin import recorded_runs

    items.extend(recorded_runs(session, spec, _setting(config, "journal"),
                               _setting(config, "prefix") or ""))
