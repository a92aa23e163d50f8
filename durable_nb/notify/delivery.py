"""Sending a parked run's request to each channel, once, whoever sees it first.

A delivery is ``(run, request, channel)``: the run that asked, the pending approval's ``id``
(new each time a request is shown anew; the digest of what it shows goes with it) and the
channel. Its record in the journal (:meth:`~durable_nb.journal.Journal.add_delivery`) is
the claim and the audit trail:

- **Claim.** A process that sees the request adds the record ``state="claimed"``; the
  journal lets exactly one of any number of racing processes (kernels, the server
  extension, ``durable-nb notify``) add it. Only that one sends.
- **Outcome.** After each attempt the claimant writes it into the record (when, how long,
  the error's short text), by compare-and-swap on the record it wrote last; at the end the
  state is ``sent`` or, after the config's ``retry.max_attempts`` (waits with exponential
  backoff between them), ``failed``. Nothing
  retries a failed delivery by itself; the run stays parked either way: a delivery never
  decides, resumes or blocks a run.
- **Takeover.** A claim whose record has not changed for the config's ``lease`` seconds
  (its process died) is taken over, by compare-and-swap, by the next process that sees it.

**At least once.** A claimant killed after its message left and before it wrote the outcome
is taken over, and the message is sent again: the receiver gets one extra. Each message
carries the delivery id (``X-Durable-NB-Delivery: RUN/REQUEST/CHANNEL``; the e-mail's
``Message-ID`` too), the same on every attempt and every takeover, so a receiver that keeps
the ids it saw gets each request exactly once. Without takeover a dead sender's request
would never be sent; the honest alternative to at-least-once is at-most-once.
"""

from __future__ import annotations

import atexit
import dataclasses
import logging
import os
import re
import socket
import threading
import time
import uuid
from collections.abc import Callable, Iterable
from dataclasses import replace
from typing import Any

from ..approvals.history import record_event
from ..approvals.links import issue_links
from ..approvals.policy import FollowUp, deadline_of, due_followups, escalation_key
from ..approvals.request import find_decision, pending_digest, with_escalation
from ..approvals.tick import tick
from ..journal import Journal, RunRecord, Status
from .channels import WAITING_EVENTS, DeliveryFailed, Notice
from .config import NotifyConfig

__all__ = ["chosen_channels", "decided_event", "decision_suffix", "deliver", "deliver_decided",
           "deliver_failed", "delivery_key", "drain", "in_background", "notice_for",
           "notice_from_record", "notice_record", "notify_in_background", "pending_of",
           "recipients_of", "send_to", "sweep", "take_over_lapsed"]

_ERROR_CHARS = 200
_log = logging.getLogger(__name__)
#: A URL in an error's text: it may hold a password or a token (a journal's, a webhook's).
_URL = re.compile(r"\b[a-zA-Z][a-zA-Z0-9+.-]*://\S+")


def delivery_key(request_id: str, channel: str, suffix: str = "",
                 recipient: str | None = None) -> str:
    """The key of a delivery record under its run (``suffix``: a follow-up's,
    :func:`~durable_nb.approvals.policy.due_followups`; ``recipient``: one e-mail address, each delivered on its own)."""
    key = f"{request_id}/{channel}/{suffix}" if suffix else f"{request_id}/{channel}"
    return f"{key}/to:{recipient}" if recipient is not None else key


def recipients_of(channel: str, channel_config: Any, notice: Notice) -> list[str | None]:
    """Whom ``notice`` goes to over ``channel``, one delivery (claim, attempts, outcome)
    each, so that a refused address fails alone: each e-mail address; None for a channel
    with one endpoint (a webhook, a Slack channel). The one place that splits a channel's
    sending by recipient: the channel's own ``recipients()``, where a channel with one
    endpoint names itself."""
    recipients = channel_config.recipients(notice)
    return [None] if recipients == [channel_config.name] else list(recipients)


def send_to(channel: str, channel_config: Any, notice: Notice, recipient: str | None) -> None:
    """Send ``notice`` over ``channel`` once, to ``recipient`` alone (None: the channel's
    endpoint); :class:`~durable_nb.notify.channels.DeliveryFailed` if it did not arrive."""
    if recipient is not None:
        notice = replace(notice, recipients=(recipient,))
    channel_config.send(notice, channel if recipient is None else recipient)


