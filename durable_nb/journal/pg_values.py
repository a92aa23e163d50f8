"""The PostgreSQL journal's keyed values (:meth:`~durable_nb.journal.base.Journal.put_values`
and the rest): the ``keyed_values`` table, primary key ``(scope, space, key)`` in byte order,
each call one statement or one transaction. A run's values (scope = its id) are deleted and
renamed with it by :class:`~durable_nb.journal.postgres.PostgresJournal`; who may write a
scope on a hub is :func:`scope_owner_migration`'s trigger."""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from .base import check_value_names
from .pg_connection import retried


def scope_owner_migration(s: str) -> list[str]:
    """Keyed values in scopes (schema ``s``): the column ``scope`` (a run's id: the values
    are the run's), the primary key ``(scope, space, key)``, and, once a decider is named (a
    hub, :mod:`durable_nb.hub`), who writes them, as for a run's steps: a run's scope is
    written, changed and deleted only by the role that created the run, any other scope only
    by the role that wrote its first value (in key order), and the decider writes every
    scope. Each value records the login role that wrote it first (``created_by``)."""
    decider = f"SELECT value::json ->> 'role' INTO decider FROM {s}.meta WHERE key = 'decider'"

    def refuse(text: str, *args: str) -> str:
        return (f"RAISE EXCEPTION USING ERRCODE = 'insufficient_privilege', MESSAGE = "
                f"format('{text}', {', '.join(args)})")
    return [
        f"""ALTER TABLE {s}.keyed_values ADD COLUMN scope text COLLATE "C" NOT NULL DEFAULT '',
            ADD COLUMN created_by text""",
        f"ALTER TABLE {s}.keyed_values DROP CONSTRAINT keyed_values_pkey",
        f"ALTER TABLE {s}.keyed_values ADD PRIMARY KEY (scope, space, key)",
        f"""CREATE FUNCTION {s}.guard_keyed_value() RETURNS trigger LANGUAGE plpgsql AS $fn$
            DECLARE
                decider text;
                scoped text;
                owner text;
            BEGIN
                IF TG_OP = 'INSERT' THEN
                    NEW.created_by := session_user;
                ELSIF TG_OP = 'UPDATE' THEN
                    NEW.created_by := OLD.created_by;
                END IF;
                {decider};
                IF decider IS NOT NULL AND NOT pg_has_role(session_user, decider, 'MEMBER') THEN
                    FOREACH scoped IN ARRAY CASE TG_OP WHEN 'DELETE' THEN ARRAY[OLD.scope]
                            WHEN 'INSERT' THEN ARRAY[NEW.scope]
                            ELSE ARRAY[OLD.scope, NEW.scope] END LOOP
                        SELECT created_by INTO owner FROM {s}.runs WHERE run_id = scoped;
                        IF FOUND THEN
                            IF owner IS DISTINCT FROM session_user THEN
                                {refuse("run %s was started by the role %s: only that role "
                                        "and %s (the durable-nb hub service) write or delete "
                                        "its keyed values (its LangGraph thread), not %s",
                                        "scoped", "coalesce(owner, 'unknown')", "decider",
                                        "session_user")};
                            END IF;
                            CONTINUE;
                        END IF;
                        -- Two roles writing the first value of a new scope: one goes first.
                        PERFORM pg_advisory_xact_lock(hashtext('durable_nb scope ' || scoped));
                        SELECT created_by INTO owner FROM {s}.keyed_values
                            WHERE scope = scoped ORDER BY space, key LIMIT 1;
                        IF FOUND AND owner IS DISTINCT FROM session_user THEN
                            {refuse("the keyed values %s (a LangGraph thread) were started by "
                                    "the role %s: only that role and %s (the durable-nb hub "
                                    "service) write or delete them, not %s", "scoped",
                                    "coalesce(owner, 'unknown')", "decider", "session_user")};
                        END IF;
                    END LOOP;
                END IF;
                RETURN CASE WHEN TG_OP = 'DELETE' THEN OLD ELSE NEW END;
            END
            $fn$""",
        f"""CREATE TRIGGER keyed_values_owner BEFORE INSERT OR UPDATE OR DELETE
            ON {s}.keyed_values FOR EACH ROW EXECUTE PROCEDURE {s}.guard_keyed_value()""",
        f"ALTER FUNCTION {s}.guard_keyed_value() SET search_path = pg_catalog, pg_temp",
    ]


