"""``python -m durable_nb.testing``: the loopback server in the foreground."""

from __future__ import annotations

import argparse
import dataclasses
from collections.abc import Sequence

from .quirks import Quirks
from .scripts import SCRIPT_NAMES, Script, load_script, script_named
from .server import LoopbackServer

__all__ = ["main"]


def main(argv: Sequence[str] | None = None) -> None:
    """``python -m durable_nb.testing``: serve in the foreground until killed. The first
    stdout line is ``LOOPBACK_URL=...``; the second says what answers."""
    parser = argparse.ArgumentParser(
        prog="python -m durable_nb.testing",
        description="A loopback OpenAI-compatible server with scripted replies, not a model: "
                    "by default it echoes your last message, and calls the first tool a "
                    "request offers, then answers after the tool's result.")
    parser.add_argument("--port", type=int, default=0, help="port on 127.0.0.1 (default: any free)")
    parser.add_argument("--script", default="echo", metavar="NAME|FILE",
                        help="what answers: 'echo' (default: the generic mode, for your own "
                             "cells), 'demo' (the sales demo's tool calls, round by round) "
                             "or a JSON file: a list of replies (strings or "
                             "{'content': ..., 'tool_calls': [...]})")
    parser.add_argument("--model", default="loopback-1")
    parser.add_argument("--quirks", default="",
                        help="comma-separated quirks of real servers to imitate, e.g. "
                             "'no_stream_usage,repeat_tool_call_ids,loading_for=3' (known: "
                             f"{', '.join(f.name for f in dataclasses.fields(Quirks))})")
    args = parser.parse_args(argv)
    try:
        quirks = Quirks.parse(args.quirks)
    except ValueError as e:
        parser.error(f"--quirks: {e}")
    try:
        script: Script = (script_named(args.script) if args.script in SCRIPT_NAMES
                          else load_script(args.script))
    except (OSError, ValueError, TypeError, KeyError) as e:
        parser.error(f"cannot use the script {args.script}: {e}")
    server = LoopbackServer(script, model=args.model, port=args.port, quirks=quirks).bind()
    print(f"LOOPBACK_URL={server.url}", flush=True)
    print(_what_answers(server.script_name), flush=True)
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        server.stop()


def _what_answers(name: str) -> str:
    what = {"echo": "it echoes your last message, calls the first tool a request offers and "
                    "answers after the tool's result",
            "demo": "the sales demo's script: read_csv, analyse, write_report, send_email, "
                    "then a final answer, whatever you ask"}.get(
        name, "your script's replies, round by round")
    return (f"scripted replies, not a model ({name}): {what}. Set OPENAI_BASE_URL to the URL "
            f"above and OPENAI_API_KEY to anything.")
