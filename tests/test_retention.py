"""Retention (issue 42): ``durable_nb.prune``, ``durable-nb prune`` and the journal's
retention policy applied by ``tick``, on both journals (a real diskcache directory and a
real PostgreSQL schema, tests/test_journal_conformance.py's backends). Ages come from an
injected clock (``now=``): the runs are written now, the prunes happen weeks later."""

from __future__ import annotations

import base64
import hashlib
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

import durable_nb as dn
from durable_nb.approvals.tick import tick
from durable_nb.errors import RetentionError
from durable_nb.execution.lease import Lease
from durable_nb.journal import BatchRecord, Journal, RunRecord, Status, StepEntry
from durable_nb.retention.policy import RetentionPolicy, set_policy
from durable_nb.retention.prune import export_name
from durable_nb.retention.sweep import apply_policy, policy_due_here, pruned_note
from tests.test_journal_conformance import Backend, backend  # noqa: F401 (a fixture)

DAY = 86400.0
REPO = Path(__file__).resolve().parents[1]

def _payload() -> str:
    """40 KB that do not compress (as PostgreSQL's TOAST would compress repeated text): over
    diskcache's 32 KiB, a value file of its own."""
    return base64.b64encode(os.urandom(30_000)).decode()


def _run(journal: Journal, run_id: str, at: float, status: Status = Status.DONE, *,
         steps: int = 2, **fields) -> RunRecord:
    """A run written as an executor leaves it, ``at`` (its created, updated and finished
    times), with ``steps`` entries each holding a large result and a blob."""
    record = RunRecord(run_id=run_id, status=status, created_at=at, updated_at=at,
                       finished_at=at if status is not Status.RUNNING else None, **fields)
    assert journal.create_run(record)
    for position in range(steps):
        record.step_count = position + 1
        journal.append_step(run_id, StepEntry(position, str(position), "work", "run",
                                              result=_payload(), started_at=at, finished_at=at),
                            record_json=record.to_json(),
                            blobs={f"d{position}": json.dumps(_payload()[:5000])})
    return record


#: Another process executing run ``busy`` (a DONE run replayed, say): it holds the run's
#: lease, renewing it, until its stdin closes.
_EXECUTOR = """
import sys, threading
from durable_nb.execution.lease import Lease
from durable_nb.journal import open_journal
lease = Lease.acquire(open_journal(sys.argv[1]), "busy")
def renew():
    while not done.wait(2):
        lease.renew()
done = threading.Event()
threading.Thread(target=renew, daemon=True).start()
print("held", flush=True)
sys.stdin.read()
done.set()
lease.release()
"""


def _executing_elsewhere(location: str) -> subprocess.Popen:
    child = subprocess.Popen([sys.executable, "-c", _EXECUTOR, location], text=True,
                             stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                             env={**os.environ, "PYTHONPATH": str(REPO)})
    assert child.stdout.readline().strip() == "held"
    return child


def _world(journal: Journal, t: float) -> None:
    """Runs written at ``t``: those a prune 30 days later removes, one of each kind that
    must stay, and a second wave written 45 days later."""
    for name in ("done-1", "done-2", "withkids", "osrc", "busy", "parent", "src"):
        _run(journal, name, t)
    _run(journal, "failed-1", t, Status.FAILED, error="ValueError: no")
    _run(journal, "cancelled-1", t, Status.CANCELLED, error="cancelled")
    _run(journal, "withkids/0", t, parent="withkids")
    _run(journal, "osrc@1", t, forked_from={"run_id": "osrc", "at_step": 1})  # removed with it
    # A batch whose items all ended: pruned whole.
    for key in ("a", "b"):
        _run(journal, f"OB/{key}", t)
    journal.put_batch(BatchRecord("OB", keys=["a", "b"], created_at=t))
    # Kinds that must stay, all as old as the rest.
    _run(journal, "waits", t, Status.WAITING_APPROVAL,
         pending_approval={"name": "send_email", "id": "1" * 32})
    _run(journal, "runs", t, Status.RUNNING)
    _run(journal, "interrupted", t, Status.FAILED, error="interrupted at step 1",
         attempts=[{"n": 1, "end": "interrupted"}])
    _run(journal, "undecided", t, Status.CANCELLED, error="cancelled",
         pending_approval={"name": "pay", "id": "2" * 32})
    _run(journal, "parent/1", t, Status.WAITING_APPROVAL, parent="parent",
         pending_approval={"name": "ask", "id": "3" * 32})
    _run(journal, "src@1", t + 45 * DAY, forked_from={"run_id": "src", "at_step": 1})
    for key, status in (("a", Status.DONE), ("b", Status.RUNNING)):
        _run(journal, f"KB/{key}", t, status)
    journal.put_batch(BatchRecord("KB", keys=["a", "b"], created_at=t))
    # The second wave.
    _run(journal, "young-1", t + 45 * DAY)
    _run(journal, "young-2", t + 45 * DAY, Status.FAILED, error="ValueError: late")


