"""What a run's panel says in words: pure functions of the run's record (how long it ran or
waits, why an execution stopped, its attempts, a degraded journal) and the panel's CSS. The
live widget (:mod:`~durable_nb.notebook.panel`) draws them; its saved view keeps them.
"""

from __future__ import annotations

import html
import time

from ..errors import InputChanged, JournalMismatch, RunLeased
from ..execution import attempts
from ..journal import RunRecord, Status
from ..summary import elapsed, format_duration
from ..timestamps import format_time

__all__ = ["PANEL_CSS", "attempt_number", "attempts_html", "attempts_live_html",
           "degraded_text", "stopped_badge", "timing_words"]

# Scoped to the panel (class dnb-panel on its outer box). ipywidgets adds the class
# jupyter-widgets-disconnected to every view of a model whose kernel connection is gone.
PANEL_CSS = """<style>
.dnb-panel .dnb-dead {display: none}
.dnb-panel.jupyter-widgets-disconnected .dnb-dead {display: block; background: #fff8c5;
  border: 1px solid #d4a72c; color: #4d2d00; padding: 4px 8px; margin: 2px 0 6px 0;
  border-radius: 4px}
.dnb-panel.jupyter-widgets-disconnected::before,
.dnb-panel .jupyter-widgets-disconnected::before {display: none !important}
.dnb-panel.jupyter-widgets-disconnected .dnb-button {opacity: 0.5; cursor: not-allowed;
  width: auto; max-width: none}
.dnb-panel.jupyter-widgets-disconnected .dnb-button::after {content: " (kernel stopped)";
  margin-left: 2px}
.dnb-panel .dnb-button i.fa {margin-right: 4px; vertical-align: baseline}
.dnb-panel .dnb-text {white-space: pre-wrap; word-break: normal; overflow-wrap: break-word;
  line-height: 1.4;
  margin: 2px 0}
.dnb-steps {font-size: 0.85em}
.dnb-steps > details > summary, .dnb-steps > .dnb-head {display: grid;
  grid-template-columns: 3em 6em minmax(8em, 16em) 7em 13em auto; gap: 0 8px;
  line-height: 1.5}
.dnb-steps > details > summary {cursor: pointer; list-style: none}
.dnb-steps > details > summary::-webkit-details-marker {display: none}
.dnb-steps > details > summary:hover, .dnb-steps > details[open] > summary {
  background: rgba(127, 127, 127, 0.12)}
.dnb-steps > .dnb-head {font-weight: bold}
.dnb-steps summary > span {white-space: nowrap; overflow: hidden; text-overflow: ellipsis}
.dnb-steps details details > summary {cursor: pointer; color: #57606a}
.dnb-step-body {margin: 2px 0 8px 3em; padding: 4px 8px; border-left: 3px solid #d0d7de}
.dnb-step-body pre {white-space: pre-wrap; word-break: normal; overflow-wrap: break-word;
  margin: 2px 0 6px 0; max-height: 20em; overflow: auto}
.dnb-step-body .dnb-role {font-weight: bold}
.dnb-panel .dnb-history-head {color: #57606a; cursor: pointer}
.dnb-panel .dnb-history-head::before {content: "\\25b8  "}
.dnb-panel .dnb-history-list {color: #57606a; font-size: 0.85em; margin-left: 1em;
  display: none}
</style>"""


def stopped_badge(error: BaseException) -> str:
    """The badge of an execution that stopped while the journal keeps the run's status."""
    if isinstance(error, InputChanged):
        return "stopped: input changed"
    if isinstance(error, JournalMismatch):
        return "stopped: mismatch"
    if isinstance(error, RunLeased):
        return "stopped: run busy elsewhere"
    if isinstance(error, KeyboardInterrupt):
        return "stopped: interrupted"
    return "stopped: error"


def timing_words(record: RunRecord) -> str:
    """How long the run took (DONE), ran (FAILED, CANCELLED), has run (RUNNING, redrawn every
    second while it runs; with the time of this attempt when it is not the first), or since
    when it waits (a parked run's panel is not redrawn)."""
    if record.status is Status.DONE:
        return f"took {format_duration(elapsed(record))}"
    if record.status is Status.RUNNING:
        attempt = attempts.current(record)
        this = ""
        if attempt is not None and attempt.get("end") is None and attempt["n"] > 1:
            this = (f" (attempt {attempt['n']}: "
                    f"{format_duration(max(0.0, time.time() - attempt['started_at']))})")
        return f"elapsed {format_duration(elapsed(record))}{this}"
    if record.status is Status.WAITING_APPROVAL:
        asked = format_time((record.pending_approval or {}).get("requested_at"), "")
        return f"waiting since {asked}" if asked else "waiting"
    return f"ran {format_duration(elapsed(record))}"


def degraded_text(record: RunRecord) -> str:
    if record.status is Status.DONE:
        return ("the run finished, but the journal does not hold it all and it is not "
                "recorded DONE; executing it again executes those steps again.")
    return "writes are failing and being retried; these steps may run again after a crash."


def attempt_number(record: RunRecord) -> int:
    attempt = attempts.current(record)
    return attempt["n"] if attempt is not None else 0


def attempts_html(record: RunRecord) -> str:
    """``attempt 3: resumed after a kernel restart at step 3``, opening (a click, no kernel
    round trip) to the run's attempts; nothing for a run executed once from its start."""
    words = attempts.resumed_words(record)
    if words is None:
        return ""
    lines = "".join(f"<div>{html.escape(line)}</div>" for line in attempts.history_lines(record))
    return (f"<details class='dnb-attempts' style='color:#57606a'><summary>"
            f"{html.escape(words)}</summary><div style='font-size:0.85em;margin-left:1em'>"
            f"{lines}</div></details>")


def attempts_live_html(record: RunRecord, token: str) -> str:
    """The live panel's attempts (see :func:`attempts_html`): a line that a click opens to
    the list, in the page (no kernel round trip). A redraw replaces a widget's content, and
    the panel's display, sent again when the run ends, replaces its views: the click marks
    the page's body with a class named by the panel's ``token``, which both leave alone."""
    words = attempts.resumed_words(record)
    if words is None:
        return ""
    lines = "".join(f"<div>{html.escape(line)}</div>" for line in attempts.history_lines(record))
    opened = f"body.dnb-open-{token} .dnb-history-{token}"
    toggle = f"document.body.classList.toggle('dnb-open-{token}')"
    return (f"<style>{opened} .dnb-history-list {{display: block}} {opened} "
            f".dnb-history-head::before {{content: '\\25be  '}}</style>"
            f"<div class='dnb-history-{token}'><div class='dnb-history-head' "
            f"onclick=\"{toggle}\">{html.escape(words)}</div>"
            f"<div class='dnb-history-list'>{lines}</div></div>")
