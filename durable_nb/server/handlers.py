"""The REST handlers under ``{base_url}durable-nb/api/``, each routed by and checking its
requests against its :class:`~.api.Endpoint` (the contract, which the REST reference is
rendered from).

Every handler is a Jupyter Server :class:`APIHandler` with ``@tornado.web.authenticated``:
token or login cookie as Jupyter's own APIs, and a POST authenticated by cookie must carry the
XSRF token. Journal calls run in a worker thread (:func:`asyncio.to_thread`), never on the
IOLoop. Run ids travel as query parameters or in JSON bodies (they may contain ``/``).
"""

from __future__ import annotations

import asyncio
import functools
import json
import re
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from importlib.metadata import PackageNotFoundError, version
from typing import Any, TypeVar

from jupyter_server.auth.utils import moons_of_jupyter
from jupyter_server.base.handlers import APIHandler
from jupyter_server.utils import url_path_join
from tornado import web
from tornado.iostream import StreamClosedError

from .. import registry
from ..registry import batch_rows
from ..errors import (DecisionExists, JournalError, NoJournal,
                      NoPendingApproval, NotAllowedToDecide, RunLeased, UnknownRun)
from ..approvals.request import decision_kind
from ..approvals.wording import verdict as decision_verdict
from ..journal import Journal, Status
from . import api, live, views
from .journals import (KnownJournal, NotAllowed, UnknownJournal, allowed_journals, resolve,
                       server_journals)

__all__ = ["handlers"]

T = TypeVar("T")

#: How long a decision's answer waits to see whether a kernel took it (a parked run whose
#: kernel still watches resumes at once); past it the run waits for its cell to be re-run.
TAKEN_WITHIN = 1.0
#: Seconds between the comments an idle event stream gets (proxies close silent
#: connections after a minute or so).
KEEPALIVE = 20.0
#: What an event stream tells the browser to wait before reconnecting (milliseconds).
RETRY_MS = 2000
#: The key of the server's summary watchers in the web application's settings: one for this
#: server's journals, one for every journal (``all=true``).
_WATCHERS = "durable_nb_watchers"

#: The extension's own threads for journal calls: a journal that hangs (a database that went
#: away: each call waits for its connect timeout) ties up these, never the threads Jupyter
#: Server uses for files and kernels.
WORKERS = ThreadPoolExecutor(max_workers=4, thread_name_prefix="durable-nb-api")
#: The ``summary`` being computed, per set of journals (``?journal=`` and ``?all=``): polls
#: that arrive meanwhile wait for it instead of starting another (a slow journal never piles
#: up polls).
_summaries_in_flight: dict[tuple[str, bool], asyncio.Future] = {}


def _user_name(user: Any) -> str:
    """Who decided: the Jupyter user's name (JupyterHub's user, or any identity provider's
    named user); for the anonymous user a token login gets, ``$DURABLE_NB_USER`` or the OS
    user that runs the server (:func:`~durable_nb.registry.approver_name`)."""
    if _is_anonymous(user):
        return registry.approver_name()
    for attribute in ("name", "username"):
        value = getattr(user, attribute, None)
        if isinstance(value, str) and value:
            return value
    return str(user) if isinstance(user, str) and user else registry.approver_name()


_UUID_HEX = re.compile(r"[0-9a-f]{32}")


def _is_anonymous(user: Any) -> bool:
    """Whether ``user`` is one Jupyter Server made up for a login that names nobody (a shared
    token, or no auth): ``IdentityProvider.generate_anonymous_user`` gives a random uuid as
    username and "Anonymous <a moon of Jupyter>" as name; it has no flag to say so."""
    if user is None or user == "anonymous":
        return True
    name, username = getattr(user, "name", None), getattr(user, "username", None)
    if not isinstance(name, str) or not isinstance(username, str):
        return False
    moon = name.removeprefix("Anonymous ")
    return moon != name and moon in moons_of_jupyter and bool(_UUID_HEX.fullmatch(username))


