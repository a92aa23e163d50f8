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
import os
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

__all__ = ["decided_event", "deliver", "deliver_decided", "deliver_failed", "delivery_key",
           "drain", "in_background", "notice_for", "notify_in_background", "pending_of",
           "sweep"]

_ERROR_CHARS = 200


def delivery_key(request_id: str, channel: str, suffix: str = "") -> str:
    """The key of a delivery record under its run (``suffix``: a follow-up's,
    :mod:`.followups`)."""
    return f"{request_id}/{channel}/{suffix}" if suffix else f"{request_id}/{channel}"


def pending_of(record: RunRecord) -> tuple[str, dict] | None:
    """``(run that asked, pending approval)`` of a record waiting for a decision (a parent
    shows its child's), or None. A request written before approvals had ids has none, and
    is not notified."""
    pending = record.pending_approval
    if record.status is not Status.WAITING_APPROVAL or not pending or not pending.get("id"):
        return None
    return pending.get("run_id", record.run_id), pending


def notice_for(journal: Journal, record: RunRecord, run_id: str, pending: dict,
               channel: str, followup: FollowUp | None = None,
               outcome: dict | None = None) -> Notice:
    escalation = pending.get("escalation") or {}
    approvers = tuple(escalation.get("approvers") or ())
    key = delivery_key(pending["id"], channel, followup.suffix if followup else "")
    return Notice(delivery_id=f"{run_id}/{key}", run_id=run_id, request_id=pending["id"],
                  digest=pending_digest(pending),
                  name=str(pending.get("name", "")), details=pending.get("details"),
                  requested_at=float(pending.get("requested_at") or 0.0),
                  timeout_at=deadline_of(pending), title=record.title or "",
                  notebook=record.notebook, journal=journal.location,
                  event=followup.event if followup else "approval.requested",
                  approvers=approvers, recipients=tuple(a for a in approvers if "@" in a),
                  outcome=outcome)


def _me() -> dict:
    return {"host": socket.gethostname(), "pid": os.getpid()}


def _claim(journal: Journal, run_id: str, key: str, fresh: dict, lease: float,
           now: Callable[[], float]) -> dict | None:
    """The record this process now holds for the delivery, or None (someone else's)."""
    if journal.add_delivery(run_id, key, fresh):
        return fresh
    current = journal.deliveries(run_id).get(key)
    if current is None or current.get("state") != "claimed" \
            or now() - float(current.get("heartbeat", 0)) <= lease:
        return None
    taken = dict(current, token=fresh["token"], by=fresh["by"], heartbeat=now(),
                 takeovers=int(current.get("takeovers", 0)) + 1)
    return taken if journal.swap_delivery(run_id, key, current, taken) else None


def deliver(journal: Journal, record: RunRecord, config: NotifyConfig, *,
            skip: Iterable[str] = (), now: Callable[[], float] = time.time,
            server_url: str | None = None) -> dict[str, str]:
    """Claim and send each of ``config``'s channels' delivery of ``record``'s pending
    request (blocking: the retries' waits, ``config.retry.sleep``, included), each message
    with its decision links (``server_url``: the Jupyter server this process is, their base
    when none is configured: :func:`~durable_nb.approvals.links.base_url`); record the
    channels ``skip`` as skipped (a run's ``notify=`` left them out). The states this process wrote, by channel
    (a channel another process holds is left out)."""
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
    # Read once: a sweep over many parked runs, all notified, writes nothing (a disk
    # journal's add takes its write lock, which the runs' steps need too).
    existing = journal.deliveries(run_id) if config.channels() else {}
    if existing.get(escalation_key(pending)) and not pending.get("escalation"):
        # Escalated by another process, not in the record read yet.
        pending = with_escalation(journal, run_id, pending, now())
    if "waiting" not in config.events:
        return outcome
    followups = due_followups(pending, now()) if existing else []
    if followups and find_decision(journal, run_id, pending) is not None:
        followups = []  # decided: nobody needs reminding
    for channel, channel_config in config.channels().items():
        first = existing.get(delivery_key(pending["id"], channel))
        for followup in (None, *followups):
            if followup is not None and first is not None and first.get("state") == "skipped":
                break  # the run left this channel out
            key = delivery_key(pending["id"], channel, followup.suffix if followup else "")
            state = _deliver_one(journal, record, run_id, pending, channel, channel_config,
                                 key, existing.get(key), followup, config, now,
                                 server_url=server_url)
            if state is not None:
                outcome[key.split("/", 1)[1]] = state
    return outcome


