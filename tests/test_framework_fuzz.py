"""Random OpenAI Agents SDK and Pydantic AI runs (rounds of parallel tool calls finishing in
random order, streamed or not, an approval tool), SIGKILLed at random points and resumed,
end as an uninterrupted reference run: the same output and step keys, every tool's effect
once (bar a step in flight at a kill), every model round counted once at the server bar a
round in flight at a kill; with the always-replay check. (A short run of
``tests/fuzz/framework_fuzz.py``, which runs hundreds.) ``FRAMEWORK_FUZZ_SEED`` picks the
seed (default: random, printed)."""

from __future__ import annotations

import json
import os
import random

import pytest

pytest.importorskip("agents")
pytest.importorskip("pydantic_ai")

from hypothesis import HealthCheck, Phase, example, given, seed, settings  # noqa: E402

from tests.fuzz.framework_fuzz import TOTALS, check_scenario, scenarios  # noqa: E402

SEED = int(os.environ.get("FRAMEWORK_FUZZ_SEED") or random.SystemRandom().randrange(2**32))
EXAMPLES = 2  # generated, plus the explicit one below


def _busy(framework: str, streamed: bool) -> dict:
    """Three calls in parallel, the first called finishing last, then an approved charge
    beside a booking, then a rejected charge; killed after the third step, then mid-run."""
    calls = [[("find", 40), ("note", 0), ("find", 15)], [("charge", 5), ("book", 20)],
             [("charge", 0)]]
    return {"framework": framework, "streamed": streamed, "api": "chat", "handoff": False,
            "rounds": [[{"tool": t, "wait_ms": w, "call": f"r{r}c{i}",
                         **({"amount": 4 - r} if t == "charge" else {})}
                        for i, (t, w) in enumerate(round_)] for r, round_ in enumerate(calls)],
            "delays_ms": [10, 0, 5, 0], "final": "Trip planned in 3 rounds.",
            "kills": [{"after_steps": 3}, {"after_seconds": 0.15}]}


@pytest.mark.parametrize("framework,streamed", [("agents", True), ("pydantic", False)])
def test_killed_and_resumed_framework_runs_end_as_an_uninterrupted_run(tmp_path, framework,
                                                                        streamed):
    print(f"framework fuzz seed {SEED} (rerun with FRAMEWORK_FUZZ_SEED={SEED})")
    counter = iter(range(EXAMPLES * 10))
    TOTALS.clear()

    @seed(SEED)
    @settings(max_examples=EXAMPLES, deadline=None, database=None,
              phases=[Phase.explicit, Phase.generate], suppress_health_check=list(HealthCheck))
    @given(scenario=scenarios((framework,), max_rounds=3))
    @example(scenario=_busy(framework, streamed))
    def trial(scenario):
        problems = check_scenario(scenario, tmp_path / str(next(counter)))
        assert not problems, "\n".join(problems) + f"\nscenario: {json.dumps(scenario)}"

    trial()
    print(dict(TOTALS))
    assert TOTALS["scenarios"] == EXAMPLES + 1
    assert TOTALS["kills"] >= 2, f"too few kills landed: {dict(TOTALS)}"
    assert TOTALS["approvals"] >= 2 and TOTALS["parallel_rounds"] >= 2
