"""Faults nobody scripted into the agent: a full disk, two executors, big and odd data."""

import os
import subprocess
import sys
import time
import warnings

import pytest

import durable_nb as dn
from durable_nb import DiskJournal, Status


@pytest.fixture
def tiny_fs(tmp_path):
    """A real 400 KiB tmpfs, so that the disk really fills up (needs root and mount)."""
    mount_point = tmp_path / "fs"
    mount_point.mkdir()
    proc = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=400k", "tmpfs", str(mount_point)],
                          capture_output=True, text=True)
    if proc.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {proc.stderr.strip()}")
    yield mount_point
    subprocess.run(["umount", "-l", str(mount_point)], check=False)


def _fill(path):
    """Write to ``path`` until the filesystem is full (once: a marker beside the mount)."""
    marker = path.parent.parent / "filled-once"
    if marker.exists():
        return
    marker.touch()
    fd = os.open(path, os.O_WRONLY | os.O_CREAT)
    try:
        while True:
            os.write(fd, b"x" * 4096)
    except OSError:
        pass
    finally:
        os.close(fd)


def _disk_full_agent(filler, calls):
    def handler(ctx):
        ctx.run("before", lambda: calls.append("before") or "ok")
        ctx.run("fill the disk", lambda: _fill(filler))
        ctx.run("paid llm call", lambda: calls.append("paid") or "y" * 2000)
        ctx.run("free space", lambda: filler.unlink() if filler.exists() else None)
        ctx.run("after", lambda: calls.append("after") or 1)
        return "done"
    return handler


def test_disk_full_degrades_loudly_then_catches_up(tiny_fs):
    journal = DiskJournal(tiny_fs / "journal")
    calls = []
    filler = tiny_fs / "filler"
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert dn.execute("r", _disk_full_agent(filler, calls), journal=journal,
                          on_journal_error="continue") == "done"
    degraded = [str(w.message) for w in caught if "DEGRADED" in str(w.message)]
    assert len(degraded) == 1 and "from step 1" in degraded[0]
    # Once space was back, the held-back entries were written in order: nothing partial,
    # nothing missing, and the run is DONE with the degradation cleared.
    info = dn.get_run("r", journal=journal)
    assert [s.name for s in info.steps] == ["before", "fill the disk", "paid llm call",
                                            "free space", "after"]
    assert info.status is Status.DONE and info.journal_degraded_from is None
    assert dn.execute("r", _disk_full_agent(filler, calls), journal=journal) == "done"
    assert calls == ["before", "paid", "after"]


def test_disk_full_strict_mode_stops_before_passing_the_unrecorded_step(tiny_fs):
    journal = DiskJournal(tiny_fs / "journal")
    calls = []
    filler = tiny_fs / "filler"
    with pytest.raises(dn.JournalWriteError, match="step 1"):  # "stop" is the default
        dn.execute("r", _disk_full_agent(filler, calls), journal=journal)
    assert calls == ["before"]  # it stopped before the paid call
    filler.unlink()
    assert [s.name for s in journal.steps("r")] == ["before"]
    # On resume the unrecorded step runs again (at most twice in all), the others once.
    assert dn.execute("r", _disk_full_agent(filler, calls), journal=journal) == "done"
    assert calls == ["before", "paid", "after"]


class _FailingWrites(DiskJournal):
    """A real journal whose next ``failures`` step writes raise ENOSPC (an injected OSError)."""

    failures = 0

    def append_step(self, run_id, entry, **kwargs):
        if self.failures:
            self.failures -= 1
            raise OSError(28, "No space left on device (injected)")
        super().append_step(run_id, entry, **kwargs)


def test_injected_write_failure_is_retried_in_order(tmp_path):
    journal = _FailingWrites(tmp_path / "j")

    def handler(ctx):
        ctx.run("a", lambda: 1)
        journal.failures = 2
        for name in "bcd":
            ctx.run(name, lambda: name)
        return "ok"

    with pytest.warns(RuntimeWarning, match="DEGRADED from step 1"):
        assert dn.execute("r", handler, journal=journal, on_journal_error="continue") == "ok"
    assert [s.name for s in journal.steps("r")] == ["a", "b", "c", "d"]