def value_statements(s: str) -> dict[str, str]:
    """The statements on ``keyed_values`` (schema ``s``)."""
    return {
        "put_value": f"INSERT INTO {s}.keyed_values (scope, space, key, value) "
                     f"VALUES (%s, %s, %s, %s) "
                     f"ON CONFLICT (scope, space, key) DO UPDATE SET value = EXCLUDED.value",
        "add_value": f"INSERT INTO {s}.keyed_values (scope, space, key, value) "
                     f"VALUES (%s, %s, %s, %s) ON CONFLICT DO NOTHING",
        "get_values": f"SELECT key, value FROM {s}.keyed_values WHERE scope = %s AND space = %s "
                      f"AND key = ANY(%s)",
        # The start of a scan: scan_values adds the order and the limit.
        "scan_values": f"SELECT key, value FROM {s}.keyed_values WHERE scope = %s AND space = %s "
                       f"AND key >= %s AND (%s::text IS NULL OR key < %s)",
        "delete_values": f"DELETE FROM {s}.keyed_values WHERE scope = %s AND space = %s "
                         f"AND (key = ANY(%s) OR (%s::text IS NOT NULL AND key >= %s "
                         f"AND (%s::text IS NULL OR key < %s)))",
        "value_scopes": f"SELECT DISTINCT scope FROM {s}.keyed_values WHERE space = %s "
                        f"ORDER BY scope",
        "scope_values": f"SELECT space, key, value FROM {s}.keyed_values WHERE scope = %s "
                        f"ORDER BY space, key",
        "delete_scope": f"DELETE FROM {s}.keyed_values WHERE scope = %s",
        "rename_scope": f"UPDATE {s}.keyed_values SET scope = %s WHERE scope = %s",
    }


def _prefix_end(prefix: str) -> str | None:
    """The first text after every text that starts with ``prefix`` (None: no bound)."""
    return prefix[:-1] + chr(ord(prefix[-1]) + 1) if prefix else None


class PgKeyedValues:
    """Keyed values of :class:`~durable_nb.journal.postgres.PostgresJournal`."""

    @retried
    def put_values(self, space: str, values: Mapping[str, str], *, scope: str = "",
                   replace: bool = True) -> None:
        self._writable("store keyed values")
        check_value_names(space, values, scope)
        if not values:
            return
        statement = self._sql["put_value" if replace else "add_value"]
        with self._conn("storing keyed values") as conn, conn.transaction():
            with conn.cursor() as cursor:
                cursor.executemany(statement, [(scope, space, key, text)
                                               for key, text in values.items()])

    @retried
    def get_values(self, space: str, keys: Iterable[str], *,
                   scope: str = "") -> dict[str, str]:
        check_value_names(space, scope=scope)
        wanted = list(dict.fromkeys(keys))
        if not wanted:
            return {}
        with self._conn("reading keyed values") as conn:
            return dict(conn.execute(self._sql["get_values"], (scope, space, wanted)).fetchall())

    @retried
    def scan_values(self, space: str, prefix: str = "", *, scope: str = "",
                    below: str | None = None, reverse: bool = False,
                    limit: int | None = None) -> list[tuple[str, str]]:
        check_value_names(space, [prefix], scope)
        high = _prefix_end(prefix)
        if below is not None:
            high = below if high is None else min(high, below)
        query = self._sql["scan_values"] + f" ORDER BY key{' DESC' if reverse else ''}"
        params: list = [scope, space, prefix, high, high]
        if limit is not None:
            query += " LIMIT %s"
            params.append(max(int(limit), 0))
        with self._conn("reading keyed values") as conn:
            return [tuple(row) for row in conn.execute(query, params).fetchall()]

    @retried
    def delete_values(self, space: str, *, scope: str = "", keys: Iterable[str] = (),
                      prefix: str | None = None) -> int:
        self._writable("delete keyed values")
        named = list(keys)
        check_value_names(space, named if prefix is None else [*named, prefix], scope)
        high = None if prefix is None else _prefix_end(prefix)
        with self._conn("deleting keyed values") as conn:
            return conn.execute(self._sql["delete_values"],
                                (scope, space, named, prefix, prefix, high, high)).rowcount

    @retried
    def value_scopes(self, space: str) -> list[str]:
        check_value_names(space)
        with self._conn("reading keyed values") as conn:
            return [scope for scope, in conn.execute(self._sql["value_scopes"], (space,))]

    @retried
    def scope_values(self, scope: str) -> list[tuple[str, str, str]]:
        check_value_names("-", scope=scope)
        with self._conn("reading keyed values") as conn:
            return [tuple(row) for row in conn.execute(self._sql["scope_values"], (scope,))]