FIRST_WAVE = {"done-1", "done-2", "failed-1", "cancelled-1", "withkids", "osrc", "osrc@1",
              "OB/a", "OB/b"}
MUST_STAY = {"waits": "waiting", "runs": "running", "interrupted": "interrupted",
             "undecided": "undecided", "parent": "waiting", "src": "fork", "busy": "executing",
             "KB/a": "running", "KB/b": "running"}


_HASH_FILES = """
import hashlib, sys
from pathlib import Path
digest = hashlib.sha256()
for path in sorted(Path(sys.argv[1]).rglob("*")):
    if path.is_file() and path.suffix != ".db-shm":  # SQLite's shared memory, readers write it
        digest.update(str(path).encode() + path.read_bytes())
print(digest.hexdigest())
"""


def _fingerprint(backend: Backend) -> str:
    """A hash of everything the journal stores (files, or the schema's tables)."""
    if backend.kind == "disk":
        # Hashed by another process: opening and closing the database's files here would
        # drop this process's SQLite locks on them (POSIX locks are per process).
        return subprocess.run([sys.executable, "-c", _HASH_FILES, backend.location],
                              capture_output=True, text=True, check=True).stdout
    tables = ("meta", "runs", "steps", "blobs", "leases", "requests", "deliveries", "batches")
    return hashlib.sha256(repr({t: sorted(backend.sql(f"SELECT * FROM {{s}}.{t}"), key=repr)
                                for t in tables}).encode()).hexdigest()


def test_two_waves_pruned_each_kind_that_must_stay_kept_a_second_prune_removes_nothing(
        backend: Backend, tmp_path: Path):
    journal = backend.open()
    t = time.time()
    _world(journal, t)
    busy = _executing_elsewhere(backend.location)
    try:
        before = _fingerprint(backend)
        dry = dn.prune("30d", journal=journal, now=t + 60 * DAY, dry_run=True)
        assert _fingerprint(backend) == before, "a dry run wrote to the journal"
        assert {r.run_id for r in dry.removed} == FIRST_WAVE
        assert {k.run_id: k.rule for k in dry.kept}["busy"] == "executing"

        exported = tmp_path / "audit"
        first = dn.prune("30d", journal=journal, now=t + 60 * DAY, export=exported, by="ops")
        assert {r.run_id for r in first.removed} == FIRST_WAVE
        assert first.children == ["withkids/0"] and first.batches == ["OB"]
        assert first.statuses == {"DONE": 7, "FAILED": 1, "CANCELLED": 1}
        rules = {k.run_id: k.rule for k in first.kept}
        assert {run: rules.get(run) for run in MUST_STAY} == MUST_STAY
        assert rules["young-1"] == rules["young-2"] == "newer"
        for run_id in (*FIRST_WAVE, "withkids/0"):
            assert journal.find_run(run_id) is None
            assert journal.get_step(run_id, 0) is None and journal.get_blob(run_id, "d0") is None
            data = json.loads((exported / export_name(run_id)).read_text())
            assert data["run"]["run_id"] == run_id
        assert journal.find_batch("OB") is None and journal.find_batch("KB") is not None
        assert (exported / "OB.batch.jsonl").read_text().count("\n") == 2
        for run_id in MUST_STAY:
            assert journal.find_run(run_id) is not None
        print(f"\n[{backend.kind}] first prune: {len(first.removed)} runs, journal "
              f"{first.bytes_before} bytes before, {first.bytes_after} after")

        again = dn.prune("30d", journal=journal, now=t + 60 * DAY)
        assert again.removed == [] and again.children == [] and again.batches == []

        second = dn.prune("30d", journal=journal, now=t + 90 * DAY, by="ops")
        assert {r.run_id for r in second.removed} == {"young-1", "young-2", "src@1", "src"}
        assert {run: {k.run_id: k.rule for k in second.kept}.get(run)
                for run in MUST_STAY if run != "src"} == \
            {run: rule for run, rule in MUST_STAY.items() if run != "src"}
    finally:
        busy.communicate("", timeout=60)

    events = journal.journal_events()
    assert [(e["kind"], e["runs"], e["by"], e["via"]) for e in events] == [
        ("pruned", 9, "ops", "python"), ("pruned", 4, "ops", "python")]
    assert events[0]["statuses"] == {"DONE": 7, "FAILED": 1, "CANCELLED": 1}
    assert pruned_note(journal).startswith("4 runs pruned on ")
    assert "13 in 2 prunes" in pruned_note(journal)