def pending_of(record: RunRecord) -> tuple[str, dict] | None:
    """``(run that asked, pending approval)`` of a record waiting for a decision (a parent
    shows its child's), or None. A request written before approvals had ids has none, and
    is not notified."""
    pending = record.pending_approval
    if record.status is not Status.WAITING_APPROVAL or not pending or not pending.get("id"):
        return None
    return pending.get("run_id", record.run_id), pending


def chosen_channels(config: NotifyConfig, pending: dict) -> dict[str, Any]:
    """``config``'s channels that a sender other than the run's own process may use for
    ``pending``: those the run chose when it asked (``pending["notify"]["channels"]``,
    recorded as it parked), all for a request that recorded no choice."""
    channels = config.channels()
    choice = pending.get("notify")
    if not isinstance(choice, dict):
        return channels
    named = set(choice.get("channels") or ())
    return {name: value for name, value in channels.items() if name in named}


def notice_for(journal: Journal, record: RunRecord, run_id: str, pending: dict,
               channel: str, followup: FollowUp | None = None,
               outcome: dict | None = None) -> Notice:
    escalation = pending.get("escalation") or {}
    approvers = tuple(escalation.get("approvers") or ())
    # The first message goes to the channel's recipients, also when a takeover sends it
    # after an escalation; the follow-ups go to the escalation's approvers.
    recipients = tuple(a for a in approvers if "@" in a) if followup else ()
    key = delivery_key(pending["id"], channel, followup.suffix if followup else "")
    return Notice(delivery_id=f"{run_id}/{key}", run_id=run_id, request_id=pending["id"],
                  digest=pending_digest(pending),
                  name=str(pending.get("name", "")), details=pending.get("details"),
                  requested_at=float(pending.get("requested_at") or 0.0),
                  timeout_at=deadline_of(pending), title=record.title or "",
                  notebook=record.notebook, journal=journal.location,
                  event=followup.event if followup else "approval.requested",
                  approvers=approvers, recipients=recipients,
                  outcome=outcome)


def _me() -> dict:
    return {"host": socket.gethostname(), "pid": os.getpid()}


def _lapsed(row: dict, lease: float, now: Callable[[], float]) -> bool:
    return row.get("state") == "claimed" and now() - float(row.get("heartbeat", 0)) > lease


def _claim(journal: Journal, run_id: str, key: str, fresh: dict, lease: float,
           now: Callable[[], float]) -> dict | None:
    """The record this process now holds for the delivery, or None (someone else's). A
    takeover keeps the attempts made so far: the retry bound counts them all."""
    if journal.add_delivery(run_id, key, fresh):
        return fresh
    current = journal.deliveries(run_id).get(key)
    if current is None or not _lapsed(current, lease, now):
        return None
    return _take_over(journal, run_id, key, current, now)


def _take_over(journal: Journal, run_id: str, key: str, current: dict,
               now: Callable[[], float]) -> dict | None:
    """``current``, a lapsed claim, held by this process now, or None (another was first)."""
    taken = dict(current, token=uuid.uuid4().hex, by=_me(), heartbeat=now(),
                 takeovers=int(current.get("takeovers", 0)) + 1)
    return taken if journal.swap_delivery(run_id, key, current, taken) else None


