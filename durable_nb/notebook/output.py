"""Where a run's prints go: the thread that executes a run sends what it prints to the run's
panel log; every other thread prints where it did before."""

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
    return stream.routes.get(threading.get_ident()) if isinstance(stream, _RoutedStream) else None


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
