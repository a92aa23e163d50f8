"""An approval's policy, as pure functions of the pending request: who may decide it (its
approvers' list, four-eyes), when it is due (its deadline, escalation and reminders), and the
one grammar of a duration.

**Who may decide.** A pending approval (``RunRecord.pending_approval``) carries ``approvers``
(names, or None: anyone), ``four_eyes`` (True: the person who started the run may not decide
it) and ``started_by`` (who started the run). Once escalated (``escalation``), the
escalation's ``approvers`` decide instead. A pending approval written before these fields
existed is decided by anyone, as it always was. :func:`refusal` is asked by
:func:`durable_nb.approvals.decide.decide`, which every path decides through. A deadline's
policy is never refused.

Names are compared as people write them: case does not matter, a suffix in brackets is not
part of the name (a panel decides as ``ana (notebook)``), and a name without ``@`` in the
list stands for that user anywhere (``ana`` is ``ana@laptop``, the OS user ana on a machine
without ``DURABLE_NB_USER``, and ``ana@example.com``, a decision by a link sent there). A name
with ``@`` (an e-mail address) in the list matches only itself. This protects against
mistakes and against the wrong person in the paths where Jupyter says who the user is; it
is no defence against someone who can write the journal, nor against ``--by`` (see the
docs' threat model).

**When it is due.** An approval asked with ``timeout`` keeps its policy in the pending
approval: ``timeout_at`` (Unix time), ``on_timeout`` (``"reject"``, ``"approve"`` or
``"escalate"``), ``escalate_to`` and ``remind_at`` (Unix times at which a reminder is due).
:func:`deadline_of`, :func:`due_followups` and :func:`next_due` read them; applying them is
:func:`durable_nb.approvals.tick.tick`'s.

**Durations** have one grammar everywhere (``ctx.approval(timeout=)``, ``@tool(timeout=)``,
``--timeout``): :func:`parse_duration`.
"""

from __future__ import annotations

import datetime
import getpass
import math
import os
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any, Union

from ..errors import ApprovalPolicyError, NotAllowedToDecide
from ..journal import this_host

__all__ = ["APPROVER_VARIABLE", "DURATION_FORMS", "ON_TIMEOUT", "ApprovalPolicy", "Duration",
           "FollowUp", "allowed_approvers", "approver_name", "approvers_list", "deadline_of",
           "due_followups", "escalation_key", "next_due", "parse_duration", "refusal",
           "same_person", "starter_name"]

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


def starter_name() -> str:
    """Who starts a run here, as its record says (``started_by``): on a JupyterHub the hub
    user the hub started this server and kernel for (``$JUPYTERHUB_USER``), whatever
    ``$DURABLE_NB_USER`` says (a name she sets herself, which the hub's service never
    believes: the starter shown must be the one it checks four-eyes against); elsewhere
    :func:`approver_name` without the host."""
    hub_user = os.environ.get(_HUB_USER_VARIABLE, "").strip()
    return hub_user or approver_name(host=False)


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


def refusal(run_id: str, pending: dict, by: str, via: str, *, signed_in: bool = True
            ) -> NotAllowedToDecide | None:
    """Why ``by`` (deciding ``via``) may not decide ``pending`` of run ``run_id``, as the
    error to raise; None when they may. A deadline (``via="timeout"``) always may. A decider
    nobody identified (``signed_in=False``: a link shared in a Slack channel or sent to a
    webhook, which anyone who sees it can click) may decide only a request that allows
    anyone: where an approvers' list or four-eyes applies, the person must sign in."""
    if via == "timeout":
        return None
    name = str(pending.get("name"))
    allowed = allowed_approvers(pending)
    starter = pending.get("started_by")
    if not signed_in and (allowed is not None or pending.get("four_eyes")):
        return NotAllowedToDecide(run_id, name, by, allowed, shared=True,
                                  four_eyes=bool(pending.get("four_eyes")))
    if pending.get("four_eyes") and isinstance(starter, str) and same_person(by, starter):
        others = None if allowed is None else [a for a in allowed
                                               if not same_person(a, starter)]
        return NotAllowedToDecide(run_id, name, by, others, started_by=starter)
    if allowed is not None and not any(_listed(a, by) for a in allowed):
        return NotAllowedToDecide(run_id, name, by, allowed)
    return None