def deliver(journal: Journal, record: RunRecord, config: NotifyConfig, *,
            skip: Iterable[str] = (), now: Callable[[], float] = time.time,
            server_url: str | None = None, for_the_run: bool = False) -> dict[str, str]:
    """Claim and send each of ``config``'s channels' delivery of ``record``'s pending
    request (blocking: the retries' waits, ``config.retry.sleep``, included), each message
    with its decision links (``server_url``: the Jupyter server this process is, their base
    when none is configured: :func:`~durable_nb.approvals.links.base_url`); record the
    channels ``skip`` as skipped (a run's ``notify=`` left them out). ``for_the_run``: sent
    by the run's own process with its own channels; any other sender uses only the
    channels the run chose (:func:`chosen_channels`). The states this process wrote, by
    channel (a channel another process holds is left out)."""
    found = pending_of(record)
    if found is None:
        return {}
    run_id, pending = found
    outcome: dict[str, str] = {}
    for channel in skip:
        skipped = {"channel": channel, "state": "skipped", "digest": pending_digest(pending),
                   "name": pending.get("name"), "at": now(), "attempts": []}
        if journal.add_delivery(run_id, delivery_key(pending["id"], channel), skipped):
            outcome[channel] = "skipped"
    channels = config.channels() if for_the_run else chosen_channels(config, pending)
    # Read once: a sweep over many parked runs, all notified, writes nothing (a disk
    # journal's add takes its write lock, which the runs' steps need too).
    existing = journal.deliveries(run_id) if channels else {}
    if existing.get(escalation_key(pending)) and not pending.get("escalation"):
        # Escalated by another process, not in the record read yet.
        pending = with_escalation(journal, run_id, pending, now())
    if "waiting" not in config.events:
        return outcome
    followups = due_followups(pending, now()) if existing else []
    if followups and find_decision(journal, run_id, pending) is not None:
        followups = []  # decided: nobody needs reminding
    for channel, channel_config in channels.items():
        first = existing.get(delivery_key(pending["id"], channel))
        for followup in (None, *followups):
            if followup is not None and first is not None and first.get("state") == "skipped":
                break  # the run left this channel out
            state = _deliver_one(journal, record, run_id, pending, channel, channel_config,
                                 existing, followup, config, now, server_url=server_url)
            if state is not None:
                label = f"{channel}/{followup.suffix}" if followup else channel
                outcome[label] = state
    return outcome


#: Of a channel's deliveries to several recipients, the state it is summed up by.
_WORST_FIRST = ("failed", "claimed", "lost", "skipped", "sent")


def _deliver_one(journal: Journal, record: RunRecord, run_id: str, pending: dict,
                 channel: str, channel_config: Any, existing: dict[str, dict],
                 followup: FollowUp | None, config: NotifyConfig,
                 now: Callable[[], float], outcome: dict | None = None, *,
                 server_url: str | None = None) -> str | None:
    """Claim and send ``channel``'s delivery of one notice to each of its recipients
    (``existing``: the run's delivery records as read): the worst state written of them
    (:data:`_WORST_FIRST`), or None when each is sent, failed, skipped or being sent by a
    live claimant. A message that asks for a decision (the first, a reminder, an
    escalation) carries decision links; any other keeps its notice in its claim, so that a
    claim cut short is taken over by the next sweep (:func:`take_over_lapsed`)."""
    base = notice_for(journal, record, run_id, pending, channel, followup, outcome)
    suffix = followup.suffix if followup else ""
    states = []
    for recipient in recipients_of(channel, channel_config, base):
        key = delivery_key(pending["id"], channel, suffix, recipient)
        found = existing.get(key)
        if (found is not None and not _lapsed(found, config.lease, now)) \
                or not _may_start(channel_config):
            continue  # exiting: what cannot be finished before the exit is not started
        notice = base  # its delivery id is the notice's, the same to every recipient
        fresh = {"channel": channel, "state": "claimed", "digest": pending_digest(pending),
                 "name": pending.get("name"), "token": uuid.uuid4().hex, "by": _me(),
                 "claimed_at": now(), "heartbeat": now(), "attempts": []}
        if recipient is not None:
            fresh["to"] = recipient
        if followup is not None:
            fresh["event"] = followup.event
        if notice.event not in WAITING_EVENTS:
            fresh["notice"] = notice_record(notice)
        held = _claim(journal, run_id, key, fresh, config.lease, now)
        if held is None:
            continue
        kept: dict = {}
        if notice.event in WAITING_EVENTS:
            notice, kept = _with_links(journal, run_id, pending, channel, channel_config,
                                       notice, recipient, config, now, server_url)
        state = _send_claimed(journal, run_id, key, held, channel, channel_config, notice,
                              recipient, config, now, kept)
        if followup is not None and followup.event == "approval.reminder" and state == "sent":
            record_event(journal, run_id, "reminded", followup.text.format(channel=channel),
                         pending=pending, via=channel)
        states.append(state)
    return min(states, key=_WORST_FIRST.index) if states else None


