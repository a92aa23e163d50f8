"""Who may decide a pending approval: its approvers' list and the four-eyes rule.

A pending approval (``RunRecord.pending_approval``) carries ``approvers`` (names, or None:
anyone), ``four_eyes`` (True: the person who started the run may not decide it) and
``started_by`` (who started the run). Once escalated (``escalation``), the escalation's
``approvers`` decide instead. A pending approval written before these fields existed is
decided by anyone, as it always was.

:func:`refusal` is asked by :func:`~durable_nb.execution.approvals.leave_decision`, which
every path decides through, so the rule holds for every one of them: the CLI, ``%durable``,
``durable_nb.approve``, a panel, a batch's Approve all, the Jupyter server, a decision link.
A deadline's policy is never refused.

Names are compared as people write them: case does not matter, a suffix in brackets is not
part of the name (a panel decides as ``ana (notebook)``), and a name without ``@`` in the
list stands for that user anywhere (``ana`` is ``ana@laptop``, the OS user ana on a machine
without ``DURABLE_NB_USER``, and ``ana@example.com``, a decision by a link sent there). A name
with ``@`` (an e-mail address) in the list matches only itself. This protects against
mistakes and against the wrong person in the paths where Jupyter says who the user is; it
is no defence against someone who can write the journal, nor against ``--by`` (see the
docs' threat model).
"""

from __future__ import annotations

import getpass
import os
import re
from collections.abc import Iterable

from ..errors import NotAllowedToDecide
from ..journal import this_host

__all__ = ["APPROVER_VARIABLE", "allowed_approvers", "approver_name", "approvers_list",
           "refusal", "same_person"]

#: The environment variable naming who decides approvals from this machine (the CLI, a
#: notebook's panel, a Jupyter Server whose users are anonymous); the OS user without it.
APPROVER_VARIABLE = "DURABLE_NB_USER"
#: What JupyterHub sets in a user's server and kernels: the Hub user's name.
_HUB_USER_VARIABLE = "JUPYTERHUB_USER"

_BRACKETED = re.compile(r"\s*\([^()]*\)\s*$")


def approver_name(*, host: bool = True) -> str:
    """Who acts here when nobody is named: ``$DURABLE_NB_USER``, else the JupyterHub user
    (``$JUPYTERHUB_USER``), else the OS user (``user@host``, or ``user`` with
    ``host=False``)."""
    for variable in (APPROVER_VARIABLE, _HUB_USER_VARIABLE):
        configured = os.environ.get(variable, "").strip()
        if configured:
            return configured
    return f"{getpass.getuser()}@{this_host()}" if host else getpass.getuser()


def approvers_list(value: str | Iterable[str] | None, what: str = "approvers"
                   ) -> list[str] | None:
    """``value`` (names, or one string of comma-separated names) as a list of names, or None
    for None; ValueError for an empty list or a name that is not a non-empty string."""
    if value is None:
        return None
    names = value.split(",") if isinstance(value, str) else list(value)
    if not all(isinstance(n, str) for n in names):
        raise ValueError(f"{what} must be names (strings), like ['ana', 'bo@example.com'], "
                         f"not {value!r}")
    names = [n.strip() for n in names]
    if not names or not all(names):
        raise ValueError(f"{what}={value!r} names nobody: give one or more names (Jupyter "
                         f"users, or e-mail addresses), or leave it out so that anyone may "
                         f"decide")
    return names


def _person(name: str) -> str:
    return _BRACKETED.sub("", name).strip().lower()


def _listed(name: str, by: str) -> bool:
    """Whether ``by`` is the person the listed ``name`` stands for."""
    listed, decider = _person(name), _person(by)
    return decider == listed or ("@" not in listed and decider.split("@", 1)[0] == listed)


def same_person(a: str, b: str) -> bool:
    """Whether ``a`` and ``b`` may be one person (the four-eyes rule refuses then): either
    stands for the other as a listed name would."""
    return _listed(a, b) or _listed(b, a)


def allowed_approvers(pending: dict) -> list[str] | None:
    """Who may decide ``pending``: the escalation's approvers once it was escalated, else its
    own; None: anyone."""
    escalation = pending.get("escalation")
    if isinstance(escalation, dict) and escalation.get("approvers"):
        return list(escalation["approvers"])
    approvers = pending.get("approvers")
    return list(approvers) if approvers else None


def refusal(run_id: str, pending: dict, by: str, via: str) -> NotAllowedToDecide | None:
    """Why ``by`` (deciding ``via``) may not decide ``pending`` of run ``run_id``, as the
    error to raise; None when they may. A deadline (``via="timeout"``) always may."""
    if via == "timeout":
        return None
    name = str(pending.get("name"))
    allowed = allowed_approvers(pending)
    starter = pending.get("started_by")
    if pending.get("four_eyes") and isinstance(starter, str) and same_person(by, starter):
        others = None if allowed is None else [a for a in allowed
                                               if not same_person(a, starter)]
        return NotAllowedToDecide(run_id, name, by, others, started_by=starter)
    if allowed is not None and not any(_listed(a, by) for a in allowed):
        return NotAllowedToDecide(run_id, name, by, allowed)
    return None