def test_two_processes_racing_for_one_run_exactly_one_proceeds(tmp_path):
    journal = DiskJournal(tmp_path / "j")
    go = tmp_path / "go"
    code = f"""
import os, sys, time, durable_nb as dn
while not os.path.exists({str(go)!r}):
    time.sleep(0.005)
try:
    dn.execute("shared", lambda ctx: [ctx.run(str(i), time.sleep, 0.01) for i in range(50)],
               journal={str(journal.directory)!r})
    print("DONE")
except dn.RunLeased as exc:
    print("LEASED", exc)
"""
    procs = [subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
             for _ in range(2)]
    time.sleep(1.0)  # both are importing and polling
    go.touch()
    outputs = [p.communicate(timeout=120)[0] for p in procs]
    assert sorted(o.split()[0] for o in outputs) == ["DONE", "LEASED"]
    loser = next(o for o in outputs if o.startswith("LEASED"))
    assert "being executed by pid" in loser
    assert len(list(journal.steps("shared"))) == 50


def test_two_runs_in_parallel_in_one_journal_do_not_interfere(tmp_path):
    journal = DiskJournal(tmp_path / "j")
    code = """
import sys, durable_nb as dn
run_id, directory = sys.argv[1], sys.argv[2]
print(dn.execute(run_id, lambda ctx: sum(ctx.run(str(i), lambda i=i: i) for i in range(300)),
                 journal=directory))
"""
    procs = [subprocess.Popen([sys.executable, "-c", code, run_id, str(journal.directory)],
                              stdout=subprocess.PIPE, text=True) for run_id in ("left", "right")]
    assert [p.communicate(timeout=120)[0].strip() for p in procs] == ["44850", "44850"]
    for run_id in ("left", "right"):
        steps = list(journal.steps(run_id))
        assert [s.name for s in steps] == [str(i) for i in range(300)]
        assert dn.get_run(run_id, journal=journal).status is Status.DONE


def test_decision_is_picked_up_once(journal):
    import threading

    results = []

    def handler(ctx):
        results.append(ctx.approval("first").note)
        results.append(ctx.approval("second", timeout=0.3).by)

    worker = threading.Thread(target=dn.execute, args=("r", handler),
                              kwargs={"journal": journal, "verify_replay": False})
    worker.start()
    deadline = time.time() + 10
    while (journal.find_run("r") is None or journal.get_run("r").pending_approval is None):
        assert time.time() < deadline
        time.sleep(0.01)
    dn.approve("r", "yes", journal=journal)
    worker.join(10)
    # The single decision answered the first approval only; the second timed out.
    assert results == ["yes", "timeout"]


def test_huge_tool_output_round_trips(journal):
    big = "line of tool output\n" * 1_500_000  # 30 MB
    seen = []
    dn.execute("r", lambda ctx: seen.append(len(ctx.run("dump", lambda: big))), journal=journal,
               verify_replay=False)  # one execution: `seen` logs each
    dn.execute("r", lambda ctx: seen.append(ctx.run("dump", lambda: "") == big), journal=journal)
    assert seen == [len(big), True]


def test_ten_thousand_steps_replay(journal):
    calls = []

    def handler(ctx):
        return sum(ctx.run("step", lambda i=i: calls.append(i) or i) for i in range(10_000))

    assert dn.execute("r", handler, journal=journal) == sum(range(10_000))
    assert dn.execute("r", handler, journal=journal) == sum(range(10_000))
    assert len(calls) == 10_000
    assert dn.get_run("r", journal=journal).step_count == 10_000


@pytest.mark.parametrize("value", [
    "naïve café 東京 🚀", "\x00\x01\x7f binary-looking \xff\xfe", "\ud800 lone surrogate",
    {"emoji key 🔑": ["\u202e right-to-left", "\n\t\r"]}, b"\x00\xff" * 100,
])
def test_unicode_and_binary_looking_strings_round_trip(journal, value):
    seen = []
    dn.execute("r", lambda ctx: seen.append(ctx.run("v", lambda: value)), journal=journal,
               verify_replay=False)  # one execution: `seen` logs each
    dn.execute("r", lambda ctx: seen.append(ctx.run("v", lambda: None)), journal=journal)
    assert seen == [value, value]


def test_unreadable_journal_directory_gives_a_clear_error(tmp_path):
    directory = tmp_path / "locked"
    DiskJournal(directory).close()
    directory.chmod(0o000)
    # Root reads through permissions, so the check runs as an unprivileged user.
    code = f"""
import os, durable_nb as dn
os.setgid(65534); os.setuid(65534)
try:
    dn.DiskJournal({str(directory)!r})
except dn.JournalError as exc:
    print("ERROR", exc)
"""
    tmp_path.chmod(0o755)
    env = {**os.environ, "HOME": "/tmp"}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env,
                         timeout=60)
    directory.chmod(0o700)
    if os.geteuid() != 0:
        pytest.skip("needs root to switch to an unprivileged user")
    assert out.stdout.startswith("ERROR"), out.stderr
    assert "cannot open the journal" in out.stdout and "DURABLE_NB_DIR" in out.stdout
