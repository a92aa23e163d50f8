"""The part of an approval card that answers beyond yes or no: a tool call's arguments as
JSON, editable in place (Approve sends them when they were changed), and a message for the
model (Reject sends it as the tool's answer). Shared by the run panel and ``%durable inbox``.

The form parses what was typed; whether the arguments fit the tool's schema is
:func:`~durable_nb.approvals.decide.decide`'s to say (one line, nothing written), as for
every other path.
"""

from __future__ import annotations

import json
from typing import Any

import ipywidgets as widgets

from ..approvals.request import editable
from ..errors import InvalidAnswer

__all__ = ["AnswerForm"]


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