def _with_links(journal: Journal, run_id: str, pending: dict, channel: str,
                channel_config: Any, notice: Notice, recipient: str | None,
                config: NotifyConfig, now: Callable[[], float],
                server_url: str | None) -> tuple[Notice, dict]:
    """``notice`` with its decision links, and what its delivery record keeps of them."""
    try:
        links, kept = issue_links(
            journal, run_id, pending, channel=channel, config=config.links, now=now,
            server_url=server_url, delivery=notice.delivery_id,
            recipients=[recipient] if recipient is not None else [channel])
    except Exception as exc:  # the message goes without links rather than not at all
        links, kept = [], {"links": None, "links_missing": _scrubbed(
            f"decision links not issued: {type(exc).__name__}: {exc}", channel_config)}
    return replace(notice, links=tuple(
        {"to": to, "url": url, "expires_at": (kept["links"] or {}).get("expires_at")}
        for to, url in links)), kept


def notice_record(notice: Notice) -> dict:
    """What a claim keeps of a notice that tells what became of a request or a run (data
    only: no link, no channel address or secret), to send it again after a takeover."""
    fields = dataclasses.asdict(notice)
    fields.pop("links", None)
    return fields


def notice_from_record(fields: dict) -> Notice:
    """The notice :func:`notice_record` kept."""
    known = {f.name for f in dataclasses.fields(Notice)}
    values = {k: v for k, v in fields.items() if k in known}
    for name in ("recipients", "approvers"):
        values[name] = tuple(values.get(name) or ())
    return Notice(**values)


def _send_claimed(journal: Journal, run_id: str, key: str, held: dict, channel: str,
                  channel_config: Any, notice: Notice, recipient: str | None,
                  config: NotifyConfig, now: Callable[[], float], links: dict) -> str:
    """Attempt the claimed delivery until it is sent or ``config.retry.max_attempts``
    attempts (those recorded before a takeover included) failed; each attempt recorded.
    Once this process exits (:func:`drain`), no new attempt starts: the claim lapses and
    the next sweep takes it over."""
    policy = config.retry
    while True:
        started = now()
        try:
            send_to(channel, channel_config, notice, recipient)
            error = None
        except DeliveryFailed as exc:
            error = _scrubbed(str(exc), channel_config)
        except Exception as exc:  # a bug or an odd library error: recorded, never raised
            error = _scrubbed(f"{type(exc).__name__}: {exc}", channel_config)
        attempt = {"at": started, "took": round(now() - started, 3), "ok": error is None}
        if error is not None:
            attempt["error"] = error
        attempts = [*held["attempts"], attempt]
        last = len(attempts) >= policy.max_attempts
        state = "sent" if error is None else ("failed" if last else "claimed")
        updated = dict(held, **links, attempts=attempts, state=state, heartbeat=now())
        if state != "claimed":
            updated["finished_at"] = now()
        if not journal.swap_delivery(run_id, key, held, updated):
            return "lost"  # taken over while this process stalled: the other one goes on
        held = updated
        if state != "claimed":
            return state
        if not _wait_backoff(policy.sleep, policy.delay(len(attempts)), channel_config):
            return state  # exiting: the claim lapses, and the next sweep goes on


def _scrubbed(text: str, channel_config: Any) -> str:
    """An error's text without any secret of the channel's (a URL holding a token)."""
    for name in ("url", "secret", "password", "username"):
        value = getattr(channel_config, name, None)
        if isinstance(value, str) and len(value) >= 4:
            text = text.replace(value, f"<{name}>")
    return text[:_ERROR_CHARS]


#: How far back :func:`sweep` looks for notices cut short: the newest runs, and of them
#: those changed this many seconds ago at most.
LAPSED_SCAN_RUNS = 500
LAPSED_SCAN_SECONDS = 7 * 24 * 3600.0
_SETTLE_AFTER = 600.0
#: (journal, run) -> the record's ``updated_at`` when its deliveries had no claim open.
_settled: dict[tuple[str, str], float] = {}


