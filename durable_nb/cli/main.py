"""``durable-nb``: list, inspect, approve, cancel, reset, export runs and batches from a
terminal (how runs are shown: :mod:`durable_nb.cli.show`).

``runs``, ``show`` and ``export`` only read: they never create or write a journal, and work on
a read-only copy of one. The helpers here (option parsing with suggestions, how a run is
shown, how a journal is opened for reading or writing) are shared with the ``%durable`` and
``%%durable_agent`` magics.
"""

from __future__ import annotations

import argparse
import difflib
import json
import os
import shlex
import signal
import sys
import time
from pathlib import Path
from typing import Any, Callable, Iterable, Sequence

from .. import registry
from ..batches.batch import batch as read_batch
from .answer import HELP as ANSWER_HELP, add_answer_command, answer_command
from .check import HELP as CHECK_HELP, add_check_command, check_command
from .prune import (HELP as PRUNE_HELP, add_prune_commands, pruned_note, retention_command,
                    run_prune_command)
from .show import (ITEM_STATUSES, RUN_STATUSES, effective_json, effective_states,
                       format_batch, format_batches, format_run, format_runs, list_runs,
                       more_runs_note, parse_item_status, parse_status, statuses_help)
from .usage import JOURNAL_HELP, CommandParser, SubcommandsWithJournal
from ..errors import ApprovalPolicyError, DurableError, InvalidAnswer, NoJournal, UnknownRun
from ..approvals.request import pending_digest, request_words
from ..approvals.wording import content_words, decision_words, verdict
from ..export import export_batch, export_run
from ..devsetup import dev_setup
from ..journal import Journal, Status, default_location, open_journal
from ..approvals.history import history
from ..approvals.policy import parse_duration
from ..approvals.state import effective_state
from ..notify.audit import notifications
from ..notify.start import for_journal
from ..notify.sweeper import sweep_journal
from ..profile import disable, enable
from ..registry import batch_rows, is_interrupted, recorded_decision
from ..timestamps import format_time
from ..version import __version__

__all__ = ["COMMANDS", "STEERING", "command_list", "main", "near_runs", "steer"]


# -- steering ---------------------------------------------------------------------------------------

STEERING = ("approve", "reject", "cancel", "reset", "delete")


def arguments_json(text: str) -> Any:
    """The edited arguments given as JSON text (``--args``); InvalidAnswer, in one line,
    when the text is not JSON."""
    try:
        return json.loads(text)
    except ValueError as exc:
        raise InvalidAnswer(f"--args is not JSON ({exc}): give the arguments as a JSON "
                            f"object, e.g. '{{\"database\": \"staging\"}}'") from None


def steer(command: str, run_id: str, journal: Journal, *, note: str | None = None,
          by: str | None = None, from_step: int = 0, expect: str | None = None,
          request_id: str | None = None, replace: bool = False, via: str = "durable-nb",
          args: str | None = None, message: str | None = None) -> str:
    """One of :data:`STEERING` on a run, for ``durable-nb`` and ``%durable`` (``via``);
    returns the line to print. ``approve``/``reject`` decide the request the line names
    (``expect``: only if it is the request with that digest; ``request_id``: only if it is
    the request with that id, never a later one that asks the same), once: DecisionExists
    if it was decided already, unless ``replace`` (before the run took it). ``args`` (approve:
    the edited arguments as JSON text) and ``message`` (reject: what the model is told)
    answer beyond yes or no."""
    if command in ("approve", "reject"):
        record = journal.get_run(run_id)
        pending = record.pending_approval or {}
        digest = pending_digest(pending) if pending else None
        earlier = recorded_decision(record, journal) if replace else None
        content: dict[str, Any] = {}
        if args is not None:
            if command != "approve":
                raise InvalidAnswer("--args goes with approve; reject takes --message")
            content["args"] = arguments_json(args)
        if message is not None:
            if command != "reject":
                raise InvalidAnswer("--message goes with reject; approve takes --args")
            content["message"] = message
        decide = registry.approve if command == "approve" else registry.reject
        decision = decide(run_id, note, by=by, expect=expect or digest,
                          request_id=request_id, replace=replace, via=via, journal=journal,
                          **content)
        said = content_words({"args": decision.args, "message": decision.message})
        done = f"{verdict({'approved': decision.approved})} run {run_id}" + (
            f" {said}" if said else "")
        replaced = f", replacing {decision_words(earlier, timed=True, note=80)}" if earlier else ""
        # With edited arguments, the details are what the model asked, not what runs.
        asked = "asked " if decision.args is not None else ""
        return (f"{done} (by {decision.by}{replaced}): {pending.get('name')!r} {asked}"
                f"{json.dumps(pending.get('details'))} ({request_words(pending)})")
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


