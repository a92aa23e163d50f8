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

from hypothesis import HealthCheck, Phase, given, seed, settings  # noqa: E402

from tests.fuzz.framework_fuzz import TOTALS, check_scenario, scenarios  # noqa: E402

SEED = int(os.environ.get("FRAMEWORK_FUZZ_SEED") or random.SystemRandom().randrange(2**32))
EXAMPLES = 2


@pytest.mark.parametrize("framework", ["agents", "pydantic"])
def test_killed_and_resumed_framework_runs_end_as_an_uninterrupted_run(tmp_path, framework):
    print(f"framework fuzz seed {SEED} (rerun with FRAMEWORK_FUZZ_SEED={SEED})")
    counter = iter(range(EXAMPLES * 10))
    TOTALS.clear()

    @seed(SEED)
    @settings(max_examples=EXAMPLES, deadline=None, database=None, phases=[Phase.generate],
              suppress_health_check=list(HealthCheck))
    @given(scenario=scenarios((framework,), max_rounds=3))
    def trial(scenario):
        problems = check_scenario(scenario, tmp_path / str(next(counter)))
        assert not problems, "\n".join(problems) + f"\nscenario: {json.dumps(scenario)}"

    trial()
    print(dict(TOTALS))
    assert TOTALS["scenarios"] == EXAMPLES
    assert TOTALS["kills"] >= 1, f"no kill landed: {dict(TOTALS)}"