#: What an approval's ``timeout`` and ``remind`` take: seconds, a timedelta, or "90s",
#: "30m", "2h", "1d".
Duration = Union[int, float, datetime.timedelta, str]

#: The policies ``on_timeout`` takes.
ON_TIMEOUT = ("reject", "approve", "escalate")

_UNITS = {"": 1.0, "s": 1.0, "sec": 1.0, "m": 60.0, "min": 60.0, "h": 3600.0,
          "d": 86400.0}
# ASCII digits only (re.ASCII): "٩٠" or "９０" is not a duration someone meant to type.
_DURATION = re.compile(r"\s*([0-9]+(?:\.[0-9]+)?)\s*(s|sec|m|min|h|d)?\s*", re.ASCII)
#: The grammar of a duration, as errors and the docs say it.
DURATION_FORMS = ('seconds (a number, or a string like "90"), a datetime.timedelta, or a '
                  'number with a unit: "90s", "90sec", "30m", "30min", "2h", "1d"')
#: The longest duration taken (about 31,700 years): beyond it a deadline is not a time.
_LONGEST = 1e12


def parse_duration(value: Duration, what: str = "timeout") -> float:
    """``value`` in seconds, more than zero: a number (``90``, ``1.5``), a timedelta, or a
    string of ASCII digits with an optional unit (``"90"``, ``"90s"``, ``"90sec"``,
    ``"30m"``, ``"30min"``, ``"2h"``, ``"1d"``). The one grammar of ``ctx.approval(timeout=)``,
    ``@tool(timeout=)`` and ``--timeout``. Anything else (zero, negative, not finite, beyond
    about 31,700 years, Unicode digits): :class:`ApprovalPolicyError` saying the forms."""
    seconds: float | None = None
    try:
        if isinstance(value, datetime.timedelta):
            seconds = value.total_seconds()
        elif isinstance(value, (int, float)) and not isinstance(value, bool):
            seconds = float(value)
        elif isinstance(value, str):
            match = _DURATION.fullmatch(value.lower())
            if match:
                seconds = float(match.group(1)) * _UNITS[match.group(2) or ""]
    except OverflowError:  # an int too large for a float: 10**400
        seconds = None
    if seconds is None or not math.isfinite(seconds) or not 0 < seconds <= _LONGEST:
        raise ApprovalPolicyError(f"{what}={value!r} is not a duration: use {DURATION_FORMS}; "
                                  f"more than zero and at most {_LONGEST:.0e} seconds.")
    return seconds


