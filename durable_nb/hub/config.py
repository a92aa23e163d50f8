"""The hub administrator's configuration of the durable-nb service: who is who.

A JSON file named by ``$DURABLE_NB_HUB_CONFIG`` in the service's environment (which the
hub's configuration sets, ``c.JupyterHub.services``; no user's server sees it)::

    {"users": {"ana": {"email": "ana@team.example", "role": "dnb_ana"},
               "bo":  {"email": "bo@team.example",  "role": "dnb_bo"}},
     "four_eyes": true}

``users`` maps each hub user to the address decision links for her are sent to and to the
PostgreSQL role her server logs in as (the role the database records as a run's starter).
``four_eyes`` (default true): nobody decides a request of a run her role started or last
wrote, whatever the request says. Identities come from the hub (its OAuth, its API tokens)
and this file, never from a user's environment or a run's record.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path

from ..errors import DurableError

__all__ = ["CONFIG_VARIABLE", "HubConfig", "load_config"]

CONFIG_VARIABLE = "DURABLE_NB_HUB_CONFIG"


@dataclass(frozen=True)
class HubConfig:
    """Hub users' addresses and database roles, and the hub-wide four-eyes rule."""

    emails: dict[str, str] = field(default_factory=dict)
    roles: dict[str, str] = field(default_factory=dict)
    four_eyes: bool = True

    def person_of_role(self, role: str | None) -> str | None:
        """The hub user whose server logs in as database role ``role`` (the role's own name
        for a role the map does not list), or None for None."""
        if role is None:
            return None
        for user, mapped in self.roles.items():
            if mapped == role:
                return user
        return role


def load_config(path: str | os.PathLike | None = None) -> HubConfig:
    """The configuration at ``path`` (default ``$DURABLE_NB_HUB_CONFIG``; none: nobody's
    address or role known, four-eyes on). A file that is not the format above is an error
    naming what is wrong."""
    where = path or os.environ.get(CONFIG_VARIABLE)
    if not where:
        return HubConfig()
    try:
        data = json.loads(Path(where).read_text())
    except (OSError, ValueError) as exc:
        raise DurableError(f"the durable-nb hub configuration {where} cannot be read: {exc}. "
                           f"It is a JSON file like "
                           f'{{"users": {{"ana": {{"email": "ana@x", "role": "dnb_ana"}}}}}}.'
                           ) from None
    users = data.get("users", {}) if isinstance(data, dict) else None
    if not isinstance(users, dict) or not all(isinstance(v, dict) for v in users.values()):
        raise DurableError(f"the durable-nb hub configuration {where}: \"users\" must map hub "
                           f"user names to {{\"email\": ..., \"role\": ...}}")
    four_eyes = data.get("four_eyes", True)
    if not isinstance(four_eyes, bool):
        raise DurableError(f"the durable-nb hub configuration {where}: \"four_eyes\" must be "
                           f"true or false, not {four_eyes!r}")
    return HubConfig(emails={u: str(v["email"]) for u, v in users.items() if v.get("email")},
                     roles={u: str(v["role"]) for u, v in users.items() if v.get("role")},
                     four_eyes=four_eyes)
