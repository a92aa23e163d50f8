"""Where a run's prints go: the thread that executes a run sends what it prints to the run's
panel log (and, for a cell running in the foreground, to the cell's own output as well, so
that nbclient, papermill and nbconvert keep them); every other thread prints where it did
before."""

from __future__ import annotations

import sys
import threading
from typing import Any, Callable

__all__ = ["route_of_this_thread", "route_output"]


class _RoutedStream:
    """sys.stdout/stderr stand-in that sends what a run's thread prints to its panel log and
    everything else where it went before."""

    def __init__(self, original: Any) -> None:
        self.original = original
        self.routes: dict[int, Callable[[str], None]] = {}
        self.tees: set[int] = set()

    def write(self, text: str) -> int:
        ident = threading.get_ident()
        route = self.routes.get(ident)
        if route is None:
            return self.original.write(text)
        route(text)
        if ident in self.tees:
            self.original.write(text)
        return len(text)

    def flush(self) -> None:
        self.original.flush()

    def __getattr__(self, name: str) -> Any:
        return getattr(self.original, name)


def route_of_this_thread() -> tuple[Callable[[str], None], bool] | None:
    """Where this thread's prints are routed now (sink, tee), if anywhere."""
    stream = sys.stdout
    if not isinstance(stream, _RoutedStream):
        return None
    ident = threading.get_ident()
    sink = stream.routes.get(ident)
    return None if sink is None else (sink, ident in stream.tees)


def route_output(sink: Callable[[str], None], *, tee: bool = False) -> Callable[[], None]:
    """Route this thread's prints to ``sink`` until the returned function is called; with
    ``tee``, also where they went before."""
    streams = []
    for name in ("stdout", "stderr"):
        stream = getattr(sys, name)
        if not isinstance(stream, _RoutedStream):
            stream = _RoutedStream(stream)
            setattr(sys, name, stream)
        stream.routes[threading.get_ident()] = sink
        if tee:
            stream.tees.add(threading.get_ident())
        streams.append(stream)
    ident = threading.get_ident()

    def restore() -> None:
        for stream in streams:
            stream.routes.pop(ident, None)
            stream.tees.discard(ident)

    return restore