class _Handler(APIHandler):
    """Shared parameter parsing, journal resolution and error mapping. ``endpoint``: what
    the handler serves (its route, and what its requests must be)."""

    endpoint: api.Endpoint

    async def blocking(self, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        """``fn`` in one of the extension's worker threads, its errors as HTTP errors with
        ``{"message"}``."""
        try:
            return await asyncio.get_running_loop().run_in_executor(
                WORKERS, functools.partial(fn, *args, **kwargs))
        except (NotAllowed, NotAllowedToDecide) as exc:  # a journal, a request not theirs
            raise web.HTTPError(403, str(exc)) from None
        except (UnknownJournal, UnknownRun, NoJournal) as exc:
            raise web.HTTPError(404, str(exc)) from None
        except (NoPendingApproval, RunLeased) as exc:  # ApprovalChanged is a NoPendingApproval
            raise web.HTTPError(409, str(exc)) from None
        except JournalError as exc:
            raise web.HTTPError(503, str(exc)) from None
        except ValueError as exc:
            raise web.HTTPError(400, str(exc)) from None

    def params(self) -> dict:
        """The query parameters as :attr:`endpoint` declares them (a 400 naming the first
        that does not fit)."""
        try:
            return self.endpoint.check_params(lambda name: self.get_argument(name, None))
        except api.RequestError as exc:
            raise web.HTTPError(400, str(exc)) from None

    def body(self) -> dict:
        """The JSON body as :attr:`endpoint` declares it (a 400 naming the first field that
        is missing or does not fit)."""
        try:
            return self.endpoint.check_body(json.loads(self.request.body or b"{}"))
        except api.RequestError as exc:
            raise web.HTTPError(400, str(exc)) from None
        except ValueError:
            raise web.HTTPError(400, "the request body is not JSON") from None

    @property
    def root_dir(self) -> str | None:
        root = self.settings.get("server_root_dir")
        return str(root) if root else None

    async def one_journal(self, name: Any, *, write: bool = False) -> tuple[KnownJournal, Journal]:
        """The allowed journal ``name`` names, opened (403, 404 or 503 else)."""
        if not isinstance(name, str) or not name:
            raise web.HTTPError(400, "the parameter 'journal' is missing: a journal id "
                                     "(GET durable-nb/api/journals lists them)")
        known = await self.blocking(resolve, name)
        return known, await self.blocking(known.open, write=write)

    async def journals(self, params: dict) -> tuple[list[tuple[KnownJournal, Journal]],
                                                    list[dict]]:
        """``?journal=ID``'s journal, or every one the listing shows (this server's, or all
        with ``?all=true``) that opens (and those that do not, with why)."""
        if params.get("journal"):
            return [await self.one_journal(params["journal"])], []
        return await self.blocking(_open_shown, self.root_dir, params["all"])


def _open_shown(root_dir: str | None, every: bool
                ) -> tuple[list[tuple[KnownJournal, Journal]], list[dict]]:
    """Every journal a listing shows (:func:`~.journals.server_journals`) that opens, and
    those that do not with why (blocking)."""
    opened, failed = [], []
    views.keep_facts({known.id for known in allowed_journals()})  # the gone ones' dropped
    shown = server_journals(root_dir, every=every)
    for known in shown:
        try:
            opened.append((known, known.open()))
        except (JournalError, OSError) as exc:
            failed.append({"journal": known.id, "error": str(exc)})
    return opened, failed


class JournalsHandler(_Handler):
    endpoint = api.JOURNALS

    @web.authenticated
    async def get(self) -> None:
        listed = []
        every = self.params()["all"]
        for known in await self.blocking(server_journals, self.root_dir, every=every):
            entry = {**known.to_json(self.root_dir), "ok": True, "error": None, "runs": None}
            try:
                opened = await self.blocking(known.open)
                counts = await self.blocking(opened.count_runs)
                entry["runs"] = sum(counts.values())
            except web.HTTPError as exc:
                entry.update(ok=False, error=exc.log_message)
            listed.append(entry)
        self.finish({"journals": listed})


class RunsHandler(_Handler):
    endpoint = api.RUNS

    @web.authenticated
    async def get(self) -> None:
        params = self.params()
        try:
            groups = views.parse_groups(params["status"] or "")
        except ValueError as exc:
            raise web.HTTPError(400, str(exc)) from None
        page, limit = params["page"], params["limit"]
        journals, failed = await self.journals(params)
        listing = await self.blocking(
            views.list_runs, journals, groups=groups, prefix=params["prefix"] or "",
            q=params["q"] or "", page=page, limit=limit, root_dir=self.root_dir)
        self.finish({"runs": listing.runs, "total": listing.total, "page": page,
                     "limit": limit, "pending_approvals": listing.pending_approvals,
                     "unavailable": failed + listing.unavailable})


class RunHandler(_Handler):
    endpoint = api.RUN

    @web.authenticated
    async def get(self) -> None:
        params = self.params()
        known, opened = await self.one_journal(params["journal"])
        run_id = params["id"]
        self.finish(await self.blocking(views.run_view, known, opened, run_id,
                                        root_dir=self.root_dir))


class DecisionHandler(_Handler):
    endpoint = api.DECISION

    @web.authenticated
    async def post(self) -> None:
        data = self.body()
        answer = _answer(data)
        if answer is not None:  # an MCP server's question: accept, decline or cancel
            data = {**data, "approved": answer[0] == "accept" if data["approved"] is None
                    else data["approved"]}
        run_id, approved, note, digest, replace, request_id = (
            data["id"], data["approved"], data["note"], data["digest"], data["replace"],
            data["request_id"])
        # Beyond yes or no: edited arguments (approve) or a message for the model (reject),
        # checked by decide (400 naming what is wrong; nothing written).
        content = {k: data[k] for k in ("args", "message") if data[k] is not None}
        if not run_id:
            raise web.HTTPError(400, "'id' (the run id) is empty")
        if len(digest) < 8:
            raise web.HTTPError(400, "'digest' must be the pending request's digest as shown "
                                     "(8 or more characters): a decision is bound to what "
                                     "the person saw")
        if request_id == "":
            raise web.HTTPError(400, "'request_id' must be the pending request's id, as the "
                                     "run view shows it (null for a request written before "
                                     "ids)")
        known, opened = await self.one_journal(data["journal"], write=True)
        by = _user_name(self.current_user)
        if answer is not None:
            if approved is not (answer[0] == "accept"):
                raise web.HTTPError(400, f"'approved' is {str(approved).lower()} but the "
                                         f"answer is {answer[0]}: leave 'approved' out")
            content = {"answer": {"action": answer[0], "content": answer[1]}}
        # null: the person saw a request written before ids, which is not the one pending if
        # that one has an id ("" says so to decide; None would take the pending one's).
        refused = await self.blocking(_decide, opened, run_id, approved, note, by,
                                      request_id or "", digest, replace, **content)
        if isinstance(refused, NotAllowedToDecide):  # not this user's to decide: who may
            self.set_status(403)
            self.finish({"message": str(refused), "reason": refused.reason, "by": refused.by,
                         "approvers": refused.approvers, "started_by": refused.started_by})
            return
        if refused is not None:  # decided already: who, how and when, in words and as data
            self.set_status(409)
            self.finish({"message": str(refused), "reason": "decided already",
                         "taken": refused.taken,
                         "decision": views.decision_summary(refused.decision)})
            return
        taken = await self.blocking(taken_within, opened, run_id, TAKEN_WITHIN)
        verdict = ANSWERED[answer[0]] if answer else decision_verdict(
            {"approved": approved, **content})
        self.finish({"ok": True, "taken": taken, "by": by, "status": (await self.blocking(
            opened.get_run, run_id)).status.value,
            "message": f"{verdict}; the run resumes in its kernel" if taken else
                       f"{verdict}; re-run its cell to continue"})


#: How the reply to an answered question says what was done.
ANSWERED = {"accept": "accepted", "decline": "declined", "cancel": "cancelled"}


def _answer(data: dict) -> tuple[str, dict | None] | None:
    """``(action, content)`` of a decision POST's ``answer`` (an MCP server's question:
    ``{"action": "accept" | "decline" | "cancel", "content": {...}}``, content with accept
    only), None without one; a 400 in one line when it is malformed or comes with what only
    an approval carries (edited arguments, a message for the model; a note may go with an
    answer, and the decision carries both). Whether the content fits the question's schema is
    the answer's to say (400, nothing written)."""
    if data.get("answer") is None:
        return None
    given = data["answer"]
    if not isinstance(given, dict) or set(given) - {"action", "content"}:
        raise web.HTTPError(400, "'answer' must be an object {\"action\": \"accept\" | "
                                 "\"decline\" | \"cancel\", \"content\": {...}}")
    action, content = given.get("action"), given.get("content")
    if action not in ANSWERED:
        raise web.HTTPError(400, f"'answer.action' must be accept, decline or cancel, not "
                                 f"{json.dumps(action)}")
    if content is not None and not isinstance(content, dict):
        raise web.HTTPError(400, "'answer.content' must be an object of the question's fields")
    if content is not None and action != "accept":
        raise web.HTTPError(400, f"'answer.content' goes with accept only, not {action}")
    extra = [k for k in ("args", "message") if data.get(k) not in (None, "")]
    if data.get("replace"):
        extra.append("replace")
    if extra:
        raise web.HTTPError(400, f"{', '.join(repr(k) for k in extra)} cannot go with "
                                 "'answer' (an answer is the question's whole "
                                 "content: only a note may go with it)")
    return action, content


def _decide(journal: Journal, run_id: str, approved: bool, note: str | None, by: str,
            request_id: str | None, digest: str, replace: bool, **content: Any
            ) -> DecisionExists | NotAllowedToDecide | None:
    """Decide the run's pending approval if it is the request ``request_id`` and ``digest``
    name (:func:`~durable_nb.approvals.decide.decide`, written once), so of concurrent
    decisions anywhere the first wins; the refusal of a later one (what was decided) is
    returned, as is the refusal of a user the request does not allow (its approvers,
    four-eyes). ``content``: ``args`` (approve), ``message`` (reject) or ``answer`` (a question)."""
    decide = registry.approve if approved else registry.reject
    try:
        decide(run_id, note, by=by, expect=digest, request_id=request_id, replace=replace,
               via="Jupyter server", journal=journal, **content)
    except (DecisionExists, NotAllowedToDecide) as exc:
        return exc
    return None


def taken_within(journal: Journal, run_id: str, within: float) -> bool:
    """Whether an executor (a kernel watching the parked run, or one waiting in it) took the
    decision just left for ``run_id`` within ``within`` seconds: it stamps the decision
    taken and the run stops waiting."""
    until = time.monotonic() + within
    while True:
        record = journal.get_run(run_id)
        pending = record.pending_approval
        if record.status is not Status.WAITING_APPROVAL or not pending:
            return True
        decision = journal.get_request(decision_kind(pending), pending.get("run_id", run_id))
        if decision is None or decision.get("taken_at") is not None:
            return True
        if time.monotonic() >= until:
            return False
        time.sleep(0.05)


class CancelHandler(_Handler):
    endpoint = api.CANCEL

    @web.authenticated
    async def post(self) -> None:
        data = self.body()
        run_id = data["id"]
        if not run_id:
            raise web.HTTPError(400, "'id' (the run id) is empty")
        _, opened = await self.one_journal(data["journal"], write=True)
        record = await self.blocking(registry.cancel, run_id, journal=opened)
        if record.status is Status.DONE:
            raise web.HTTPError(409, f"run {run_id!r} is DONE: there is nothing to cancel")
        self.finish({"ok": True, "status": record.status.value,
                     "message": "cancelled" if record.status is Status.CANCELLED else
                                "cancel requested: the run stops at its next step"})


class BatchHandler(_Handler):
    endpoint = api.BATCH

    @web.authenticated
    async def get(self) -> None:
        params = self.params()
        known, opened = await self.one_journal(params["journal"])
        batch_id = params["id"]
        view = await self.blocking(views.batch_view, known, opened, batch_id,
                                   root_dir=self.root_dir)
        if view is None:
            raise web.HTTPError(404, f"no batch {batch_id!r} in {known.display}")
        self.finish(view)


class BatchesHandler(_Handler):
    endpoint = api.BATCHES

    @web.authenticated
    async def get(self) -> None:
        journals, failed = await self.journals(self.params())
        rows = []
        for known, opened in journals:
            found = await self.blocking(batch_rows, opened)
            rows += [{"journal": known.id, **row} for row in found]
        self.finish({"batches": rows, "unavailable": failed})


class SummaryHandler(_Handler):
    endpoint = api.SUMMARY

    @web.authenticated
    async def get(self) -> None:
        params = self.params()
        key = (params["journal"] or "", params["all"])
        running = _summaries_in_flight.get(key)
        if running is None:
            running = asyncio.ensure_future(self._summary(params))
            _summaries_in_flight[key] = running
            running.add_done_callback(lambda _: _summaries_in_flight.pop(key, None))
        self.finish(await asyncio.shield(running))

    async def _summary(self, params: dict) -> dict:
        journals, failed = await self.journals(params)
        answer = await self.blocking(views.summary, journals)
        return {**answer, "unavailable": failed + answer["unavailable"]}


def _summary_of(root_dir: str | None, every: bool) -> tuple[dict, list[Journal]]:
    """``GET summary``'s answer over the journals a listing shows, and the journals read
    (blocking)."""
    journals, failed = _open_shown(root_dir, every)
    answer = views.summary(journals)
    return ({**answer, "unavailable": failed + answer["unavailable"]},
            [opened for _, opened in journals])


def _check(root_dir: str | None, every: bool) -> live.Check:
    async def check() -> tuple[dict, list[Journal]]:
        return await asyncio.get_running_loop().run_in_executor(
            WORKERS, _summary_of, root_dir, every)
    return check


class EventsHandler(_Handler):
    """``GET events``: ``GET summary``'s answer as server-sent events (``event: summary``),
    one when the stream opens and one each time its version changes, from the server's one
    :class:`~.live.Watcher`; a comment every :data:`KEEPALIVE` seconds keeps proxies from
    closing an idle stream and finds the streams whose browser went away."""

    endpoint = api.EVENTS
    #: An open tab is not a person's activity: a hub's idle culler still sees the server idle.
    _track_activity = False
    _closed: asyncio.Event

    @web.authenticated
    async def get(self) -> None:
        every = self.params()["all"]
        self._closed = asyncio.Event()
        watchers = self.settings.setdefault(_WATCHERS, {})
        watcher = watchers.get(every)
        if watcher is None:
            watcher = watchers[every] = live.Watcher(_check(self.root_dir, every))
        self.set_header("Content-Type", "text/event-stream")
        self.set_header("Cache-Control", "no-cache")
        self.set_header("X-Accel-Buffering", "no")  # nginx (a hub's proxy): do not buffer
        stream = watcher.subscribe()
        sent = None
        try:
            self.write(f"retry: {RETRY_MS}\n\n")  # the browser's delay before reconnecting
            await self.flush()
            while not self._closed.is_set():
                changed = asyncio.ensure_future(stream.wait())
                closed = asyncio.ensure_future(self._closed.wait())
                done, _ = await asyncio.wait({changed, closed}, timeout=KEEPALIVE,
                                             return_when=asyncio.FIRST_COMPLETED)
                changed.cancel()
                closed.cancel()
                latest = watcher.latest
                if changed in done and latest is not None and latest["version"] != sent:
                    sent = latest["version"]
                    self.write(live.event("summary", latest))
                elif not done:
                    self.write(": keep-alive\n\n")
                stream.clear()
                await self.flush()
        except StreamClosedError:
            pass
        finally:
            watcher.unsubscribe(stream)

    def on_connection_close(self) -> None:
        closed = getattr(self, "_closed", None)  # None: it closed before the stream began
        if closed is not None:
            closed.set()
        super().on_connection_close()


class VersionHandler(_Handler):
    endpoint = api.VERSION

    @web.authenticated
    async def get(self) -> None:
        try:
            installed = version("durable-nb")
        except PackageNotFoundError:
            installed = "unknown"
        self.finish({"version": installed, "api": api.API_VERSION})


#: Every handler; each is routed by its endpoint's path.
HANDLERS: tuple[type[_Handler], ...] = (
    VersionHandler, JournalsHandler, RunsHandler, RunHandler, DecisionHandler, CancelHandler,
    BatchHandler, BatchesHandler, SummaryHandler, EventsHandler)


def handlers(base_url: str) -> list[tuple[str, type]]:
    """The routes, under the server's ``base_url``."""
    return [(url_path_join(base_url, "durable-nb", "api", handler.endpoint.path), handler)
            for handler in HANDLERS]
