"""What tracing costs a step: ``python -m benchmarks.tracing [--steps N] [--repeats R]``.

A run of N ``ctx.run`` steps (each returns a ~225-byte dict and does no work, as in
:mod:`benchmarks.workloads`) that fails after its last step, then its resume, which replays
the N steps and ends. Three ways, alternated run by run, each run in a fresh process with a
fresh journal directory:

- ``off``: tracing never turned on (OpenTelemetry is not even imported: checked);
- ``untraced``: as ``off``, with durable_nb's one tracing check bypassed (the runner's
  ``traced`` replaced by the identity): the floor ``off`` is compared with;
- ``on``: ``durable_nb.tracing()`` to an SDK tracer provider with a
  ``BatchSpanProcessor`` whose exporter takes the spans and drops them (so the measure is
  durable_nb and the SDK, not a collector), and a meter provider with no reader.

Prints a markdown table: per executed step (the failing run, until it raised), the same
with the batch processor's flush (``force_flush`` after it: the export thread's share), and
per replayed step (the resume), in CPU time of the process (all its threads: the export
thread's work counts; other processes on a shared machine do not), and the executed step in
wall time. Medians (min..max) over the repeats.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from typing import Any

from .workloads import noop

MODES = ("untraced", "off", "on")


class _Crash(Exception):
    pass


def one(mode: str, steps: int, directory: str) -> dict[str, float]:
    """One measured run and its resume, in this process."""
    import durable_nb.runner as runner_module
    from durable_nb.journal import DiskJournal
    from durable_nb.runner import Runner

    flush = None
    if mode == "untraced":
        runner_module.traced = lambda observer, run_id, journal: observer
    elif mode == "on":
        import durable_nb as dn
        from opentelemetry.sdk.metrics import MeterProvider
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import (
            BatchSpanProcessor,
            SpanExporter,
            SpanExportResult,
        )

        class Dropping(SpanExporter):
            def export(self, spans: Any) -> SpanExportResult:
                return SpanExportResult.SUCCESS

        provider = TracerProvider()
        provider.add_span_processor(BatchSpanProcessor(Dropping()))
        dn.tracing(provider, MeterProvider())
        flush = provider.force_flush
    journal = DiskJournal(directory)
    crash = [True]

    def handler(ctx: Any) -> int:
        for i in range(steps):
            ctx.run("noop", noop, i)
        if crash.pop() if crash else False:
            raise _Crash()
        return steps

    w0, t0 = time.perf_counter(), time.process_time()
    try:
        Runner("bench", handler, journal=journal).run()
    except _Crash:
        pass
    w1, t1 = time.perf_counter(), time.process_time()
    if flush is not None:
        flush()
    t2 = time.process_time()
    assert Runner("bench", handler, journal=journal).run().result == steps
    t3 = time.process_time()
    if mode != "on":
        assert not any(name.startswith("opentelemetry") for name in sys.modules), \
            "tracing off imported OpenTelemetry"
    journal.close()
    us = 1e6 / steps
    return {"executed": (t1 - t0) * us, "executed_flushed": (t2 - t0) * us,
            "replayed": (t3 - t2) * us, "executed_wall": (w1 - w0) * us}


def _measure(mode: str, steps: int) -> dict[str, float]:
    with tempfile.TemporaryDirectory(prefix="dnb-bench-tracing-") as directory:
        out = subprocess.run(
            [sys.executable, "-m", "benchmarks.tracing", "--one", mode, "--steps", str(steps),
             "--dir", directory], capture_output=True, text=True, check=True, timeout=600)
    return json.loads(out.stdout.strip().splitlines()[-1])


def _cell(values: list[float]) -> str:
    return f"{statistics.median(values):.0f} ({min(values):.0f}..{max(values):.0f})"


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.tracing",
                                     description=__doc__.split("\n")[0])
    parser.add_argument("--steps", type=int, default=2000)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--one", choices=MODES, help=argparse.SUPPRESS)
    parser.add_argument("--dir", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.one:
        print(json.dumps(one(args.one, args.steps, args.dir)))
        return
    results: dict[str, list[dict[str, float]]] = {mode: [] for mode in MODES}
    for repeat in range(args.repeats):
        order = MODES[repeat % len(MODES):] + MODES[:repeat % len(MODES)]
        for mode in order:
            results[mode].append(_measure(mode, args.steps))
    print(f"{args.steps} steps, {args.repeats} repeats; µs per step, median (min..max)\n")
    print("| tracing | executed (CPU) | executed + flush (CPU) | replayed (CPU) "
          "| executed (wall) |")
    print("|---|---:|---:|---:|---:|")
    for mode in MODES:
        rows = results[mode]
        print(f"| {mode} | " + " | ".join(_cell([r[key] for r in rows]) for key in (
            "executed", "executed_flushed", "replayed", "executed_wall")) + " |")


if __name__ == "__main__":
    main()
