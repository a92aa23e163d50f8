"""The disk journal's keyed values (:meth:`~durable_nb.journal.base.Journal.put_values` and
the rest): rows ``value:SCOPE<US>SPACE<US>KEY`` of its diskcache ``Cache`` table, JSON text
like every other row, read in key order by range queries on the table's key index. A scope's
rows are one range: a run's (scope = run id) are deleted and renamed with it by
:class:`~durable_nb.journal.local.DiskJournal`."""

from __future__ import annotations

import time
from collections.abc import Iterable, Mapping

from diskcache.core import MODE_RAW

from .base import check_value_names, read_only_error
from .disk_layout import INSERT_IF_ABSENT, READ_AHEAD, prefix_end

#: Between a scope, a space and its keys: a character no scope or space holds
#: (check_value_names; a run id is printable).
VALUE_SEP = "\x1f"


def value_key(scope: str, space: str | None = None, key: str = "") -> str:
    """The row key of a keyed value; without ``space``: the prefix of the scope's rows."""
    if space is None:
        return f"value:{scope}{VALUE_SEP}"
    return f"value:{scope}{VALUE_SEP}{space}{VALUE_SEP}{key}"


class DiskKeyedValues:
    """Keyed values of :class:`~durable_nb.journal.local.DiskJournal`."""

    def put_values(self, space: str, values: Mapping[str, str], *, scope: str = "",
                   replace: bool = True) -> None:
        if self.read_only:
            raise read_only_error(self.location, "be written")
        check_value_names(space, values, scope)
        rows = [(value_key(scope, space, key), self._columns(value_key(scope, space, key), text))
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

    def get_values(self, space: str, keys: Iterable[str], *,
                   scope: str = "") -> dict[str, str]:
        check_value_names(space, scope=scope)
        wanted = list(dict.fromkeys(keys))
        found: dict[str, str] = {}
        start = len(value_key(scope, space))
        for first in range(0, len(wanted), READ_AHEAD):
            chunk = [value_key(scope, space, key) for key in wanted[first:first + READ_AHEAD]]
            rows = self._cache._sql(
                "SELECT key, mode, filename, value FROM Cache WHERE raw = 1 AND key IN ("
                + ", ".join("?" * len(chunk)) + ")", chunk).fetchall()
            for key, mode, filename, value in rows:
                found[key[start:]] = self._value_text(mode, filename, value)
        return found

    def scan_values(self, space: str, prefix: str = "", *, scope: str = "",
                    below: str | None = None, reverse: bool = False,
                    limit: int | None = None) -> list[tuple[str, str]]:
        check_value_names(space, [prefix], scope)
        low = value_key(scope, space, prefix)
        high = prefix_end(low)
        if below is not None:
            high = min(high, value_key(scope, space, below))
        query = ("SELECT key, mode, filename, value FROM Cache WHERE key >= ? AND key < ? "
                 f"AND raw = 1 ORDER BY key{' DESC' if reverse else ''}")
        params: list = [low, high]
        if limit is not None:
            query += " LIMIT ?"
            params.append(max(int(limit), 0))
        start = len(value_key(scope, space))
        return [(key[start:], self._value_text(mode, filename, value))
                for key, mode, filename, value in self._cache._sql(query, params).fetchall()]

    def delete_values(self, space: str, *, scope: str = "", keys: Iterable[str] = (),
                      prefix: str | None = None) -> int:
        if self.read_only:
            raise read_only_error(self.location, "be written")
        named = list(keys)
        check_value_names(space, named if prefix is None else [*named, prefix], scope)
        with self._cache._transact(retry=True) as (sql, cleanup):
            doomed = {value_key(scope, space, key) for key in named}
            if prefix is not None:
                low = value_key(scope, space, prefix)
                doomed.update(key for key, in sql(
                    "SELECT key FROM Cache WHERE key >= ? AND key < ? AND raw = 1",
                    (low, prefix_end(low))).fetchall())
            return self._delete_rows(sql, cleanup, sorted(doomed))

    def value_scopes(self, space: str) -> list[str]:
        check_value_names(space)
        rows = self._cache._sql("SELECT key FROM Cache WHERE key >= ? AND key < ? AND raw = 1",
                                ("value:", prefix_end("value:"))).fetchall()
        scopes = set()
        for key, in rows:
            parts = key[len("value:"):].split(VALUE_SEP, 2)
            if len(parts) == 3 and parts[1] == space:
                scopes.add(parts[0])
        return sorted(scopes)

    def scope_values(self, scope: str) -> list[tuple[str, str, str]]:
        check_value_names("-", scope=scope)
        low = value_key(scope)
        rows = self._cache._sql("SELECT key, mode, filename, value FROM Cache WHERE key >= ? "
                                "AND key < ? AND raw = 1 ORDER BY key",
                                (low, prefix_end(low))).fetchall()
        return [(*key[len(low):].split(VALUE_SEP, 1), self._value_text(mode, filename, value))
                for key, mode, filename, value in rows]

    def _value_text(self, mode: int, filename: str | None, value: object) -> str:
        return value if mode == MODE_RAW and type(value) is str else \
            self._cache._disk.fetch(mode, filename, value, False)

    @staticmethod
    def _scope_keys(sql, scope: str) -> list[str]:
        """Inside a transaction: the keys of the scope's values (a run's: ``scope`` its id)."""
        low = value_key(scope)
        return [key for key, in sql("SELECT key FROM Cache WHERE key >= ? AND key < ? "
                                    "AND raw = 1", (low, prefix_end(low))).fetchall()]
