"""The REST API's contract: each endpoint's route, method, parameters, body and answer.

One :class:`Endpoint` per route under ``{base_url}durable-nb/api/``. Its handler
(:mod:`.handlers`) is routed by it and checks every request against it
(:meth:`Endpoint.check_body`, :meth:`Endpoint.check_params`: a 400 in one line naming the
field and what it must be); the REST reference (docs/pages/reference/rest.md, rendered by
docs/hooks/rest_reference.py) is written from it; tests/test_rest_reference.py sends every
example it holds to a real Jupyter server and checks the answer against it. So the reference
cannot say what the server does not do.

The API has a version (:data:`API_VERSION`, reported by ``GET version``), raised whenever a
client written for the previous one could break; :data:`API_CHANGES` says what each one
changed. A body that lacks a field an earlier version did not ask for is refused with the
version that asked for it.

Nothing here imports Jupyter Server: the documentation builds without it.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

__all__ = ["API_CHANGES", "API_VERSION", "ENDPOINTS", "Endpoint", "Example", "Field",
           "RequestError"]

#: The version of the REST API this server speaks (``GET version``'s ``api``).
API_VERSION = 3

#: What each version of the API changed, oldest first.
API_CHANGES: tuple[tuple[int, str], ...] = (
    (1, "The first API; `GET version` reported only the package's version."),
    (2, "`POST run/decision` requires `request_id`, the id of the pending request the person "
        "saw (null for a request written before ids): a decision is bound to that request, "
        "not to an identical one asked after it."),
    (3, "`GET version` reports `api`, this version. `GET journals`, `runs`, `batches`, "
        "`summary` and `events` cover this server's journals (those under its root "
        "directory and the configured ones) unless `all=true`; each journal and each run "
        "says where its journal is (`name`, `journal_name`) and whether it is this "
        "server's (`here`). A request that lacks a field is refused naming the version "
        "that asked for it."),
)

#: The JSON kinds a field can have, and the Python values each accepts.
_KINDS: dict[str, Callable[[Any], bool]] = {
    "string": lambda v: isinstance(v, str),
    "boolean": lambda v: isinstance(v, bool),
    "integer": lambda v: isinstance(v, int) and not isinstance(v, bool),
    "number": lambda v: isinstance(v, (int, float)) and not isinstance(v, bool),
    "object": lambda v: isinstance(v, dict),
    "list": lambda v: isinstance(v, list),
    "null": lambda v: v is None,
}


class RequestError(ValueError):
    """A request that does not fit its endpoint: the message says which field and what it
    must be (HTTP 400)."""


@dataclass(frozen=True)
class Field:
    """A query parameter, a body field or a field of an answer. ``kind``: ``"string"``,
    ``"boolean"``, ``"integer"``, ``"number"``, ``"object"``, ``"list"``, or alternatives
    joined by ``" or "`` (``"string or null"``). ``since``: the API version that added it
    (a required field a client of an earlier version does not send). ``unless``: required
    unless that other field is given."""

    name: str
    kind: str
    doc: str
    required: bool = False
    default: Any = None
    since: int = 1
    unless: str | None = None
    low: int | None = None
    high: int | None = None

    def fits(self, value: Any) -> bool:
        """Whether ``value`` is of this field's kind (and in its range)."""
        if not any(_KINDS[kind](value) for kind in self.kind.split(" or ")):
            return False
        if isinstance(value, int) and not isinstance(value, bool):
            return (self.low is None or value >= self.low) and \
                (self.high is None or value <= self.high)
        return True

    def wanted(self) -> str:
        """What a value must be, in words: ``an object``, ``true or false``."""
        if self.kind == "boolean":
            return "true or false"
        if self.low is not None and self.high is not None:
            return f"a whole number from {self.low} to {self.high}"
        return " or ".join(_article(kind) for kind in self.kind.split(" or "))

    def missing(self) -> str:
        """The refusal of a request without this required field."""
        said = f"'{self.name}' ({self.doc}) is missing"
        if self.since > 1:
            said += (f": it is required since version {self.since} of this API, and this "
                     f"server speaks version {API_VERSION} (GET durable-nb/api/version); a "
                     f"client written for an earlier version must send it (the REST "
                     f"reference lists every field)")
        return said