def sweep(journal: Journal, config: NotifyConfig, *, exclude: str | None = None,
          now: Callable[[], float] = time.time, server_url: str | None = None,
          records: list[RunRecord] | None = None) -> dict[str, dict[str, str]]:
    """Deliver what is due or lapsed in ``journal``: :func:`deliver` for each run that waits
    for a decision with a delivery not yet sent or claimed (or claimed by a process that
    stopped), its reminders, escalation and decision included, but for the run ``exclude``
    and its children; then the notices of decisions and failures whose claim lapsed
    (:func:`take_over_lapsed`). Only the channels each run chose (:func:`chosen_channels`).
    ``records``: the waiting runs as a :func:`~durable_nb.approvals.tick.tick` left them
    (its listener passes them); without them, the journal is ticked first. What was sent,
    by run. Blocking; the sweepers (:mod:`.sweeper`) and a process's first look at a
    journal call it."""
    done: dict[str, dict[str, str]] = {}
    if records is None:
        records = journal.list_runs(status=Status.WAITING_APPROVAL)
        if not journal.read_only:
            tick(journal, records=records, now=now())
    if not config.channels():
        return done
    decisions = {"decided", "timed_out"} & set(config.events)
    for record in records:
        if exclude is not None and (record.run_id == exclude
                                    or record.run_id.startswith(exclude + "/")):
            continue  # the run this process executes notifies with its own choice of channels
        found = pending_of(record)
        if found is not None:
            outcome = deliver(journal, record, config, now=now, server_url=server_url)
            if decisions and (decision := find_decision(journal, *found)) is not None:
                outcome.update(deliver_decided(journal, record, found[1], decision, config,
                                               now=now))
            if outcome:
                done[record.run_id] = outcome
    if not journal.read_only:
        for run_id, outcome in take_over_lapsed(journal, config, now=now).items():
            done.setdefault(run_id, {}).update(outcome)
    return done


def take_over_lapsed(journal: Journal, config: NotifyConfig, *,
                     now: Callable[[], float] = time.time) -> dict[str, dict[str, str]]:
    """Take over and send each notice of a decision or a failure whose claim lapsed (its
    sender exited or died before it finished) over ``config``'s channel of the same name,
    its attempts so far counted. Looks at the :data:`LAPSED_SCAN_RUNS` newest runs changed in the last
    :data:`LAPSED_SCAN_SECONDS`. What was sent, by run."""
    channels = config.channels()
    done: dict[str, dict[str, str]] = {}
    if not channels:
        return done
    for record in journal.list_runs(limit=LAPSED_SCAN_RUNS, newest_first=True):
        if record.updated_at < now() - LAPSED_SCAN_SECONDS \
                or _settled.get((journal.location, record.run_id)) == record.updated_at:
            continue
        rows = journal.deliveries(record.run_id)
        if now() - record.updated_at > _SETTLE_AFTER and not any(
                row.get("state") == "claimed" for row in rows.values()):
            # Nothing open, and the notices a run's process sends follow a change of its
            # record within seconds: not read again until the record changes.
            if len(_settled) > 4 * LAPSED_SCAN_RUNS:
                _settled.clear()
            _settled[(journal.location, record.run_id)] = record.updated_at
        for key, row in rows.items():
            channel = row.get("channel")
            if (channel not in channels or "notice" not in row
                    or not _lapsed(row, config.lease, now)
                    or not _may_start(channels[channel])):
                continue
            held = _take_over(journal, record.run_id, key, row, now)
            if held is None:
                continue
            notice = notice_from_record(row["notice"])
            state = _send_claimed(journal, record.run_id, key, held, channel,
                                  channels[channel], notice, row.get("to"), config, now, {})
            done.setdefault(record.run_id, {})[key.split("/", 1)[1]] = state
    return done


# -- what became of a request or a run -------------------------------------------------------

def decided_event(decision: dict) -> str:
    """The event a decision is notified as: ``timed_out`` (its deadline's policy) or
    ``decided``."""
    return "timed_out" if decision.get("via") == "timeout" else "decided"


