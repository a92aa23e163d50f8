"""The agent the check tests record and edit: a sales report with a model call, a counting
tool, an approval and an email. Tests copy this file into their work folder as
``sales_agent.py``, record runs with it in a child process (``python sales_agent.py JOURNAL``),
edit the copy's text and check the recorded runs against the edit.

Every effect is counted in ``effects.txt`` in the working folder; the model is the loopback
server at ``OPENAI_BASE_URL`` (its ``/_stats`` count the requests)."""

import json
import sys

import durable_nb

PROMPT = "Summarise the sales figures in one line."
SIGNATURE = "-- the sales bot"
QUARTERS = ["q1", "q2", "q3", "q4"]


def _effect(text):
    with open("effects.txt", "a") as out:
        out.write(text + "\n")


def fetch_sales(quarter):
    _effect(f"fetch {quarter}")
    return {"quarter": quarter, "total": 100 + len(quarter)}


def send_email(text):
    _effect("send")
    return "sent"


def handler(ctx):
    quarter = ctx.run_id.rpartition("-")[2]
    figures = ctx.run("fetch_sales", fetch_sales, quarter)
    reply = ctx.chat(model="loopback-1", messages=[
        {"role": "system", "content": PROMPT},
        {"role": "user", "content": json.dumps(figures)}])
    summary = reply.choices[0].message.content
    if ctx.approval("send_report", {"summary": summary}).approved:
        ctx.run("send_email", send_email, summary + "\n" + SIGNATURE)
    return summary


def item_handler(ctx, quarter):
    figures = ctx.run("fetch_sales", fetch_sales, quarter)
    reply = ctx.chat(model="loopback-1", messages=[
        {"role": "system", "content": PROMPT},
        {"role": "user", "content": json.dumps(figures)}])
    return reply.choices[0].message.content


def record(journal):
    """sales-q1 and sales-q2 approved (DONE, email sent), sales-q3 parked on its approval,
    sales-q4 rejected (DONE, no email); the batch ``quarters`` of every quarter, DONE."""
    for quarter in QUARTERS:
        durable_nb.execute(f"sales-{quarter}", handler, journal=journal, on_approval="park")
    durable_nb.approve("sales-q1", journal=journal)
    durable_nb.approve("sales-q2", journal=journal)
    durable_nb.reject("sales-q4", journal=journal)
    for quarter in ("q1", "q2", "q4"):
        durable_nb.execute(f"sales-{quarter}", handler, journal=journal, on_approval="park")
    durable_nb.map(item_handler, QUARTERS, batch_id="quarters", journal=journal)


if __name__ == "__main__":
    record(sys.argv[1])
    print(json.dumps({r.run_id: str(r.status) for r in durable_nb.runs(journal=sys.argv[1])}))