def test_the_space_comes_back(backend: Backend):
    journal = backend.open()
    t = time.time()
    for n in range(60):
        _run(journal, f"big-{n}", t, steps=3)
    size_full = journal.size_on_disk()
    result = dn.prune("30d", journal=journal, now=t + 31 * DAY)
    assert len(result.removed) == 60
    assert result.bytes_before >= size_full
    print(f"\n[{backend.kind}] 60 runs of 3 x 40 KB steps: {result.bytes_before} bytes before "
          f"the prune, {result.bytes_after} after")
    if backend.kind == "disk":
        # VACUUM rewrote the database file; the value files went with their rows.
        assert result.bytes_after < result.bytes_before / 10
        assert journal.size_on_disk() < result.bytes_before / 10
    else:
        # VACUUM makes the space free for new rows: the same runs written again take it
        # instead of growing the tables.
        for n in range(60):
            _run(journal, f"again-{n}", t, steps=3)
        size_again = journal.size_on_disk()
        print(f"[{backend.kind}] the same 60 runs written again: {size_again} bytes")
        assert size_again < result.bytes_before * 1.15


def test_the_journal_s_policy_is_applied_by_a_sweep_at_most_once_per_period(
        backend: Backend):
    journal = backend.open()
    t = time.time()
    _run(journal, "old", t)
    _run(journal, "waits", t, Status.WAITING_APPROVAL,
         pending_approval={"name": "send_email", "id": "1" * 32})
    assert apply_policy(journal, now=t + 60 * DAY) is None  # no policy: every run kept
    set_policy(journal, RetentionPolicy.of("30d", every="1d"))
    # A deadline's tick never prunes: the sweepers apply the policy.
    tick(journal, now=t + 60 * DAY)
    assert journal.find_run("old") is not None
    # A sweeper that reads the journal read-only is told to open it for writing.
    reader = backend.open(read_only=True)
    assert policy_due_here(reader, now=t + 60 * DAY)
    assert apply_policy(reader, now=t + 60 * DAY) is None
    pruned = apply_policy(journal, now=t + 60 * DAY)
    assert [r.run_id for r in pruned.removed] == ["old"]
    assert journal.find_run("old") is None and journal.find_run("waits") is not None
    _run(journal, "later", t)
    assert apply_policy(journal, now=t + 60 * DAY + 3600) is None  # applied an hour ago
    assert not policy_due_here(reader, now=t + 60 * DAY + 3600)
    assert [r.run_id for r in apply_policy(journal, now=t + 61 * DAY).removed] == ["later"]
    assert [e["via"] for e in journal.journal_events()] == ["policy", "policy"]
    assert journal.journal_events()[0]["by"].startswith("retention policy")


def test_statuses_that_never_go_are_refused_in_one_line():
    with pytest.raises(RetentionError, match="never removes RUNNING"):
        RetentionPolicy.of("30d", "done,running")
    with pytest.raises(RetentionError, match="older_than=.*is not a duration"):
        RetentionPolicy.of("a month")