def decision_suffix(decision: dict) -> str:
    """The delivery key's suffix for notifying ``decision``: ``decided`` or ``timed_out``,
    then ``-N`` for the N-th decision of a request whose earlier ones were replaced
    (``--replace``), so that a replacement is notified too."""
    replaced = decision.get("replaced") or ()
    event = decided_event(decision)
    return f"{event}-{len(replaced) + 1}" if replaced else event


def deliver_decided(journal: Journal, record: RunRecord, pending: dict, decision: dict,
                    config: NotifyConfig, *, now: Callable[[], float] = time.time,
                    for_the_run: bool = False) -> dict[str, str]:
    """Send, once per channel and decision (key ``REQUEST/CHANNEL/decided``, or
    ``.../timed_out``; ``-N`` after it for a replacing decision: :func:`decision_suffix`),
    that ``pending`` was decided, if ``config.events`` lists it: the states written, by key.
    ``for_the_run``: the run's own process sends with its own channels; any other sender
    with those the run chose (:func:`chosen_channels`)."""
    event = decided_event(decision)
    if event not in config.events or not pending.get("id"):
        return {}
    run_id = pending.get("run_id", record.run_id)
    outcome = {k: decision.get(k) for k in ("approved", "by", "via", "note", "at")}
    if decision.get("replaced"):
        outcome["replaced"] = len(decision["replaced"])
    channels = config.channels() if for_the_run else chosen_channels(config, pending)
    return _deliver_event(journal, record, run_id, pending, decision_suffix(decision),
                          f"approval.{event}", outcome, config, channels, now)


def deliver_failed(journal: Journal, record: RunRecord, config: NotifyConfig, *,
                   now: Callable[[], float] = time.time) -> dict[str, str]:
    """Send, once per channel (key ``failed-N/CHANNEL``, N the run's attempt), that the run
    failed, if ``config.events`` lists ``failed``: the states written, by key (by the run's
    own process, with its channels; a notice cut short is taken over by the next sweep,
    :func:`take_over_lapsed`)."""
    if "failed" not in config.events or record.status is not Status.FAILED:
        return {}
    attempt = len(record.attempts or ()) + record.attempts_dropped
    about = {"id": f"failed-{attempt}", "name": record.title or record.run_id,
             "details": None}
    return _deliver_event(journal, record, record.run_id, about, "", "run.failed",
                          {"error": record.error, "failed_step": record.failed_step},
                          config, config.channels(), now)


def _deliver_event(journal: Journal, record: RunRecord, run_id: str, about: dict, suffix: str,
                   event: str, outcome: dict, config: NotifyConfig, channels: dict[str, Any],
                   now: Callable[[], float]) -> dict[str, str]:
    existing = journal.deliveries(run_id) if channels else {}
    followup = FollowUp(suffix, event, "")
    done = {}
    for channel, channel_config in channels.items():
        key = delivery_key(about["id"], channel, suffix)
        state = _deliver_one(journal, record, run_id, about, channel, channel_config,
                             existing, followup, config, now, outcome)
        if state is not None:
            done[key.split("/", 1)[1] if suffix else key] = state
    return done


# -- from a process that parks a run ---------------------------------------------------------

#: Set once this process exits normally (:func:`drain`): a retry's backoff wakes to check
#: that the retry can still finish.
_closing = threading.Event()
#: How long a normal exit waits for the deliveries in flight.
EXIT_WAIT = 30.0
#: What an attempt's record takes to write, beyond the channel's ``timeout``.
_RECORD_TIME = 5.0
_exit_by: float | None = None  # time.monotonic() when the exit stops waiting


def _may_start(channel_config: Any, after: float = 0.0) -> bool:
    """Whether an attempt over a channel may start (``after`` seconds from now): always,
    but during a normal exit only if it can end (the channel's ``timeout``) and be recorded
    before the exit stops waiting, so that a message sent is a message recorded."""
    if _exit_by is None:
        return True
    timeout = float(getattr(channel_config, "timeout", EXIT_WAIT))
    return time.monotonic() + after + timeout + _RECORD_TIME <= _exit_by


