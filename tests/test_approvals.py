"""Approvals bound to what was shown (issue 17, item 15): a decision is applied only to the
pending request whose name and details the person saw, and concurrent approvals never take
or remove each other's decisions."""

from __future__ import annotations

import asyncio
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

import durable_nb as dn
from durable_nb import Status
from durable_nb.approvals.decide import decide
from durable_nb.approvals.request import decision_kind, find_decision, request_digest

REPO = Path(__file__).resolve().parents[1]
_WHEN = r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d"


def _drop(db: str, dropped: list[str]):
    """A cell that drops the database named in its approval, once approved."""
    def handler(ctx):
        if ctx.approval("drop database", {"db": db}).approved:
            ctx.run("drop", lambda: dropped.append(db))
            return f"dropped {db}"
        return "kept"
    return handler


def _cli(journal, *args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    return subprocess.run([sys.executable, "-m", "durable_nb.cli", "--journal",
                           str(journal.directory), *args],
                          capture_output=True, text=True, timeout=120, env=env)


def test_an_approval_whose_details_changed_waits_for_a_new_decision(journal):
    dropped: list[str] = []
    assert dn.execute("r", _drop("staging", dropped), journal=journal,
                      on_approval="park") is None
    staging = journal.get_run("r").pending_approval
    assert staging["digest"] == request_digest("drop database", {"db": "staging"})
    dn.approve("r", "staging is fine", journal=journal)

    # The cell is edited: the approval at the same step now asks about production.
    assert dn.execute("r", _drop("production", dropped), journal=journal,
                      on_approval="park") is None
    record = journal.get_run("r")
    assert record.status is Status.WAITING_APPROVAL and dropped == []
    production = record.pending_approval
    assert production["details"] == {"db": "production"} and production["key"] == staging["key"]
    assert production["digest"] == request_digest("drop database", {"db": "production"})
    assert production["id"] != staging["id"]
    assert production["replaces"]["details"] == {"db": "staging"}
    # The decision on staging is kept in the journal, not applied.
    kept = journal.get_request(decision_kind(staging), "r")
    assert kept["digest"] == staging["digest"] and kept["note"] == "staging is fine"
    assert find_decision(journal, "r", production) is None

    dn.approve("r", "production too", expect=production["digest"][:10], journal=journal)
    assert dn.execute("r", _drop("production", dropped), journal=journal) == \
        "dropped production"
    assert dropped == ["production"]
    step = next(e for e in journal.steps("r") if e.kind == "approval")
    assert step.result["digest"] == production["digest"]
    assert step.result["note"] == "production too"


def test_a_decision_for_a_request_no_longer_pending_is_refused(journal):
    dropped: list[str] = []
    dn.execute("r", _drop("staging", dropped), journal=journal, on_approval="park")
    seen = journal.get_run("r").pending_approval["digest"]
    dn.execute("r", _drop("production", dropped), journal=journal, on_approval="park")
    pending = journal.get_run("r").pending_approval
    with pytest.raises(dn.ApprovalChanged, match="production") as info:
        dn.approve("r", expect=seen, journal=journal)
    assert "nothing was decided" in str(info.value)
    assert isinstance(info.value, dn.NoPendingApproval)
    assert find_decision(journal, "r", pending) is None
    assert journal.get_request(decision_kind(pending), "r") is None


def test_the_cli_shows_and_decides_the_request_it_names(journal):
    dropped: list[str] = []
    dn.execute("r", _drop("staging", dropped), journal=journal, on_approval="park")
    staging = journal.get_run("r").pending_approval["digest"]
    dn.execute("r", _drop("production", dropped), journal=journal, on_approval="park")
    production = journal.get_run("r").pending_approval["digest"]

    shown = _cli(journal, "show", "r")
    assert shown.returncode == 0, shown.stderr
    assert f"details digest {production[:12]}): db: production" in shown.stdout
    assert "the request at this step changed" in shown.stdout and staging[:12] in shown.stdout

    refused = _cli(journal, "approve", "r", "--expect", staging[:12])
    assert refused.returncode != 0 and "nothing was decided" in refused.stderr + refused.stdout
    # One name for one thing (issue 41): the id is the request id, the digest a details digest.
    waiting = journal.get_run("r").pending_approval
    assert (f"(request id {waiting['id']}, details digest {production[:12]}), not for the "
            f"request that was seen (request id {waiting['id']}, details digest {staging[:12]})"
            ) in refused.stderr, refused.stderr

    approved = _cli(journal, "approve", "r", "ok", "--by", "ana")
    assert approved.returncode == 0, approved.stderr
    assert "approved run r (by ana)" in approved.stdout
    request_id = journal.get_run("r").pending_approval["id"]
    assert (f'{{"db": "production"}} (request id {request_id}, details digest '
            f'{production[:12]})') in approved.stdout
    assert dn.execute("r", _drop("production", dropped), journal=journal) == \
        "dropped production"
    listing = _cli(journal, "show", "r").stdout
    assert re.search(rf"approved by ana via durable-nb at {_WHEN} \(.ok.\) \(details digest "
                     rf"{production[:12]}\)", listing), listing


def test_concurrent_approvals_never_take_or_remove_each_others_decisions(journal):
    async def handler(ctx):
        async def ask(name: str) -> str:
            decision = ctx.approval(name, {"what": name})
            return f"{name}:{decision.note}"
        return await asyncio.gather(ask("a"), ask("b"))

    assert dn.execute("r", handler, journal=journal, on_approval="park") is None
    first = journal.get_run("r").pending_approval
    assert first["name"] == "a"
    dn.approve("r", "for a", journal=journal)
    assert dn.execute("r", handler, journal=journal, on_approval="park") is None
    second = journal.get_run("r").pending_approval
    assert second["name"] == "b" and second["id"] != first["id"]
    taken = journal.get_request(decision_kind(first), "r")  # a's, taken by a, kept
    assert taken["note"] == "for a" and taken["taken_at"] >= taken["at"]
    dn.approve("r", "for b", journal=journal)
    # A late decision on a (from someone who read the run while a was pending) goes to a's
    # own place, where a's taken decision refuses it: b's is neither replaced nor removed.
    with pytest.raises(dn.DecisionExists, match="has taken that decision"):
        decide(journal, "r", request_id=first["id"], digest=first["digest"], approved=False,
               note="late", by="bo", via="test", replace=True)
    assert find_decision(journal, "r", second)["note"] == "for b"
    assert dn.execute("r", handler, journal=journal) == ["a:for a", "b:for b"]
    assert journal.get_request(decision_kind(first), "r")["note"] == "for a"
    dn.delete("r", journal=journal)
    assert journal.get_request(decision_kind(first), "r") is None  # deleted with the run


def _as_older_version(journal, run_id: str) -> None:
    """Rewrite the run's pending approval and decision as a durable_nb without digests
    left them: no digest, no id, the decision under ``decision`` with the step key only."""
    record = journal.get_run(run_id)
    pending = record.pending_approval
    decision = journal.get_request(decision_kind(pending), run_id)
    journal.delete_request(decision_kind(pending), run_id)
    record.pending_approval = {k: v for k, v in pending.items() if k not in ("digest", "id")}
    journal.put_run(record)
    journal.put_request("decision", run_id, {k: v for k, v in decision.items()
                                             if k not in ("digest", "name")})


def test_an_older_decision_without_digest_applies_only_to_the_request_it_was_given_for(
        journal):
    dropped: list[str] = []
    for run_id in ("same", "edited"):
        dn.execute(run_id, _drop("staging", dropped), journal=journal, on_approval="park")
        dn.approve(run_id, journal=journal)
        _as_older_version(journal, run_id)
    # Resumed unchanged: the pending request it was given for showed exactly this.
    assert dn.execute("same", _drop("staging", dropped), journal=journal) == "dropped staging"
    # Resumed edited: a new request, which the older decision does not decide.
    assert dn.execute("edited", _drop("production", dropped), journal=journal,
                      on_approval="park") is None
    assert dropped == ["staging"]
    pending = journal.get_run("edited").pending_approval
    assert pending["details"] == {"db": "production"} and pending["id"]
    assert journal.get_request("decision", "edited") is not None  # kept, not applied


def test_a_child_runs_approval_is_decided_through_its_parent(journal):
    def sub(ctx, db):
        return ctx.approval("drop database", {"db": db}).note

    def parent(ctx):
        return ctx.child("cleanup", sub, "staging")

    assert dn.execute("p", parent, journal=journal, on_approval="park") is None
    shown = journal.get_run("p").pending_approval
    child = shown["run_id"]
    assert child != "p" and journal.get_run(child).pending_approval["id"] == shown["id"]
    dn.approve("p", "via the parent", expect=shown["digest"], journal=journal)
    assert journal.get_request(decision_kind(shown), child)["note"] == "via the parent"
    assert dn.execute("p", parent, journal=journal) == "via the parent"
