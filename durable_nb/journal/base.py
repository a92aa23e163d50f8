"""The journal interface: what every backend stores and which operations are atomic.

A backend keeps, per run: its record, its step entries by position, its blobs (inputs stored
once per run, by digest), its lease (who executes it now) and requests from other processes
(a decision on an approval, a cancel). Every method is safe to call from several threads and
processes at once. The operations that must be atomic are atomic in the backend itself (one
SQLite or PostgreSQL transaction): creating a run, appending a step with the record and blobs
it changed, taking a lease, rewriting a run's steps (a rewind), publishing a staged copy,
deleting a run.

**Fencing.** Writes of an executor carry its lease token. :meth:`Journal.append_step` and
:meth:`Journal.put_run` with a token check, in the same transaction as the write, that the
lease still holds that token, and refuse with :class:`~durable_nb.errors.RunLeased` once it
moved to another executor; and a step is written only where its position is free. An
executor that stalled past its lease and woke up can therefore never write over the work of
the one that took over. Every other writer of a run's steps is fenced the same way:
:meth:`Journal.rewrite_steps` (reset, re-run, the retry of a failed step) and
:meth:`Journal.delete_run` check ``token`` in their own transaction, and the callers that edit
a run (the registry, ``durable-nb``, the runner's re-run) hold the run's lease while they do.
"""

from __future__ import annotations

import abc
import json
import re
import threading
import time
import uuid
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import Union

from ..errors import JournalError, UnknownRun
from .records import BatchRecord, RunRecord, Status, StepEntry

__all__ = ["FENCED_ADVICE", "REQUEST_KINDS", "SETTINGS", "Journal", "delivery_text", "StatusFilter",
           "check_request_kind", "check_setting", "check_value_names", "only_deliveries",
           "position_taken_advice", "read_only_error", "select_runs", "wanted_statuses"]

#: What :class:`~durable_nb.errors.RunLeased` tells an executor whose write was refused
#: because its lease moved to another executor (every backend says the same).
FENCED_ADVICE = ("this executor was fenced out: it lost the run's lease (it stalled longer than "
                 "the lease lasts, and another executor took the run over), so it stopped "
                 "without writing anything more. The run goes on in the other executor.")

#: The kinds of requests other processes leave for a run's executor. A decision on an
#: approval is left under ``decision.ID``, the id of the pending approval it decides
#: (:mod:`durable_nb.approvals.request`); ``decision`` alone is what older versions wrote.
REQUEST_KINDS = ("decision", "cancel")
_DECISION_KIND = re.compile(r"decision\.[0-9a-f]{32}")


#: The journal-wide settings a journal keeps (:meth:`Journal.setting`): ``retention``, the
#: policy its sweep applies (:mod:`durable_nb.retention`).
SETTINGS = ("retention",)


def check_setting(name: str) -> None:
    if name not in SETTINGS:
        raise ValueError(f"unknown journal setting {name!r}: use one of {', '.join(SETTINGS)}")


#: The key prefix of a run's history events among its keyed records.
HISTORY_PREFIX = "history/"
#: The key prefix of a run's decision links' records (the SHA-256 of a link's secret follows).
LINK_PREFIX = "link/"


def position_taken_advice(position: int) -> str:
    """The RunLeased advice when a step's position was already written by someone else."""
    return f"position {position} of its journal was written by another executor. {FENCED_ADVICE}"


def read_only_error(location: str, action: str) -> JournalError:
    """The error every write method of a journal opened read-only raises."""
    return JournalError(
        f"the journal at {location} was opened read-only, so it cannot {action}. Open it "
        f"without read_only=True (open_journal(..., read_only=False)) to change it.")


#: What ``status=`` of :meth:`Journal.list_runs` takes: one status, several, or None (all).
StatusFilter = Union[Status, str, Iterable[Union[Status, str]], None]


