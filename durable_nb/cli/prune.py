"""``durable-nb prune`` (old runs removed, by hand) and ``durable-nb retention`` (the
journal's policy, which its sweep applies), and the line ``durable-nb runs`` ends with once
runs were pruned. The work is :mod:`durable_nb.retention`'s."""

from __future__ import annotations

import argparse
import json
from typing import Any

from ..journal import Journal, open_journal
from ..retention.policy import (PRUNABLE, RetentionPolicy, duration_words, last_applied,
                                read_policy, set_policy)
from ..retention.prune import prune
from ..retention.sweep import PruneResult, pruned_note
from ..timestamps import format_time

__all__ = ["HELP", "add_prune_commands", "prune_lines", "pruned_note", "retention_command",
           "run_prune_command"]

#: The commands' lines in ``durable-nb``'s list.
HELP = {
    "prune": "remove runs that ended long ago (--older-than 30d; --dry-run, --export DIR)",
    "retention": "the journal's retention policy, applied by its sweep (--older-than 90d; "
                 "--off)",
}

_STATUSES = ",".join(s.value.lower() for s in PRUNABLE)
#: How many runs kept for a reason of safety ``prune`` names one by one.
NAMED_KEPT = 20


def add_prune_commands(sub: Any) -> None:
    """Add ``prune`` and ``retention`` to ``durable-nb``'s subcommands (``sub``)."""
    p = sub.add_parser("prune", help=HELP["prune"], description=(
        "Remove runs that ended (DONE, FAILED, CANCELLED) and have not changed for a while, "
        "with their child runs, steps, stored inputs and history; a batch whole or not at "
        "all. Never removed: a run that waits, runs or was interrupted, one holding a "
        "request nobody decided, a fork's source while the fork is kept, a run executing "
        "now. The prune is recorded in the journal (`durable-nb runs` says so) and the "
        "space given back."))
    p.add_argument("--older-than", required=True, metavar="AGE",
                   help="unchanged for at least AGE: 30d, 12h, 90m, seconds")
    _scope_options(p)
    p.add_argument("--dry-run", action="store_true",
                   help="only list what would be removed; nothing is written")
    p.add_argument("--export", metavar="DIR",
                   help="first write each run removed to DIR as JSON (RUN.json; a batch also "
                        "as BATCH.batch.jsonl; never over an earlier export: RUN (2).json), "
                        "for an audit trail; not with --dry-run")
    p.add_argument("--by", metavar="WHO",
                   help="who prunes, as the journal records it (default: user@host)")
    p.add_argument("--json", action="store_true", help="print JSON")
    p = sub.add_parser("retention", help=HELP["retention"], description=(
        "Show or set the journal's retention policy: its sweep (a Jupyter server's, "
        "`durable-nb sweep`, a JupyterHub's durable-nb service) prunes by it, at most once "
        "per --every. Without options: show it."))
    how = p.add_mutually_exclusive_group()
    how.add_argument("--older-than", metavar="AGE",
                     help="set the policy: prune runs unchanged for AGE (30d, 12h ...)")
    how.add_argument("--off", action="store_true", help="remove the policy: keep every run")
    _scope_options(p)
    p.add_argument("--every", metavar="PERIOD",
                   help="how often the sweep applies it (default 1d)")


def _scope_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("--status", metavar="S[,S]",
                   help=f"only runs in these statuses (default {_STATUSES})")
    p.add_argument("--prefix", metavar="P", help="only runs whose id starts with P")


def run_prune_command(args: argparse.Namespace) -> int:
    """``durable-nb prune`` as ``args`` say: prints what was removed and kept."""
    journal = open_journal(args.journal, read_only=args.dry_run)
    result = prune(args.older_than, status=args.status, prefix=args.prefix,
                   dry_run=args.dry_run, export=args.export, journal=journal, by=args.by,
                   via="durable-nb prune")
    if args.json:
        print(json.dumps(_result_json(result), indent=2))
    else:
        print("\n".join(prune_lines(result, journal.reclaimed_space_note)))
    return 0