# -- options -------------------------------------------------------------------------------------

#: Every command with its one-line description, for `durable-nb` and `%durable` alone.
COMMANDS = {
    "runs": "list runs, newest first (--limit N, --status S, --prefix P, --json)",
    "batches": "list batches with their items' counts by status",
    "batch": "one batch: `batch show ID` (totals, items; --status S, --limit N), "
             "`batch export ID` (JSON lines or a notebook report)",
    "show": "one run: status, tokens, cost, its steps",
    "inbox": "the requests waiting, with Approve / Reject (a widget: %durable only)",
    "approve": "approve the run's pending approval (with an optional note)",
    "reject": "reject it",
    "answer": ANSWER_HELP,
    "cancel": "stop the run at its next step (status CANCELLED)",
    "reset": "forget steps N and later (--from N), so they run again",
    "delete": "delete the run and its journal",
    **PRUNE_HELP,
    "export": "write the run as a notebook (.ipynb) or JSON",
    "check": CHECK_HELP,
    "trace": "send the run's finished attempts as OpenTelemetry spans (--to OTLP_URL)",
    "copy": "copy a run to another journal (--to DIR or postgresql://...; --move, --as NEW)",
    "wait": "wait until the run finishes (headless notebooks)",
    "sweep": "apply deadlines and send due notices, for a journal no Jupyter server sweeps "
             "(--once, or --every SECONDS)",
    "demo": "the offline crash-and-resume demo",
    "enable": "load durable_nb in every IPython kernel (writes your IPython profile)",
    "disable": "undo `enable` (also `durable-nb enable --undo`)",
    "dev-setup": "a checkout installed with pip install -e: its Lab and server extensions",
}


def command_list(prog: str, names: Iterable[str]) -> str:
    names = list(names)
    width = max(len(n) for n in names)
    return "\n".join([f"{prog} COMMAND ...; the commands:"]
                     + [f"  {n.ljust(width)}  {COMMANDS[n]}" for n in names]
                     + [f"`{prog} COMMAND --help` tells more." if prog == "durable-nb"
                        else f"`{prog}?` tells more."])


def _count(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"{text!r} must be 0 or more")
    return value