def wanted_statuses(status: StatusFilter) -> tuple[Status, ...] | None:
    """``status=`` of :meth:`Journal.list_runs` as a tuple of statuses (None: all)."""
    if status is None:
        return None
    if isinstance(status, (Status, str)):
        return (Status.parse(status),)
    return tuple(dict.fromkeys(Status.parse(s) for s in status))


def select_runs(records: Iterable[RunRecord], wanted: tuple[Status, ...] | None,
                limit: int | None, newest_first: bool) -> list[RunRecord]:
    """``records`` filtered by status, in listing order, cut to ``limit``: what a backend
    returns once it has read the candidates."""
    chosen = [r for r in records if wanted is None or r.status in wanted]
    chosen.sort(key=lambda r: (r.created_at, r.run_id), reverse=newest_first)
    return chosen if limit is None else chosen[:max(limit, 0)]


def delivery_text(value: dict) -> str:
    """A delivery record as stored: JSON with sorted keys, so that the same record is the same
    text (:meth:`Journal.swap_delivery` compares stored text)."""
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False)


def only_deliveries(records: dict[str, dict]) -> dict[str, dict]:
    """A run's keyed records without its history's events and its decision links'."""
    return {k: v for k, v in records.items() if not k.startswith((HISTORY_PREFIX, LINK_PREFIX))}


def check_value_names(space: str, keys: Iterable[str] = (), scope: str = "") -> None:
    """Refuse a keyed values' space, scope or key that a backend cannot store as given: NUL
    anywhere (PostgreSQL's text has none), ``\\x1f`` in a space or scope (the disk
    journal's separator between a scope, a space and its keys), an empty space."""
    if not space or "\x00" in space or "\x1f" in space:
        raise ValueError(f"a keyed values' space must be non-empty text without NUL or \\x1f, "
                         f"not {space!r}")
    if "\x00" in scope or "\x1f" in scope:
        raise ValueError(f"a keyed values' scope must be text without NUL or \\x1f, "
                         f"not {scope!r}")
    for key in keys:
        if "\x00" in key:
            raise ValueError(f"a keyed value's key must be text without NUL, not {key!r}")


def check_request_kind(kind: str) -> None:
    if kind not in REQUEST_KINDS and not _DECISION_KIND.fullmatch(kind):
        raise ValueError(f"unknown request kind {kind!r}: use one of {', '.join(REQUEST_KINDS)}")


