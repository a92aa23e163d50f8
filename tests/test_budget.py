"""Budgets that hold: the prompt estimate calibrated by the server's own counts, plus the
completion cap, must fit max_tokens and max_cost before each call. The loopback server
counts usage like the API; its extra_prompt_tokens quirk makes it count more than the offline
estimate, as servers with a chat template of their own do."""

from __future__ import annotations

import math
import re

import openai
import pytest

import durable_nb as dn
from durable_nb.llm.budget import DEFAULT_COMPLETION_RESERVE
from durable_nb.llm.pricing import Price
from durable_nb.testing import LoopbackServer, Quirks
from durable_nb.llm.tokens import count_message_tokens

ANSWER = "Revenue grew in every region this quarter, led by the West, which sold the most."
CAP = 12
STOP = re.compile(r"used (\d+) of (\d+), and the next request may take (\d+) more \(about "
                  r"(\d+) prompt tokens \+ (\d+) ")


def server_for(extra=0):
    return LoopbackServer([ANSWER] * 60, quirks=Quirks(extra_prompt_tokens=extra))


def chat_loop(client, model, asked, **options):
    """Chats until the budget stops it; ``asked`` gets the messages of every request made
    or refused."""
    def handler(ctx):
        messages = [{"role": "system", "content": "You are terse."},
                    {"role": "user", "content": "Report on Q3."}]
        for _ in range(40):
            asked.append(list(messages))
            reply = ctx.chat(client=client, model=model, messages=messages, **options)
            messages += [dn.assistant_message(reply.choices[0].message),
                         {"role": "user", "content": "And then?"}]
        return "ran out of script"
    return handler


def run_to_budget(journal, run_id, client, model, budget, **options):
    asked = []
    with pytest.raises(dn.BudgetExhausted) as caught:
        dn.execute(run_id, chat_loop(client, model, asked, **options), journal=journal,
                   max_tokens=budget, verify_replay=False)
    record = dn.get_run(run_id, journal=journal)
    return record, str(caught.value), asked


@pytest.mark.parametrize("model", ["gpt-4", "loopback-1"])
def test_with_caps_the_run_never_ends_above_its_budget_and_says_exactly_what_it_used(
        journal, model):
    with server_for(extra=25) as srv:
        client = openai.OpenAI(base_url=srv.url, api_key="any", max_retries=0)
        calibration_mattered = 0
        for budget in range(120, 900, 37):
            run_id = f"r{budget}"
            record, message, asked = run_to_budget(journal, run_id, client, model, budget,
                                                   max_tokens=CAP)
            used = record.prompt_tokens + record.completion_tokens
            assert used <= budget
            used_said, budget_said, more, prompt, cap = map(int, STOP.search(message).groups())
            assert (used_said, budget_said, cap, more) == (used, budget, CAP, prompt + CAP)
            estimate = count_message_tokens(asked[-1], model)
            if record.iteration >= 2:
                # Calibrated by the latest two replies: the server counts 25 more than the
                # offline estimate, whatever the length.
                assert prompt == estimate + 25
                calibration_mattered += used + estimate + CAP <= budget
            elif record.iteration == 1:  # one reply: its offset, the growth since 1.5 times
                first = count_message_tokens(asked[0], model)
                assert prompt == estimate + 25 + math.ceil((estimate - first) * 0.5)
            else:  # no reply yet to calibrate with
                assert prompt == (estimate if model == "gpt-4" else math.ceil(estimate * 1.5) + 32)
        # For some budgets the uncalibrated estimate would have let one more call through,
        # and that call would have ended the run above its budget.
        assert calibration_mattered > 0


def test_the_calibration_is_read_back_from_the_journal_on_resume(journal):
    with server_for(extra=25) as srv:
        client = openai.OpenAI(base_url=srv.url, api_key="any", max_retries=0)
        record, first, _ = run_to_budget(journal, "r", client, "gpt-4", 300, max_tokens=CAP)
        sent = srv.count()
        # A new execution (as after a kernel restart): the replayed calls calibrate it.
        record, again, asked = run_to_budget(journal, "r", client, "gpt-4", 300, max_tokens=CAP)
        assert srv.count() == sent
    assert STOP.search(again).groups() == STOP.search(first).groups()
    assert int(STOP.search(again).group(4)) == count_message_tokens(asked[-1], "gpt-4") + 25


def test_a_request_without_a_cap_reserves_room_for_the_reply(journal):
    with server_for() as srv:
        client = openai.OpenAI(base_url=srv.url, api_key="any", max_retries=0)
        record, message, _ = run_to_budget(journal, "r", client, "gpt-4", 600)
        assert srv.count() >= 1
    assert f"+ {DEFAULT_COMPLETION_RESERVE} reserved for the reply, as the request sets no " \
           f"max_tokens" in message
    assert record.prompt_tokens + record.completion_tokens <= 600


def test_max_cost_holds_and_each_entry_records_its_cost(journal):
    price = Price(input=30.0, cached_input=15.0, output=60.0)  # dollars per million tokens
    with server_for() as srv:
        client = openai.OpenAI(base_url=srv.url, api_key="any", max_retries=0)
        with pytest.raises(dn.BudgetExhausted, match=r"cost budget exhausted: spent \$") as caught:
            dn.execute("r", chat_loop(client, "gpt-4", [], max_tokens=CAP), journal=journal,
                       max_cost=0.02, prices={"gpt-4": price}, verify_replay=False)
    record = dn.get_run("r", journal=journal)
    chats = [s for s in journal.steps("r") if s.kind == "chat"]
    assert len(chats) >= 2 and record.cost <= 0.02
    for step in chats:
        assert step.meta["model"] == "gpt-4"
        assert step.meta["cost"] == pytest.approx(
            (step.prompt_tokens * 30.0 + step.completion_tokens * 60.0) / 1e6)
    assert record.cost == pytest.approx(sum(s.meta["cost"] for s in chats))
    assert f"spent ${record.cost:.6f} of $0.020000" in str(caught.value)


def test_max_cost_with_a_model_of_unknown_price_stops_before_sending(journal):
    with server_for() as srv:
        client = openai.OpenAI(base_url=srv.url, api_key="any", max_retries=0)
        with pytest.raises(dn.BudgetExhausted, match=r"price of model 'my-local-model' is not "
                                                     r"known.*RunOptions\(prices="):
            dn.execute("r", chat_loop(client, "my-local-model", []), journal=journal,
                       max_cost=1.0)
        assert srv.count() == 0
        # With a price (free, for a local model) it runs.
        with pytest.raises(dn.BudgetExhausted, match="max_iterations"):
            dn.execute("r", chat_loop(client, "my-local-model", []), journal=journal,
                       max_cost=1.0, prices={"my-local-model": Price(0, 0, 0)},
                       max_iterations=2)
        assert srv.count() == 2