def build_parser() -> argparse.ArgumentParser:
    """The ``durable-nb`` parser: every command and option (the CLI reference is made from it)."""
    parser = CommandParser(prog="durable-nb",
                           description="Inspect and steer durable agent runs.")
    parser.list_commands = command_list
    parser.add_argument("--journal", metavar="JOURNAL", help=JOURNAL_HELP)
    parser.add_argument("--version", action="version", version=f"durable-nb {__version__}",
                        help="print the version of durable-nb and exit")
    sub = SubcommandsWithJournal(parser.add_subparsers(dest="command", required=True,
                                                        metavar="COMMAND"))

    p = sub.add_parser("runs", help=COMMANDS["runs"])
    p.add_argument("--status", type=parse_status, metavar="STATUS",
                   help=f"only runs in this status: {statuses_help(RUN_STATUSES)}")
    p.add_argument("--prefix", metavar="P",
                   help="only runs whose id starts with P (a batch's items: --prefix BATCH/)")
    p.add_argument("--limit", type=_count, default=50, metavar="N",
                   help="the newest N runs (default 50; 0: all)")
    p.add_argument("--json", action="store_true", help="print JSON")

    p = sub.add_parser("sweep", help=COMMANDS["sweep"],
                       description="Apply what time makes due in the journal: deadlines "
                                   "(decided or escalated by their policy), reminders, and "
                                   "notices whose sender died; for a journal no Jupyter "
                                   "server sweeps (cron, a Kubernetes CronJob).")
    how = p.add_mutually_exclusive_group()
    how.add_argument("--once", action="store_true",
                     help="sweep once and exit (the default; for cron)")
    how.add_argument("--every", type=_seconds, metavar="SECONDS",
                     help="keep sweeping: when something falls due, at least every SECONDS")

    p = sub.add_parser("batches", help=COMMANDS["batches"])
    p.add_argument("--json", action="store_true", help="print JSON")

    p = sub.add_parser("batch", help=COMMANDS["batch"])
    batch = SubcommandsWithJournal(p.add_subparsers(dest="batch_command", required=True,
                                                     metavar="show|export"))
    b = batch.add_parser("show", help="the batch's totals and its items")
    b.add_argument("batch_id", metavar="ID")
    b.add_argument("--status", type=parse_item_status, metavar="STATUS",
                   help=f"only items in this status: {statuses_help(ITEM_STATUSES)}; "
                        f"pending: never started")
    b.add_argument("--limit", type=_count, default=50, metavar="N",
                   help="at most N items (default 50; 0: all)")
    b.add_argument("--json", action="store_true", help="print JSON (every item)")
    b = batch.add_parser("export", help="write the items as JSON lines or a notebook report")
    b.add_argument("batch_id", metavar="ID")
    b.add_argument("--to", required=True, metavar="FILE",
                   help="FILE.jsonl (one line per item) or FILE.ipynb (a report)")

    p = sub.add_parser("show", help=COMMANDS["show"])
    p.add_argument("run_id", metavar="RUN")
    p.add_argument("--json", action="store_true", help="print JSON")

    for name in ("approve", "reject"):
        p = sub.add_parser(name, help=COMMANDS[name])
        p.add_argument("run_id", metavar="RUN")
        p.add_argument("note", nargs="?", help="a note for the agent (quote it)")
        p.add_argument("--by", help="who decides (default: user@host)")
        p.add_argument("--expect", metavar="DIGEST",
                       help="decide only if the pending request is the one with this digest "
                            "(`show` prints it; 8 or more characters): for scripts")
        p.add_argument("--request", metavar="ID", dest="request_id",
                       help="decide only the request with this id (`show` prints it), never "
                            "a later one that asks the same thing: for scripts")
        p.add_argument("--replace", action="store_true",
                       help="change a decision already given that the run has not taken yet "
                            "(the run's history keeps both); without it a second decision "
                            "is refused")
        if name == "approve":
            p.add_argument("--args", metavar="JSON", dest="edited_args",
                           help="approve with edited arguments (a tool call's): a JSON object "
                                "that fits the tool's schema; the tool runs with them")
        else:
            p.add_argument("--message", metavar="TEXT",
                           help="what the model receives as the tool's answer, e.g. "
                                "'Denied: use the staging database'")

    add_answer_command(sub)
    p = sub.add_parser("cancel", help=COMMANDS["cancel"])
    p.add_argument("run_id", metavar="RUN")

    p = sub.add_parser("reset", help=COMMANDS["reset"])
    p.add_argument("run_id", metavar="RUN")
    p.add_argument("--from", dest="from_step", type=int, required=True, metavar="N",
                   help="first step to forget (0 forgets all; `durable-nb show RUN` numbers "
                        "them)")

    p = sub.add_parser("delete", help=COMMANDS["delete"])
    p.add_argument("run_id", metavar="RUN")

    add_prune_commands(sub)
    p = sub.add_parser("export", help=COMMANDS["export"])
    p.add_argument("run_id", metavar="RUN")
    p.add_argument("--to", required=True, metavar="FILE", help="output file")
    p.add_argument("--format", choices=["ipynb", "json"], default=None,
                   help="default: from the file's extension")

    p = sub.add_parser("trace", help=COMMANDS["trace"])
    p.add_argument("run_id", metavar="RUN")
    p.add_argument("--to", required=True, metavar="OTLP_URL",
                   help="an OTLP/HTTP collector, e.g. http://localhost:4318")

    p = sub.add_parser("copy", help=COMMANDS["copy"])
    p.add_argument("run_id", metavar="RUN")
    p.add_argument("--to", required=True, metavar="JOURNAL",
                   help="the journal to copy it to: a directory or a postgresql:// URL")
    p.add_argument("--from", dest="source", metavar="JOURNAL",
                   help="the journal it is in (default: --journal, or DURABLE_NB_JOURNAL)")
    p.add_argument("--as", dest="new_id", metavar="NEW", help="the copy's run id (default: RUN)")
    p.add_argument("--move", action="store_true",
                   help="delete the run from its journal once copied")

    add_check_command(sub)

    p = sub.add_parser("demo", help=COMMANDS["demo"])
    p.add_argument("--dir", metavar="DIR", help="work directory (default: a new temp dir)")

    for name in ("enable", "disable"):
        p = sub.add_parser(name, help=COMMANDS[name])
        p.add_argument("--profile", default="default",
                       help="the IPython profile (default: default)")
        if name == "enable":
            p.add_argument("--undo", action="store_true",
                           help="remove what `enable` added (the same as `disable`)")
    sub.add_parser("dev-setup", help=COMMANDS["dev-setup"])
    return parser


