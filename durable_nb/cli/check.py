"""``durable-nb check``: recorded runs checked against the code as it is now, by a dry
replay (:mod:`durable_nb.checking`): nothing executed, nothing written. Exit status 1 when
a run diverges, so that a script or CI job stops before resuming runs the code no longer
fits."""

from __future__ import annotations

import argparse
import json
from typing import Any

from ..checking import check
from ..checking.handlers import load_object

__all__ = ["HELP", "add_check_command", "check_command"]

HELP = ("check runs against the code as it is now, executing nothing (a dry replay): "
        "replays, would execute, or diverges")
_DESCRIPTION = ("Check recorded runs against a handler as it is now (--handler "
                "module:function), executing nothing: every step is answered from the journal. "
                "Prints per run: replays, would execute (where), or diverges (what changed). "
                "Exit status 1 when a run diverges.")


def add_check_command(sub: Any) -> None:
    """The ``check`` command's options, on the sub-command group ``sub``."""
    p = sub.add_parser("check", help=HELP, description=_DESCRIPTION)
    p.add_argument("run_ids", nargs="*", metavar="RUN",
                   help="the runs to check (default: every run whose id starts with --prefix, "
                        "or every run of the journal)")
    p.add_argument("--handler", required=True, metavar="MODULE:FUNCTION",
                   help="the run's handler as it is now: handler(ctx), or handler(ctx, item) "
                        "with --items; a module importable from here, or path/to/file.py")
    p.add_argument("--prefix", metavar="P",
                   help="the runs whose id starts with P (a batch's items: BATCH/)")
    p.add_argument("--items", metavar="MODULE:NAME",
                   help="a batch's items (the list given to durable_nb.map), with --prefix "
                        "BATCH: each item's run checked with handler(ctx, item)")
    p.add_argument("--key", metavar="index|MODULE:FUNCTION",
                   help="with --items: the items' key as given to durable_nb.map (default: "
                        "a digest of each item)")
    p.add_argument("--model", help="the runs' default model (RunOptions.model), if they had one")
    p.add_argument("--diff", action="store_true",
                   help="show what changed in each diverging run as a diff")
    p.add_argument("--json", action="store_true", help="one JSON object per run")


def check_command(args: argparse.Namespace) -> int:
    """Run ``durable-nb check``: print one line per run and a summary; 1 if one diverges."""
    if args.items is None and args.key is not None:
        raise ValueError("--key goes with --items (the batch's items)")
    if args.items is not None and (args.run_ids or not args.prefix):
        raise ValueError("--items checks a batch's items: give --prefix BATCH (the batch's "
                         "id), not run ids")
    handler = load_object(args.handler)
    options: dict[str, Any] = {"model": args.model} if args.model else {}
    if args.items is not None:
        key = args.key if args.key in (None, "index") else load_object(args.key, "--key")
        report = check(handler, journal=args.journal, prefix=args.prefix,
                       items=load_object(args.items, "--items"), key=key, **options)
    else:
        report = check(handler, journal=args.journal, runs=args.run_ids or None,
                       prefix=args.prefix, **options)
    if args.json:
        for run in report:
            print(json.dumps({"run_id": run.run_id, "verdict": run.verdict,
                              "status": run.status.value if run.status else None,
                              "step": run.position, "key": run.key, "change": run.change,
                              "approval": run.approval}))
    else:
        print(report.text(diff=args.diff))
    return 0 if report.ok else 1
