"""How errors look in a notebook: durable_nb's own errors as their message alone (they say
what happened and what to do); an exception from the user's code with the user's frames
only, from below the magic that ran the cell, never durable_nb's internals; a syntax error
in a ``%%durable_agent`` cell numbered as in the cell. Through IPython's
``_render_traceback_`` protocol.
"""

from __future__ import annotations

import sys
import sysconfig
import textwrap
import types
from pathlib import Path
from typing import Any

from IPython.core.error import UsageError

from ..errors import (
    CellSyntaxError,
    ContextNotActive,
    DurableError,
    SerializationError,
    TerminalError,
)

__all__ = ["cell_syntax_error", "shorten"]

_PACKAGE = Path(__file__).resolve().parents[1]  # the durable_nb package, not just notebook/
_MAGICS = Path(__file__).resolve().with_name("magics.py")  # where the cell magics run cells
_EXAMPLES = {_PACKAGE / "demo.py"}  # example user code shipped in the package
_LIBRARIES = tuple(str(Path(p).resolve()) for p in
                   {sysconfig.get_paths()[k] for k in ("stdlib", "purelib", "platlib")})
#: durable_nb errors whose frames in the user's code say where it went wrong.
_USER_ERRORS = (TerminalError, ContextNotActive, SerializationError)


def _user_frame(frame: types.FrameType) -> bool:
    filename = frame.f_code.co_filename
    if filename.startswith("<"):
        return True  # a cell: <durable_agent RUN>, or an IPython cell
    path = Path(filename).resolve()
    if path in _EXAMPLES:
        return True
    if _PACKAGE in path.parents:
        return False
    return not str(path).startswith(_LIBRARIES) and "IPython" not in path.parts


def _user_traceback(tb: types.TracebackType | None) -> types.TracebackType | None:
    """The traceback with only the user's frames (their cells and modules), from below the
    magic that ran the cell."""
    entries = []
    while tb is not None:
        entries.append(tb)
        tb = tb.tb_next
    starts = [i for i, e in enumerate(entries)
              if e.tb_frame.f_code.co_name in ("durable_agent", "durable")
              and Path(e.tb_frame.f_code.co_filename).resolve() == _MAGICS]
    if starts:
        entries = entries[starts[-1] + 1:]
    new = None
    for entry in reversed([e for e in entries if _user_frame(e.tb_frame)]):
        new = types.TracebackType(new, entry.tb_frame, entry.tb_lasti, entry.tb_lineno)
    return new


def _message_only(exc: BaseException, text: str | None = None) -> list[str]:
    # Wrapped at word boundaries: a front end wraps a long line anywhere, mid-word.
    name = type(exc).__name__
    message = textwrap.fill(f"{name}: {text if text is not None else exc}", 100,
                            break_long_words=False, break_on_hyphens=False)
    return [f"\x1b[0;31m{name}\x1b[0m{message[len(name):]}"]


def _cell_file(shell: Any) -> str | None:
    """The name IPython compiled the running cell under (it shows as ``Cell In[N]``): the
    file of the nearest calling frame that IPython knows as a cell's."""
    known = getattr(shell.compile, "format_code_name", None)
    frame = sys._getframe(1)
    while frame is not None and callable(known):
        if known(frame.f_code.co_filename) is not None:
            return frame.f_code.co_filename
        frame = frame.f_back
    return None


def cell_syntax_error(exc: SyntaxError, shell: Any) -> CellSyntaxError:
    """``exc``, raised compiling a ``%%durable_agent`` cell's body, as the error the cell
    shows: the line and a caret, numbered as in the cell, the way IPython shows a syntax
    error in a plain cell; no frames of IPython's or durable_nb's."""
    where = _cell_file(shell)
    # The body starts on the cell's second line, after the magic's.
    shift = 1 if where is not None else 0
    located = SyntaxError(exc.msg, (
        where or exc.filename, exc.lineno + shift if exc.lineno else None, exc.offset,
        exc.text, exc.end_lineno + shift if exc.end_lineno else None, exc.end_offset))
    error = CellSyntaxError(located)
    error._render_traceback_ = (  # type: ignore[attr-defined]
        lambda: shell.SyntaxTB.structured_traceback(SyntaxError, located, []))
    return error


def shorten(exc: BaseException, shell: Any, interrupted: str | None = None) -> None:
    """Make IPython show ``exc`` short: durable_nb's errors as their message, the user's
    exceptions with the user's frames only (IPython's ``_render_traceback_`` protocol)."""
    if isinstance(exc, UsageError) or getattr(exc, "_render_traceback_", None):
        return
    try:
        if isinstance(exc, KeyboardInterrupt):
            text = interrupted or "the run stopped; re-run the cell to continue it"
            exc._render_traceback_ = lambda: _message_only(exc, text)  # type: ignore[attr-defined]
            return
        if isinstance(exc, DurableError) and not isinstance(exc, _USER_ERRORS):
            exc._render_traceback_ = lambda: _message_only(exc)  # type: ignore[attr-defined]
            return
        tb = _user_traceback(exc.__traceback__)
        if tb is None:
            exc._render_traceback_ = lambda: _message_only(exc)  # type: ignore[attr-defined]
            return

        def render() -> list[str]:
            formatter = shell.InteractiveTB
            return formatter.structured_traceback(type(exc), exc.with_traceback(tb), tb)

        exc._render_traceback_ = render  # type: ignore[attr-defined]
    except (AttributeError, TypeError):  # an exception type that takes no attributes
        return