def _deliver_one(journal: Journal, record: RunRecord, run_id: str, pending: dict,
                 channel: str, channel_config: Any, key: str, found: dict | None,
                 followup: FollowUp | None, config: NotifyConfig,
                 now: Callable[[], float], outcome: dict | None = None, *,
                 server_url: str | None = None) -> str | None:
    """Claim and send the delivery ``key`` (``found``: its record as read), or None when it
    is sent, failed, skipped or being sent by a live claimant. A message that asks for a
    decision (the first, a reminder, an escalation) carries decision links."""
    if found is not None and not (found.get("state") == "claimed" and
                                  now() - float(found.get("heartbeat", 0)) > config.lease):
        return None
    fresh = {"channel": channel, "state": "claimed", "digest": pending_digest(pending),
             "name": pending.get("name"), "token": uuid.uuid4().hex, "by": _me(),
             "claimed_at": now(), "heartbeat": now(), "attempts": []}
    if followup is not None:
        fresh["event"] = followup.event
    held = _claim(journal, run_id, key, fresh, config.lease, now)
    if held is None:
        return None
    notice = notice_for(journal, record, run_id, pending, channel, followup, outcome)
    kept: dict = {}
    if notice.event in WAITING_EVENTS:
        try:
            links, kept = issue_links(
                journal, run_id, pending, channel=channel, config=config.links, now=now,
                server_url=server_url, delivery=notice.delivery_id,
                recipients=channel_config.recipients(notice))
        except Exception as exc:  # the message goes without links rather than not at all
            links, kept = [], {"links": None, "links_missing": _scrubbed(
                f"decision links not issued: {type(exc).__name__}: {exc}", channel_config)}
        notice = replace(notice, links=tuple(
            {"to": to, "url": url, "expires_at": (kept["links"] or {}).get("expires_at")}
            for to, url in links))
    state = _send_claimed(journal, run_id, key, held, channel, channel_config, notice, config,
                          now, kept)
    if followup is not None and followup.event == "approval.reminder" and state == "sent":
        record_event(journal, run_id, "reminded", followup.text.format(channel=channel),
                     pending=pending, via=channel)
    return state


def _send_claimed(journal: Journal, run_id: str, key: str, held: dict, channel: str,
                  channel_config: Any, notice: Notice, config: NotifyConfig,
                  now: Callable[[], float], links: dict) -> str:
    policy = config.retry
    attempt_number = 0
    while True:
        attempt_number += 1
        started = now()
        try:
            for recipient in channel_config.recipients(notice):
                channel_config.send(notice, recipient)
            error = None
        except DeliveryFailed as exc:
            error = _scrubbed(str(exc), channel_config)
        except Exception as exc:  # a bug or an odd library error: recorded, never raised
            error = _scrubbed(f"{type(exc).__name__}: {exc}", channel_config)
        attempt = {"at": started, "took": round(now() - started, 3), "ok": error is None}
        if error is not None:
            attempt["error"] = error
        last = attempt_number >= policy.max_attempts
        state = "sent" if error is None else ("failed" if last else "claimed")
        updated = dict(held, **links, attempts=[*held["attempts"], attempt], state=state,
                       heartbeat=now())
        if state != "claimed":
            updated["finished_at"] = now()
        if not journal.swap_delivery(run_id, key, held, updated):
            return "lost"  # taken over while this process stalled: the other one goes on
        held = updated
        if state != "claimed":
            return state
        policy.sleep(policy.delay(attempt_number))


def _scrubbed(text: str, channel_config: Any) -> str:
    """An error's text without any secret of the channel's (a URL holding a token)."""
    for name in ("url", "secret", "password", "username"):
        value = getattr(channel_config, name, None)
        if isinstance(value, str) and len(value) >= 4:
            text = text.replace(value, f"<{name}>")
    return text[:_ERROR_CHARS]


def sweep(journal: Journal, config: NotifyConfig, *, exclude: str | None = None,
          **kwargs: Any) -> dict[str, dict[str, str]]:
    """The deadlines of every run of ``journal`` that waits for a decision applied
    (:func:`~durable_nb.approvals.tick.tick`), then :func:`deliver` for each
    with a delivery not yet sent or claimed (or claimed by a process that died), its
    reminders and escalation included, but for the run ``exclude`` and its children: what
    was sent, by run. Blocking; the server
    extension, ``durable-nb notify`` and a process's first look at a journal call it."""
    done: dict[str, dict[str, str]] = {}
    records = journal.list_runs(status=Status.WAITING_APPROVAL)
    if not journal.read_only:
        tick(journal, records=records, now=kwargs["now"]() if "now" in kwargs else None)
    if not config.channels():
        return done
    decisions = {"decided", "timed_out"} & set(config.events)
    for record in records:
        if exclude is not None and (record.run_id == exclude
                                    or record.run_id.startswith(exclude + "/")):
            continue  # the run this process executes notifies with its own choice of channels
        found = pending_of(record)
        if found is not None:
            outcome = deliver(journal, record, config, **kwargs)
            if decisions and (decision := find_decision(journal, *found)) is not None:
                outcome.update(deliver_decided(journal, record, found[1], decision, config,
                                               **({"now": kwargs["now"]} if "now" in kwargs
                                                  else {})))
            if outcome:
                done[record.run_id] = outcome
    return done


