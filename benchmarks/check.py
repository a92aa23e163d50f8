"""How fast recorded runs are checked against code (``durable_nb.check``, a dry replay).

``python -m benchmarks.check [--runs 1000] [--steps 10] [--journal DIR]``: records RUNS runs
of STEPS steps each as a batch (half of them model calls through the real openai client to
the loopback server, half tool steps, the conversation growing every round), then checks
them all twice: against the same code (every run replays) and against an edited prompt
(every run diverges at its first model call). Prints the seconds of each check, the runs a
second and whether the target holds: 1,000 runs of 10 steps in under 10 s. ``--journal``
keeps (and on a second call reuses) the recorded journal. Not a test: its figures depend on
the machine's load, and are reported, not asserted.
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time

import openai

import durable_nb
from durable_nb.testing import Echo, LoopbackServer

TARGET_SECONDS = 10.0
BATCH = "bench"


def agent(client: openai.OpenAI, steps: int, prompt: str):
    """The item handler: ``steps`` steps, a model call then a tool, round after round."""
    def handler(ctx, item):
        messages = [{"role": "system", "content": prompt},
                    {"role": "user", "content": f"ticket {item}: the printer is broken"}]
        for step in range(steps):
            if step % 2 == 0:
                reply = ctx.chat(model="loopback-1", client=client, messages=messages)
                messages.append({"role": "assistant",
                                 "content": reply.choices[0].message.content})
            else:
                found = ctx.run("lookup", lambda n: {"ticket": item, "round": n}, step)
                messages.append({"role": "user", "content": f"lookup said {found}"})
        return messages[-1]["content"]
    return handler


def record(journal: str, client: openai.OpenAI, runs: int, steps: int) -> float:
    """Seconds to record the batch (skipped, 0.0, when the journal holds it already)."""
    done = durable_nb.batch(BATCH, journal=journal) if durable_nb.runs(
        journal=journal, prefix=f"{BATCH}/", limit=1) else None
    if done is not None and len(done) == runs and done.done:
        return 0.0
    started = time.perf_counter()
    durable_nb.map(agent(client, steps, "Triage the ticket."), list(range(runs)),
                   batch_id=BATCH, key="index", journal=journal, concurrency=8)
    return time.perf_counter() - started


def timed_check(journal: str, client: openai.OpenAI, runs: int, steps: int,
                prompt: str) -> tuple[float, dict[str, int]]:
    started = time.perf_counter()
    report = durable_nb.check(agent(client, steps, prompt), journal=journal, prefix=BATCH,
                              items=list(range(runs)), key="index")
    return time.perf_counter() - started, report.counts


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=1000)
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--journal", help="where to record (kept); default: a temp dir")
    args = parser.parse_args()
    journal = args.journal or tempfile.mkdtemp(prefix="dnb-check-bench-")
    os.environ.pop("DURABLE_NB_VERIFY_REPLAY", None)  # a recording, not the suite's check
    with LoopbackServer(Echo()) as server:
        client = openai.OpenAI(base_url=server.url, api_key="bench", max_retries=0)
        recorded = record(journal, client, args.runs, args.steps)
        calls = server.stats()["total"]
        same, same_counts = timed_check(journal, client, args.runs, args.steps,
                                        "Triage the ticket.")
        edited, edited_counts = timed_check(journal, client, args.runs, args.steps,
                                            "Triage the ticket briefly.")
        assert server.stats()["total"] == calls, "a check sent a model request"
    print(f"journal: {journal}" + (f" (recorded in {recorded:.1f} s)" if recorded else ""))
    for name, seconds, counts in (("unchanged code", same, same_counts),
                                  ("edited prompt", edited, edited_counts)):
        verdict = "met" if seconds < TARGET_SECONDS * args.runs / 1000 else "MISSED"
        print(f"{name}: {args.runs} runs of {args.steps} steps checked in {seconds:.2f} s "
              f"({args.runs / seconds:.0f} runs/s; target under "
              f"{TARGET_SECONDS * args.runs / 1000:g} s: {verdict}); {counts}")


if __name__ == "__main__":
    main()
