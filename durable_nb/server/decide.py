"""The decision-link page, ``{base_url}durable-nb/decide#TOKEN``
(:mod:`durable_nb.approvals.links`).

The token is the credential, and it is kept out of every URL a server or proxy sees: it is
in the fragment, which browsers never send. GET answers a small page whose script reads the
fragment, removes it from the address bar and posts it in the body (``action=view``); the
answer shows the request (run, notebook, tool, details, to whom the link was sent, until when
it is valid) and, only when the link may decide it, a form, Approve / Reject with a note,
which posts the token again in its body; for an MCP server's question, its message and a
form of its fields with Accept / Decline / Cancel (:func:`question_form`). Viewing never
decides (link scanners and chat previews open links). The form's POST decides once, as the
link's recipient, via ``link``, through :func:`~durable_nb.approvals.decide.decide`. No
Jupyter login is needed, and no kernel or JupyterLab. The form carries Jupyter's XSRF token
(tornado's ``_xsrf`` field and cookie), so a page elsewhere cannot post it; every answer says
``Referrer-Policy: no-referrer`` (a browser then sends ``Origin: null`` with the form, which
this handler accepts: the XSRF check and the token in the body are what protect it).

Answers: 200 the form, or decided; 404 a token that names no link (nothing decided, logged
without the token); 410 used already or expired; 409 the request changed since the link was
sent, or someone decided it already; 403 the link may not decide it (shown before any
button: an approvers' list or four-eyes applies and the link does not say who clicks it).
"""

from __future__ import annotations

import asyncio
import functools
import html
import json
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar

from jupyter_server.base.handlers import JupyterHandler
from jupyter_server.utils import url_path_join
from tornado import web

from ..errors import JournalError
from ..journal import Journal
from ..approvals.links import (LINK_PATH, LinkOutcome, inspect_link, journal_ref,
                               parse_token, sent_to, use_link)
from ..approvals.question import (ACTIONS, QuestionField, answer_words, question_of,
                                  typed_value)
from ..approvals.request import editable
from ..approvals.wording import decision_words
from ..timestamps import format_time
from .handlers import TAKEN_WITHIN, WORKERS, taken_within
from .journals import allowed_journals

try:  # jupyter_server >= 2.13: a handler open to a request without a login says so
    from jupyter_server.auth.decorator import allow_unauthenticated
except ImportError:  # pragma: no cover - older servers let any handler through
    def allow_unauthenticated(method: Any) -> Any:
        return method

__all__ = ["DecideHandler", "LinkForm", "decide_handlers", "loader_page", "posted_answer",
           "question_form", "read_form", "render"]

T = TypeVar("T")
_NOTE_CHARS = 2000
_UNKNOWN = LinkOutcome("unknown", 404, "This link is not valid: it was never issued, or its "
                       "run or journal is gone. Nothing was decided.")


def _find_journal(ref: str) -> Journal | None:
    """The journal this server shows whose reference is ``ref``, opened for writing."""
    for known in allowed_journals():
        if journal_ref(known.display) == ref:
            return known.open(write=True)
    return None


