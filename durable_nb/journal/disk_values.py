"""The disk journal's keyed values (:meth:`~durable_nb.journal.base.Journal.put_values` and
the rest): rows ``value:SPACE<US>KEY`` of its diskcache ``Cache`` table, JSON text like every
other row, read in key order by range queries on the table's key index."""

from __future__ import annotations

import time
from collections.abc import Iterable, Mapping

from diskcache.core import MODE_RAW

from .base import check_value_names, read_only_error
from .disk_layout import INSERT_IF_ABSENT, READ_AHEAD, prefix_end

#: Between a space and its keys: a character no space holds (check_value_names).
VALUE_SEP = "\x1f"


def value_key(space: str, key: str = "") -> str:
    return f"value:{space}{VALUE_SEP}{key}"


class DiskKeyedValues:
    """Keyed values of :class:`~durable_nb.journal.local.DiskJournal`."""

    def put_values(self, space: str, values: Mapping[str, str], *, replace: bool = True) -> None:
        if self.read_only:
            raise read_only_error(self.location, "be written")
        check_value_names(space, values)
        rows = [(value_key(space, key), self._columns(value_key(space, key), text))
                for key, text in values.items()]
        with self._value_files_of(rows), self._cache._transact(retry=True) as (sql, cleanup):
            now = time.time()
            if replace:
                self._delete_rows(sql, cleanup, [key for key, _ in rows])
            for key, columns in rows:
                size, mode, filename, value = columns
                if sql(INSERT_IF_ABSENT, (key, now, now, size, mode, filename, value)
                       ).rowcount != 1:
                    cleanup(filename)  # kept the stored value: the new file goes

    def get_values(self, space: str, keys: Iterable[str]) -> dict[str, str]:
        check_value_names(space)
        wanted = list(dict.fromkeys(keys))
        found: dict[str, str] = {}
        fetch = self._cache._disk.fetch
        start = len(value_key(space))
        for first in range(0, len(wanted), READ_AHEAD):
            chunk = [value_key(space, key) for key in wanted[first:first + READ_AHEAD]]
            rows = self._cache._sql(
                "SELECT key, mode, filename, value FROM Cache WHERE raw = 1 AND key IN ("
                + ", ".join("?" * len(chunk)) + ")", chunk).fetchall()
            for key, mode, filename, value in rows:
                found[key[start:]] = value if mode == MODE_RAW and type(value) is str else \
                    fetch(mode, filename, value, False)
        return found

    def scan_values(self, space: str, prefix: str = "", *, below: str | None = None,
                    reverse: bool = False, limit: int | None = None) -> list[tuple[str, str]]:
        check_value_names(space, [prefix])
        low = value_key(space, prefix)
        high = prefix_end(low)
        if below is not None:
            high = min(high, value_key(space, below))
        query = ("SELECT key, mode, filename, value FROM Cache WHERE key >= ? AND key < ? "
                 f"AND raw = 1 ORDER BY key{' DESC' if reverse else ''}")
        params: list = [low, high]
        if limit is not None:
            query += " LIMIT ?"
            params.append(max(int(limit), 0))
        fetch = self._cache._disk.fetch
        start = len(value_key(space))
        return [(key[start:], value if mode == MODE_RAW and type(value) is str else
                 fetch(mode, filename, value, False))
                for key, mode, filename, value in self._cache._sql(query, params).fetchall()]

    def delete_values(self, space: str, *, keys: Iterable[str] = (),
                      prefix: str | None = None) -> int:
        if self.read_only:
            raise read_only_error(self.location, "be written")
        named = list(keys)
        check_value_names(space, named if prefix is None else [*named, prefix])
        with self._cache._transact(retry=True) as (sql, cleanup):
            doomed = {value_key(space, key) for key in named}
            if prefix is not None:
                low = value_key(space, prefix)
                doomed.update(key for key, in sql(
                    "SELECT key FROM Cache WHERE key >= ? AND key < ? AND raw = 1",
                    (low, prefix_end(low))).fetchall())
            return self._delete_rows(sql, cleanup, sorted(doomed))