def _run(args: argparse.Namespace) -> int:
    if args.command == "demo":
        from ..demo import run_demo  # the demo's agent and server import openai: only here

        return run_demo(args.dir)
    if args.command in ("enable", "disable"):
        on = args.command == "enable" and not getattr(args, "undo", False)
        print(enable(args.profile) if on else disable(args.profile))
        return 0
    if args.command == "dev-setup":
        print(dev_setup())
        return 0
    if args.command == "copy":
        record = registry.copy_run(args.run_id, args.to, journal=args.source or args.journal,
                                   new_id=args.new_id, move=args.move)
        target = open_journal(args.to)
        steps = f"{record.step_count} step{'' if record.step_count == 1 else 's'}"
        print(f"{'moved' if args.move else 'copied'} run {args.run_id} ({steps}, "
              f"{record.status.value}) to {target.location} as {record.run_id}; execute it "
              f"there to go on")
        return 0
    if args.command == "check":
        return check_command(args)
    if args.command == "sweep":
        return sweep_command(open_journal(args.journal), args.every)
    if args.command in ("prune", "retention"):
        return (run_prune_command if args.command == "prune" else retention_command)(args)
    if args.command in ("runs", "show", "export", "batches", "batch", "trace"):
        journal = open_journal(args.journal, read_only=True)
    else:
        journal = open_journal(args.journal)
    if args.command == "runs":
        records, more = list_runs(journal, status=args.status, prefix=args.prefix,
                                  limit=args.limit)
        interrupted = [r.run_id for r in records if is_interrupted(r, journal)]
        effective = effective_states(journal, records)
        if args.json:
            print(json.dumps([dict(json.loads(r.to_json(complete=True)), interrupted=r.run_id in interrupted,
                                   effective=effective_json(effective.get(r.run_id)))
                              for r in records], indent=2))
        else:
            print(format_runs(records, interrupted, effective))
            for note in (more_runs_note(len(records), more, "durable-nb runs"),
                         pruned_note(journal)):
                if note:
                    print(note)
    elif args.command == "batches":
        rows = batch_rows(journal)
        print(json.dumps(rows, indent=2) if args.json else format_batches(rows))
    elif args.command == "batch":
        _batch_command(args, journal)
    elif args.command == "show":
        info = registry.get_run(args.run_id, journal=journal)
        interrupted = is_interrupted(info, journal)
        decision = recorded_decision(info, journal)
        notified = notifications(journal, args.run_id)
        events = history(journal, args.run_id)
        effective = effective_state(journal, info)
        if args.json:
            print(json.dumps(dict(info.to_dict(), interrupted=interrupted, decision=decision,
                                  notifications=notified, history=events,
                                  effective=effective_json(effective)), indent=2))
        else:
            print(format_run(info, interrupted, decision, notified, events, effective))
    elif args.command == "answer":
        print(answer_command(args, journal))
    elif args.command in STEERING:
        print(steer(args.command, args.run_id, journal, note=getattr(args, "note", None),
                    by=getattr(args, "by", None), from_step=getattr(args, "from_step", 0),
                    expect=getattr(args, "expect", None),
                    request_id=getattr(args, "request_id", None),
                    replace=getattr(args, "replace", False),
                    args=getattr(args, "edited_args", None),
                    message=getattr(args, "message", None)))
    elif args.command == "export":
        path = export_run(args.run_id, args.to, format=args.format, journal=journal)
        print(f"wrote {path}")
    elif args.command == "trace":
        from ..telemetry import send_run  # OpenTelemetry is imported for this command only
        record = journal.get_run(args.run_id)
        sent = send_run(record, list(journal.steps(args.run_id)), args.to)
        print(f"sent {sent} span{'' if sent == 1 else 's'} of run {args.run_id} to {args.to}")
    return 0


def sweep_command(journal: Journal, every: float | None = None,
                  sleep: Callable[[float], object] = time.sleep) -> int:
    """``durable-nb sweep``: :func:`~durable_nb.notify.sweeper.sweep_journal` once, or
    (``every``) again when something next falls due and at least every ``every`` seconds,
    until interrupted. Prints one line for each thing a sweep applied or sent."""
    while True:
        ticked, sent, pruned = sweep_journal(journal, for_journal(journal))
        for run_id, what in ticked.applied.items():
            print(f"{format_time(time.time())} {run_id}: {what} by its deadline's policy")
        if pruned is not None and pruned.removed:
            count = len(pruned.removed)
            print(f"{format_time(time.time())} pruned {count} run{'' if count == 1 else 's'} "
                  f"by the journal's retention policy")
        for run_id, outcome in sent.items():
            print(f"{format_time(time.time())} {run_id}: notified "
                  f"({', '.join(f'{k} {v}' for k, v in outcome.items())})")
        sys.stdout.flush()
        if every is None:
            return 0
        wait = every if ticked.next_due is None else min(every, ticked.next_due - time.time())
        sleep(max(0.05, wait))