class Journal(abc.ABC):
    """The durable store of runs and their steps. See the module docstring for guarantees."""

    #: Where the journal is, for messages: a directory, or a database URL without password.
    location: str
    #: True for a journal opened with ``read_only=True``: it never creates or writes
    #: anything, and its write methods raise :class:`~durable_nb.errors.JournalError`.
    read_only: bool = False
    #: What becomes of the space of deleted runs, when the journal's size does not tell it
    #: (:meth:`reclaim_space`); said beside sizes measured around a prune.
    reclaimed_space_note: str = ""
    #: True when :meth:`wait_for_request` is told of new requests by the backend and waits
    #: without reading (PostgreSQL's LISTEN/NOTIFY); False when it polls.
    notifies: bool = False

    # -- runs -----------------------------------------------------------------------------

    @abc.abstractmethod
    def create_run(self, record: RunRecord) -> bool:
        """Store a new run; False (and nothing written) if the id exists already."""

    @abc.abstractmethod
    def find_run(self, run_id: str) -> RunRecord | None:
        """The run record, or None if there is no such run."""

    def get_run(self, run_id: str) -> RunRecord:
        """The run record; :class:`UnknownRun` if there is none."""
        record = self.find_run(run_id)
        if record is None:
            raise UnknownRun(run_id, self.location)
        return record

    @abc.abstractmethod
    def put_run(self, record: RunRecord, *, token: str | None = None) -> None:
        """Replace the run record (stamping ``updated_at``); with ``token``, only while that
        lease holds the run, else :class:`~durable_nb.errors.RunLeased`."""

    @abc.abstractmethod
    def list_runs(self, prefix: str = "", *, status: StatusFilter = None,
                  limit: int | None = None, newest_first: bool = False) -> list[RunRecord]:
        """The run records whose id starts with ``prefix`` (a batch's items: ``"BATCH/"``),
        oldest first (by ``created_at``, then id), or newest first.

        ``status``: only runs in that status, or in any of several (``Status`` or names in
        any case). ``limit``: at most that many, the first ones in the order asked for
        (``limit=20, newest_first=True``: the 20 newest). Backends answer both from an
        index, reading only the records they return."""

    def list_runs_counted(self, prefix: str = "", *, status: StatusFilter = None,
                          limit: int | None = None,
                          newest_first: bool = False) -> list[RunRecord]:
        """:meth:`list_runs`, with ``step_count`` set to the number of entries the journal
        holds (a record written before a crash may lag behind): what a listing of runs
        shows. Backends answer it in one query where they can."""
        records = self.list_runs(prefix, status=status, limit=limit, newest_first=newest_first)
        for record in records:
            record.step_count = self.count_steps(record.run_id, record.step_count)
        return records

    def count_runs(self, prefix: str = "") -> dict[Status, int]:
        """How many runs whose id starts with ``prefix`` are in each status (statuses
        without runs left out). Backends count from their index without reading records."""
        counts: dict[Status, int] = {}
        for record in self.list_runs(prefix):
            counts[record.status] = counts.get(record.status, 0) + 1
        return counts

    @abc.abstractmethod
    def delete_run(self, run_id: str, *, token: str | None = None,
                   children: Iterable[str] = ()) -> None:
        """Remove the run, and the runs ``children`` (its child runs), with their steps,
        blobs, leases, requests and keyed values (their scopes), in one transaction (exactly
        these runs: not ``RUN:2``); with ``token``, only while that lease holds the run, else
        :class:`~durable_nb.errors.RunLeased` and nothing is removed."""

    @abc.abstractmethod
    def publish_runs(self, staged: list[tuple[str, RunRecord]]) -> bool:
        """For each ``(staging_id, record)``: make the staged run ``staging_id`` (its
        entries, blobs and keyed values; its record is replaced) the run ``record.run_id``
        with that record, all in one transaction; False, and nothing changed, if one of the runs
        exists already. How a copy becomes a run at once (:mod:`.edits`)."""

    # -- batches ----------------------------------------------------------------------------

    @abc.abstractmethod
    def put_batch(self, record: BatchRecord) -> None:
        """Store the batch record (stamping ``updated_at``), replacing any earlier one."""

    @abc.abstractmethod
    def find_batch(self, batch_id: str) -> BatchRecord | None:
        """The batch record, or None."""

    @abc.abstractmethod
    def list_batches(self) -> list[BatchRecord]:
        """Every batch record, oldest first."""

    # -- steps ----------------------------------------------------------------------------

    @abc.abstractmethod
    def get_step(self, run_id: str, position: int) -> StepEntry | None:
        """The entry at ``position``, or None past the end of the run's journal."""

    @abc.abstractmethod
    def has_step(self, run_id: str, position: int) -> bool:
        """Whether an entry exists at ``position`` (without reading it)."""

    @abc.abstractmethod
    def append_step(self, run_id: str, entry: StepEntry, *, record_json: str | None = None,
                    token: str | None = None, blobs: dict[str, str] | None = None) -> None:
        """Write ``entry`` at its position, with the run record (``record_json``) and any
        ``blobs`` (digest -> JSON text, kept if present) in the same transaction.

        Raises :class:`~durable_nb.errors.RunLeased` when ``token`` no longer holds the
        lease or the position is taken: nothing is written then.
        """

    @abc.abstractmethod
    def rewrite_steps(self, run_id: str, from_position: int, entries: list[StepEntry], *,
                      record_json: str | None = None, token: str | None = None,
                      drop_blobs: Iterable[str] = (), drop_requests: bool = False) -> int:
        """In one transaction: delete the entries from ``from_position`` on, write
        ``entries`` in their place (positions ``from_position``, ``from_position + 1`` ...,
        as given), delete the blobs ``drop_blobs``, the pending requests if
        ``drop_requests``, and write the run record (``record_json``). Returns how many
        entries were deleted.

        With ``token``, only while that lease holds the run: else
        :class:`~durable_nb.errors.RunLeased`, and nothing is changed."""

    def truncate(self, run_id: str, from_position: int, *, token: str | None = None) -> int:
        """Delete the entries from ``from_position`` on (fenced by ``token``); how many."""
        return self.rewrite_steps(run_id, from_position, [], token=token)

    def steps(self, run_id: str, start: int = 0) -> Iterator[StepEntry]:
        """The run's entries in position order."""
        position = start
        while (entry := self.get_step(run_id, position)) is not None:
            yield entry
            position += 1

    def count_steps(self, run_id: str, hint: int = 0) -> int:
        """How many entries the run has: a few lookups from ``hint`` (a record's
        ``step_count``, right unless a crash came after the last record write)."""
        low = 0  # a known count: every position below exists
        if hint > 0 and self.has_step(run_id, hint - 1):
            low = hint
        step = 1
        while self.has_step(run_id, low + step - 1):  # gallop past the end ...
            low += step
            step *= 2
        high = low + step - 1  # ... then bisect: positions from `high` on do not exist
        while low < high:
            mid = (low + high) // 2
            if self.has_step(run_id, mid):
                low = mid + 1
            else:
                high = mid
        return low

    # -- blobs ----------------------------------------------------------------------------

    @abc.abstractmethod
    def get_blob(self, run_id: str, digest: str) -> str | None:
        """The JSON text stored under ``digest`` for the run, or None."""

    # -- leases ---------------------------------------------------------------------------

    @abc.abstractmethod
    def acquire_lease(self, run_id: str, holder: dict,
                      holder_alive: Callable[[dict], bool]) -> None:
        """Make ``holder`` (a dict with a ``token``) the run's lease holder, atomically,
        unless a holder for which ``holder_alive`` is true holds it:
        :class:`~durable_nb.errors.RunLeased` naming that holder then.

        The holder dicts passed to ``holder_alive`` (and returned by :meth:`lease`) are the
        stored ones. A backend with a clock of its own (PostgreSQL's ``now()``) stamps the
        heartbeat in that clock and adds ``heartbeat_age``: seconds since the last heartbeat
        by that clock, which :func:`durable_nb.execution.lease.holder_alive` prefers to comparing
        ``heartbeat`` with this host's clock; ``heartbeat`` is then that age subtracted from
        this process's ``time.time()``."""

    @abc.abstractmethod
    def renew_lease(self, run_id: str, token: str, heartbeat: float) -> bool:
        """Stamp the heartbeat of the lease held by ``token`` (``heartbeat``, or the
        backend's own clock); False if it moved on."""

    @abc.abstractmethod
    def release_lease(self, run_id: str, token: str) -> None:
        """Remove the lease if ``token`` still holds it."""

    @abc.abstractmethod
    def lease(self, run_id: str) -> dict | None:
        """The lease as stored (its holder may be dead), or None."""

    # -- requests from other processes -----------------------------------------------------

    @abc.abstractmethod
    def put_request(self, kind: str, run_id: str, value: dict) -> None:
        """Leave a request (``"decision"`` or ``"cancel"``) for the run's executor."""

    @abc.abstractmethod
    def add_request(self, kind: str, run_id: str, value: dict) -> dict | None:
        """Leave ``value`` as the request of ``kind`` unless there is one already, in one
        atomic step (diskcache's ``add``; in PostgreSQL an ``INSERT ... ON CONFLICT DO
        NOTHING``): of processes racing to add, exactly one writes. None when the request
        is ``value`` now (written by this call, or by this same call made again after a
        lost connection); else the request that was there, unchanged. How a decision is
        written once (:func:`durable_nb.approvals.decide.decide`)."""

    @abc.abstractmethod
    def swap_request(self, kind: str, run_id: str, old: dict, new: dict) -> bool:
        """Replace the request of ``kind`` with ``new`` only if it is ``old`` (equal as
        JSON data), in one atomic step (compare and set). True when the request is ``new``
        now (swapped by this call, or by this same call made again after a lost
        connection); False, and nothing changed, when it is anything else or absent."""

    @abc.abstractmethod
    def get_request(self, kind: str, run_id: str) -> dict | None:
        """The pending request of ``kind``, or None."""

    @abc.abstractmethod
    def delete_request(self, kind: str, run_id: str) -> None:
        """Remove the pending request of ``kind``."""

    # Reads for many runs at once, for the views over a whole journal (the server's listing
    # and summary, the hub's inbox): the same answers as one read per run, which a backend
    # whose reads are round trips (PostgreSQL) makes in one query.

    def requests_of(self, wanted: Iterable[tuple[str, str]]) -> dict[tuple[str, str], dict]:
        """:meth:`get_request` for each ``(kind, run_id)``: the requests present, by
        ``(kind, run_id)``."""
        found = {}
        for kind, run_id in wanted:
            value = self.get_request(kind, run_id)
            if value is not None:
                found[(kind, run_id)] = value
        return found

    def leases_of(self, run_ids: Iterable[str]) -> dict[str, dict]:
        """:meth:`lease` for each run: the leases present, by run id."""
        return {run_id: holder for run_id in run_ids
                if (holder := self.lease(run_id)) is not None}

    def deliveries_of(self, run_ids: Iterable[str]) -> dict[str, dict[str, dict]]:
        """:meth:`deliveries` for each run, by run id."""
        return {run_id: self.deliveries(run_id) for run_id in run_ids}

    def wait_for_request(self, kind: str, run_id: str, timeout: float | None, *,
                         accept: Callable[[dict], bool] | None = None,
                         wake: threading.Event | None = None,
                         poll_interval: float = 0.1) -> dict | None:
        """The pending request of ``kind`` for the run (one ``accept`` takes, if given: a
        decision on this approval, not a stale one), at once if there is one, else the first
        to arrive within ``timeout`` seconds (None: no limit).

        None when the timeout passed, or when ``wake`` was set (by this process: a decision
        or cancel given here, an interrupt; the caller clears it, looks at what else it
        waits for and waits again). A backend may also return None early when another
        request for the run arrived (a cancel wakes a run waiting for a decision).

        This default reads :meth:`get_request` every ``poll_interval`` seconds; a backend
        that can be told of new requests waits for that instead (PostgreSQL: ``LISTEN``).
        """
        check_request_kind(kind)
        until = None if timeout is None else time.monotonic() + timeout
        return self._await_request(kind, run_id, until, accept, wake,
                                   wake if wake is not None else threading.Event(),
                                   poll_interval)

    def _await_request(self, kind: str, run_id: str, until: float | None,
                       accept: Callable[[dict], bool] | None, wake: threading.Event | None,
                       event: threading.Event, interval: float) -> dict | None:
        """The loop of :meth:`wait_for_request`: read the request and return it if wanted;
        None once ``wake`` is set or ``until`` (monotonic) has passed; else wait on ``event``
        for up to ``interval`` seconds and read again. An ``event`` of the backend's own
        (not ``wake``) is cleared before each read, so a signal during the read counts."""
        while True:
            if event is not wake:
                event.clear()
            value = self.get_request(kind, run_id)
            if value is not None and (accept is None or accept(value)):
                return value
            if wake is not None and wake.is_set():
                return None
            left = None if until is None else until - time.monotonic()
            if left is not None and left <= 0:
                return None
            event.wait(interval if left is None else min(interval, left))

    # -- deliveries of notifications -------------------------------------------------------

    def add_delivery(self, run_id: str, key: str, value: dict) -> bool:
        """Store the delivery record ``value`` under ``(run_id, key)`` unless one is there:
        whether it was stored. Atomic: of processes racing to add the same key, exactly one
        gets True (how a notification is claimed: :mod:`durable_nb.notify.delivery`)."""
        raise JournalError(f"the journal at {self.location} does not record deliveries")

    def swap_delivery(self, run_id: str, key: str, expected: dict, value: dict) -> bool:
        """Replace the delivery record under ``(run_id, key)`` by ``value`` only if it is
        still ``expected`` (compared as stored): whether it was replaced. Atomic, like
        :meth:`add_delivery`: of processes swapping the same record, one wins."""
        raise JournalError(f"the journal at {self.location} does not record deliveries")

    def deliveries(self, run_id: str) -> dict[str, dict]:
        """The run's delivery records by key (none: ``{}``), its history's events and its
        decision links' records left out."""
        return only_deliveries(self._run_records(run_id))

    def link_records(self, run_id: str) -> dict[str, dict]:
        """The run's decision links' records by key (:mod:`durable_nb.approvals.links`), kept
        with its deliveries (added and swapped as they are) under keys of their own."""
        return {k: v for k, v in self._run_records(run_id).items()
                if k.startswith(LINK_PREFIX)}

    def _run_records(self, run_id: str) -> dict[str, dict]:
        """Every keyed record of the run in the store deliveries are kept in: deliveries and
        the run's history (:meth:`add_event`)."""
        return {}

    # -- keyed values (key/value namespaces, each in a scope) ----------------------------------
    # A scope named like a run is the run's: Journal.delete_run deletes its values with the
    # run, a copy of the run (copy_run, the fork a re-run keeps) copies them, publish_runs
    # renames them with the run. On a hub journal (PostgreSQL, a decider named) a run's scope
    # is written only by the run's creator role, another scope only by the role that wrote
    # its first value (or the decider).

    def put_values(self, space: str, values: Mapping[str, str], *, scope: str = "",
                   replace: bool = True) -> None:
        """Store each ``key -> text`` of ``values`` (JSON text) in the namespace ``space``
        of ``scope``, all in one transaction. ``replace=False``: a key already there keeps
        its value (insert if absent; of writers racing to add a key, one value stays).

        ``scope``: a run's id (the values are the run's: deleted, copied and renamed with
        it) or any other text ("" by default). Spaces, scopes and keys are text without NUL
        (a space and a scope without ``\\x1f``).
        :mod:`durable_nb.integrations.langgraph.checkpoint` keeps LangGraph's checkpoints
        here, a thread's in the scope named by its thread id."""
        raise JournalError(f"the journal at {self.location} does not store keyed values")

    def get_values(self, space: str, keys: Iterable[str], *,
                   scope: str = "") -> dict[str, str]:
        """The texts stored under those of ``keys`` that ``space`` of ``scope`` holds, by
        key (one query, or a few for many keys)."""
        raise JournalError(f"the journal at {self.location} does not store keyed values")

    def scan_values(self, space: str, prefix: str = "", *, scope: str = "",
                    below: str | None = None, reverse: bool = False,
                    limit: int | None = None) -> list[tuple[str, str]]:
        """``(key, text)`` of the keys of ``space`` in ``scope`` that start with ``prefix``
        (and, with ``below``, sort before it), in key order (code point order, as UTF-8
        bytes sort; ``reverse``: last first), at most ``limit``: one indexed range query."""
        raise JournalError(f"the journal at {self.location} does not store keyed values")

    def delete_values(self, space: str, *, scope: str = "", keys: Iterable[str] = (),
                      prefix: str | None = None) -> int:
        """Delete ``keys`` of ``space`` in ``scope`` and, with ``prefix``, every key that
        starts with it (``""``: the whole space), in one transaction; how many were
        deleted."""
        raise JournalError(f"the journal at {self.location} does not store keyed values")

    def value_scopes(self, space: str) -> list[str]:
        """The scopes that hold values of ``space``, sorted (reads every scope's keys on
        disk: for listings across scopes, not for a step's path)."""
        raise JournalError(f"the journal at {self.location} does not store keyed values")

    def scope_values(self, scope: str) -> list[tuple[str, str, str]]:
        """``(space, key, text)`` of every value in ``scope``, by space and key: what a
        copy of the run ``scope`` copies."""
        raise JournalError(f"the journal at {self.location} does not store keyed values")

    # -- who decides ---------------------------------------------------------------------------

    def decision_authority(self, run_id: str | None = None
                           ) -> tuple[str | None, bool, tuple[str | None, str | None]]:
        """``(decider, is_decider, (created_by, written_by))``: the database role that alone
        writes decisions in this journal, whether this process logs in as it, and who the
        database says created and last wrote run ``run_id``. Only a PostgreSQL journal set
        up for a hub (:mod:`durable_nb.hub`) names a decider; every other journal answers
        ``(None, True, (None, None))``: whoever can write it decides, as always."""
        return None, True, (None, None)

    def writers_of(self, run_ids: Iterable[str]) -> dict[str, tuple[str | None, str | None]]:
        """The ``(created_by, written_by)`` of :meth:`decision_authority` for each run, by
        run id (read at once where the journal records them)."""
        return {run_id: self.decision_authority(run_id)[2] for run_id in run_ids}

    # -- a run's history (its audit trail) ----------------------------------------------------

    def add_event(self, run_id: str, event: dict) -> None:
        """Append ``event`` (JSON data) to the history of run ``run_id``: kept, never changed,
        deleted with the run (:mod:`durable_nb.approvals.history` writes and reads them)."""
        # Kept in the deliveries' store, under a key no delivery has (their keys start with a
        # request's hex id): a history needs the same per-run, add-once records, and no
        # PostgreSQL migration.
        key = f"{HISTORY_PREFIX}{time.time_ns():020d}-{uuid.uuid4().hex[:8]}"
        self.add_delivery(run_id, key, event)

    def events(self, run_id: str) -> list[dict]:
        """The history of run ``run_id``, oldest first."""
        return [value for key, value in sorted(self._run_records(run_id).items())
                if key.startswith(HISTORY_PREFIX)]

    # -- the journal's own settings and history ----------------------------------------------

    def setting(self, name: str) -> dict | None:
        """The journal-wide setting ``name`` (one of :data:`SETTINGS`), or None."""
        check_setting(name)
        return None

    def put_setting(self, name: str, value: dict | None) -> None:
        """Store the journal-wide setting ``name`` (None: remove it). On a journal set up
        for a hub only the service's role may (the database refuses the others)."""
        raise JournalError(f"the journal at {self.location} keeps no settings")

    def add_journal_event(self, event: dict) -> None:
        """Append ``event`` (JSON data) to the journal's own history: what happened to the
        journal as a whole (runs pruned), kept when the runs it names are gone."""
        raise JournalError(f"the journal at {self.location} keeps no history of its own")

    def journal_events(self) -> list[dict]:
        """The journal's own history, oldest first (none: ``[]``)."""
        return []

    def delete_batch(self, batch_id: str, items: dict[str, str | None],
                     children: Iterable[str] = ()) -> None:
        """Remove the batch record with its item runs ``items`` (run id -> the lease token
        held on it, or None) and ``children`` (the items' child runs), with their steps,
        blobs, leases and requests, in one transaction: the batch goes whole or not at all.
        Where a token no longer holds its item's lease,
        :class:`~durable_nb.errors.RunLeased` and nothing is removed."""
        raise JournalError(f"the journal at {self.location} cannot delete a batch")

    def size_on_disk(self) -> int:
        """Bytes the journal takes where it is stored (a directory's files, a schema's
        tables with their indexes and TOAST), for reports of space reclaimed."""
        return 0

    def reclaim_space(self) -> None:
        """Give the space of deleted runs back (SQLite's ``VACUUM``; PostgreSQL's
        ``VACUUM`` of the journal's tables), after a prune."""

    # -- lifecycle ------------------------------------------------------------------------

    def close(self) -> None:
        """Release this thread's resources (connections); the journal stays usable."""

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.location!r})"
