"""A question asked as a request (an MCP server's elicitation), and its answer as a decision.

An MCP server may ask the user mid-call: a message and the JSON schema of the answer it
wants, a flat object of string, number, integer, boolean and enum fields. The run asks it as
an approval request whose details say ``"kind": "elicitation"`` (with ``message``,
``schema``, ``server`` and ``tool``). Its answer is the decision's ``answer``,
``{"action": "accept" | "decline" | "cancel", "content": {...}}`` (content with accept
only), checked by :func:`~durable_nb.approvals.decide.decide` with :func:`checked_answer`
and journaled with the decision, so that a replay gives the server the same answer.

A plain decision on a question (an Approve button with no form) is written with the answer
it amounts to (:func:`plain_answer`): Approve is accept with no content when the schema
requires none, else cancel; Reject is decline. Decisions written before answers were
decision content (durable_nb 29bcdb7) carry the answer as JSON in their note:
:func:`answer_of` still reads them.

Every form that shows a question (the panel, ``%durable inbox``, the decision page, the
command line, a notification) reads it with :func:`question_of` and its fields with
:attr:`Question.fields`, and turns typed text into values with :func:`form_value`.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from ..errors import InvalidAnswer
from ..schema_check import json_type, schema_defect, schema_problems, shown_json

__all__ = ["ACTIONS", "QUESTION_KIND", "Question", "QuestionField", "answer_of",
           "answer_words", "checked_answer", "form_value", "is_question", "plain_answer",
           "question_of", "typed_value"]

#: The ``kind`` in the details of an approval request that is a server's question.
QUESTION_KIND = "elicitation"
#: The answers MCP knows: accept (with content), decline, cancel.
ACTIONS = ("accept", "decline", "cancel")


@dataclass(frozen=True)
class QuestionField:
    """One field of a question's form, read from its schema's property ``name``."""
    name: str
    schema: Mapping[str, Any]
    required: bool

    @property
    def title(self) -> str:
        """The label a form shows (the schema's ``title``, else the name)."""
        return str(self.schema.get("title") or self.name)

    @property
    def description(self) -> str:
        return str(self.schema.get("description") or "")

    @property
    def kind(self) -> str:
        """``string``, ``number``, ``integer``, ``boolean``, ``choice`` (an enum, or a titled
        one: ``oneOf`` of ``const``) or ``choices`` (an array of them)."""
        if self.choices and self.schema.get("type") == "array":
            return "choices"
        if self.choices:
            return "choice"
        kind = self.schema.get("type")
        return kind if kind in ("string", "number", "integer", "boolean") else "string"

    @property
    def choices(self) -> list[tuple[Any, str]]:
        """``(value, label)`` of an enum field (with ``enumNames`` or ``oneOf`` titles)."""
        schema = self.schema
        if schema.get("type") == "array" and isinstance(schema.get("items"), Mapping):
            schema = schema["items"]
        if isinstance(schema.get("enum"), list):
            names = schema.get("enumNames")
            labels = names if isinstance(names, list) and len(names) == len(schema["enum"]) \
                else [str(v) for v in schema["enum"]]
            return [(v, str(label)) for v, label in zip(schema["enum"], labels)]
        branches = schema.get("oneOf") or schema.get("anyOf")
        if isinstance(branches, list) and branches and all(
                isinstance(b, Mapping) and "const" in b for b in branches):
            return [(b["const"], str(b.get("title") or b["const"])) for b in branches]
        return []

    @property
    def default(self) -> Any:
        return self.schema.get("default")

    def hint(self) -> str:
        """What the field takes, in words: ``integer, 1 to 30``, ``e-mail address``."""
        schema = self.schema
        parts = [{"choice": "one of " + ", ".join(label for _, label in self.choices),
                  "choices": "any of " + ", ".join(label for _, label in self.choices)}.get(
                      self.kind, {"date-time": "date and time", "email": "e-mail address"}
                      .get(str(schema.get("format")), str(schema.get("format") or self.kind)))]
        low, high = schema.get("minimum"), schema.get("maximum")
        if low is not None and high is not None:
            parts.append(f"{low} to {high}")
        elif low is not None:
            parts.append(f"at least {low}")
        elif high is not None:
            parts.append(f"at most {high}")
        if schema.get("minLength") is not None or schema.get("maxLength") is not None:
            parts.append(f"{schema.get('minLength', 0)} to {schema.get('maxLength', '...')} "
                         f"characters")
        if schema.get("pattern"):
            parts.append(f"matching {schema['pattern']}")
        parts.append("required" if self.required else "optional")
        return ", ".join(parts)


@dataclass(frozen=True)
class Question:
    """A question a request asks: the server's ``message``, the ``schema`` of the answer,
    which ``server`` asked during which ``tool``'s call."""
    message: str
    schema: Mapping[str, Any]
    server: str
    tool: str

    @property
    def fields(self) -> list[QuestionField]:
        """The form's fields, in the schema's order."""
        properties = self.schema.get("properties")
        if not isinstance(properties, Mapping):
            return []
        required = self.schema.get("required") or ()
        return [QuestionField(str(name), sub if isinstance(sub, Mapping) else {},
                              name in required)
                for name, sub in properties.items()]


def is_question(pending: Mapping[str, Any] | None) -> bool:
    """Whether a pending request is a server's question (answered, not approved)."""
    details = (pending or {}).get("details")
    return isinstance(details, Mapping) and details.get("kind") == QUESTION_KIND


def question_of(pending: Mapping[str, Any] | None) -> Question | None:
    """The question ``pending`` asks, or None for a request that is not a question."""
    if not is_question(pending):
        return None
    assert pending is not None
    details = pending["details"]
    schema = details.get("schema")
    return Question(message=str(details.get("message") or ""),
                    schema=schema if isinstance(schema, Mapping) else {},
                    server=str(details.get("server") or ""), tool=str(details.get("tool") or ""))


def plain_answer(approved: bool, schema: Mapping[str, Any]) -> dict:
    """The answer a plain decision gives (see the module docstring)."""
    if not approved:
        return {"action": "decline"}
    return {"action": "accept", "content": {}} if not schema.get("required") \
        else {"action": "cancel"}


def checked_answer(run_id: str, pending: Mapping[str, Any], answer: Any,
                   approved: bool) -> dict:
    """``answer`` for the question ``pending`` asks, as the decision keeps it (``{"action",
    "content"}``, content with accept only); :class:`~durable_nb.errors.InvalidAnswer`, one
    line naming what is wrong, when it is not an answer to it: not a question, an unknown
    action, content with decline or cancel, content the schema refuses, a schema that cannot
    check anything, or ``approved`` saying otherwise than the action (accept approves)."""
    name = pending.get("name")
    question = question_of(pending)
    nothing = "Nothing was decided."
    if question is None:
        raise InvalidAnswer(f"run {run_id!r}: {name!r} is not a question from an MCP server, "
                            f"so it takes no answer: approve or reject it. {nothing}")
    if not isinstance(answer, Mapping) or set(answer) - {"action", "content"}:
        raise InvalidAnswer(f"run {run_id!r}: an answer is {{\"action\": ..., \"content\": "
                            f"...}}, not {shown_json(answer)}. {nothing}")
    action, content = answer.get("action"), answer.get("content")
    if action not in ACTIONS:
        raise InvalidAnswer(f"run {run_id!r}: the answer's action must be one of "
                            f"{', '.join(ACTIONS)}, not {action!r}. {nothing}")
    if approved != (action == "accept"):
        raise InvalidAnswer(f"run {run_id!r}: {action} goes with "
                            f"{'an approval' if action == 'accept' else 'a rejection'}. "
                            f"{nothing}")
    if action != "accept":
        if content not in (None, {}):
            raise InvalidAnswer(f"run {run_id!r}: only accept carries content; {action} "
                                f"takes none. {nothing}")
        return {"action": action}
    content = {} if content is None else content
    if not isinstance(content, dict):
        raise InvalidAnswer(f"run {run_id!r}: the answer to {name!r} must be a JSON object, "
                            f"got {json_type(content)}. {nothing}")
    defect = schema_defect(question.schema)
    if defect:
        raise InvalidAnswer(f"run {run_id!r}: the question's schema cannot check an answer: "
                            f"{defect}. Decline or cancel it (the server "
                            f"{question.server!r} sent that schema). {nothing}")
    problems = schema_problems(content, question.schema, noun="field")
    if problems:
        raise InvalidAnswer(f"run {run_id!r}: the answer to {name!r} does not fit its schema: "
                            f"{'; '.join(problems)}. {nothing}")
    return {"action": "accept", "content": content}


def answer_of(decision: Mapping[str, Any], schema: Mapping[str, Any]
              ) -> tuple[str, dict | None]:
    """``(action, content)`` of a decision on a question: its ``answer``; in a decision
    written before answers were decision content, the answer its note holds as JSON; else
    what a plain decision amounts to (:func:`plain_answer`)."""
    given = decision.get("answer")
    if not (isinstance(given, Mapping) and given.get("action") in ACTIONS):
        given = _note_answer(decision.get("note"))
    if given is None:
        given = plain_answer(bool(decision.get("approved")), schema)
    action = str(given["action"])
    return action, (dict(given.get("content") or {}) if action == "accept" else None)


def _note_answer(note: Any) -> dict | None:
    """The answer a note of durable_nb 29bcdb7 held (``{"action": ..., "content": ...}``)."""
    if not isinstance(note, str) or not note.startswith("{"):
        return None
    try:
        value = json.loads(note)
    except ValueError:
        return None
    return value if isinstance(value, dict) and value.get("action") in ACTIONS else None


def answer_words(answer: Mapping[str, Any] | None) -> str:
    """``accept {"nights": 3}``, ``decline``: an answer on one line."""
    if not isinstance(answer, Mapping):
        return ""
    content = answer.get("content")
    return str(answer.get("action")) + (
        f" {json.dumps(content, ensure_ascii=False, sort_keys=True)}" if content else "")


def form_value(field: QuestionField, text: Any) -> Any:
    """What a form's ``text`` for ``field`` means (see :func:`typed_value`)."""
    return typed_value(field.kind, text)


def typed_value(kind: str, text: Any) -> Any:
    """What a form's ``text`` means for a field of ``kind`` (:attr:`QuestionField.kind`): a
    number for a number field, a boolean for a checkbox (``on``, ``true``, ``yes``), the
    value a choice's JSON names; the text as it is when it does not read as the kind (the
    schema check then names it). ``None`` for an empty field (left out of the answer)."""
    if isinstance(text, (bool, list)):
        return text
    text = "" if text is None else str(text)
    if kind == "boolean":
        return text.strip().lower() in ("on", "true", "yes", "1")
    if text.strip() == "":
        return None
    if kind in ("integer", "number"):
        try:
            number = float(text.strip())
        except ValueError:
            return text
        return int(number) if number.is_integer() and "." not in text else number
    if kind in ("choice", "choices"):
        try:
            return json.loads(text)
        except ValueError:
            return text
    return text
