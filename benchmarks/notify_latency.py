"""From park to the receiver: how long after a run starts waiting for an approval its
webhook notification reaches an HTTP receiver on loopback.

``python -m benchmarks.notify_latency [--runs N]``: parks N runs one after another in a disk
journal, each with a signed webhook to a loopback receiver, and prints the time from the
pending request's ``requested_at`` (stamped as the run parks) to the receiver's reading the
request: the median, the 90th percentile and the worst. Not a test: its figures depend on the
machine's load, and are reported, not asserted.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time

import durable_nb as dn
from durable_nb.journal import open_journal
from durable_nb.notify import NotifyConfig, WebhookConfig
from durable_nb.notify.loopback import WebhookReceiver


def measure(runs: int) -> list[float]:
    """Seconds from park to receipt, one per run."""
    directory = tempfile.mkdtemp(prefix="dnb-notify-bench-")
    journal = open_journal(directory)
    seconds = []
    with WebhookReceiver("bench-secret") as hook:
        config = NotifyConfig(webhook=WebhookConfig(hook.url, secret="bench-secret"))
        for i in range(runs):
            run_id = f"park-{i}"
            dn.execute(run_id, lambda ctx: ctx.approval("deploy", {"n": i}), journal=journal,
                       on_approval="park", notify=config)
            arrived = hook.wait_for(i + 1)[i]
            assert arrived["verified"] and arrived["json"]["run_id"] == run_id
            parked_at = journal.get_run(run_id).pending_approval["requested_at"]
            seconds.append(arrived["at"] - parked_at)
    return seconds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=30)
    args = parser.parse_args()
    started = time.time()
    seconds = sorted(measure(args.runs))
    p90 = seconds[int(0.9 * (len(seconds) - 1))]
    print(f"park -> webhook received, {len(seconds)} runs: median "
          f"{statistics.median(seconds) * 1000:.1f} ms, p90 {p90 * 1000:.1f} ms, "
          f"worst {seconds[-1] * 1000:.1f} ms (took {time.time() - started:.1f} s)")


if __name__ == "__main__":
    main()
