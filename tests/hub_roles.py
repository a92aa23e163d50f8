"""One shared PostgreSQL journal set up for a hub: a service role that owns the schema and
alone decides, and a role per hub user (tests/postgres.py's server)."""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from urllib.parse import quote

from durable_nb.journal import PostgresJournal


@dataclass
class HubDatabase:
    """The roles' names and URLs; ``service_url`` logs in as the decider."""

    schema: str
    service_role: str
    user_roles: dict[str, str]  # hub user -> role
    urls: dict[str, str]        # "service" or hub user -> journal URL

    def journal(self, who: str) -> PostgresJournal:
        return PostgresJournal(self.urls[who])


def make_hub_database(server, users: tuple[str, ...] = ("ana", "bo", "cy")) -> HubDatabase:
    """Create the roles and a schema owned by the service role, open the journal as the
    service (which migrates it) and make the service the decider, as the service does at
    its start."""
    tag = uuid.uuid4().hex[:6]
    schema, service = f"team_{tag}", f"dnb_service_{tag}"
    roles = {user: f"dnb_{user}_{tag}" for user in users}
    database = server.url.rsplit("/", 1)[1]

    def url(role: str) -> str:
        return (f"postgresql://{role}:{quote('pw-' + role, safe='')}@127.0.0.1:{server.port}/"
                f"{database}?schema={schema}")

    with server.connect() as conn:
        for role in (service, *roles.values()):
            conn.execute(f"CREATE ROLE {role} LOGIN PASSWORD 'pw-{role}'")
        conn.execute(f"CREATE SCHEMA {schema} AUTHORIZATION {service}")
    urls = {"service": url(service), **{user: url(role) for user, role in roles.items()}}
    service_journal = PostgresJournal(urls["service"])
    try:
        service_journal.become_decider(sorted(roles.values()),
                                       people={role: user for user, role in roles.items()})
    finally:
        service_journal.dispose()
    return HubDatabase(schema, service, roles, urls)
