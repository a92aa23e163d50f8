"""A panel as static HTML, for a saved notebook: the display right after a live panel (a
run's, :mod:`~durable_nb.notebook.panel`, or a batch's), shown where the live one cannot be.
"""

from __future__ import annotations

import html
import time

from ..timestamps import format_time

__all__ = ["LOG_KEPT", "saved_view"]

#: Characters of a panel's log that its saved view keeps (the last ones).
LOG_KEPT = 20_000


# The saved view is a display of its own right after the live panel's. Where the panel is live
# (class dnb-live), the saved view is hidden; where the panel's widget model is gone (a notebook
# reopened: JupyterLab and Notebook 7 then show "Error displaying widget: model not found",
# whatever else the output's bundle holds), that output is hidden and the saved view shown.
# Front ends without these classes (nbviewer, GitHub) show the saved view and the panel's text.
# Rendered HTML gets the front end's table styles (right-aligned cells): the saved view resets them.
_SAVED_CSS = """<style>
.jp-OutputArea-child:has(.dnb-live) + .jp-OutputArea-child:has(.dnb-saved) {display: none}
.jp-OutputArea-child:not(:has(.dnb-live)):has(+ .jp-OutputArea-child .dnb-saved) {
  display: none}
.dnb-saved .dnb-saved-note {color: #6e7781; font-size: 0.85em; margin: 0 0 4px 0}
.dnb-saved pre.dnb-log {max-height: 240px; overflow: auto; font-size: 0.85em; margin: 4px 0}
.dnb-panel.dnb-saved table th, .dnb-panel.dnb-saved table td {text-align: left;
  padding: 2px 6px}
.dnb-panel.dnb-saved table td.dnb-num {text-align: right}
</style>"""


def saved_view(body: str, what: str, log: str = "") -> str:
    """A panel as static HTML for a saved notebook (see _SAVED_CSS): ``body`` (the panel's
    HTML, with its own CSS), a note saying it is a saved view of ``what`` and when, and the
    log's text."""
    note = (f"<div class='dnb-saved-note'>Saved view of {html.escape(what)} as of "
            f"{format_time(time.time())}: the live panel needs the kernel that drew it; re-run the "
            f"cell for it.</div>")
    shown = f"<pre class='dnb-log'>{html.escape(log)}</pre>" if log else ""
    return (f"{_SAVED_CSS}<div class='dnb-panel dnb-saved'>{note}{body}{shown}</div>")