class DecideHandler(JupyterHandler):
    """GET: the page that posts the fragment's token; POST: the request and the form
    (``action=view``), or the decision (``action=approve|reject``)."""

    def check_origin(self, origin_to_satisfy_tornado: str = "") -> bool:
        # "no-referrer" makes a browser send "Origin: null" with the form's POST: accepted
        # here, where the XSRF cookie and the token in the body decide.
        if self.request.headers.get("Origin") == "null":
            return True
        return bool(super().check_origin(origin_to_satisfy_tornado))

    def set_default_headers(self) -> None:
        super().set_default_headers()
        self.set_header("Referrer-Policy", "no-referrer")
        self.set_header("Cache-Control", "no-store")
        self.set_header("X-Robots-Tag", "noindex, nofollow")

    async def _blocking(self, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        return await asyncio.get_running_loop().run_in_executor(
            WORKERS, functools.partial(fn, *args, **kwargs))

    async def _locate(self, token: str) -> tuple[Journal, str, str] | None:
        parsed = parse_token(token)
        try:
            journal = None if parsed is None else await self._blocking(_find_journal,
                                                                       parsed[0])
        except JournalError as exc:  # a journal this server shows that does not open now
            raise web.HTTPError(503, str(exc)) from None
        if parsed is None or journal is None:
            self.log.warning("durable_nb: a decision link that names no link was opened "
                             "(from %s); nothing was decided", self.request.remote_ip)
            return None
        return journal, parsed[1], parsed[2]

    @allow_unauthenticated
    async def get(self) -> None:
        self.set_header("Content-Type", "text/html; charset=utf-8")
        self.finish(loader_page(self.xsrf_form_html()))

    @allow_unauthenticated
    async def post(self) -> None:
        posted = read_form(self)
        token, action, choice, note, content = (posted.token, posted.action, posted.choice,
                                                posted.note, posted.content)
        found = await self._locate(token)
        if found is None:
            return self._page(_UNKNOWN, "", "")
        journal, run_id, secret = found
        try:
            if action == "view":
                _, outcome = await self._blocking(inspect_link, journal, run_id, secret)
            else:
                outcome = await self._blocking(use_link, journal, run_id, secret,
                                               approved=action == "approve", note=note,
                                               **content)
        except JournalError as exc:
            raise web.HTTPError(503, str(exc)) from None
        if outcome.kind == "unknown":
            self.log.warning("durable_nb: a decision link with an unknown secret was posted "
                             "(run %r, from %s); nothing was decided", run_id,
                             self.request.remote_ip)
        taken = False
        if outcome.kind == "decided":
            taken = await self._blocking(taken_within, journal, run_id, TAKEN_WITHIN)
        self._page(outcome, run_id, token, taken=taken, choice=choice)

    def _page(self, outcome: LinkOutcome, run_id: str, token: str, *,
              taken: bool = False, choice: str = "") -> None:
        self.set_status(outcome.status)
        self.set_header("Content-Type", "text/html; charset=utf-8")
        form = (self.xsrf_form_html() + f'<input type="hidden" name="token" '
                f'value="{html.escape(token)}">') if outcome.kind == "open" else ""
        self.finish(render(outcome, run_id, form=form, taken=taken, choice=choice))


@dataclass(frozen=True)
class LinkForm:
    """What a decision page posted: its link's ``token``, the ``action`` (``view``,
    ``approve``, ``reject``), the button's ``choice`` to focus, the ``note``, and the
    decision's ``content`` beyond yes or no (:func:`form_content`)."""
    token: str
    action: str
    choice: str
    note: str | None
    content: dict


def read_form(handler: web.RequestHandler) -> LinkForm:
    """The decision page's POST, read and checked (a 400 for an unknown action or arguments
    that are not JSON): the one reading of it, for a user's server and the hub's service.
    An answer to a question (Accept, Decline, Cancel) is read as Approve (accept) or Reject
    with its ``answer`` in ``content``."""
    action = handler.get_body_argument("action", "view")
    if action in ACTIONS:
        return LinkForm(
            token=handler.get_body_argument("token", ""),
            action="approve" if action == "accept" else "reject",
            choice=handler.get_body_argument("choice", ""),
            note=handler.get_body_argument("note", "").strip()[:_NOTE_CHARS] or None,
            content={"answer": posted_answer(action, {
                name: [v.decode("utf-8", "replace") for v in values]
                for name, values in handler.request.body_arguments.items()})})
    if action not in ("view", "approve", "reject"):
        raise web.HTTPError(400, "choose Approve or Reject")
    return LinkForm(
        token=handler.get_body_argument("token", ""), action=action,
        choice=handler.get_body_argument("choice", ""),
        note=handler.get_body_argument("note", "").strip()[:_NOTE_CHARS] or None,
        content=form_content(action, handler.get_body_argument("args", ""),
                             handler.get_body_argument("args_shown", ""),
                             handler.get_body_argument("message", "")))


def form_content(action: str, args: str, args_shown: str, message: str) -> dict:
    """What the form says beyond yes or no: the arguments on Approve when they were edited
    (text that is not JSON: a 400, nothing decided), the message on Reject when one was
    typed. Whether the arguments fit the tool's schema is ``decide``'s to say."""
    if action == "approve" and args.strip():
        try:
            edited, shown = json.loads(args), json.loads(args_shown or "null")
        except ValueError as exc:
            raise web.HTTPError(400, f"the arguments are not JSON ({exc}): nothing was "
                                     f"decided; open the link again") from None
        return {} if edited == shown else {"args": edited}
    if action == "reject" and message.strip():
        return {"message": message.strip()[:_NOTE_CHARS]}
    return {}


def posted_answer(action: str, posted: dict[str, list[str]]) -> dict:
    """The answer a question's form posted: ``{"action", "content"}``, content (with accept)
    from the fields named ``field.KIND.NAME`` (:func:`question_form`), each read as its
    kind says (:func:`~durable_nb.approvals.question.typed_value`); an empty field is left
    out. Whether it fits the question's schema is ``decide``'s to say."""
    if action != "accept":
        return {"action": action}
    content: dict = {}
    for key, values in posted.items():
        parts = key.split(".", 2)
        if len(parts) != 3 or parts[0] != "field" or not values:
            continue
        kind, name = parts[1], parts[2]
        if kind == "choices":
            value = [typed_value("choice", v) for v in values if v != ""]
        elif kind == "boolean":
            value = any(typed_value("boolean", v) for v in values)
        else:
            value = typed_value(kind, values[-1])
        if value is not None:
            content[name] = value
    return {"action": "accept", "content": content}


def question_form(pending: dict) -> str:
    """The form fields of the question ``pending`` asks (empty for another request): one
    input per field of its schema, named ``field.KIND.NAME``, labelled with its title,
    description and what it takes, its default filled in."""
    question = question_of(pending)
    if question is None:
        return ""
    return "".join(_field_html(field) for field in question.fields)


_INPUT_TYPES = {"email": "email", "uri": "url", "date": "date"}


def _field_html(field: QuestionField) -> str:
    e = html.escape
    key = f"field.{field.kind}.{field.name}"
    label = (f'<label for="{e(key)}">{e(field.title)}'
             f'<span class="fine"> ({e(field.hint())})</span></label>'
             + (f'<div class="fine">{e(field.description)}</div>' if field.description else ""))
    schema, default = field.schema, field.default
    required = " required" if field.required else ""
    if field.kind == "boolean":
        checked = " checked" if default is True else ""
        return (f'{label}<input type="hidden" name="{e(key)}" value="false">'
                f'<input type="checkbox" id="{e(key)}" name="{e(key)}" value="on"{checked}>')
    if field.kind in ("choice", "choices"):
        chosen = default if isinstance(default, list) else [default]
        if field.kind == "choices":
            boxes = "".join(
                f'<label class="option"><input type="checkbox" name="{e(key)}" '
                f'value="{e(json.dumps(v))}"{" checked" if v in chosen else ""}> '
                f'{e(text)}</label>' for v, text in field.choices)
            return f'{label}<div id="{e(key)}">{boxes}</div>'
        options = ("" if field.required else '<option value=""></option>') + "".join(
            f'<option value="{e(json.dumps(v))}"{" selected" if v in chosen else ""}>'
            f'{e(text)}</option>' for v, text in field.choices)
        return f'{label}<select id="{e(key)}" name="{e(key)}"{required}>{options}</select>'
    attributes = required
    if field.kind in ("integer", "number"):
        kind = "number"
        attributes += ' step="1"' if field.kind == "integer" else ' step="any"'
        for bound, attribute in (("minimum", "min"), ("maximum", "max")):
            if isinstance(schema.get(bound), (int, float)):
                attributes += f' {attribute}="{schema[bound]}"'
    else:
        kind = _INPUT_TYPES.get(str(schema.get("format")), "text")
        for bound, attribute in (("minLength", "minlength"), ("maxLength", "maxlength")):
            if isinstance(schema.get(bound), int):
                attributes += f' {attribute}="{schema[bound]}"'
        if isinstance(schema.get("pattern"), str):
            attributes += f' pattern="{e(schema["pattern"])}"'
    value = "" if default is None else f' value="{e(str(default))}"'
    return f'{label}<input type="{kind}" id="{e(key)}" name="{e(key)}"{value}{attributes}>'


#: The page a link opens: it posts the fragment's token (never sent by a browser in a URL)
#: and takes it out of the address bar, so that it is neither logged nor bookmarked.
_LOADER = """<!DOCTYPE html><html><head><meta charset="utf-8">
<meta name="robots" content="noindex"><meta name="referrer" content="no-referrer">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>Decision link</title><style>{style}</style></head><body><main>
<h1>Decision link</h1><form id="view" method="post">{xsrf}
<input type="hidden" name="action" value="view"><input type="hidden" name="token" value="">
<input type="hidden" name="choice" value="">
<p class="message open" id="status">Opening the request&hellip;</p>
<noscript><p class="message unknown">This page needs JavaScript to read its link.</p></noscript>
</form><script>
(function () {{
  // "#TOKEN", and the button's choice from "?choice=reject" before or after it.
  var fragment = window.location.hash.slice(1).split("?");
  // (or, on a JupyterHub service, kept in this tab while its login dropped the fragment)
  var token = fragment[0] || window.sessionStorage.getItem("durable-nb-link") || "";
  window.sessionStorage.removeItem("durable-nb-link");
  var query = new URLSearchParams(fragment[1] || window.location.search);
  var form = document.getElementById("view");
  if (!token) {{
    document.getElementById("status").textContent =
      "This link has no token: open the whole link from the message. Nothing was decided.";
    return;
  }}
  window.history.replaceState(null, "", window.location.pathname);
  form.elements.token.value = token;
  form.elements.choice.value = query.get("choice") || "";
  form.submit();
}})();
</script></main></body></html>"""


def loader_page(xsrf: str) -> str:
    """The page a link's GET answers (``xsrf``: the form's XSRF field): its script posts the
    fragment's token in the body of ``action=view`` to the same path."""
    return _LOADER.format(xsrf=xsrf, style=_STYLE)


def render(outcome: LinkOutcome, run_id: str, *, form: str = "", taken: bool = False,
           choice: str = "") -> str:
    """The page's HTML for ``outcome`` (``form``: the XSRF field, when it may decide)."""
    e = html.escape
    link, run, pending = outcome.link or {}, outcome.run or {}, outcome.pending or {}
    rows = [("Run", run_id), ("Title", run.get("title")), ("Notebook", run.get("notebook")),
            ("Tool / action", link.get("name")),
            ("Details digest", str(link.get("digest", ""))[:12]),
            ("Requested", pending.get("requested_at")
             and format_time(pending["requested_at"], "?")),
            ("Sent to", link.get("to") and sent_to(link)),
            ("Valid until", link.get("expires_at") and format_time(link["expires_at"], "?"))]
    if outcome.decision:
        decision = outcome.decision
        rows.append(("Decision", decision_words(decision, timed=True)))
        if decision.get("answer"):
            rows.append(("Answer", answer_words(decision["answer"])))
        if decision.get("note"):
            rows.append(("Note", decision["note"]))
    table = "".join(f"<tr><th>{e(label)}</th><td>{e(str(value))}</td></tr>"
                    for label, value in rows if value)
    details = ""
    question = question_of(pending)
    if question is not None:
        details = (f"<h2>Question from {e(question.server or 'an MCP server')}</h2>"
                   f'<p class="question" id="question">{e(question.message)}</p>')
    elif "details" in pending:
        text = pending["details"] if isinstance(pending["details"], str) else json.dumps(
            pending["details"], indent=2, sort_keys=True, ensure_ascii=False, default=repr)
        details = f"<h2>Details</h2><pre>{e(text)}</pre>"
    message = outcome.message
    if outcome.kind == "decided":
        message += (" The run resumes in its kernel." if taken else
                    " The run goes on when its cell is run again.")
    body = (f'<p class="message {e(outcome.kind)}" id="outcome">{e(message)}</p>'
            f"<table>{table}</table>{details}")
    if outcome.kind == "open" and question is not None:
        body += (f'<form method="post">{form}{question_form(pending)}'
                 f'<label for="note">Note (optional)</label>'
                 f'<textarea id="note" name="note" rows="2" maxlength="{_NOTE_CHARS}">'
                 f'</textarea><div class="buttons">'
                 f'<button type="submit" name="action" value="accept" class="approve">Accept'
                 f'</button><button type="submit" name="action" value="decline" '
                 f'class="reject" formnovalidate>Decline</button>'
                 f'<button type="submit" name="action" value="cancel" class="neutral" '
                 f'formnovalidate>Cancel</button></div>'
                 f"<p class=\"fine\">Answering uses this link: it works once, as "
                 f"{e(str(link.get('to')))}. Decline says no; Cancel dismisses the question."
                 f"</p></form>")
    elif outcome.kind == "open":
        answers = ""
        if editable(pending):
            shown = json.dumps(pending["details"]["arguments"], indent=2, ensure_ascii=False)
            answers = (f'<label for="args">Arguments (JSON: edit them, then Approve runs the '
                       f'tool with them)</label><textarea id="args" name="args" rows="6" '
                       f'class="code">{e(shown)}</textarea>'
                       f'<input type="hidden" name="args_shown" value="{e(shown)}">'
                       f'<label for="message">Message for the model (sent on Reject)</label>'
                       f'<textarea id="message" name="message" rows="2" '
                       f'maxlength="{_NOTE_CHARS}"></textarea>')
        body += (f'<form method="post">{form}{answers}'
                 f'<label for="note">Note (optional)</label>'
                 f'<textarea id="note" name="note" rows="3" maxlength="{_NOTE_CHARS}">'
                 f'</textarea><div class="buttons">'
                 f'<button type="submit" name="action" value="approve" class="approve"'
                 f'{"" if choice == "reject" else " autofocus"}>Approve</button>'
                 f'<button type="submit" name="action" value="reject" class="reject"'
                 f'{" autofocus" if choice == "reject" else ""}>Reject</button></div>'
                 f"<p class=\"fine\">Deciding uses this link: it works once, as "
                 f"{e(str(link.get('to')))}.</p></form>")
    title = f"{'Question' if question else 'Approval'}: {link.get('name')}" \
        if link.get("name") else "Decision link"
    return (f"<!DOCTYPE html><html><head><meta charset=\"utf-8\">"
            f"<meta name=\"robots\" content=\"noindex\">"
            f"<meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">"
            f"<title>{e(title)}</title><style>{_STYLE}</style></head><body><main>"
            f"<h1>{e(title)}</h1>{body}</main></body></html>")


_STYLE = """
body { font-family: system-ui, sans-serif; background: #f5f5f5; color: #222; margin: 0; }
main { max-width: 46rem; margin: 2rem auto; background: #fff; padding: 1.5rem 2rem;
       border-radius: 8px; box-shadow: 0 1px 4px rgba(0,0,0,.15); }
h1 { font-size: 1.4rem; margin-top: 0; } h2 { font-size: 1.1rem; }
table { border-collapse: collapse; margin: 1rem 0; }
th { text-align: left; padding: .2rem 1rem .2rem 0; color: #555; font-weight: 600; }
td { padding: .2rem 0; }
pre { background: #f0f0f0; padding: .8rem; border-radius: 4px; overflow-x: auto; }
.message { padding: .7rem 1rem; border-radius: 4px; background: #eef3fb; }
.message.decided { background: #e7f6e9; } .message.open { background: #fff8e1; }
.message.used, .message.expired, .message.changed, .message.decided_already,
.message.refused, .message.unknown, .message.failed { background: #fdecea; }
label { display: block; margin: 1rem 0 .3rem; font-weight: 600; }
textarea { width: 100%; box-sizing: border-box; font: inherit; }
textarea.code { font-family: ui-monospace, monospace; }
.buttons { margin-top: .8rem; display: flex; gap: .8rem; }
button { font-size: 1rem; padding: .5rem 1.4rem; border: 0; border-radius: 4px; color: #fff;
         cursor: pointer; }
button.approve { background: #2e7d32; } button.reject { background: #c62828; }
button.neutral { background: #616161; }
input, select { font: inherit; padding: .3rem; box-sizing: border-box; }
input[type=text], input[type=email], input[type=url], input[type=number], select {
  width: 100%; }
label.option { display: inline; font-weight: normal; margin-right: 1rem; }
.question { font-size: 1.1rem; white-space: pre-wrap; }
.fine { color: #666; font-size: .85rem; }
"""


def decide_handlers(base_url: str) -> list[tuple[str, type]]:
    """The page's route, under the server's ``base_url``."""
    return [(url_path_join(base_url, LINK_PATH), DecideHandler)]
