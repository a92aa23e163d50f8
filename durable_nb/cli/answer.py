"""``durable-nb answer RUN accept --content JSON | decline | cancel``: answer the question
an MCP server asked a run (elicitation), and the lines ``durable-nb show`` prints of it.

The answer is a decision through the registry and :func:`~durable_nb.approvals.decide.decide`
as ``approve`` and ``reject`` are: checked against the question's schema (one line, nothing
written, when it does not fit), bound to the request the command reads (or to ``--expect``),
written once, by whom the request allows. Kept apart from :mod:`durable_nb.cli.main` so that the
command line needs no ``mcp`` SDK to answer.
"""

from __future__ import annotations

import argparse
import json
from typing import Any

from .. import registry
from ..approvals.question import ACTIONS, Question, answer_words, question_of
from ..approvals.request import pending_digest, request_words
from ..errors import InvalidAnswer, NoPendingApproval
from ..journal import Journal

__all__ = ["HELP", "add_answer_command", "answer_command", "question_lines"]

#: The command's line in ``durable-nb``'s list.
HELP = "answer an MCP server's question: accept --content JSON, decline or cancel"


def add_answer_command(sub: Any) -> None:
    """Add ``answer`` to ``durable-nb``'s subcommands (``sub``)."""
    p = sub.add_parser("answer", help=HELP,
                       description="Answer the question an MCP server asked a run (`durable-nb "
                                   "show RUN` shows it with its fields).")
    p.add_argument("run_id", metavar="RUN")
    p.add_argument("action", choices=ACTIONS, help="accept (with --content), decline, cancel")
    p.add_argument("--content", metavar="JSON",
                   help="with accept: the answer, a JSON object that fits the question's "
                        "schema, e.g. '{\"nights\": 3}'")
    p.add_argument("--by", help="who answers (default: user@host)")
    p.add_argument("--expect", metavar="DIGEST",
                   help="answer only if the pending request is the one with this digest "
                        "(`show` prints it; 8 or more characters)")


def answer_command(args: argparse.Namespace, journal: Journal) -> str:
    """Answer as ``args`` say; the line to print."""
    record = journal.get_run(args.run_id)
    pending = record.pending_approval
    question = question_of(pending)
    if question is None:
        waits = f" (it waits for approval of {pending.get('name')!r}: use `durable-nb " \
                f"approve` or `reject`)" if pending else ""
        raise NoPendingApproval(f"run {args.run_id!r} is not waiting for an answer to an MCP "
                                f"server's question{waits}. Nothing was decided.")
    assert pending is not None
    answer: dict[str, Any] = {"action": args.action}
    if args.content is not None:
        try:
            answer["content"] = json.loads(args.content)
        except ValueError as exc:
            raise InvalidAnswer(f"--content is not JSON ({exc}): give the answer as a JSON "
                                f"object, e.g. '{_example(question)}'") from None
    elif args.action == "accept" and question.schema.get("required"):
        raise InvalidAnswer(f"accept needs --content: the question requires "
                            f"{', '.join(map(str, question.schema['required']))}, e.g. "
                            f"--content '{_example(question)}'")
    decide = registry.approve if args.action == "accept" else registry.reject
    decision = decide(args.run_id, None, by=args.by,
                      expect=args.expect or pending_digest(pending),
                      request_id=pending.get("id") or "", via="durable-nb", answer=answer,
                      journal=journal)
    return (f"answered {answer_words(decision.answer)} to {question.server or 'the server'}'s "
            f"question in run {args.run_id} (by {decision.by}; {request_words(pending)})")


def question_lines(pending: dict, run_id: str) -> list[str]:
    """``durable-nb show``'s lines for a question: its message, each field with what it
    takes, and how to answer; none for a request that is not a question."""
    question = question_of(pending)
    if question is None:
        return []
    lines = [f"question   {question.server or 'an MCP server'} asks during "
             f"{question.tool or 'a call'}: {question.message}"]
    for field in question.fields:
        about = f": {field.description}" if field.description else ""
        lines.append(f"  {field.name:<10} {field.title} ({field.hint()}){about}")
    lines.append(f"  answer: durable-nb answer {run_id} accept --content "
                 f"'{_example(question)}' (or decline, cancel)")
    return lines


def _example(question: Question) -> str:
    """A JSON answer to show: each field's default, else a value of its kind."""
    sample = {"string": "...", "number": 1.5, "integer": 1, "boolean": True}
    example = {}
    for field in question.fields:
        if field.default is not None:
            example[field.name] = field.default
        elif field.choices:
            value = field.choices[0][0]
            example[field.name] = [value] if field.kind == "choices" else value
        else:
            example[field.name] = sample.get(field.kind, "...")
    return json.dumps(example, ensure_ascii=False)
