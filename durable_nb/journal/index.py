"""The per-user index of journals: which journals the processes of this user opened.

Every process that opens a journal (a kernel, a script, ``durable-nb``) leaves a small file
here naming it, so that the user's Jupyter Server (:mod:`durable_nb.server`) can list runs of
journals it was never told about. One file per journal, named by :func:`journal_id`, written
once per process and location (``open_journal`` opens each location once): nothing is read or
written per step. Recording never fails the caller: an index that cannot be written only
means the server does not see that journal.

Where: ``$DURABLE_NB_INDEX``, else ``durable_nb/journals`` in Jupyter's data directory
(``jupyter --data-dir``, per user). The directory is the user's own (0700) and its files 0600:
a PostgreSQL URL is kept with its password, since the server must connect with it.
"""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
import time
from pathlib import Path

from .postgres import is_postgres_url

__all__ = ["forget", "index_dir", "journal_id", "known_locations", "record_opened"]


def journal_id(location: str) -> str:
    """A short, stable id of a journal location (an absolute directory or a URL)."""
    return "j" + hashlib.sha256(location.encode()).hexdigest()[:10]


def index_dir() -> Path:
    """Where the index files are: ``$DURABLE_NB_INDEX`` or Jupyter's data directory."""
    configured = os.environ.get("DURABLE_NB_INDEX")
    if configured:
        return Path(configured).expanduser()
    try:
        from jupyter_core.paths import jupyter_data_dir
        base = Path(jupyter_data_dir())
    except ImportError:  # jupyter_core comes with ipykernel; a bare environment still works
        base = Path.home() / ".local" / "share" / "jupyter"
    return base / "durable_nb" / "journals"


def record_opened(location: str) -> None:
    """Note that this process opened the journal at ``location`` (an absolute directory or
    a PostgreSQL URL). Never raises: the index is a convenience for the server, never a
    reason for a run to fail."""
    try:
        folder = index_dir()
        path = folder / f"{journal_id(location)}.json"
        if path.exists():
            return
        folder.mkdir(parents=True, exist_ok=True, mode=0o700)
        fd, temp = tempfile.mkstemp(dir=folder, prefix=".", suffix=".tmp")  # 0600
        with os.fdopen(fd, "w") as out:
            json.dump({"location": location, "opened_at": time.time(), "pid": os.getpid()}, out)
        os.replace(temp, path)
    except Exception:  # noqa: BLE001 - see the docstring: recording never fails the caller
        pass


def known_locations() -> list[str]:
    """The journal locations in the index, oldest first; the entries of directories that no
    longer exist are dropped (a PostgreSQL journal is kept: only connecting tells).

    The files are read again only when the index directory changed (a file added, replaced
    or removed changes its time): a server that asks at every poll reads a few hundred
    entries once, then checks that their directories still exist."""
    folder = index_dir()
    try:
        stamp = folder.stat().st_mtime_ns
    except OSError:
        return []
    read_at = time.time_ns()
    cached = _read.get(folder)
    if cached is not None and cached[0] == stamp:
        locations = cached[1]
    else:
        locations = _read_index(folder)
        # A file added within the directory's clock tick after this read could leave the
        # same time: such a read is not kept.
        if stamp < read_at - 50_000_000:
            _read[folder] = (stamp, locations)
    kept = []
    for location in locations:
        if not is_postgres_url(location) and not os.path.isdir(location):
            forget(location)
            continue
        kept.append(location)
    return kept


#: The index as last read, per index directory: its time and the locations in it.
_read: dict[Path, tuple[int, list[str]]] = {}


def _read_index(folder: Path) -> list[str]:
    """The locations the index files name, oldest first (unreadable files skipped)."""
    try:
        paths = sorted(folder.glob("j*.json"), key=lambda p: p.stat().st_mtime)
    except OSError:
        return []
    locations = []
    for path in paths:
        try:
            location = json.loads(path.read_text())["location"]
        except (OSError, ValueError, KeyError, TypeError):
            continue  # half-written by a crashed process, or not ours: skipped
        if isinstance(location, str):
            locations.append(location)
    return locations


def forget(location: str) -> None:
    """Drop ``location`` from the index (it is recorded again when a process opens it)."""
    try:
        (index_dir() / f"{journal_id(location)}.json").unlink()
    except OSError:
        pass
