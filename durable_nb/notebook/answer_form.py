"""The part of an approval card that answers beyond yes or no, shared by the run panel and
``%durable inbox``: a tool call's arguments as JSON, editable in place (Approve sends them
when they were changed), and a message for the model (Reject sends it as the tool's answer)
(:class:`AnswerForm`); an MCP server's question as a form of its fields with Accept /
Decline / Cancel (:class:`QuestionForm`).

The form parses what was typed; whether the arguments fit the tool's schema is
:func:`~durable_nb.approvals.decide.decide`'s to say (one line, nothing written), as for
every other path.
"""

from __future__ import annotations

import html
import json
from collections.abc import Callable
from typing import Any

import ipywidgets as widgets

from ..approvals.question import QuestionField, form_value, question_of
from ..approvals.request import editable, pending_digest
from ..errors import InvalidAnswer

__all__ = ["AnswerForm", "QuestionForm"]


class AnswerForm:
    """Arguments (a Textarea with their JSON) and a message for the model."""

    def __init__(self) -> None:
        self.arguments = widgets.Textarea(rows=4, layout=widgets.Layout(width="auto"))
        self.message = widgets.Text(placeholder="message for the model, sent on Reject",
                                    layout=widgets.Layout(width="auto"))
        label = widgets.HTML("<b>Arguments</b> (JSON: edit them, then Approve runs the tool "
                             "with them)")
        self.box = widgets.VBox([label, self.arguments, self.message],
                                layout=widgets.Layout(display="none"))
        self._shown: Any = None

    def show(self, pending: dict | None) -> None:
        """Show the form for ``pending`` (hidden for a request without editable arguments);
        the arguments are set anew only when the request changes, so typing is kept."""
        if not editable(pending):
            self._shown = None
            self.box.layout.display = "none"
            return
        assert pending is not None
        arguments = pending["details"]["arguments"]
        if self._shown != (pending.get("id"), arguments):
            self._shown = (pending.get("id"), arguments)
            self.arguments.value = json.dumps(arguments, indent=2, ensure_ascii=False)
            self.message.value = ""
        self.box.layout.display = "flex"

    def content(self, approved: bool) -> dict:
        """What a click sends beyond yes or no: ``{"args": ...}`` on Approve when the
        arguments were changed, ``{"message": ...}`` on Reject when one was typed, else {}.
        Text that is not JSON: :class:`~durable_nb.errors.InvalidAnswer`, in one line."""
        if self._shown is None:
            return {}
        if not approved:
            text = self.message.value.strip()
            return {"message": text} if text else {}
        try:
            edited = json.loads(self.arguments.value)
        except ValueError as exc:
            raise InvalidAnswer(f"the arguments are not JSON ({exc}): nothing was "
                                f"decided") from None
        return {} if edited == self._shown[1] else {"args": edited}


class QuestionForm:
    """A server's question: its message, one widget per field of its schema (a text box, a
    checkbox for a boolean, a dropdown for a choice, a multiple selection for choices), and
    Accept / Decline / Cancel, which call ``on_answer(action)``. Whether the answer fits the
    schema is :func:`~durable_nb.approvals.decide.decide`'s to say."""

    def __init__(self, on_answer: Callable[[str], None]) -> None:
        self.message = widgets.HTML()
        self.fields = widgets.VBox()
        #: The field widgets by name (what a test fills in, as a person does).
        self.inputs: dict[str, tuple[QuestionField, widgets.Widget]] = {}
        self.accept = widgets.Button(description="Accept", button_style="success",
                                     icon="check")
        self.decline = widgets.Button(description="Decline", button_style="danger",
                                      icon="times")
        self.cancel = widgets.Button(description="Cancel", icon="ban")
        for button, action in ((self.accept, "accept"), (self.decline, "decline"),
                               (self.cancel, "cancel")):
            button.add_class("dnb-button")
            button.on_click(lambda _b, chosen=action: on_answer(chosen))
        self.buttons = widgets.HBox([self.accept, self.decline, self.cancel])
        #: Why the last answer was refused (it does not fit the schema ...), in red.
        self.problem = widgets.HTML()
        self.box = widgets.VBox([self.message, self.fields, self.problem, self.buttons],
                                layout=widgets.Layout(display="none"))
        self._shown: Any = None

    def show(self, pending: dict | None, live: bool = True) -> bool:
        """Show the form of the question ``pending`` asks (hidden for another request, and
        its buttons hidden unless ``live``); whether it shows one. The fields are built anew
        only when the request changes, so what was typed is kept across redraws."""
        question = question_of(pending)
        if question is None:
            self._shown = None
            self.box.layout.display = "none"
            return False
        assert pending is not None
        seen = (pending.get("id"), pending_digest(pending))
        if self._shown != seen:
            self._shown = seen
            self.problem.value = ""
            self.message.value = (
                f"<b>Question from {html.escape(question.server or 'an MCP server')}</b> "
                f"(during {html.escape(question.tool or 'a call')}):"
                f"<div class='dnb-text dnb-question'>{html.escape(question.message)}</div>")
            self.inputs = {field.name: (field, _field_widget(field))
                           for field in question.fields}
            for _, widget in self.inputs.values():
                widget.add_class("dnb-question-field")
            self.fields.children = [widgets.VBox([_field_label(field), widget])
                                    for field, widget in self.inputs.values()]
        self.buttons.layout.display = "flex" if live else "none"
        for button in (self.accept, self.decline, self.cancel):
            button.disabled = not live
        self.box.layout.display = "flex"
        return True

    def say(self, text: str) -> None:
        """Show ``text`` (why an answer was refused) under the fields."""
        self.problem.value = (f"<div class='dnb-text' style='color:#cf222e'>"
                              f"{html.escape(text)}</div>")

    def answer(self, action: str) -> dict:
        """The answer a click gives: ``{"action", "content"}``, the content (with accept)
        read from the fields, an empty one left out."""
        if action != "accept":
            return {"action": action}
        content = {}
        for name, (field, widget) in self.inputs.items():
            value = form_value(field, list(widget.value) if isinstance(widget.value, tuple)
                               else widget.value)
            if value is not None:
                content[name] = value
        return {"action": "accept", "content": content}


def _field_label(field: QuestionField) -> widgets.HTML:
    about = f" &middot; {html.escape(field.description)}" if field.description else ""
    return widgets.HTML(f"<b>{html.escape(field.title)}</b> "
                        f"<span style='color:#6e7781'>({html.escape(field.hint())}){about}"
                        f"</span>")


def _field_widget(field: QuestionField) -> widgets.Widget:
    """The input for ``field``, its default filled in."""
    layout = widgets.Layout(width="auto")
    default = field.default
    if field.kind == "boolean":
        return widgets.Checkbox(value=default is True, indent=False)
    if field.kind == "choice":
        options = ([] if field.required else [("", None)]) + [
            (label, value) for value, label in field.choices]
        chosen = default if any(v == default for _, v in options) else options[0][1]
        return widgets.Dropdown(options=options, value=chosen, layout=layout)
    if field.kind == "choices":
        options = [(label, value) for value, label in field.choices]
        picked = tuple(v for _, v in options if isinstance(default, list) and v in default)
        return widgets.SelectMultiple(options=options, value=picked, layout=layout)
    return widgets.Text(value="" if default is None else str(default),
                        placeholder=field.hint(), layout=layout)
