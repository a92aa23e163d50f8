"""What a run asks of notifications when it starts: its channels, and a first sweep of the
journal for requests nobody notified."""

from __future__ import annotations

import os
import threading
from typing import Any

from ..journal import Journal
from .config import NotifyConfig, NotifySelection, choose, load_config, user_config_path
from .delivery import in_background, sweep

__all__ = ["for_directory", "for_journal", "for_run", "sweep_once_in_background"]

_cache: dict[Any, NotifyConfig] = {}
_swept: set[str] = set()
_swept_lock = threading.Lock()


def for_journal(journal: Journal) -> NotifyConfig:
    """The configuration for runs of ``journal`` (the user's file, the journal's, the
    environment), read again only when one of them changed."""
    return for_directory(getattr(journal, "directory", None))


def for_directory(directory: str | os.PathLike | None) -> NotifyConfig:
    """:func:`for_journal` by the journal's directory (None: a database), without opening it."""
    paths = [user_config_path()] + ([os.path.join(directory, "notify.toml")] if directory else [])
    stamp = (tuple(_mtime(p) for p in paths), tuple(str(p) for p in paths),
             tuple(sorted((k, v) for k, v in os.environ.items()
                          if k.startswith("DURABLE_NB_NOTIFY"))))
    config = _cache.get(stamp)
    if config is None:
        config = _cache[stamp] = load_config(directory)
        if len(_cache) > 32:
            _cache.clear()
    return config


def for_run(journal: Journal, selection: NotifySelection) -> tuple[NotifyConfig, tuple[str, ...]]:
    """The channels a run of ``journal`` with ``notify=selection`` notifies, and the
    configured ones it leaves out (recorded as skipped, so no other process sends them)."""
    base = NotifyConfig() if isinstance(selection, NotifyConfig) else for_journal(journal)
    chosen = choose(base, selection)
    skip = tuple(name for name in base.channels() if name not in chosen.channels())
    return chosen, skip


def sweep_once_in_background(journal: Journal, exclude: str | None = None) -> None:
    """The first time this process opens ``journal`` for a run: on a thread of its own
    (waited for at exit, :func:`~durable_nb.notify.delivery.drain`), apply the deadlines
    due and send, with the journal's channels (:func:`for_journal`) as each run chose
    them, what is due or lapsed (:func:`~durable_nb.notify.delivery.sweep`), but for the
    run ``exclude`` (the one this process starts, which notifies with its own
    ``notify=``). Not on a hub's journal (one that names a decider role this process is
    not): the hub's service is its one sweeper."""
    if journal.read_only:
        return
    with _swept_lock:
        if journal.location in _swept:
            return
        _swept.add(journal.location)

    # Waited for at a normal exit, like the run's own deliveries (a message sent is a
    # message recorded; the next process that opens the journal sends what was left).
    def first_sweep() -> None:
        decider, is_decider, _ = journal.decision_authority()
        if decider is not None and not is_decider:
            return  # a hub's journal: its service alone sweeps (the database refuses us)
        sweep(journal, for_journal(journal), exclude=exclude)

    in_background(first_sweep, name="durable-nb-notify-sweep")


def _mtime(path: Any) -> float | None:
    try:
        return os.stat(path).st_mtime
    except OSError:
        return None