def _wait_backoff(sleep: Callable[[float], Any], delay: float, channel_config: Any) -> bool:
    """Wait ``delay`` seconds before a retry; whether it may start then (:func:`_may_start`).
    An exit that begins meanwhile cuts the wait short when the retry could not finish."""
    if sleep is not time.sleep:  # a test's
        sleep(delay)
        return _may_start(channel_config)
    until = time.monotonic() + delay
    if _closing.wait(delay):
        left = max(0.0, until - time.monotonic())
        if not _may_start(channel_config, after=left):
            return False
        time.sleep(left)
    return _may_start(channel_config)

_threads: set[threading.Thread] = set()
_threads_lock = threading.Lock()
_busy: set[tuple[str, str, str]] = set()  # (journal, run, request) being delivered here


def notify_in_background(journal: Journal, record: RunRecord, config: NotifyConfig,
                         skip: Iterable[str] = ()) -> None:
    """:func:`deliver` on a thread of its own, for the run's own process with the run's
    channels ``config``: returns at once, never raises, never touches the run. A request
    already being delivered by this process is not started again. Not on a hub's journal
    (one that names a decider role this process is not): the hub's service sends."""
    found = pending_of(record)
    if found is None or not (config.channels() or skip):
        return
    busy = (journal.location, found[0], found[1]["id"])
    with _threads_lock:
        if busy in _busy:
            return
        _busy.add(busy)
    snapshot = RunRecord.from_json(record.to_json())  # the run goes on changing its own
    skip = tuple(skip)

    def send() -> None:
        decider, is_decider, _ = journal.decision_authority()
        if decider is not None and not is_decider:
            return  # a hub's journal: its service alone notifies (the database refuses us)
        deliver(journal, snapshot, config, skip=skip, for_the_run=True)

    in_background(send, name=f"durable-nb-notify-{found[0]}",
                  done=lambda: _busy.discard(busy))


def in_background(send: Callable[[], Any], *, name: str,
                  done: Callable[[], None] | None = None) -> None:
    """``send`` (deliveries) on a thread of its own, waited for at exit (:func:`drain`):
    returns at once, never raises (a journal that failed: the next process that looks
    sends it). A ``send`` that raises is logged once, as a warning of this module's logger
    naming the thread ``name`` and the error, its URLs left out (they may hold secrets);
    what the deliveries recorded stays as they wrote it."""
    def work() -> None:
        try:
            send()
        except Exception as exc:
            _log.warning("durable_nb: %s stopped: %s. What it did not send stays due: the "
                         "next process that sweeps this journal sends it.", name,
                         _logged_error(exc))
        finally:
            with _threads_lock:
                if done is not None:
                    done()
                _threads.discard(thread)

    thread = threading.Thread(target=work, name=name, daemon=True)
    with _threads_lock:
        _threads.add(thread)
    thread.start()


def _logged_error(exc: BaseException) -> str:
    """``exc`` as a log line may show it: its type and text, URLs replaced by ``<URL>``
    (a journal's may hold a password, a webhook's a token), cut to 200 characters."""
    return _URL.sub("<URL>", f"{type(exc).__name__}: {exc}")[:_ERROR_CHARS]


def drain(timeout: float) -> bool:
    """Wait up to ``timeout`` seconds for this process's deliveries in flight; whether
    none is left.

    At a normal exit the process waits up to :data:`EXIT_WAIT` seconds; in that time an
    attempt (a first one, or a retry after its backoff) starts only if its channel's
    ``timeout`` lets it end and be recorded before the wait ends: so a message sent is a
    message recorded, and a second copy comes only after a SIGKILL.
    What was not started (or not retried) stays due, or claimed until its lease lapses:
    the next sweep sends it."""
    until = time.monotonic() + timeout
    while True:
        with _threads_lock:
            left = list(_threads)
        if not left:
            return True
        remaining = until - time.monotonic()
        if remaining <= 0:
            return False
        left[0].join(remaining)


def _at_exit() -> None:
    global _exit_by
    _exit_by = time.monotonic() + EXIT_WAIT
    _closing.set()
    drain(EXIT_WAIT)


atexit.register(_at_exit)
