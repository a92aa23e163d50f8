"""The REST handlers under ``{base_url}durable-nb/api/`` (the contract: API.md in the repo's
issue notes, described in docs/pages/guide/server.md).

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
from . import live, views
from .journals import KnownJournal, NotAllowed, UnknownJournal, allowed_journals, resolve

__all__ = ["handlers"]

T = TypeVar("T")

#: How long a decision's answer waits to see whether a kernel took it (a parked run whose
#: kernel still watches resumes at once); past it the run waits for its cell to be re-run.
TAKEN_WITHIN = 1.0
_MAX_LIMIT = 500
#: Seconds between the comments an idle event stream gets (proxies close silent
#: connections after a minute or so).
KEEPALIVE = 20.0
#: What an event stream tells the browser to wait before reconnecting (milliseconds).
RETRY_MS = 2000
#: The key of the server's one summary watcher in the web application's settings.
_WATCHER = "durable_nb_watcher"

#: The extension's own threads for journal calls: a journal that hangs (a database that went
#: away: each call waits for its connect timeout) ties up these, never the threads Jupyter
#: Server uses for files and kernels.
WORKERS = ThreadPoolExecutor(max_workers=4, thread_name_prefix="durable-nb-api")
#: The ``summary`` being computed, per set of journals: polls that arrive meanwhile wait for
#: it instead of starting another (a slow journal never piles up polls).
_summaries_in_flight: dict[tuple[str, ...], asyncio.Future] = {}


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
    """Shared parameter parsing, journal resolution and error mapping."""

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

    def int_argument(self, name: str, default: int, low: int, high: int) -> int:
        text = self.get_argument(name, str(default))
        try:
            value = int(text)
        except ValueError:
            raise web.HTTPError(400, f"{name}={text!r} is not a whole number") from None
        if not low <= value <= high:
            raise web.HTTPError(400, f"{name}={value} is out of range: {low} to {high}")
        return value

    def required_argument(self, name: str) -> str:
        value = self.get_argument(name, "")
        if not value:
            raise web.HTTPError(400, f"the parameter {name!r} is missing")
        return value

    def body(self) -> dict:
        try:
            data = json.loads(self.request.body or b"{}")
        except ValueError:
            raise web.HTTPError(400, "the request body is not JSON") from None
        if not isinstance(data, dict):
            raise web.HTTPError(400, "the request body is not a JSON object")
        return data

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

    async def journals(self) -> tuple[list[tuple[KnownJournal, Journal]], list[dict]]:
        """``?journal=ID``'s journal, or every allowed one that opens (and those that do
        not, with why)."""
        name = self.get_argument("journal", "")
        if name:
            return [await self.one_journal(name)], []
        return await self.blocking(_open_allowed)


def _open_allowed() -> tuple[list[tuple[KnownJournal, Journal]], list[dict]]:
    """Every allowed journal that opens, and those that do not with why (blocking)."""
    opened, failed = [], []
    allowed = allowed_journals()
    views.keep_facts({known.id for known in allowed})
    for known in allowed:
        try:
            opened.append((known, known.open()))
        except (JournalError, OSError) as exc:
            failed.append({"journal": known.id, "error": str(exc)})
    return opened, failed


class JournalsHandler(_Handler):
    @web.authenticated
    async def get(self) -> None:
        listed = []
        for known in await self.blocking(allowed_journals):
            entry = {**known.to_json(), "ok": True, "error": None, "runs": None}
            try:
                opened = await self.blocking(known.open)
                counts = await self.blocking(opened.count_runs)
                entry["runs"] = sum(counts.values())
            except web.HTTPError as exc:
                entry.update(ok=False, error=exc.log_message)
            listed.append(entry)
        self.finish({"journals": listed})


class RunsHandler(_Handler):
    @web.authenticated
    async def get(self) -> None:
        try:
            groups = views.parse_groups(self.get_argument("status", ""))
        except ValueError as exc:
            raise web.HTTPError(400, str(exc)) from None
        page = self.int_argument("page", 0, 0, 1_000_000)
        limit = self.int_argument("limit", 50, 1, _MAX_LIMIT)
        journals, failed = await self.journals()
        listing = await self.blocking(
            views.list_runs, journals, groups=groups, prefix=self.get_argument("prefix", ""),
            q=self.get_argument("q", ""), page=page, limit=limit, root_dir=self.root_dir)
        self.finish({"runs": listing.runs, "total": listing.total, "page": page,
                     "limit": limit, "pending_approvals": listing.pending_approvals,
                     "unavailable": failed + listing.unavailable})


class RunHandler(_Handler):
    @web.authenticated
    async def get(self) -> None:
        known, opened = await self.one_journal(self.get_argument("journal", ""))
        run_id = self.required_argument("id")
        self.finish(await self.blocking(views.run_view, known, opened, run_id,
                                        root_dir=self.root_dir))


class DecisionHandler(_Handler):
    @web.authenticated
    async def post(self) -> None:
        data = self.body()
        answer = _answer(data)
        if answer is not None:  # an MCP server's question: accept, decline or cancel
            data = {**data, "approved": data.get("approved", answer[0] == "accept")}
        run_id, approved, note, digest, replace = (data.get("id"), data.get("approved"),
                                                   data.get("note"), data.get("digest"),
                                                   data.get("replace", False))
        request_id = data.get("request_id")
        # Beyond yes or no: edited arguments (approve) or a message for the model (reject),
        # checked by decide (400 naming what is wrong; nothing written).
        content = {k: data[k] for k in ("args", "message") if data.get(k) is not None}
        if not isinstance(run_id, str) or not run_id:
            raise web.HTTPError(400, "'id' (the run id) is missing")
        if not isinstance(approved, bool):
            raise web.HTTPError(400, "'approved' must be true or false")
        if note is not None and not isinstance(note, str):
            raise web.HTTPError(400, "'note' must be a string or null")
        if not isinstance(replace, bool):
            raise web.HTTPError(400, "'replace' must be true or false (default false)")
        if not isinstance(digest, str) or len(digest) < 8:
            raise web.HTTPError(400, "'digest' (of the pending request as shown, 8 or more "
                                     "characters) is missing: a decision is bound to what "
                                     "the person saw")
        if request_id is not None and (not isinstance(request_id, str) or not request_id):
            raise web.HTTPError(400, "'request_id' must be the pending request's id (a "
                                     "string), as the run view shows it")
        if "request_id" not in data:
            raise web.HTTPError(400, "'request_id' (the id of the pending request as shown; "
                                     "null for a request written before ids) is missing: a "
                                     "decision is bound to the request the person saw, not "
                                     "to an identical one asked after it")
        known, opened = await self.one_journal(data.get("journal"), write=True)
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
    @web.authenticated
    async def post(self) -> None:
        data = self.body()
        run_id = data.get("id")
        if not isinstance(run_id, str) or not run_id:
            raise web.HTTPError(400, "'id' (the run id) is missing")
        _, opened = await self.one_journal(data.get("journal"), write=True)
        record = await self.blocking(registry.cancel, run_id, journal=opened)
        if record.status is Status.DONE:
            raise web.HTTPError(409, f"run {run_id!r} is DONE: there is nothing to cancel")
        self.finish({"ok": True, "status": record.status.value,
                     "message": "cancelled" if record.status is Status.CANCELLED else
                                "cancel requested: the run stops at its next step"})


class BatchHandler(_Handler):
    @web.authenticated
    async def get(self) -> None:
        known, opened = await self.one_journal(self.get_argument("journal", ""))
        batch_id = self.required_argument("id")
        view = await self.blocking(views.batch_view, known, opened, batch_id,
                                   root_dir=self.root_dir)
        if view is None:
            raise web.HTTPError(404, f"no batch {batch_id!r} in {known.display}")
        self.finish(view)


class BatchesHandler(_Handler):
    @web.authenticated
    async def get(self) -> None:
        journals, failed = await self.journals()
        rows = []
        for known, opened in journals:
            found = await self.blocking(batch_rows, opened)
            rows += [{"journal": known.id, **row} for row in found]
        self.finish({"batches": rows, "unavailable": failed})


class SummaryHandler(_Handler):
    @web.authenticated
    async def get(self) -> None:
        key = self.get_argument("journal", "")
        running = _summaries_in_flight.get(key)
        if running is None:
            running = asyncio.ensure_future(self._summary())
            _summaries_in_flight[key] = running
            running.add_done_callback(lambda _: _summaries_in_flight.pop(key, None))
        self.finish(await asyncio.shield(running))

    async def _summary(self) -> dict:
        journals, failed = await self.journals()
        answer = await self.blocking(views.summary, journals)
        return {**answer, "unavailable": failed + answer["unavailable"]}


def _summary_of_all() -> tuple[dict, list[Journal]]:
    """``GET summary``'s answer over every allowed journal, and the journals read
    (blocking)."""
    journals, failed = _open_allowed()
    answer = views.summary(journals)
    return ({**answer, "unavailable": failed + answer["unavailable"]},
            [opened for _, opened in journals])


async def _check() -> tuple[dict, list[Journal]]:
    return await asyncio.get_running_loop().run_in_executor(WORKERS, _summary_of_all)


class EventsHandler(_Handler):
    """``GET events``: ``GET summary``'s answer as server-sent events (``event: summary``),
    one when the stream opens and one each time its version changes, from the server's one
    :class:`~.live.Watcher`; a comment every :data:`KEEPALIVE` seconds keeps proxies from
    closing an idle stream and finds the streams whose browser went away."""

    #: An open tab is not a person's activity: a hub's idle culler still sees the server idle.
    _track_activity = False
    _closed: asyncio.Event

    @web.authenticated
    async def get(self) -> None:
        self._closed = asyncio.Event()
        watcher = self.settings.get(_WATCHER)
        if watcher is None:
            watcher = self.settings[_WATCHER] = live.Watcher(_check)
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
    @web.authenticated
    async def get(self) -> None:
        try:
            installed = version("durable-nb")
        except PackageNotFoundError:
            installed = "unknown"
        self.finish({"version": installed})


def handlers(base_url: str) -> list[tuple[str, type]]:
    """The routes, under the server's ``base_url``."""
    routes = {"journals": JournalsHandler, "runs": RunsHandler, "run": RunHandler,
              "run/decision": DecisionHandler, "run/cancel": CancelHandler,
              "batch": BatchHandler, "batches": BatchesHandler, "summary": SummaryHandler,
              "events": EventsHandler, "version": VersionHandler}
    return [(url_path_join(base_url, "durable-nb", "api", path), handler)
            for path, handler in routes.items()]
