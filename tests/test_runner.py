"""The durable core without Jupyter: replay, mismatch, expiry, leases, approvals, retries."""

import json
import subprocess
import sys
import threading
import time

import pytest

import durable_nb as dn
from durable_nb import Status
from durable_nb.journal import DiskJournal
from durable_nb.runner import RunOptions, Runner



def test_completed_steps_are_replayed_not_called_again(journal):
    calls = []

    def handler(ctx):
        a = ctx.run("fetch", lambda: calls.append("fetch") or {"rows": [1, 2, 3]})
        b = ctx.run("total", lambda rows: calls.append("total") or sum(rows), a["rows"])
        return {"total": b}

    assert dn.execute("r", handler, journal=journal) == {"total": 6}
    assert dn.execute("r", handler, journal=journal) == {"total": 6}
    assert calls == ["fetch", "total"]
    info = dn.get_run("r", journal=journal)
    assert info.status is Status.DONE
    assert [(s.kind, s.name) for s in info.steps] == [("run", "fetch"), ("run", "total")]


def test_failed_run_resumes_and_tries_the_failed_step_again(journal):
    calls = []

    def two():
        calls.append("two")
        if calls.count("two") == 1:
            raise RuntimeError("service down")
        return "two-ok"

    def handler(ctx):
        ctx.run("one", lambda: calls.append("one"))
        ctx.run("two", two)
        ctx.run("three", lambda: calls.append("three"))
        return "ok"

    with pytest.raises(RuntimeError, match="service down"):
        dn.execute("r", handler, journal=journal)
    assert dn.get_run("r", journal=journal).status is Status.FAILED
    # Resuming replays "one" and tries the failed step again (it was not terminal).
    assert dn.execute("r", handler, journal=journal) == "ok"
    assert calls == ["one", "two", "two", "three"]


def test_results_keep_their_types_on_replay(journal):
    import datetime

    value = {"t": (1, 2), "b": b"\x00\xff", "s": {3}, "when": datetime.date(2026, 1, 2),
             "n": {1: "int key"}, "$t": "user key", "nan": float("inf")}
    seen = []
    dn.execute("r", lambda ctx: seen.append(ctx.run("v", lambda: value)), journal=journal,
               verify_replay=False)  # one execution: `seen` logs each
    dn.execute("r", lambda ctx: seen.append(ctx.run("v", lambda: None)), journal=journal)
    assert seen == [value, value]


def test_changed_code_raises_mismatch_and_leaves_journal(journal):
    dn.execute("r", lambda ctx: [ctx.run("a", lambda: 1), ctx.run("b", lambda: 2)],
               journal=journal)
    before = [s.to_json() for s in journal.steps("r")]
    with pytest.raises(dn.JournalMismatch) as info:
        dn.execute("r", lambda ctx: [ctx.run("a", lambda: 1), ctx.run("c", lambda: 3)],
                   journal=journal)
    message = str(info.value)
    assert "step 1" in message and "'b'" in message and "'c'" in message
    assert "reset" in message
    assert [s.to_json() for s in journal.steps("r")] == before


def test_input_changed_names_the_old_and_the_new_value_shortened(journal):
    prompt = "You are a careful analyst. " * 10 + "Write the Q3 report."
    dn.execute("r", lambda ctx: ctx.run("draft", str, prompt), journal=journal)
    with pytest.raises(dn.InputChanged) as info:
        dn.execute("r", lambda ctx: ctx.run("draft", str, prompt.replace("Q3", "Q4")),
                   journal=journal)
    # From a little before where the two first differ, not the 270 characters they share.
    assert ("step 0, run 'draft': args[0] changed from ...'analyst. Write the Q3 report.' to "
            "...'analyst. Write the Q4 report.'") in str(info.value)
    dn.execute("s", lambda ctx: ctx.run("f", str, "x"), journal=journal)
    with pytest.raises(dn.InputChanged, match=r"args\[0\] changed from 'x' to 2\."):
        dn.execute("s", lambda ctx: ctx.run("f", str, 2), journal=journal)


class _Notes:
    """An observer keeping the notes a panel would show."""

    def __init__(self):
        self.notes = []

    def on_step(self, entry, replayed):
        pass

    def on_record(self, record):
        pass

    def on_note(self, text):
        self.notes.append(text)


@pytest.mark.parametrize("changed_at, replayed", [(0, "no step is replayed"),
                                                  (1, "1 step it does not affect is replayed"),
                                                  (2, "2 steps it does not affect are replayed")])