def _article(kind: str) -> str:
    return {"null": "null", "list": "a list", "integer": "a whole number"}.get(
        kind, f"an {kind}" if kind[0] in "aeiou" else f"a {kind}")


@dataclass(frozen=True)
class Example:
    """A request as the reference shows it (a body for a POST, query parameters for a GET)
    and the status it is answered with. ``given``: the fields whose values a client takes
    from an earlier answer (a journal's id, a run's request id and digest); a test sends the
    example with those taken from its own server, the rest exactly as shown."""

    title: str
    request: Mapping[str, Any]
    given: tuple[str, ...] = ()
    status: int = 200


@dataclass(frozen=True)
class Endpoint:
    """One route of the API: what it takes, what it answers, and examples of both."""

    method: str
    path: str
    doc: str
    params: tuple[Field, ...] = ()
    body: tuple[Field, ...] = ()
    answer: tuple[Field, ...] = ()
    errors: str = ""
    examples: tuple[Example, ...] = ()
    content_type: str = "application/json"

    def check_body(self, data: Any) -> dict:
        """``data`` (the decoded JSON body) if it fits :attr:`body`, with each optional
        field's default filled in; :class:`RequestError` naming the first field that does not
        fit. Fields the endpoint does not take are left as they are."""
        if not isinstance(data, dict):
            raise RequestError("the request body is not a JSON object")
        return self._checked(data, "field")

    def check_params(self, get: Callable[[str], str | None]) -> dict:
        """The query parameters (``get(name)``: the parameter's text, None when absent),
        each converted to its kind, defaults filled in; :class:`RequestError` naming the
        first that does not fit."""
        given: dict[str, Any] = {}
        for param in self.params:
            text = get(param.name)
            if text is None or text == "":
                continue
            given[param.name] = _parse(param, text)
        return self._checked(given, "parameter")

    def _checked(self, data: dict, what: str) -> dict:
        checked = dict(data)
        for spec in self.params if what == "parameter" else self.body:
            if spec.name not in data:
                if spec.required and (spec.unless is None or data.get(spec.unless) is None):
                    raise RequestError(spec.missing() if what == "field" else
                                       f"the parameter '{spec.name}' ({spec.doc}) is missing")
                checked[spec.name] = spec.default
            elif not spec.fits(data[spec.name]):
                raise RequestError(f"'{spec.name}' must be {spec.wanted()} ({spec.doc})")
        return checked


def _parse(param: Field, text: str) -> Any:
    """A query parameter's text as its kind."""
    if param.kind == "integer":
        try:
            return int(text)
        except ValueError:
            raise RequestError(f"{param.name}={text!r} is not a whole number") from None
    if param.kind == "boolean":
        if text.lower() in ("true", "1", "yes"):
            return True
        if text.lower() in ("false", "0", "no"):
            return False
        raise RequestError(f"{param.name}={text!r} must be true or false")
    return text


# -- the endpoints -----------------------------------------------------------------------------

_JOURNAL = Field("journal", "string", "a journal's id from GET journals, or its location",
                 required=True)
_ONE_JOURNAL = Field("journal", "string", "only this journal (its id, or its location)")
_ALL = Field("all", "boolean", "every journal a process of this user opened, not only this "
             "server's (those under its root directory and the configured ones)",
             default=False, since=3)
_UNAVAILABLE = Field("unavailable", "list", "the journals that did not answer: "
                     "`{\"journal\", \"error\"}` each")
_SUMMARY = (Field("pending_approvals", "integer", "requests waiting for a person"),
            _UNAVAILABLE,
            Field("version", "string", "changes when anything GET runs shows changes"))
_RUN_ID = Field("id", "string", "the run's id", required=True)

VERSION = Endpoint(
    "GET", "version", "The package's version and the API's.",
    answer=(Field("version", "string", "the durable-nb package the server runs"),
            Field("api", "integer", "the API version this server speaks")),
    examples=(Example("the versions", {}),))

JOURNALS = Endpoint(
    "GET", "journals", "The journals the server shows, each with where it is and how many "
    "runs it holds.",
    params=(_ALL,),
    answer=(Field("journals", "list", "`{\"id\", \"name\", \"location\", \"kind\", \"here\", "
                  "\"ok\", \"error\", \"runs\"}` each: `name` is where the journal is (a path "
                  "relative to the server's root, else its absolute path or its PostgreSQL "
                  "URL without password), `here` whether it is this server's, `ok` whether "
                  "it opened"),),
    examples=(Example("this server's journals", {}),
              Example("every journal of this user", {"all": "true"})))

