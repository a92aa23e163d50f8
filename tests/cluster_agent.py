"""The batch agent of the Dask tests, importable by the cluster's workers.

:func:`make_handler` returns a closure, which Dask ships by value (cloudpickle); the functions
it calls are shipped by reference to this module, as Dask ships any importable function, so
the workers import ``tests.cluster_agent`` (they run with this interpreter's ``sys.path``).

Each item: a chat round, a ``label`` tool step, a second chat round. The tool marks that it
was entered (``entered-ID-PID``), waits for the ``gate`` file, then appends its step id and
pid to ``effects.log``: a test holds items inside the tool, before their side effect, kills a
worker there, and counts every side effect.
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any, Callable

MODEL = "loopback-1"
SCRIPT = ["classified", "confirmed"]  # the loopback server's reply in round 0 and round 1
GATE_TIMEOUT = 120.0


def label_tool(workdir: str, item_id: int, step_id: str) -> str:
    root = Path(workdir)
    (root / f"entered-{item_id}-{os.getpid()}").touch()
    deadline = time.monotonic() + GATE_TIMEOUT
    while not (root / "gate").exists():
        if time.monotonic() > deadline:
            raise TimeoutError(f"no gate file in {root} after {GATE_TIMEOUT:g} s")
        time.sleep(0.02)
    with open(root / "effects.log", "a") as log:  # one short O_APPEND write: atomic
        log.write(f"{step_id} {os.getpid()}\n")
    return f"label-{item_id}"


def make_handler(url: str, workdir: str) -> Callable[[Any, dict], dict]:
    def handler(ctx: Any, item: dict) -> dict:
        import openai

        import durable_nb

        # Made here, on the worker: an openai client cannot be pickled.
        client = openai.OpenAI(base_url=url, api_key="loopback", max_retries=0)
        messages = [{"role": "user", "content": f"classify ticket {item['id']}"}]
        reply = ctx.chat(model=MODEL, messages=messages, client=client, max_tokens=20)
        messages.append(durable_nb.assistant_message(reply.choices[0].message))
        label = ctx.run("label", label_tool, workdir, item["id"], ctx.step_id)
        messages.append({"role": "user", "content": f"{label}: confirm"})
        final = ctx.chat(model=MODEL, messages=messages, client=client, max_tokens=20)
        return {"id": item["id"], "label": label, "answer": final.choices[0].message.content}

    return handler
