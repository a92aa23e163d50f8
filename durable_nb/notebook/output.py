"""Where a run's output goes, and the displays a cell keeps up to date.

Prints are shown once. While a cell runs in the foreground, its run's prints go to the cell's
output as any cell's do (nbclient, papermill and nbconvert keep them, and they appear as they
are printed); the panel's log holds only what has no cell to go to: the prints of a run, or
batch items, resumed in the background after an approval. A thread that executes such a run
has its prints routed to the panel's log (:func:`route_output`); every other thread prints
where it did before.

:class:`CellDisplays` is the panel under a cell, its saved view (static HTML that front ends
show once the widget's model is gone, e.g. in a notebook reopened later) and, for a batch, the
cell's value: each updated in place by display id.
"""

from __future__ import annotations

import sys
import threading
from typing import Any, Callable

__all__ = ["CellDisplays", "route_of_this_thread", "route_output"]


class _RoutedStream:
    """sys.stdout/stderr stand-in that sends what a routed thread prints to its sink and
    everything else where it went before."""

    def __init__(self, original: Any) -> None:
        self.original = original
        self.routes: dict[int, Callable[[str], None]] = {}

    def write(self, text: str) -> int:
        route = self.routes.get(threading.get_ident())
        if route is None:
            return self.original.write(text)
        route(text)
        return len(text)

    def flush(self) -> None:
        self.original.flush()

    def __getattr__(self, name: str) -> Any:
        return getattr(self.original, name)


def route_of_this_thread() -> Callable[[str], None] | None:
    """Where this thread's prints are routed now, if anywhere."""
    stream = sys.stdout
    if not isinstance(stream, _RoutedStream):
        return None
    return stream.routes.get(threading.get_ident())


def route_output(sink: Callable[[str], None]) -> Callable[[], None]:
    """Route this thread's prints to ``sink`` until the returned function is called."""
    streams = []
    for name in ("stdout", "stderr"):
        stream = getattr(sys, name)
        if not isinstance(stream, _RoutedStream):
            stream = _RoutedStream(stream)
            setattr(sys, name, stream)
        stream.routes[threading.get_ident()] = sink
        streams.append(stream)
    ident = threading.get_ident()

    def restore() -> None:
        for stream in streams:
            stream.routes.pop(ident, None)

    return restore


class CellDisplays:
    """A panel's display under its cell and, right after it, the panel's saved view.

    ``panel`` has ``_repr_mimebundle_`` (the widget and its text summary) and
    ``static_html()``. :meth:`update` sends both again: the text summary and the saved view
    then tell the latest state, in the live page and in the notebook file.
    """

    def __init__(self, panel: Any) -> None:
        from IPython.display import display

        self.panel = panel
        self._live = display(panel, display_id=True)
        self._saved = display(self._saved_bundle(), raw=True, display_id=True)

    def _saved_bundle(self) -> dict[str, str]:
        return {"text/html": self.panel.static_html()}

    def update(self) -> None:
        """Send the panel's display and its saved view again (any thread)."""
        self.panel.refresh(force=True)
        self._live.update(self.panel)
        self._saved.update(self._saved_bundle(), raw=True)
