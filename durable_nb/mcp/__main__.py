"""``python -m durable_nb.mcp answer RUN_ID accept '{"nights": 3}'``: answer the question an
MCP server asked a run (accept with JSON content, decline, cancel); see
:func:`durable_nb.mcp.answer`."""

from __future__ import annotations

import argparse
import json
import sys

from ..errors import DurableError


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m durable_nb.mcp",
                                     description="Answer an MCP server's question to a run.")
    commands = parser.add_subparsers(dest="command", required=True)
    answering = commands.add_parser("answer", help="answer the question a run waits on")
    answering.add_argument("run_id")
    answering.add_argument("action", choices=("accept", "decline", "cancel"))
    answering.add_argument("content", nargs="?", help="with accept: the answer, a JSON object")
    answering.add_argument("--by", help="who answers (default: $DURABLE_NB_APPROVER, the user)")
    answering.add_argument("--expect", help="the digest of the question you saw")
    answering.add_argument("--journal", help="the journal (default: $DURABLE_NB_JOURNAL, "
                                             "./.durable_nb)")
    args = parser.parse_args(argv)
    from . import answer

    try:
        content = json.loads(args.content) if args.content else None
    except ValueError as exc:
        parser.error(f"the content is not JSON ({exc}); give a JSON object, e.g. "
                     f"'{{\"nights\": 3}}'")
    try:
        decision = answer(args.run_id, args.action, content, by=args.by, expect=args.expect,
                          via="CLI", journal=args.journal)
    except DurableError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    print(f"{args.action} given to run {args.run_id} by {decision.by}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