def test_a_rerun_note_says_which_steps_are_replayed(journal, changed_at, replayed):
    def steps(changed):
        return lambda ctx: [ctx.run(f"s{i}", str, "new" if changed and i >= changed_at else i)
                            for i in range(3)]

    dn.execute("r", steps(False), journal=journal)
    observer = _Notes()
    Runner("r", steps(True), journal=journal, options=RunOptions(on_change="rerun"),
           observer=observer).run()
    assert observer.notes == [f"Executing again from step {changed_at}; {replayed}. The run "
                              f"as it was is kept as 'r@1'."]


def test_on_change_rerun_executes_again_from_divergence_and_keeps_a_fork(journal):
    calls = []

    def first(ctx):
        ctx.run("a", lambda: calls.append("a"))
        return ctx.run("b", lambda: calls.append("b") or "old")

    def changed(ctx):
        ctx.run("a", lambda: calls.append("a"))
        return ctx.run("c", lambda: calls.append("c") or "new")

    assert dn.execute("r", first, journal=journal) == "old"
    assert dn.execute("r", changed, journal=journal, on_change="rerun") == "new"
    assert calls == ["a", "b", "c"]
    info = dn.get_run("r", journal=journal)
    assert [s.name for s in info.steps] == ["a", "c"] and info.status is Status.DONE
    assert info.result == "new"
    fork = dn.get_run("r@1", journal=journal)
    assert [s.name for s in fork.steps] == ["a", "b"] and fork.result == "old"
    assert fork.forked_from["run_id"] == "r" and fork.forked_from["position"] == 1


def test_reset_forgets_steps_from_n(journal):
    calls = []

    def handler(ctx):
        return [ctx.run(n, lambda n=n: calls.append(n) or n) for n in "abc"]

    dn.execute("r", handler, journal=journal)
    record = dn.reset("r", 1, journal=journal)
    assert record.step_count == 1 and record.status is Status.RUNNING
    assert dn.execute("r", handler, journal=journal) == ["a", "b", "c"]
    assert calls == ["a", "b", "c", "b", "c"]


def test_done_run_asking_for_a_new_step_is_a_mismatch(journal):
    dn.execute("r", lambda ctx: ctx.run("a", lambda: 1), journal=journal)
    with pytest.raises(dn.JournalMismatch, match="is DONE"):
        dn.execute("r", lambda ctx: [ctx.run("a", lambda: 1), ctx.run("b", lambda: 2)],
                   journal=journal)
    assert dn.get_run("r", journal=journal).status is Status.DONE


def test_expired_run_is_failed_and_not_resumed(journal):
    calls = []

    def handler(ctx):
        calls.append("started")
        ctx.run("slow", lambda: (_ for _ in ()).throw(KeyboardInterrupt()))

    with pytest.raises(KeyboardInterrupt):
        dn.execute("r", handler, journal=journal, timeout=0.2)
    assert "interrupted" in dn.get_run("r", journal=journal).error
    time.sleep(0.3)
    with pytest.raises(dn.RunExpired, match="expired on resume"):
        dn.execute("r", handler, journal=journal, timeout=0.2)
    record = dn.get_run("r", journal=journal)
    assert record.status is Status.FAILED and record.error.startswith("expired on resume")
    assert calls == ["started"]


def test_live_lease_holder_blocks_a_second_executor(journal, tmp_path):
    ready = tmp_path / "ready"
    code = f"""
import time, durable_nb as dn
def h(ctx):
    ctx.run("a", lambda: open({str(ready)!r}, "w").close())
    time.sleep(30)
dn.execute("r", h, journal={str(journal.directory)!r})
"""
    holder = subprocess.Popen([sys.executable, "-c", code])
    try:
        deadline = time.time() + 30
        while not ready.exists():
            assert time.time() < deadline and holder.poll() is None
            time.sleep(0.05)
        with pytest.raises(dn.RunLeased) as info:
            dn.execute("r", lambda ctx: None, journal=journal)
        assert str(holder.pid) in str(info.value)
    finally:
        holder.kill()
        holder.wait()
    # The holder is dead now: its lease is taken over at once and the run resumes.
    assert dn.execute("r", lambda ctx: ctx.run("a", lambda: 1) or "took over",
                      journal=journal) == "took over"


def test_stale_heartbeat_from_another_host_is_taken_over(journal):
    def lease_held_elsewhere(run_id, age):
        journal.acquire_lease(run_id, {"token": "x", "pid": 1, "host": "elsewhere",
                                       "heartbeat": time.time() - age}, lambda holder: False)

    lease_held_elsewhere("r", 3600)
    assert dn.execute("r", lambda ctx: "mine", journal=journal) == "mine"
    lease_held_elsewhere("r2", 0)
    with pytest.raises(dn.RunLeased, match="elsewhere"):
        dn.execute("r2", lambda ctx: "mine", journal=journal)


