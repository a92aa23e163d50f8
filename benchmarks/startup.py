"""How long durable_nb takes to start: the import, the command line, the extension, a first call.

``python -m benchmarks.startup [--repeats 7] [--against REV]``: each measure is timed in a fresh
process (or a fresh kernel), alternated with a bare interpreter (``python -c pass``; an empty
cell in a fresh kernel for ``%load_ext``) in the same run, and reported as the median of the
differences, wall clock (what the goals are in) and CPU time of the process measured (which
other processes on a busy machine change far less than the wall clock). ``--against REV`` times
the same measures with REV's durable_nb (checked out into a temporary git worktree and put
first on ``PYTHONPATH``) alternated with this checkout's.

- ``import durable_nb``;
- ``durable-nb --help``, and ``durable-nb runs`` on a directory journal of 20 runs;
- ``%load_ext durable_nb`` as the first cell of a fresh IPython kernel (jupyter_client);
- a first ``ctx.chat`` in a fresh process: ``import durable_nb`` and one run whose one step is
  a chat to the bundled loopback server (``durable_nb.testing.LoopbackServer``), the whole
  process, which pays for importing openai where the others must not.

Not a test: it reports figures against the goals of issue 42 and asserts nothing.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

#: Goals above the bare interpreter, seconds (issue 42); None: measured, no goal.
GOALS: dict[str, float | None] = {
    "import durable_nb": 0.30,
    "durable-nb --help": 0.40,
    "durable-nb runs (20 runs)": 0.40,
    "%load_ext durable_nb (fresh kernel)": 0.50,
    "first ctx.chat (fresh process)": None,
}

#: The command line as the console script runs it (``durable-nb``).
CLI = "import sys; from durable_nb.cli import main; sys.argv[0] = 'durable-nb'; sys.exit(main())"

FIRST_CHAT = """
import sys, durable_nb, openai
client = openai.OpenAI(base_url=sys.argv[1], api_key="bench", max_retries=0)
def agent(ctx):
    return ctx.chat(model="loopback-1", messages=[{"role": "user", "content": "hi"}],
                    client=client).choices[0].message.content
durable_nb.execute(sys.argv[3], agent, journal=sys.argv[2])
"""

MAKE_RUNS = """
import sys, durable_nb
for i in range(20):
    durable_nb.execute(f"run-{i:02d}", lambda ctx: [ctx.run("a", lambda: "x" * 100),
                                                    ctx.run("b", lambda: "y" * 100)],
                       journal=sys.argv[1])
