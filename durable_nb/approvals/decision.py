"""What ``ctx.approval`` returns: :class:`Decision`, a person's answer as the run takes it
(the same live and on replay)."""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["Decision"]


@dataclass(frozen=True)
class Decision:
    """A person's answer to ``ctx.approval``: approved or not, an optional note, and who;
    ``args`` the arguments they edited when approving (a request given a ``schema``),
    ``message`` what they said to the model when rejecting."""

    approved: bool
    note: str | None = None
    by: str | None = None
    args: dict | None = None
    message: str | None = None
    #: The answer to an MCP server's question: ``{"action": ..., "content": ...}``.
    answer: dict | None = None
