"""``durable-nb``: list, inspect, approve, cancel, reset, export runs from a terminal."""

from __future__ import annotations

import argparse
import json
import sys
import time
from typing import Sequence

from . import registry
from .errors import DurableError
from .journal import Journal, RunRecord, Status, open_journal

__all__ = ["STEERING", "format_run", "format_runs", "main", "steer"]


def _age(ts: float) -> str:
    seconds = max(0, time.time() - ts)
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= size:
            return f"{seconds / size:.0f}{unit} ago"
    return f"{seconds:.0f}s ago"


def format_runs(records: list[RunRecord]) -> str:
    """The run table shown by ``durable-nb runs`` and ``%durable runs``."""
    if not records:
        return "no runs"
    rows = [("RUN", "STATUS", "ITER", "TOKENS", "STEPS", "UPDATED", "TITLE")]
    for r in records:
        iters = f"{r.iteration}/{r.max_iterations}" if r.max_iterations else str(r.iteration)
        rows.append((r.run_id, str(r.status), iters, str(r.tokens), str(r.step_count),
                     _age(r.updated_at), r.title))
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]) - 1)]
    return "\n".join("  ".join(c.ljust(w) for c, w in zip(row, widths)) + "  " + row[-1]
                     for row in rows).rstrip()


def format_run(info: registry.RunInfo) -> str:
    """The detail view shown by ``durable-nb show`` and ``%durable show``."""
    lines = [f"run        {info.run_id}" + (f"  ({info.title})" if info.title else ""),
             f"status     {info.status}" + ("  [executing now]" if info.executing else ""),
             f"iteration  {info.iteration}" + (f" / {info.max_iterations}"
                                               if info.max_iterations else ""),
             f"tokens     {info.prompt_tokens} prompt + {info.completion_tokens} completion"
             + (f" of {info.max_tokens}" if info.max_tokens else ""),
             f"created    {time.ctime(info.created_at)}"]
    if info.deadline:
        lines.append(f"deadline   {time.ctime(info.deadline)}")
    if info.pending_approval:
        p = info.pending_approval
        lines.append(f"waiting    approval {p.get('name')!r} (step {p.get('key')}): "
                     f"{json.dumps(p.get('details'))}")
    if info.error:
        lines.append(f"error      {info.error}")
    if info.status is Status.DONE:
        lines.append(f"result     {json.dumps(info.result)[:500]}")
    if info.context_summary:
        lines.append(f"summary    {info.context_summary[:500]}")
    lines.append(f"steps      {len(info.steps)}")
    for e in info.steps:
        outcome = "ok" if e.ok else f"FAILED {e.error.get('type') if e.error else ''}"
        tokens = f"  {e.prompt_tokens}+{e.completion_tokens} tok" if e.prompt_tokens else ""
        lines.append(f"  {e.position:>4}  {e.kind:<8} {e.name:<28} {e.duration * 1000:8.1f} ms"
                     f"  {outcome}{tokens}")
    return "\n".join(lines)


STEERING = ("approve", "reject", "cancel", "reset", "delete")


def steer(command: str, run_id: str, journal: Journal, *, note: str | None = None,
          by: str | None = None, from_step: int = 0) -> str:
    """One of :data:`STEERING` on a run, for ``durable-nb`` and ``%durable``; returns the
    line to print."""
    if command in ("approve", "reject"):
        decide = registry.approve if command == "approve" else registry.reject
        decision = decide(run_id, note, by=by, journal=journal)
        done = "approved" if command == "approve" else "rejected"
        return f"{done} run {run_id} (by {decision.by})"
    if command == "cancel":
        record = registry.cancel(run_id, journal=journal)
        return (f"run {run_id} is already DONE" if record.status is Status.DONE
                else f"cancel requested for run {run_id}")
    if command == "reset":
        record = registry.reset(run_id, from_step, journal=journal)
        return f"run {run_id} reset: {record.step_count} steps kept; run it again to go on"
    if command == "delete":
        registry.delete(run_id, journal=journal)
        return f"deleted run {run_id}"
    raise ValueError(f"unknown command {command!r}")


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="durable-nb", description="Inspect and steer durable agent runs.")
    parser.add_argument("--journal", metavar="DIR",
                        help="journal directory (default: $DURABLE_NB_DIR or ./.durable_nb)")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    p = sub.add_parser("runs", help="list runs")
    p.add_argument("--status", choices=[s.value for s in Status], help="only runs in this status")
    p.add_argument("--json", action="store_true", help="print JSON")

    p = sub.add_parser("show", help="show one run and its steps")
    p.add_argument("run_id", metavar="RUN")
    p.add_argument("--json", action="store_true", help="print JSON")

    for name, verb in (("approve", "approve"), ("reject", "reject")):
        p = sub.add_parser(name, help=f"{verb} the run's pending approval")
        p.add_argument("run_id", metavar="RUN")
        p.add_argument("note", nargs="?", help="a note for the agent")
        p.add_argument("--by", help="who decides (default: user@host)")

    p = sub.add_parser("cancel", help="cancel a run (it stops at its next step)")
    p.add_argument("run_id", metavar="RUN")

    p = sub.add_parser("reset", help="forget steps from N on, so they run again")
    p.add_argument("run_id", metavar="RUN")
    p.add_argument("--from", dest="from_step", type=int, required=True, metavar="N",
                   help="first step to forget (0 forgets all)")

    p = sub.add_parser("delete", help="delete a run and its journal")
    p.add_argument("run_id", metavar="RUN")

    p = sub.add_parser("export", help="write a run as a notebook (or JSON)")
    p.add_argument("run_id", metavar="RUN")
    p.add_argument("--to", required=True, metavar="FILE", help="output file")
    p.add_argument("--format", choices=["ipynb", "json"], default=None,
                   help="default: from the file's extension")

    p = sub.add_parser("demo", help="an offline crash-and-resume demo (no API key needed)")
    p.add_argument("--dir", metavar="DIR", help="work directory (default: a new temp dir)")
    return parser


def _run(args: argparse.Namespace) -> int:
    if args.command == "demo":
        from .demo import run_demo

        return run_demo(args.dir)
    journal = open_journal(args.journal)
    if args.command == "runs":
        records = registry.runs(args.status, journal=journal)
        if args.json:
            print(json.dumps([json.loads(r.to_json()) for r in records], indent=2))
        else:
            print(format_runs(records))
    elif args.command == "show":
        info = registry.get_run(args.run_id, journal=journal)
        print(json.dumps(info.to_dict(), indent=2) if args.json else format_run(info))
    elif args.command in STEERING:
        print(steer(args.command, args.run_id, journal, note=getattr(args, "note", None),
                    by=getattr(args, "by", None), from_step=getattr(args, "from_step", 0)))
    elif args.command == "export":
        from .export import export_run

        path = export_run(args.run_id, args.to, format=args.format, journal=journal)
        print(f"wrote {path}")
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``durable-nb`` command; returns the exit code."""
    args = _parser().parse_args(argv)
    try:
        return _run(args)
    except (DurableError, ValueError, OSError) as exc:
        print(f"durable-nb: error: {exc}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
