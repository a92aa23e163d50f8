"""The PostgreSQL journal's keyed values (:meth:`~durable_nb.journal.base.Journal.put_values`
and the rest): the ``keyed_values`` table, primary key ``(space, key)`` in byte order, each
call one statement or one transaction."""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from .base import check_value_names
from .pg_connection import retried


def _prefix_end(prefix: str) -> str | None:
    """The first text after every text that starts with ``prefix`` (None: no bound)."""
    return prefix[:-1] + chr(ord(prefix[-1]) + 1) if prefix else None


class PgKeyedValues:
    """Keyed values of :class:`~durable_nb.journal.postgres.PostgresJournal`."""

    @retried
    def put_values(self, space: str, values: Mapping[str, str], *, replace: bool = True) -> None:
        self._writable("store keyed values")
        check_value_names(space, values)
        if not values:
            return
        statement = self._sql["put_value" if replace else "add_value"]
        with self._conn("storing keyed values") as conn, conn.transaction():
            with conn.cursor() as cursor:
                cursor.executemany(statement, [(space, key, text)
                                               for key, text in values.items()])

    @retried
    def get_values(self, space: str, keys: Iterable[str]) -> dict[str, str]:
        check_value_names(space)
        wanted = list(dict.fromkeys(keys))
        if not wanted:
            return {}
        with self._conn("reading keyed values") as conn:
            return dict(conn.execute(self._sql["get_values"], (space, wanted)).fetchall())

    @retried
    def scan_values(self, space: str, prefix: str = "", *, below: str | None = None,
                    reverse: bool = False, limit: int | None = None) -> list[tuple[str, str]]:
        check_value_names(space, [prefix])
        high = _prefix_end(prefix)
        if below is not None:
            high = below if high is None else min(high, below)
        query = self._sql["scan_values"] + f" ORDER BY key{' DESC' if reverse else ''}"
        params: list = [space, prefix, high, high]
        if limit is not None:
            query += " LIMIT %s"
            params.append(max(int(limit), 0))
        with self._conn("reading keyed values") as conn:
            return [tuple(row) for row in conn.execute(query, params).fetchall()]

    @retried
    def delete_values(self, space: str, *, keys: Iterable[str] = (),
                      prefix: str | None = None) -> int:
        self._writable("delete keyed values")
        named = list(keys)
        check_value_names(space, named if prefix is None else [*named, prefix])
        high = None if prefix is None else _prefix_end(prefix)
        with self._conn("deleting keyed values") as conn:
            return conn.execute(self._sql["delete_values"],
                                (space, named, prefix, prefix, high, high)).rowcount