# -- what became of a request or a run -------------------------------------------------------

def decided_event(decision: dict) -> str:
    """The event a decision is notified as: ``timed_out`` (its deadline's policy) or
    ``decided``."""
    return "timed_out" if decision.get("via") == "timeout" else "decided"


def deliver_decided(journal: Journal, record: RunRecord, pending: dict, decision: dict,
                    config: NotifyConfig, *, now: Callable[[], float] = time.time
                    ) -> dict[str, str]:
    """Send, once per channel (key ``REQUEST/CHANNEL/decided`` or ``.../timed_out``), that
    ``pending`` was decided, if ``config.events`` lists it: the states written, by key."""
    event = decided_event(decision)
    if event not in config.events or not pending.get("id"):
        return {}
    run_id = pending.get("run_id", record.run_id)
    outcome = {k: decision.get(k) for k in ("approved", "by", "via", "note", "at")}
    return _deliver_event(journal, record, run_id, pending, event, f"approval.{event}",
                          outcome, config, now)


def deliver_failed(journal: Journal, record: RunRecord, config: NotifyConfig, *,
                   now: Callable[[], float] = time.time) -> dict[str, str]:
    """Send, once per channel (key ``failed-N/CHANNEL``, N the run's attempt), that the run
    failed, if ``config.events`` lists ``failed``: the states written, by key."""
    if "failed" not in config.events or record.status is not Status.FAILED:
        return {}
    attempt = len(record.attempts or ()) + record.attempts_dropped
    about = {"id": f"failed-{attempt}", "name": record.title or record.run_id,
             "details": None}
    return _deliver_event(journal, record, record.run_id, about, "", "run.failed",
                          {"error": record.error, "failed_step": record.failed_step},
                          config, now)


def _deliver_event(journal: Journal, record: RunRecord, run_id: str, about: dict, suffix: str,
                   event: str, outcome: dict, config: NotifyConfig,
                   now: Callable[[], float]) -> dict[str, str]:
    existing = journal.deliveries(run_id) if config.channels() else {}
    followup = FollowUp(suffix, event, "")
    done = {}
    for channel, channel_config in config.channels().items():
        key = delivery_key(about["id"], channel, suffix)
        state = _deliver_one(journal, record, run_id, about, channel, channel_config, key,
                             existing.get(key), followup, config, now, outcome)
        if state is not None:
            done[key.split("/", 1)[1] if suffix else key] = state
    return done


# -- from a process that parks a run ---------------------------------------------------------

_threads: set[threading.Thread] = set()
_threads_lock = threading.Lock()
_busy: set[tuple[str, str, str]] = set()  # (journal, run, request) being delivered here


def notify_in_background(journal: Journal, record: RunRecord, config: NotifyConfig,
                         skip: Iterable[str] = ()) -> None:
    """:func:`deliver` on a thread of its own: returns at once, never raises, never touches
    the run. A request already being delivered by this process is not started again."""
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
    in_background(lambda: deliver(journal, snapshot, config, skip=skip),
                  name=f"durable-nb-notify-{found[0]}",
                  done=lambda: _busy.discard(busy))


def in_background(send: Callable[[], Any], *, name: str,
                  done: Callable[[], None] | None = None) -> None:
    """``send`` (deliveries) on a thread of its own, waited for at exit (:func:`drain`):
    returns at once, never raises (a journal that failed: the next process that looks
    sends it)."""
    def work() -> None:
        try:
            send()
        except Exception:
            pass
        finally:
            with _threads_lock:
                if done is not None:
                    done()
                _threads.discard(thread)

    thread = threading.Thread(target=work, name=name, daemon=True)
    with _threads_lock:
        _threads.add(thread)
    thread.start()


def drain(timeout: float) -> bool:
    """Wait up to ``timeout`` seconds for this process's deliveries in flight; whether
    none is left. At exit a process waits for them this long (a first attempt's timeout);
    a delivery cut short by exit is taken over by the next process after the lease."""
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


atexit.register(drain, 10.0)