@dataclass(frozen=True)
class ApprovalPolicy:
    """What happens when nobody decides an approval in time (see the module docstring)."""
    timeout: float | None = None
    on_timeout: str = "reject"
    escalate_to: tuple[str, ...] = ()
    #: Seconds before the deadline at which a reminder is due, longest first.
    remind: tuple[float, ...] = ()

    @classmethod
    def of(cls, timeout: Duration | None = None, on_timeout: str = "reject",
           escalate_to: str | Sequence[str] | None = None,
           remind: Duration | Sequence[Duration] | None = None) -> "ApprovalPolicy":
        """The policy for these options, checked: :class:`ApprovalPolicyError` naming the
        option that is wrong and what it takes."""
        seconds = None if timeout is None else parse_duration(timeout)
        if on_timeout not in ON_TIMEOUT:
            raise ApprovalPolicyError(f"on_timeout={on_timeout!r} is not a policy: use "
                                      f"{', '.join(map(repr, ON_TIMEOUT))}.")
        approvers = _approvers(escalate_to)
        if on_timeout == "escalate" and not approvers:
            raise ApprovalPolicyError('on_timeout="escalate" needs escalate_to: a list of '
                                      'approvers (user names or e-mail addresses).')
        if remind is None:
            befores: tuple[float, ...] = ()
        else:
            many = isinstance(remind, (list, tuple))
            befores = tuple(parse_duration(r, "remind") for r in (remind if many else [remind]))
        if befores and seconds is None:
            raise ApprovalPolicyError("remind needs a timeout: reminders are sent that long "
                                      "before the deadline.")
        return cls(seconds, on_timeout, approvers, tuple(sorted(set(befores), reverse=True)))

    def pending_fields(self, requested_at: float) -> dict:
        """The fields of a pending approval asked at ``requested_at`` under this policy
        (an approval without a timeout has none of them but ``timeout_at``)."""
        if self.timeout is None:
            return {"timeout_at": None}
        timeout_at = requested_at + self.timeout
        fields: dict[str, Any] = {"timeout_at": timeout_at, "timeout": self.timeout,
                                  "on_timeout": self.on_timeout}
        if self.escalate_to:
            fields["escalate_to"] = list(self.escalate_to)
        if self.remind:
            fields["remind_at"] = [timeout_at - before for before in self.remind
                                   if timeout_at - before > requested_at]
        return fields


def _approvers(value: str | Sequence[str] | None) -> tuple[str, ...]:
    if value is None:
        return ()
    names = value.split(",") if isinstance(value, str) else value
    if not isinstance(names, (list, tuple)) or not all(isinstance(n, str) for n in names):
        raise ApprovalPolicyError(f"escalate_to={value!r} is not a list of approvers: use user "
                                  f"names or e-mail addresses, e.g. ['ana', 'bo@example.org'].")
    return tuple(dict.fromkeys(n.strip() for n in names if n.strip()))


def deadline_of(pending: dict) -> float | None:
    """When ``pending`` is decided by its policy: the escalation's deadline once escalated,
    else ``timeout_at`` (None: no deadline)."""
    escalation = pending.get("escalation")
    if escalation:
        return escalation.get("timeout_at")
    return pending.get("timeout_at")


def escalation_key(pending: dict) -> str:
    """The key of ``pending``'s escalation record in the deliveries store."""
    return f"{pending['id']}/escalation"


@dataclass(frozen=True)
class FollowUp:
    """A follow-up notice due for a request."""
    suffix: str  # of its delivery key: "remind-2", "escalated"
    event: str   # the notice's event: "approval.reminder", "approval.escalated"
    text: str    # the history's sentence once it is sent, "{channel}" for its channel


def due_followups(pending: dict, now: float) -> list[FollowUp]:
    """The follow-ups of ``pending`` (with its escalation, if any) due at ``now``, whether
    sent already or not (the caller claims each once)."""
    due: list[FollowUp] = []
    escalation = pending.get("escalation")
    if escalation:
        due.append(FollowUp("escalated", "approval.escalated",
                            f"escalation to {', '.join(escalation.get('approvers') or ())} "
                            f"sent by {{channel}}"))
        return due  # reminders were for the first deadline
    deadline = deadline_of(pending)
    if deadline is None or now >= deadline:
        return due
    reached = [i for i, at in enumerate(pending.get("remind_at") or ()) if now >= at]
    if reached:
        number = reached[-1] + 1
        left = max(0, round(deadline - now))
        due.append(FollowUp(f"remind-{number}", "approval.reminder",
                            f"reminder {number} sent by {{channel}}: no decision yet, "
                            f"{left} s left before the deadline"))
    return due


def next_due(pending: dict, now: float) -> float | None:
    """When something about ``pending`` (with its escalation, if any) next comes due after
    ``now``: its deadline, or a reminder not reached yet (None: nothing ever). A sweeper
    sleeps until then."""
    deadline = deadline_of(pending)
    if deadline is None:
        return None
    ahead = [at for at in (pending.get("remind_at") or ()) if now < at < deadline]
    if pending.get("escalation"):
        ahead = []
    return min([deadline, *ahead])