def _seconds(text: str) -> float:
    try:
        return parse_duration(text, "--every")
    except ApprovalPolicyError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _batch_command(args: argparse.Namespace, journal: Journal) -> None:
    if args.batch_command == "export":
        print(f"wrote {export_batch(args.batch_id, args.to, journal=journal)}")
        return
    batch = read_batch(args.batch_id, journal=journal)
    interrupted = [item.run_id for item in batch if item.status is Status.RUNNING
                   and registry.lease_holder(item.run_id, journal=journal) is None]
    if args.json:
        print(json.dumps({"batch_id": batch.batch_id, "title": batch.title,
                          "removed": batch.removed, "counts": batch.counts,
                          "items": [dict(item.to_dict(), interrupted=item.run_id in interrupted)
                                    for item in batch]}, indent=2, default=str))
    else:
        print(format_batch(batch, status=args.status, limit=args.limit,
                           interrupted=interrupted))


#: How many of the newest runs a run id not found is compared with for a did-you-mean.
NEAR_MISS_RUNS = 2000


def near_runs(run_id: str, journal: Any = None) -> str:
    """`` Did you mean 'quickstart'?`` when one of the :data:`NEAR_MISS_RUNS` newest runs
    in ``journal`` (a Journal, directory or URL) has an id close to ``run_id``; empty
    otherwise, and when the journal cannot be read (the error said what to do already).
    The journal's index answers: no scan of every run."""
    try:
        ids = [r.run_id for r in registry.runs(journal=open_journal(journal, read_only=True),
                                               limit=NEAR_MISS_RUNS, newest_first=True)]
    except (DurableError, OSError):
        return ""
    close = difflib.get_close_matches(run_id, ids, n=3, cutoff=0.6)
    if not close:
        return ""
    return f" Did you mean {' or '.join(repr(c) for c in close)}?"


def _pruned_since(journal: Any) -> str:
    """`` (312 runs pruned on ... by ...: it may have been one.)`` when runs were pruned
    from ``journal``; empty otherwise, and when it cannot be read."""
    try:
        note = pruned_note(open_journal(journal, read_only=True))
    except (DurableError, OSError):
        return ""
    return f" ({note}: it may have been one of them.)" if note else ""


def _reader_gone() -> int:
    """The reader of our output left (``durable-nb show RUN | head``): end quietly, as a
    Unix tool ended by SIGPIPE does (exit 141), with nothing more written to the pipe."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stdout.fileno())  # the flush at exit must not fail again
    os.close(devnull)
    return 128 + signal.SIGPIPE


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``durable-nb`` command; returns the exit code."""
    args = build_parser().parse_args(list(sys.argv[1:] if argv is None else argv))
    try:
        code = _run(args)
        sys.stdout.flush()  # here, not at exit: a closed pipe is answered below
        return code
    except BrokenPipeError:
        return _reader_gone()
    except (DurableError, ValueError, OSError) as exc:
        print(f"durable-nb: error: {_explained(exc, args)}", file=sys.stderr)
        return 1


def _explained(exc: BaseException, args: argparse.Namespace) -> str:
    """The error's message, with where to look next: run ids close to one not found, the
    journals below this folder when the default one is not there."""
    if isinstance(exc, UnknownRun):
        return (f"{exc}{near_runs(exc.run_id, getattr(args, 'source', None) or args.journal)}"
                f"{_pruned_since(getattr(args, 'source', None) or args.journal)}")
    if isinstance(exc, NoJournal) and args.journal is None \
            and Path(exc.location).resolve() == Path(default_location()).resolve():
        found = journals_below(Path.cwd())
        if found:
            return (f"{exc} Journals below this folder: {', '.join(found)} (e.g. `durable-nb "
                    f"--journal {shlex.quote(found[0])} runs`).")
    return str(exc)


def journals_below(folder: Path, depth: int = 3, limit: int = 5) -> list[str]:
    """Journals (``.durable_nb`` folders that hold runs) in ``folder``'s subfolders, up to
    ``depth`` levels down (the bundled notebooks keep theirs in ``notebooks/work/NAME/``),
    relative to ``folder``; the first ``limit``. Hidden folders (``.venv``) are not searched."""
    found: list[str] = []
    for level in range(1, depth + 1):
        pattern = "/".join(["*"] * level + [".durable_nb", "cache.db"])
        found += sorted(str(db.parent.relative_to(folder)) for db in folder.glob(pattern))
    return found[:limit]