def _result_json(result: PruneResult) -> dict[str, Any]:
    return {"dry_run": result.dry_run, "at": result.at, "by": result.by,
            "policy": result.policy.to_dict(),
            "removed": [r.run_id for r in result.removed], "statuses": result.statuses,
            "child_runs": result.children, "batches": result.batches,
            "kept": [{"run_id": k.run_id, "rule": k.rule, "reason": k.reason}
                     for k in result.kept],
            "bytes_before": result.bytes_before, "bytes_after": result.bytes_after,
            "reclaim_error": result.reclaim_error}


def prune_lines(result: PruneResult, space_note: str = "") -> list[str]:
    """What a prune removed and kept, for people (``space_note``: what the journal does
    with the space freed, said beside its size)."""
    runs = len(result.removed)
    verb = "would remove" if result.dry_run else "removed"
    statuses = ", ".join(f"{k} {v}" for k, v in sorted(result.statuses.items()))
    extra = []
    if result.children:
        extra.append(f"{len(result.children)} child run{'s' * (len(result.children) != 1)}")
    if result.batches:
        extra.append(f"{len(result.batches)} whole batch{'es' * (len(result.batches) != 1)}")
    head = f"{verb} {runs} run{'' if runs == 1 else 's'}"
    if statuses:
        head += f" ({statuses})"
    if extra:
        head += ", with " + " and ".join(extra)
    lines = [f"{head}: {result.policy.describe()}"]
    ordinary = {"newer": 0, "status": 0}
    guarded = []
    for kept in result.kept:
        if kept.rule in ordinary:
            ordinary[kept.rule] += 1
        else:
            guarded.append(kept)
    if ordinary["newer"]:
        lines.append(f"kept {ordinary['newer']} that changed within the last "
                     f"{duration_words(result.policy.older_than)}")
    if ordinary["status"]:
        lines.append(f"kept {ordinary['status']} in other statuses")
    if guarded:
        lines.append(f"kept {len(guarded)} that must stay:")
        width = min(max(len(k.run_id) for k in guarded), 40)
        lines += [f"  {k.run_id.ljust(width)}  {k.reason}" for k in guarded[:NAMED_KEPT]]
        if len(guarded) > NAMED_KEPT:
            lines.append(f"  ... and {len(guarded) - NAMED_KEPT} more (--json lists them all)")
    if result.bytes_before is not None and result.bytes_after is not None and runs:
        lines.append(f"journal size: {_size(result.bytes_before)} before, "
                     f"{_size(result.bytes_after)} after"
                     f"{f' ({space_note})' if space_note else ''}")
    if result.reclaim_error:
        lines.append(f"the space was not given back ({result.reclaim_error}); the next "
                     f"prune tries again")
    return lines


def _size(count: int) -> str:
    for unit, size in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if count >= size:
            return f"{count / size:.1f} {unit}"
    return f"{count} bytes"


def retention_command(args: argparse.Namespace) -> int:
    """``durable-nb retention``: show the journal's policy, set it, or remove it."""
    if args.older_than is None and not args.off:
        if args.status or args.prefix or args.every:
            raise ValueError("--status, --prefix and --every go with --older-than (set a "
                             "policy); alone, `durable-nb retention` shows it")
        journal = open_journal(args.journal, read_only=True)
        print(_policy_line(journal))
        return 0
    journal = open_journal(args.journal)
    policy = None if args.off else RetentionPolicy.of(args.older_than, args.status,
                                                      args.prefix, args.every)
    set_policy(journal, policy)
    print(_policy_line(journal))
    return 0


def _policy_line(journal: Journal) -> str:
    policy = read_policy(journal)
    if policy is None:
        return (f"no retention policy: {journal.location} keeps every run until it is "
                f"pruned (durable-nb prune) or deleted")
    applied = (last_applied(journal) or {}).get("at")
    last = f"; last applied {format_time(applied)}" if applied else "; not applied yet"
    return (f"retention policy: prune {policy.describe()}, at most every "
            f"{duration_words(policy.every)} by the journal's sweep{last}")