"""


#: One sample: (wall-clock seconds, CPU seconds of the process measured, user + system).
Sample = tuple[float, float]


def timed(argv: list[str], env: dict[str, str]) -> Sample:
    """Wall-clock and CPU seconds of one process, which must succeed. It runs in the
    temporary directory, not a checkout: ``python -c`` puts the working directory first on
    sys.path."""
    started = time.perf_counter()
    proc = subprocess.Popen(argv, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                            text=True, cwd=tempfile.gettempdir())
    _, status, usage = os.wait4(proc.pid, 0)
    took = time.perf_counter() - started
    proc.returncode = os.waitstatus_to_exitcode(status)
    if proc.returncode != 0:
        raise SystemExit(f"{' '.join(argv[:3])} ... failed:\n{proc.stderr.read()[-2000:]}")
    proc.stderr.close()
    return took, usage.ru_utime + usage.ru_stime


def kernel_cell(code: str, env: dict[str, str]) -> Sample:
    """Seconds from sending ``code`` as the first cell of a fresh IPython kernel to its reply
    (the kernel's own start is not counted), and the kernel's CPU seconds meanwhile."""
    import psutil
    from jupyter_client.manager import start_new_kernel

    km, kc = start_new_kernel(kernel_name="python3", env=env, cwd=tempfile.gettempdir(),
                              stderr=subprocess.DEVNULL)
    try:
        kernel = psutil.Process(km.provisioner.pid)
        cpu = sum(kernel.cpu_times()[:2])
        started = time.perf_counter()
        reply = kc.execute_interactive(code, timeout=120, output_hook=lambda msg: None)
        took = time.perf_counter() - started
        if reply["content"]["status"] != "ok":
            raise SystemExit(f"{code!r} failed in the kernel: {reply['content']}")
        return took, sum(kernel.cpu_times()[:2]) - cpu
    finally:
        kc.stop_channels()
        km.shutdown_kernel(now=True)


class Measures:
    """The measures, each a pair (bare, measured) of zero-argument timers, for one checkout."""

    def __init__(self, checkout: Path, work: Path, chat_url: str) -> None:
        self.env = dict(os.environ, PYTHONPATH=str(checkout))
        self.env.pop("DURABLE_NB_JOURNAL", None)
        self.journal = work / "runs-journal"
        self.work, self.chat_url = work, chat_url
        self.chats = 0

    def make_journal(self) -> None:
        if not self.journal.exists():
            subprocess.run([sys.executable, "-c", MAKE_RUNS, str(self.journal)], env=self.env,
                           cwd=self.work, check=True)

    def pairs(self) -> dict[str, tuple[Callable[[], Sample], Callable[[], Sample]]]:
        py, env = sys.executable, self.env
        bare = lambda: timed([py, "-c", "pass"], env)  # noqa: E731
        return {
            "import durable_nb": (bare, lambda: timed([py, "-c", "import durable_nb"], env)),
            "durable-nb --help": (bare, lambda: timed([py, "-c", CLI, "--help"], env)),
            "durable-nb runs (20 runs)": (bare, lambda: timed(
                [py, "-c", CLI, "runs", "--journal", str(self.journal)], env)),
            "%load_ext durable_nb (fresh kernel)": (
                lambda: kernel_cell("pass", env),
                lambda: kernel_cell("%load_ext durable_nb", env)),
            "first ctx.chat (fresh process)": (bare, self.first_chat),
        }

    def first_chat(self) -> Sample:
        self.chats += 1
        journal = self.work / f"chat-{self.chats}"
        return timed([sys.executable, "-c", FIRST_CHAT, self.chat_url, str(journal), "chat"],
                     self.env)


def measure(checkouts: dict[str, Measures], repeats: int, only: set[str] | None
            ) -> dict[str, dict[str, list[Sample]]]:
    """Seconds (wall clock, CPU) above the bare baseline, per measure and checkout:
    ``repeats`` samples each, the checkouts and the baseline alternated sample by sample."""
    for measures in checkouts.values():
        measures.make_journal()
    names = [n for n in GOALS if only is None or n in only]
    samples: dict[str, dict[str, list[Sample]]] = {n: {c: [] for c in checkouts} for n in names}
    for name in names:
        for measures in checkouts.values():  # a warm-up: bytecode written, files cached
            measures.pairs()[name][1]()
        for _ in range(repeats):
            for checkout, measures in checkouts.items():
                bare, measured = measures.pairs()[name]
                (wall, cpu), (bare_wall, bare_cpu) = measured(), bare()
                samples[name][checkout].append((wall - bare_wall, cpu - bare_cpu))
    return samples


def table(samples: dict[str, dict[str, list[Sample]]], baseline: Sample) -> str:
    """Medians above the bare baseline: wall clock (the goals), and CPU time in brackets,
    which other processes on a busy machine change less than they change the wall clock."""
    checkouts = list(next(iter(samples.values())))
    lines = [f"bare `python -c pass`: {baseline[0]:.3f} s wall, {baseline[1]:.3f} s CPU "
             f"(medians); load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores", "",
             "| what (median above bare: wall s (CPU s)) | " + " | ".join(checkouts)
             + " | goal (wall) | met |",
             "|---|" + "---:|" * len(checkouts) + "---:|---|"]
    for name, by_checkout in samples.items():
        walls = [statistics.median(w for w, _ in by_checkout[c]) for c in checkouts]
        cpus = [statistics.median(c for _, c in by_checkout[c]) for c in checkouts]
        goal = GOALS[name]
        met = "" if goal is None else ("yes" if walls[0] <= goal else "no")
        lines.append(f"| {name} | " + " | ".join(f"{w:.3f} ({c:.3f})"
                                                   for w, c in zip(walls, cpus))
                     + f" | {'' if goal is None else f'<= {goal:.2f}'} | {met} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--against", default=None, help="a git revision to compare with")
    parser.add_argument("--only", action="append", choices=list(GOALS),
                        help="one measure (repeatable)")
    args = parser.parse_args(argv)
    from durable_nb.testing import LoopbackServer

    with tempfile.TemporaryDirectory(prefix="dnb-startup-") as tmp, \
            LoopbackServer("echo") as server:
        work = Path(tmp)
        checkouts = {"this checkout": Measures(ROOT, work / "here", server.url)}
        other = work / "rev"
        if args.against:
            subprocess.run(["git", "-C", str(ROOT), "worktree", "add", "-q", "--detach",
                            str(other), args.against], check=True)
            checkouts[args.against] = Measures(other, work / "there", server.url)
        try:
            for measures in checkouts.values():
                measures.work.mkdir()
            bare = [timed([sys.executable, "-c", "pass"], os.environ.copy())
                    for _ in range(args.repeats)]
            baseline = (statistics.median(w for w, _ in bare), statistics.median(c for _, c in bare))
            samples = measure(checkouts, args.repeats, set(args.only) if args.only else None)
        finally:
            if args.against:
                subprocess.run(["git", "-C", str(ROOT), "worktree", "remove", "--force",
                                str(other)], check=False)
    print(table(samples, baseline))


if __name__ == "__main__":
    main()
