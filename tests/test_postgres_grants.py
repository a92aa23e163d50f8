"""The grants the README documents for a shared PostgreSQL journal, on a real server: a role
that owns a schema made for it runs agents there; a role with USAGE and SELECT lists and shows
runs, and its writes are refused with a message, nothing written."""

from __future__ import annotations

import uuid
from urllib.parse import quote

import pytest

import durable_nb as dn
from durable_nb.errors import DurableError
from durable_nb.journal import PostgresJournal

pytestmark = pytest.mark.postgres


def _role_url(server, role: str, password: str, schema: str) -> str:
    return (f"postgresql://{role}:{quote(password, safe='')}@127.0.0.1:{server.port}/"
            f"{server.url.rsplit('/', 1)[1]}?schema={schema}")


def test_the_documented_grants_let_one_role_run_and_another_only_read(postgres_server):
    tag = uuid.uuid4().hex[:8]
    agent, auditor, schema = f"agent_{tag}", f"auditor_{tag}", f"shared_{tag}"
    with postgres_server.connect() as conn:  # the README's statements, as an administrator
        conn.execute(f"CREATE ROLE {agent} LOGIN PASSWORD 'a-{tag}'")
        conn.execute(f"CREATE SCHEMA {schema} AUTHORIZATION {agent}")
        conn.execute(f"CREATE ROLE {auditor} LOGIN PASSWORD 'r-{tag}'")
        conn.execute(f"GRANT USAGE ON SCHEMA {schema} TO {auditor}")
        conn.execute(f"ALTER DEFAULT PRIVILEGES FOR ROLE {agent} IN SCHEMA {schema} "
                     f"GRANT SELECT ON TABLES TO {auditor}")
    writer = PostgresJournal(_role_url(postgres_server, agent, f"a-{tag}", schema))
    reader = PostgresJournal(_role_url(postgres_server, auditor, f"r-{tag}", schema),
                             read_only=True)
    try:
        assert dn.execute("graded", lambda ctx: ctx.run("grade", lambda: "A"),
                          journal=writer) == "A"
        assert [r.run_id for r in dn.runs(journal=reader)] == ["graded"]
        assert [e.name for e in dn.get_run("graded", journal=reader).steps] == ["grade"]
        with pytest.raises(DurableError) as refused:
            dn.delete("graded", journal=reader)
        assert "read-only" in str(refused.value) or "not writable" in str(refused.value)
        # The auditor's own connection, read-write: the database refuses, and says which.
        as_auditor = PostgresJournal(_role_url(postgres_server, auditor, f"r-{tag}", schema))
        try:
            with pytest.raises(DurableError, match="permission denied"):
                dn.delete("graded", journal=as_auditor)
            assert "r-" + tag not in str(as_auditor.location)
        finally:
            as_auditor.dispose()
        assert dn.get_run("graded", journal=writer).status is dn.Status.DONE
    finally:
        writer.dispose()
        reader.dispose()
