"""The disk journal's layout: its keys (see :mod:`durable_nb.journal.local`), the statements
it makes on diskcache's ``Cache`` table itself, and the index of run records by status and
creation time (the ``tag`` of their rows)."""

from __future__ import annotations

import json
import re
from typing import Any

from .base import check_request_kind
from .records import Status


# Statements on the Cache table of diskcache 5 (its columns as ``Cache._row_insert`` writes
# them; a str key is stored with raw = 1).
SELECT_VALUE = "SELECT mode, filename, value FROM Cache WHERE key = ? AND raw = 1"
INSERT_IF_ABSENT = (
    "INSERT OR IGNORE INTO Cache(key, raw, store_time, expire_time, access_time, access_count,"
    " tag, size, mode, filename, value) VALUES (?, 1, ?, NULL, ?, 0, NULL, ?, ?, ?, ?)")

# INSERT_IF_ABSENT, only while the lease row (inline) holds the given text.
INSERT_IF_LEASED = (
    "INSERT OR IGNORE INTO Cache(key, raw, store_time, expire_time, access_time, access_count,"
    " tag, size, mode, filename, value) SELECT ?, 1, ?, NULL, ?, 0, NULL, ?, ?, ?, ?"
    " WHERE EXISTS (SELECT 1 FROM Cache WHERE key = ? AND raw = 1 AND mode = ? AND value = ?)")

# diskcache's set() of an existing row whose value is inline, and stays so: its UPDATE
# (store and access time, no expiry, access count 0, tag, size 0, mode, no file, value),
# for a row that already has no expiry and the same tag. Neither is written then: an indexed
# column named in SET costs its index a page in the step's commit, even for the same value.
UPDATE_INLINE = (
    "UPDATE Cache SET store_time = ?, access_time = ?, access_count = 0, size = 0, mode = ?,"
    " filename = NULL, value = ? WHERE key = ? AND raw = 1 AND filename IS NULL"
    " AND expire_time IS NULL AND tag IS ?")

#: Entries read per query by :meth:`DiskJournal.steps` (SQLite allows 999 parameters at least).
READ_AHEAD = 256
SELECT_STEPS = ("SELECT key, mode, filename, value FROM Cache WHERE raw = 1 AND key IN ("
                 + ", ".join("?" * READ_AHEAD) + ")")


# Run records are listed by status and creation time through the ``tag`` column of their rows
# ("DONE|0001764590000.123456", see run_tag) and an index of our own over the run records
# only: steps and other rows stay out of it, so a step append pays nothing for it. (Not
# diskcache's tag_index, which indexes every row, and which a journal opened by an older
# durable_nb, passing tag_index=False, would drop.) A query must repeat the index's WHERE
# literally for SQLite to use it: IN_RUNS.
IN_RUNS = "key >= 'run:' AND key < 'run;'"
RUNS_INDEX = f"CREATE INDEX IF NOT EXISTS durable_nb_runs ON Cache(tag, key) WHERE {IN_RUNS}"


def run_tag(status: Any, created_at: Any) -> str | None:
    """``STATUS|CREATED`` (created_at zero-padded: tags of one status sort by creation)."""
    name = status.value if isinstance(status, Status) else status
    if name not in STATUS_NAMES:
        return None  # placed by parsing when listed
    try:
        created = min(max(float(created_at or 0.0), 0.0), 9_999_999_999_999.0)
    except (TypeError, ValueError):
        created = 0.0
    return f"{name}|{created:020.6f}"


# RunRecord.to_json starts with the two fields of the tag: read there, a step that rewrites
# the record does not parse all of it (its source and attempts) again.
_TAG_PREFIX = re.compile(r'\{"status":"([A-Z_]+)","created_at":(null|-?[0-9]+(?:\.[0-9]+)?'
                         r'(?:[eE][-+]?[0-9]+)?),')


def record_tag(text: str) -> str | None:
    """The tag of a run record given as JSON text (None if it is not one)."""
    prefix = _TAG_PREFIX.match(text)
    if prefix is not None:
        status, created = prefix.groups()
        return run_tag(status, None if created == "null" else float(created))
    try:
        data = json.loads(text)
    except (ValueError, RecursionError):
        return None
    return run_tag(data.get("status"), data.get("created_at")) if isinstance(data, dict) \
        else None


STATUS_NAMES = frozenset(s.value for s in Status)


def step_key(run_id: str, position: int) -> str:
    return f"step:{run_id}:{position}"


def prefix_end(prefix: str) -> str:
    return prefix[:-1] + chr(ord(prefix[-1]) + 1)


#: Between a run's id and a delivery's key (``delivery:RUN<US>KEY``): a character no run id
#: or delivery key holds.
DELIVERY_SEP = "\x1f"


def delivery_key(run_id: str, key: str) -> str:
    return f"delivery:{run_id}{DELIVERY_SEP}{key}"


def request_key(kind: str, run_id: str) -> str:
    check_request_kind(kind)
    return f"{kind}:{run_id}"