RUNS = Endpoint(
    "GET", "runs", "A page of runs: waiting for approval first, then running, interrupted, "
    "failed, cancelled, done, newest first within each. A run's `deliveries` says how many "
    "of its request's notifications were `sent`, `failed`, are `retrying`, `sending` or "
    "`skipped`, and `problem` (which channel and why) when one failed or is retrying.",
    params=(_ONE_JOURNAL, _ALL,
            Field("status", "string", "comma-separated statuses: waiting_approval, running, "
                  "interrupted, failed, cancelled, done"),
            Field("q", "string", "text in the run's id, title or notebook"),
            Field("prefix", "string", "run ids that start with it"),
            Field("page", "integer", "the page", default=0, low=0, high=1_000_000),
            Field("limit", "integer", "runs per page", default=50, low=1, high=500)),
    answer=(Field("runs", "list", "the runs: id, title, status, tokens, cost, journal "
                  "(`journal`, `journal_name`, `journal_location`), notebook and cell, "
                  "pending approval with its id and digest, decision, deliveries"),
            Field("total", "integer", "runs that match, on every page"),
            Field("page", "integer", "this page"), Field("limit", "integer", "runs per page"),
            Field("pending_approvals", "integer", "requests waiting for a person"),
            _UNAVAILABLE),
    errors="400 for an unknown status or a page or limit out of range",
    examples=(Example("the first page", {}),
              Example("waiting runs whose id or title says 'report'",
                      {"status": "waiting_approval", "q": "report", "limit": 20})))

RUN = Endpoint(
    "GET", "run", "One run: its record (as in GET runs, with its result, notification "
    "deliveries as `notifications`, its audit trail as `history`: `{\"kind\", \"at\", "
    "\"text\", ...}`, its limits and source) and its steps as text.",
    params=(_JOURNAL, _RUN_ID),
    answer=(Field("record", "object", "the run"),
            Field("steps", "list", "its steps, as text built from the journal's JSON")),
    errors="404 for a run or journal that does not exist",
    examples=(Example("one run", {"journal": "j5c1f0e9a3b", "id": "q3-email"},
                      given=("journal",)),))

_DECISION_FIELDS = (
    Field("journal", "string", "the run's journal: its id, or its location", required=True),
    Field("id", "string", "the run id", required=True),
    Field("approved", "boolean", "approve (true) or reject (false)", required=True,
          unless="answer"),
    Field("request_id", "string or null", "the id of the pending request as shown; null for "
          "a request written before ids", required=True, since=2),
    Field("digest", "string", "the digest of the pending request as shown (8 or more "
          "characters): a decision is bound to what the person saw", required=True),
    Field("note", "string or null", "a note kept with the decision"),
    Field("replace", "boolean", "change a decision the run has not taken yet", default=False),
    Field("args", "object", "approve with these arguments in place of the model's (checked "
          "against the request's schema)"),
    Field("message", "string", "reject with this message for the model"),
    Field("answer", "object", "an MCP server's question answered: `{\"action\": \"accept\" | "
          "\"decline\" | \"cancel\", \"content\": {...}}` (content with accept only, checked "
          "against the question's schema), in place of `approved`"),
)
_PENDING = ("journal", "id", "request_id", "digest")

