"""MkDocs hook: the REST API reference, rendered from the endpoints the handlers are routed by.

A page holding the marker ``<!-- durable-nb:rest -->`` gets, from
``durable_nb/server/api.py``, the API's version and what each version changed, then every
endpoint: its method and route, its query parameters or body fields (kind, required or not,
default, the version that added it), its answer's fields, its errors and its examples. The
handlers check each request against the same declarations, and
tests/test_rest_reference.py sends every example shown here to a real Jupyter server.
"""

from __future__ import annotations

import json
from typing import Any

REST_MARKER = "<!-- durable-nb:rest -->"


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def _fields(title: str, fields: tuple, *, request: bool) -> list[str]:
    if not fields:
        return []
    head = "| name | kind | required | what it is |\n|---|---|---|---|" if request else \
        "| name | kind | what it is |\n|---|---|---|"
    rows = []
    for field in fields:
        if request:
            need = ("required" + (f" unless `{field.unless}`" if field.unless else "")
                    if field.required else
                    "optional" + (f", default `{json.dumps(field.default)}`"
                                  if field.default is not None else ""))
            if field.since > 1:
                need += f" (since API {field.since})"
            rows.append(f"| `{field.name}` | {field.kind} | {need} | {_cell(field.doc)} |")
        else:
            rows.append(f"| `{field.name}` | {field.kind} | {_cell(field.doc)} |")
    return [f"**{title}**", "", head, *rows, ""]


def _example(endpoint: Any, example: Any) -> list[str]:
    answered = "" if example.status == 200 else f", answered {example.status}"
    if endpoint.method == "GET":
        query = "&".join(f"{k}={v}" for k, v in example.request.items())
        shown = f"GET {endpoint.path}" + (f"?{query}" if query else "")
        return [f"*{example.title}*{answered}: `{shown}`", ""]
    lines = [f"*{example.title}*{answered}: `POST {endpoint.path}`", "", "```json",
             json.dumps(example.request, indent=2), "```", ""]
    refusal = _refusal(endpoint, example.request)
    if refusal is not None:
        lines += ["The answer:", "", "```json", json.dumps({"message": refusal}, indent=2),
                  "```", ""]
    return lines


def _refusal(endpoint: Any, body: dict) -> str | None:
    """What the server answers a body that does not fit (its check, not a copy of it)."""
    from durable_nb.server.api import RequestError

    try:
        endpoint.check_body(body)
    except RequestError as exc:
        return str(exc)
    return None


def rest_reference() -> str:
    """The reference, as Markdown."""
    from durable_nb.server.api import API_CHANGES, API_VERSION, ENDPOINTS

    parts = [f"This server speaks **version {API_VERSION}** of the API (`GET version` answers "
             f"`{{\"version\": ..., \"api\": {API_VERSION}}}`). The version goes up whenever "
             f"a client written for the previous one could break:", "",
             "| API | what changed |", "|---|---|"]
    parts += [f"| {number} | {_cell(text)} |" for number, text in API_CHANGES]
    parts.append("")
    for endpoint in ENDPOINTS:
        parts += [f"### `{endpoint.method} {endpoint.path}`", "", endpoint.doc, ""]
        if endpoint.content_type != "application/json":
            parts += [f"Answers `{endpoint.content_type}`; each event's data:", ""]
        parts += _fields("Query parameters", endpoint.params, request=True)
        parts += _fields("Body (JSON)", endpoint.body, request=True)
        parts += _fields("Answer", endpoint.answer, request=False)
        if endpoint.errors:
            parts += [f"**Errors**: {endpoint.errors}.", ""]
        for example in endpoint.examples:
            parts += _example(endpoint, example)
    return "\n".join(parts)


def on_page_markdown(markdown: str, page: Any, **kwargs: Any) -> str:
    """Fill the marker of the page being built."""
    if REST_MARKER in markdown:
        markdown = markdown.replace(REST_MARKER, rest_reference())
    return markdown