def _cli(location: str, *args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    return subprocess.run([sys.executable, "-m", "durable_nb.cli", "--journal", location,
                           *args], capture_output=True, text=True, timeout=120, env=env)


def test_the_command_line_prunes_exports_and_says_so_in_runs_and_show(
        backend: Backend, tmp_path: Path):
    journal = backend.open()
    t = time.time() - 40 * DAY  # the command line measures ages by the clock
    _run(journal, "old-1", t)
    _run(journal, "old-2", t, Status.FAILED, error="ValueError: no")
    _run(journal, "waits", t, Status.WAITING_APPROVAL,
         pending_approval={"name": "send_email", "id": "1" * 32})
    _run(journal, "new", time.time())
    before = _fingerprint(backend)
    dry = _cli(backend.location, "prune", "--older-than", "30d", "--dry-run")
    assert dry.returncode == 0, dry.stderr
    assert _fingerprint(backend) == before
    assert dry.stdout.splitlines()[0].startswith("would remove 2 runs (DONE 1, FAILED 1)")
    assert "waits  it waits for a decision" in dry.stdout
    listed = json.loads(_cli(backend.location, "prune", "--older-than", "30d", "--dry-run",
                             "--json").stdout)
    assert (listed["dry_run"], sorted(listed["removed"])) == (True, ["old-1", "old-2"])
    assert {k["run_id"]: k["rule"] for k in listed["kept"]} == {"waits": "waiting",
                                                                 "new": "newer"}

    done = _cli(backend.location, "prune", "--older-than", "30d", "--export",
                str(tmp_path / "audit"))
    assert done.returncode == 0, done.stderr
    print(done.stdout)
    assert done.stdout.startswith("removed 2 runs (DONE 1, FAILED 1)")
    assert "journal size:" in done.stdout
    assert sorted(p.name for p in (tmp_path / "audit").iterdir()) == ["old-1.json", "old-2.json"]
    runs = _cli(backend.location, "runs")
    assert "2 runs pruned on " in runs.stdout.splitlines()[-1]
    show = _cli(backend.location, "show", "old-1")
    assert show.returncode == 1 and "2 runs pruned on" in show.stderr

    bad = _cli(backend.location, "prune", "--older-than", "30d", "--status", "waiting_approval")
    assert bad.returncode == 1 and len(bad.stderr.splitlines()) == 1
    assert "never removes WAITING_APPROVAL" in bad.stderr

    policy = _cli(backend.location, "retention", "--older-than", "90d", "--status", "done")
    assert policy.returncode == 0, policy.stderr
    assert _cli(backend.location, "retention").stdout.startswith(
        "retention policy: prune DONE runs unchanged for 90 days, at most every 1 day")
    assert "no retention policy" in _cli(backend.location, "retention", "--off").stdout

    _run(journal, "old-3", t)
    assert _cli(backend.location, "retention", "--older-than", "30d").returncode == 0
    swept = _cli(backend.location, "sweep", "--once")
    assert swept.returncode == 0, swept.stderr
    assert swept.stdout.strip().endswith("pruned 1 run by the journal's retention policy")
    assert journal.find_run("old-3") is None and journal.find_run("waits") is not None


@pytest.mark.postgres
def test_on_a_hub_only_the_service_prunes_by_the_journal_s_policy(postgres_server,
                                                                   monkeypatch):
    """Real PostgreSQL roles set up as the hub's service sets them up (tests/hub_roles.py):
    ana's role writes her runs; pruning them is the service's."""
    from durable_nb.approvals.authority import SERVICE_VARIABLE, TOKEN_VARIABLE
    from durable_nb.errors import DatabaseError, PruneRefused
    from tests.hub_roles import make_hub_database

    for variable in (SERVICE_VARIABLE, TOKEN_VARIABLE, "JUPYTERHUB_USER"):
        monkeypatch.delenv(variable, raising=False)
    database = make_hub_database(postgres_server, users=("ana",))
    ana, service = database.journal("ana"), database.journal("service")
    try:
        t = time.time()
        _run(ana, "old", t)
        _run(ana, "kept", t, Status.WAITING_APPROVAL,
             pending_approval={"name": "send_email", "id": "1" * 32})
        service.add_event("old", {"kind": "decided", "text": "approved by bo"})

        with pytest.raises(PruneRefused) as refused:
            dn.prune("30d", journal=ana, now=t + 60 * DAY)
        assert str(refused.value) == (
            f"on this hub's journal only the role {database.service_role} (the durable-nb hub "
            f"service) removes runs, by the journal's retention policy; ask your hub's "
            f"administrator.")
        with pytest.raises(PruneRefused):
            set_policy(ana, RetentionPolicy.of("30d"))
        with pytest.raises(DatabaseError):  # and the database refuses her role itself
            ana.put_setting("retention", RetentionPolicy.of("1d").to_dict())
        with pytest.raises(DatabaseError, match="deletes a run's history"):
            ana.delete_run("old")
        assert ana.find_run("old") is not None

        set_policy(service, RetentionPolicy.of("30d"))
        # Her server's sweeper never opens the journal for writing to prune (only the
        # service stamps the policy applied: it would be due at her every sweep).
        assert not policy_due_here(ana, now=t + 60 * DAY)
        assert apply_policy(ana, now=t + 60 * DAY) is None  # her kernel's sweep leaves it
        assert policy_due_here(service, now=t + 60 * DAY)
        pruned = apply_policy(service, now=t + 60 * DAY)
        assert [r.run_id for r in pruned.removed] == ["old"]
        assert [k.rule for k in pruned.kept] == ["waiting"]
        assert ana.find_run("old") is None and service.events("old") == []
        assert pruned_note(ana).startswith("1 run pruned on ")
        assert ana.journal_events()[0]["by"].startswith("retention policy")
    finally:
        ana.dispose()
        service.dispose()


def test_a_batch_goes_in_one_transaction_fenced_by_every_item_s_lease(backend: Backend):
    journal = backend.open()
    t = time.time()
    for key in ("a", "b"):
        _run(journal, f"B/{key}", t)
    _run(journal, "B/a/child", t, parent="B/a")
    journal.put_batch(BatchRecord("B", keys=["a", "b"], created_at=t))
    held = {key: Lease.acquire(journal, f"B/{key}") for key in ("a", "b")}
    try:
        stale = {"B/a": held["a"].token, "B/b": "not-the-token"}
        with pytest.raises(dn.RunLeased):
            journal.delete_batch("B", stale, children=["B/a/child"])
        assert journal.find_batch("B") is not None  # nothing removed
        assert {r.run_id for r in journal.list_runs("B/")} == {"B/a", "B/b", "B/a/child"}
        journal.delete_batch("B", {f"B/{k}": lease.token for k, lease in held.items()},
                             children=["B/a/child"])
    finally:
        for lease in held.values():
            lease.release()
    assert journal.find_batch("B") is None and journal.list_runs("B/") == []
    assert journal.get_step("B/a", 0) is None and journal.lease("B/a") is None


def test_settings_and_the_journal_s_own_history_are_kept_apart_from_runs(backend: Backend):
    journal = backend.open()
    assert journal.setting("retention") is None and journal.journal_events() == []
    journal.put_setting("retention", {"older_than": 60})
    assert journal.setting("retention") == {"older_than": 60}
    journal.add_journal_event({"kind": "pruned", "runs": 1})
    journal.add_journal_event({"kind": "pruned", "runs": 2})
    assert [e["runs"] for e in journal.journal_events()] == [1, 2]
    assert journal.list_runs() == [] and journal.list_batches() == []
    journal.put_setting("retention", None)
    assert journal.setting("retention") is None
    with pytest.raises(ValueError, match="unknown journal setting 'format'"):
        journal.put_setting("format", {"version": 99})
    reader = backend.open(read_only=True)
    assert [e["runs"] for e in reader.journal_events()] == [1, 2]


def test_the_plan_keeps_a_batch_item_asked_for_alone_and_a_chain_of_forks_in_order():
    from durable_nb.retention.plan import plan_prune

    t = 1000.0
    old = dict(created_at=t, updated_at=t, finished_at=t, status=Status.DONE)
    records = [RunRecord("B/a", **old), RunRecord("B/b", **old), RunRecord("r", **old),
               RunRecord("r@1", forked_from={"run_id": "r"}, **old),
               RunRecord("r@1@1", forked_from={"run_id": "r@1"}, **old)]
    batch = BatchRecord("B", keys=["a", "b"], updated_at=t)
    policy = RetentionPolicy.of("1d")
    alone = plan_prune(records, [batch], RetentionPolicy.of("1d", prefix="B/a"), t + 2 * 86400)
    assert alone.units == [] and [(k.run_id, k.rule) for k in alone.kept] == [("B/a", "batch")]
    whole = plan_prune(records, [batch], policy, t + 2 * 86400)
    assert [u.run_ids for u in whole.units] == [["r@1@1"], ["r@1"], ["B/a", "B/b"], ["r"]]
    young_fork = [*records[:4], RunRecord("r@1@1", forked_from={"run_id": "r@1"},
                                          created_at=t + 86400 * 1.5, status=Status.DONE)]
    kept = plan_prune(young_fork, [batch], policy, t + 2 * 86400)
    assert {k.run_id: k.rule for k in kept.kept} == {"r@1@1": "newer", "r@1": "fork",
                                                      "r": "fork"}


def test_a_run_resumed_or_forked_after_the_plan_is_judged_again_under_its_lease(
        backend: Backend, monkeypatch):
    from durable_nb.retention import sweep

    journal = backend.open()
    t = time.time()
    for run_id in ("resumed", "forked", "gone"):
        _run(journal, run_id, t)
    policy = RetentionPolicy.of("30d")
    planned = sweep.plan_for(journal, policy, t + 60 * DAY)
    # Between the plan and the removal: one run is executed again, another forked.
    record = journal.get_run("resumed")
    record.status = Status.RUNNING
    journal.put_run(record)
    _run(journal, "forked@1", t + 60 * DAY, forked_from={"run_id": "forked", "at_step": 1})
    monkeypatch.setattr(sweep, "plan_for", lambda *args: planned)
    result = sweep.carry_out(journal, policy, now=t + 60 * DAY)
    assert [r.run_id for r in result.removed] == ["gone"]
    assert {k.run_id: k.rule for k in result.kept} == {"resumed": "running", "forked": "fork"}
    assert journal.find_run("resumed") is not None and journal.find_run("forked") is not None
    assert journal.lease("resumed") is None and journal.lease("forked") is None  # released


def test_an_item_started_after_the_plan_keeps_its_batch(backend: Backend, monkeypatch):
    """The batch record is read again under the items' leases: an item added and started
    since the plan (not in the unit, so not leased) keeps the batch and every item."""
    from durable_nb.retention import sweep

    journal = backend.open()
    t = time.time()
    for key in ("a", "b"):
        _run(journal, f"B/{key}", t)
    journal.put_batch(BatchRecord("B", keys=["a", "b"], created_at=t))
    policy = RetentionPolicy.of("30d")
    planned = sweep.plan_for(journal, policy, t + 60 * DAY)
    assert [u.batch_id for u in planned.units] == ["B"]
    batch = journal.find_batch("B")
    batch.keys.append("c")
    journal.put_batch(batch)
    _run(journal, "B/c", t, Status.RUNNING)
    monkeypatch.setattr(sweep, "plan_for", lambda *args: planned)
    result = sweep.carry_out(journal, policy, now=t + 60 * DAY)
    assert result.removed == [] and result.batches == []
    assert {k.run_id: k.rule for k in result.kept} == {"B/a": "batch", "B/b": "batch"}
    assert journal.find_batch("B") is not None
    assert {r.run_id for r in journal.list_runs("B/")} == {"B/a", "B/b", "B/c"}


def test_a_batch_with_an_item_never_started_is_kept_saying_so():
    from durable_nb.retention.plan import plan_prune

    t = 1000.0
    records = [RunRecord("B/a", status=Status.DONE, created_at=t, updated_at=t, finished_at=t)]
    plan = plan_prune(records, [BatchRecord("B", keys=["a", "b"], updated_at=t)],
                      RetentionPolicy.of("1d"), t + 2 * 86400)
    assert plan.units == [] and [(k.run_id, k.rule) for k in plan.kept] == [
        ("B/a", "not started")]


def test_a_prune_whose_vacuum_fails_is_recorded_and_says_so(backend: Backend, monkeypatch,
                                                             caplog):
    journal = backend.open()
    t = time.time()
    _run(journal, "old", t)

    def refused() -> None:
        raise OSError("No space left on device")

    monkeypatch.setattr(journal, "reclaim_space", refused)
    result = dn.prune("30d", journal=journal, now=t + 60 * DAY, by="ops")
    assert [r.run_id for r in result.removed] == ["old"] and journal.find_run("old") is None
    assert result.reclaim_error == "OSError: No space left on device"
    assert [(e["kind"], e["runs"], e["by"]) for e in journal.journal_events()] == [
        ("pruned", 1, "ops")]
    assert "the space was not given back: OSError: No space left" in caplog.text


def test_an_export_never_overwrites_an_earlier_prune_s(backend: Backend, tmp_path: Path):
    """A run id pruned, used again and pruned again: both exports stay; and a dry run with
    an export is refused before anything is read."""
    journal = backend.open()
    audit = tmp_path / "audit"
    t = time.time()
    _run(journal, "B/a", t, steps=1)
    journal.put_batch(BatchRecord("B", keys=["a"], created_at=t))
    dn.prune("30d", journal=journal, now=t + 60 * DAY, export=audit)
    _run(journal, "B/a", t + 10, steps=2)
    journal.put_batch(BatchRecord("B", keys=["a"], created_at=t + 10))
    dn.prune("30d", journal=journal, now=t + 60 * DAY, export=audit)
    assert sorted(p.name for p in audit.iterdir()) == [
        "B (2).batch.jsonl", "B%2Fa (2).json", "B%2Fa.json", "B.batch.jsonl"]
    first, second = (json.loads((audit / export_name("B/a", n)).read_text())
                     for n in (1, 2))
    assert first != second  # the earlier prune's export is still the earlier run's
    with pytest.raises(RetentionError) as refused:
        dn.prune("30d", journal=journal, dry_run=True, export=tmp_path / "none")
    assert str(refused.value) == (
        "a dry run (--dry-run) removes nothing, so it exports nothing: leave out the export "
        "folder (--export), or prune for real")
    assert not (tmp_path / "none").exists()
    cli = _cli(backend.location, "prune", "--older-than", "1d", "--dry-run", "--export",
               str(tmp_path / "none"))
    assert cli.returncode == 1 and len(cli.stderr.splitlines()) == 1
    assert "a dry run (--dry-run) removes nothing" in cli.stderr


def test_the_jupyter_server_s_sweeper_applies_the_policy(tmp_path: Path, monkeypatch):
    """The server's sweeper (no notification channel: the journal read through the listing's
    handle) opens the journal for writing when the policy is due, and prunes by it."""
    pytest.importorskip("jupyter_server")
    from durable_nb.journal.index import record_opened
    from durable_nb.server.notify import sweep_allowed

    monkeypatch.setenv("DURABLE_NB_INDEX", str(tmp_path / "index"))
    monkeypatch.setenv("DURABLE_NB_NOTIFY_CONFIG", str(tmp_path / "none.toml"))
    for variable in ("DURABLE_NB_JOURNAL", "DURABLE_NB_DIR", "DURABLE_NB_NOTIFY_WEBHOOK"):
        monkeypatch.delenv(variable, raising=False)
    journal = dn.DiskJournal(tmp_path / "shared")
    _run(journal, "old", time.time() - 40 * DAY, steps=1)
    _run(journal, "new", time.time(), steps=1)
    set_policy(journal, RetentionPolicy.of("30d"))
    record_opened(str(journal.directory))
    sweep_allowed()
    assert journal.find_run("old") is None and journal.find_run("new") is not None
    assert [e["via"] for e in journal.journal_events()] == ["policy"]


def test_of_two_sweepers_racing_one_applies_the_policy(backend: Backend, monkeypatch):
    """Two sweepers of one journal find the policy due at the same moment: the one that
    claims second (its read of the last application made before the first one wrote) does
    not prune; the claim is a conditional write, not a read then a write."""
    from durable_nb.retention.policy import claim_due

    first, second = backend.open(), backend.open()
    t = time.time()
    _run(first, "old", t, steps=1)
    set_policy(first, RetentionPolicy.of("30d"))
    now = t + 60 * DAY
    authority = second.decision_authority

    def first_applies_meanwhile(*args):  # between the second's due check and its claim
        monkeypatch.setattr(second, "decision_authority", authority)
        assert [r.run_id for r in apply_policy(first, now=now).removed] == ["old"]
        return authority(*args)

    monkeypatch.setattr(second, "decision_authority", first_applies_meanwhile)
    assert apply_policy(second, now=now) is None
    assert [e["via"] for e in first.journal_events()] == ["policy"]
    # The claim itself: a read made before the other sweeper's write loses.
    set_policy(first, RetentionPolicy.of("30d"))
    stale = second.deliveries("journal retention")
    assert claim_due(first, now, {"at": now}) is not None
    monkeypatch.setattr(second, "deliveries", lambda run_id: stale)
    assert claim_due(second, now, {"at": now}) is None