DECISION = Endpoint(
    "POST", "run/decision", "Approve or reject the pending request shown, or answer an MCP "
    "server's question. The decision is signed with the Jupyter user's name (`by`).",
    body=_DECISION_FIELDS,
    answer=(Field("ok", "boolean", "true"),
            Field("taken", "boolean", "whether a kernel took the decision at once"),
            Field("by", "string", "who decided"),
            Field("status", "string", "the run's status now"),
            Field("message", "string", "the decision in words, with the edited arguments or the "
                  "message to the model when given, and what happens next: \"approved with "
                  "edited arguments {...}; the run resumes in its kernel\", or \"...; re-run its "
                  "cell to continue\"")),
    errors="400 naming the field that is missing or wrong; 403 `{\"message\", \"reason\", "
    "\"by\", \"approvers\", \"started_by\"}` for a user the request does not allow; 409 when "
    "the request changed, or `{\"message\", \"reason\": \"decided already\", \"taken\", "
    "\"decision\": {\"approved\", \"by\", \"via\", \"at\", \"note\", \"digest\", \"answer\", "
    "\"args\", \"message\"}}` (`args`: the edited arguments, `message`: the message to the model, "
    "each null when not given) "
    "when it was decided already",
    examples=(
        Example("approve", {"journal": "j5c1f0e9a3b", "id": "q3-email", "approved": True,
                            "request_id": "637b2f55c3e04c7f9d1a2b3c4d5e6f70",
                            "digest": "9f7996211197", "note": "ship it"}, given=_PENDING),
        Example("approve with edited arguments",
                {"journal": "j5c1f0e9a3b", "id": "q3-email", "approved": True,
                 "request_id": "637b2f55c3e04c7f9d1a2b3c4d5e6f70", "digest": "9f7996211197",
                 "args": {"to": "team@example.com", "subject": "Q3 report"}}, given=_PENDING),
        Example("reject with a message for the model",
                {"journal": "j5c1f0e9a3b", "id": "q3-email", "approved": False,
                 "request_id": "637b2f55c3e04c7f9d1a2b3c4d5e6f70", "digest": "9f7996211197",
                 "message": "Do not email the team; write the summary here."},
                given=_PENDING),
        Example("answer an MCP server's question",
                {"journal": "j5c1f0e9a3b", "id": "trip", "request_id":
                 "0c9e4d8f2a7b4e61b5d3f1a2c4e6a8b0", "digest": "4b1f0a9c2d7e",
                 "answer": {"action": "accept", "content": {"nights": 3}}}, given=_PENDING),
        Example("a body of API version 1 (no request_id)",
                {"journal": "j5c1f0e9a3b", "id": "q3-email", "approved": True,
                 "digest": "9f7996211197"}, given=("journal",), status=400),
    ))

CANCEL = Endpoint(
    "POST", "run/cancel", "Cancel a run (a running one stops at its next step).",
    body=(Field("journal", "string", "the run's journal: its id, or its location",
                required=True),
          Field("id", "string", "the run id", required=True)),
    answer=(Field("ok", "boolean", "true"), Field("status", "string", "the run's status now"),
            Field("message", "string", "\"cancelled\", or \"cancel requested: ...\"")),
    errors="409 for a run that is DONE",
    examples=(Example("cancel", {"journal": "j5c1f0e9a3b", "id": "nightly"},
                      given=("journal",)),))

BATCH = Endpoint(
    "GET", "batch", "A batch's counts by status (PENDING: items never started) and its "
    "items in item order.",
    params=(_JOURNAL, Field("id", "string", "the batch id", required=True)),
    answer=(Field("batch", "object", "`{\"journal\", \"batch_id\", \"title\", \"items\", "
                  "\"counts\", \"created_at\", \"updated_at\"}`"),
            Field("items", "list", "the items' runs, as in GET runs")),
    errors="404 for a batch that does not exist",
    examples=(Example("one batch", {"journal": "j5c1f0e9a3b", "id": "prices"},
                      given=("journal",)),))

BATCHES = Endpoint(
    "GET", "batches", "Every batch.",
    params=(_ONE_JOURNAL, _ALL),
    answer=(Field("batches", "list", "each batch's counts, with its `journal`"),
            _UNAVAILABLE),
    examples=(Example("the batches", {}),))

SUMMARY = Endpoint(
    "GET", "summary", "How many requests wait for a person, and a version that changes "
    "when any listed run does (what a client polls).",
    params=(_ONE_JOURNAL, _ALL),
    answer=_SUMMARY,
    examples=(Example("the summary", {}),))

EVENTS = Endpoint(
    "GET", "events", "GET summary's answer pushed as server-sent events (`event: summary`): "
    "one when the stream opens, then one each time its `version` changes, and a comment "
    "every 20 s; what the sidebar listens to.",
    params=(_ALL,),
    answer=_SUMMARY, content_type="text/event-stream")

#: Every endpoint, in the order the reference lists them.
ENDPOINTS: tuple[Endpoint, ...] = (VERSION, JOURNALS, RUNS, RUN, DECISION, CANCEL, BATCH,
                                   BATCHES, SUMMARY, EVENTS)
