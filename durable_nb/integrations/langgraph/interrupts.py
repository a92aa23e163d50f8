"""A LangGraph ``interrupt()`` asked as a durable_nb request, its decision given back as the
value the graph resumes with.

Each interrupt is asked with ``ctx.approval`` (so the run parks or waits like any approval,
and is decided on every path: the panel, ``%durable inbox``, the Lab sidebar, decision links,
the CLI, REST, the hub), and the decision is journaled: a replay answers the interrupt again
without asking. What the request shows and what the graph gets back depend on what the
interrupt asks:

- **LangChain's human-in-the-loop middleware** (``create_agent`` with
  ``HumanInTheLoopMiddleware``): a ``HITLRequest`` is one request per tool call, named after
  the tool, details ``{"tool", "arguments", "description"}``; the graph gets
  ``{"decisions": [...]}``: ``approve``, ``edit`` with the edited arguments, ``reject`` with the
  person's message. A per-call ``ToolApprovalRequest`` gets that one decision.
- **The agent-inbox schema** (``HumanInterrupt``, one or a list): one request per interrupt,
  named after its action, details ``{"tool", "arguments", "description"}``; the graph gets a
  ``HumanResponse`` each: ``accept``; ``edit`` with the edited arguments (when the interrupt
  allows edits); ``response`` with the person's message; ``ignore`` for a rejection without
  one.
- **Any other value**: one request named after the node, details ``{"node", "interrupt"}``
  (the value, JSON data); the graph gets ``{"approved": bool}``, with ``"message"`` when the
  person wrote one and ``"note"`` when they left a note. Such an interrupt with a
  ``response_schema`` is refused: a yes or no would not fit it.
"""

from __future__ import annotations

from typing import Any

from ...errors import NotJournaled

__all__ = ["resume_value"]

_ANY_OBJECT = {"type": "object"}


def _is_human_interrupt(value: Any) -> bool:
    return (isinstance(value, dict) and isinstance(value.get("action_request"), dict)
            and "config" in value)


def _human_response(ctx: Any, asked: dict) -> dict[str, Any]:
    action = asked["action_request"]
    allowed = asked.get("config") or {}
    name = str(action.get("action") or "interrupt")
    details = {"tool": name, "arguments": action.get("args") or {},
               "description": asked.get("description") or ""}
    decision = ctx.approval(name, details,
                            schema=_ANY_OBJECT if allowed.get("allow_edit") else None)
    if decision.approved:
        if decision.args is not None:
            return {"type": "edit", "args": {"action": name, "args": decision.args}}
        return {"type": "accept", "args": None}
    if decision.message:
        return {"type": "response", "args": decision.message}
    return {"type": "ignore", "args": None}


def _tool_decision(ctx: Any, name: str, args: Any, description: str, allowed: list[str],
                   schema: dict | None) -> dict[str, Any]:
    details = {"tool": name, "arguments": args or {}, "description": description}
    decision = ctx.approval(name, details,
                            schema=(schema or _ANY_OBJECT) if "edit" in allowed else None)
    if decision.approved:
        if decision.args is not None:
            return {"type": "edit", "edited_action": {"name": name, "args": decision.args}}
        return {"type": "approve"}
    if decision.message and "reject" not in allowed and "respond" in allowed:
        return {"type": "respond", "message": decision.message}
    return {"type": "reject", **({"message": decision.message} if decision.message else {})}


def _hitl_response(ctx: Any, asked: dict) -> dict[str, Any]:
    configs = {c.get("action_name"): c for c in asked.get("review_configs") or []}
    decisions = []
    for action in asked["action_requests"]:
        config = configs.get(action["name"]) or {}
        decisions.append(_tool_decision(ctx, action["name"], action.get("args"),
                                        action.get("description") or "",
                                        list(config.get("allowed_decisions") or
                                             ["approve", "edit", "reject"]),
                                        config.get("args_schema")))
    return {"decisions": decisions}


def resume_value(ctx: Any, node: str, value: Any, response_schema: Any = None) -> Any:
    """Ask for the interrupt of node ``node`` whose value is ``value`` (see the module
    docstring) and return what the graph resumes with. An interrupt of another shape that
    gives a ``response_schema`` is refused (:class:`~durable_nb.errors.NotJournaled`) before
    anyone is asked: a yes or no would not fit its schema."""
    if isinstance(value, dict) and isinstance(value.get("action_requests"), list):
        return _hitl_response(ctx, value)
    if isinstance(value, dict) and value.get("type") == "tool_approval":
        return _tool_decision(ctx, str(value.get("name")), value.get("args"),
                              str(value.get("description") or ""),
                              ["approve", "edit", "reject"], None)
    if _is_human_interrupt(value):
        return _human_response(ctx, value)
    if isinstance(value, list) and value and all(_is_human_interrupt(v) for v in value):
        return [_human_response(ctx, v) for v in value]
    if response_schema:
        raise NotJournaled(
            f"node {node!r} interrupts with a response_schema, whose answer durable_nb cannot "
            f"ask for yet (it asks yes or no, with a message): interrupt without one and read "
            f"the answer {{'approved': bool, 'message': ...}}, or use LangChain's "
            f"HumanInTheLoopMiddleware or the agent-inbox HumanInterrupt")
    decision = ctx.approval(node, {"node": node, "interrupt": value})
    answer: dict[str, Any] = {"approved": decision.approved}
    if decision.message:
        answer["message"] = decision.message
    if decision.note:
        answer["note"] = decision.note
    return answer