def test_approval_from_another_process_resumes_waiting_run(journal):
    def handler(ctx):
        decision = ctx.approval("send email", {"to": "team@example.com"})
        return {"approved": decision.approved, "note": decision.note, "by": decision.by}

    result = {}
    worker = threading.Thread(target=lambda: result.update(
        dn.execute("r", handler, journal=journal)))
    worker.start()
    deadline = time.time() + 10
    while (journal.find_run("r") is None
           or journal.get_run("r").status is not Status.WAITING_APPROVAL):
        assert time.time() < deadline
        time.sleep(0.02)
    pending = dn.get_run("r", journal=journal).pending_approval
    assert pending["name"] == "send email" and pending["details"] == {"to": "team@example.com"}
    proc = subprocess.run([sys.executable, "-m", "durable_nb.cli", "--journal",
                           str(journal.directory), "approve", "r", "looks good", "--by", "ana"],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    worker.join(10)
    assert result == {"approved": True, "note": "looks good", "by": "ana"}
    # Replay returns the journaled decision without waiting.
    assert dn.execute("r", handler, journal=journal) == result


def test_rejection_and_approval_timeout(journal):
    def handler(ctx):
        d = ctx.approval("delete table", timeout=0.05)
        return [d.approved, d.by]

    assert dn.execute("r", handler, journal=journal) == [False, "timeout"]
    with pytest.raises(dn.NoPendingApproval):
        dn.approve("r", journal=journal)


def test_retry_policy_retries_then_journals(journal):
    attempts = []

    def flaky():
        attempts.append(1)
        if len(attempts) < 3:
            raise ConnectionError("blip")
        return "ok"

    policy = dn.RetryPolicy(max_attempts=5, sleep=lambda s: None)
    assert dn.execute("r", lambda ctx: ctx.run("call", flaky, retry=policy), journal=journal) == "ok"
    assert len(attempts) == 3


def test_terminal_error_is_journaled_and_raised_again_on_replay(journal):
    attempts = []

    def refuse():
        attempts.append(1)
        raise dn.TerminalError("card declined")

    def handler(ctx):
        try:
            ctx.run("charge", refuse, retry=dn.RetryPolicy(max_attempts=5, sleep=lambda s: None))
        except dn.TerminalError as exc:
            return f"handled: {exc}"

    assert dn.execute("r", handler, journal=journal) == "handled: card declined"
    assert dn.execute("r", handler, journal=journal) == "handled: card declined"
    assert attempts == [1]
    entry = next(journal.steps("r"))
    assert entry.error["type"] == "durable_nb.errors.TerminalError" and entry.error["terminal"]


def test_unserializable_result_names_step_and_type_and_keeps_journal(journal):
    class Handle:
        pass

    def handler(ctx):
        ctx.run("good", lambda: 1)
        ctx.run("open socket", Handle)

    with pytest.raises(dn.UnserializableResult) as info:
        dn.execute("r", handler, journal=journal)
    message = str(info.value)
    assert "step 1" in message and "'open socket'" in message and "Handle" in message
    assert "already ran" in message
    assert [s.name for s in journal.steps("r")] == ["good"]


def test_state_now_uuid_random_are_identical_on_replay(journal):
    def handler(ctx):
        ctx.state["plan"] = ["a", "b"]
        ctx.state["n"] = 1
        del ctx.state["n"]
        return [ctx.now(), ctx.uuid(), ctx.random(), dict(ctx.state)]

    first = dn.execute("r", handler, journal=journal)
    assert dn.execute("r", handler, journal=journal) == first
    assert first[3] == {"plan": ["a", "b"]}
    assert dn.get_run("r", journal=journal).state == {"plan": ["a", "b"]}


def test_durable_sleep_sleeps_only_the_remainder(journal):
    def handler(ctx):
        ctx.sleep(0.4)
        raise KeyboardInterrupt

    started = time.time()
    with pytest.raises(KeyboardInterrupt):
        dn.execute("r", handler, journal=journal)
    assert time.time() - started >= 0.4
    time.sleep(0.4)
    started = time.time()
    dn.execute("r", lambda ctx: ctx.sleep(0.4), journal=journal)
    assert time.time() - started < 0.4  # the wake-up time had passed: nothing left to sleep


def test_child_run_has_own_journal_and_replays_after_crash(journal):
    calls, crashed = [], []

    def sub(ctx, topic):
        ctx.run("search", lambda: calls.append("search") or f"notes on {topic}")
        if not crashed:
            crashed.append(True)
            raise KeyboardInterrupt  # the process dies inside the child
        return ctx.run("summarise", lambda: calls.append("summarise") or "summary")

    def handler(ctx):
        return ctx.child("research", sub, "sales")

    with pytest.raises(KeyboardInterrupt):
        dn.execute("r", handler, journal=journal)
    assert dn.execute("r", handler, journal=journal) == "summary"
    assert calls == ["search", "summarise"]
    assert [s.name for s in journal.steps("r/research-0")] == ["search", "summarise"]
    assert dn.execute("r", handler, journal=journal) == "summary"
    assert calls == ["search", "summarise"]


def test_step_id_is_stable_across_replays(journal):
    def handler(ctx):
        inside = ctx.run("email", lambda: ctx.step_id)
        return [inside, ctx.step_id]

    first = dn.execute("r", handler, journal=journal)
    assert first == ["r:0", "r:1"]
    assert dn.execute("r", handler, journal=journal) == first


def test_cancel_stops_at_next_step_and_keeps_journal(journal):
    def handler(ctx):
        ctx.run("a", lambda: 1)
        dn.cancel("r", journal=journal)
        ctx.run("b", lambda: 2)

    with pytest.raises(dn.RunCancelled):
        dn.execute("r", handler, journal=journal)
    info = dn.get_run("r", journal=journal)
    assert info.status is Status.CANCELLED
    assert [s.name for s in info.steps] == ["a"]


def test_max_iterations_fails_the_run_even_if_caught(journal):
    def handler(ctx):
        try:
            ctx.chat(model="gpt-4o-mini", messages=[{"role": "user", "content": "hi"}])
        except dn.BudgetExhausted:
            return "swallowed"

    with pytest.raises(dn.BudgetExhausted, match="max_iterations"):
        dn.execute("r", handler, journal=journal, max_iterations=0)
    assert dn.get_run("r", journal=journal).status is Status.FAILED


def test_corrupt_entry_gives_clear_error_and_other_runs_stay(journal):
    dn.execute("good", lambda ctx: ctx.run("a", lambda: 1), journal=journal)
    dn.execute("bad", lambda ctx: [ctx.run("a", lambda: 1), ctx.run("b", lambda: 2)],
               journal=journal)
    journal._cache.set("step:bad:1", '{"n": "b", "k": "run", "r": 2, "t0"')  # truncated write
    with pytest.raises(dn.CorruptEntry) as info:
        dn.get_run("bad", journal=journal)
    assert "run 'bad' step 1" in str(info.value) and "reset bad --from 1" in str(info.value)
    assert dn.get_run("good", journal=journal).status is Status.DONE
    dn.reset("bad", 1, journal=journal)
    assert dn.execute("bad", lambda ctx: [ctx.run("a", lambda: 1), ctx.run("b", lambda: 2)],
                      journal=journal) == [1, 2]


def test_newer_format_version_is_refused(tmp_path):
    DiskJournal(tmp_path / "j")._cache.set("format", json.dumps({"version": 99}))
    with pytest.raises(dn.IncompatibleJournal, match="version 99"):
        DiskJournal(tmp_path / "j")


def test_journal_files_are_private(tmp_path):
    j = DiskJournal(tmp_path / "j")
    dn.execute("r", lambda ctx: ctx.run("a", lambda: 1), journal=j)
    assert (tmp_path / "j").stat().st_mode & 0o077 == 0
    assert (tmp_path / "j" / "cache.db").stat().st_mode & 0o077 == 0


def test_cli_exit_codes_and_messages(journal):
    dn.execute("r", lambda ctx: ctx.run("a", lambda: {"x": 1}), journal=journal)
    base = [sys.executable, "-m", "durable_nb.cli", "--journal", str(journal.directory)]

    def cli(*args):
        return subprocess.run(base + list(args), capture_output=True, text=True, timeout=60)

    ok = cli("runs")
    assert ok.returncode == 0 and "r" in ok.stdout and "DONE" in ok.stdout
    shown = cli("show", "r", "--json")
    assert shown.returncode == 0 and json.loads(shown.stdout)["steps"][0]["name"] == "a"
    unknown = cli("show", "nope")
    assert unknown.returncode == 1
    assert unknown.stderr.count("\n") == 1 and "no run 'nope'" in unknown.stderr
    assert cli("approve", "r").returncode == 1  # nothing pending
    assert cli("reset", "r").returncode == 2  # --from is required
    assert cli("frobnicate").returncode == 2
    assert cli("reset", "r", "--from", "0").returncode == 0
    assert dn.get_run("r", journal=journal).steps == []
