"""Agent frameworks made durable, one module per framework, each imported only when used:

- :mod:`durable_nb.integrations.openai_agents`: the OpenAI Agents SDK (``pip install
  durable-nb[agents]``);
- :mod:`durable_nb.integrations.pydantic_ai`: Pydantic AI (``pip install
  durable-nb[pydantic-ai]``), with any model (:mod:`~durable_nb.integrations.pydantic_ai_models`)
  and MCP toolsets (:mod:`~durable_nb.integrations.pydantic_ai_mcp`, imported only when the
  agent has one);
- :mod:`durable_nb.integrations.langgraph`: LangGraph graphs and LangChain's models and tools
  (``pip install durable-nb[langgraph]``).
"""

from __future__ import annotations

import importlib

from ..errors import MissingExtra

__all__ = ["EXTRAS", "require"]

#: Each extra of an integration, and the modules it must make importable.
EXTRAS: dict[str, tuple[str, ...]] = {
    "agents": ("agents",),
    "pydantic-ai": ("pydantic_ai", "pydantic_ai.models.openai"),
    "mcp": ("mcp",),
    "langgraph": ("langgraph", "langchain_core"),
}


def require(extra: str) -> None:
    """Return when the packages of ``extra`` (a key of :data:`EXTRAS`) import; else raise
    :class:`~durable_nb.errors.MissingExtra`, one line saying what to install (a notebook's
    first cell calls it, so Run All stops there rather than in a child process)."""
    if extra not in EXTRAS:
        raise ValueError(f"unknown extra {extra!r}: one of {', '.join(sorted(EXTRAS))}")
    for module in EXTRAS[extra]:
        try:
            importlib.import_module(module)
        except ImportError as exc:
            raise MissingExtra(
                f"pip install \"durable-nb[{extra}]\" in this kernel's environment, then "
                f"restart the kernel: this needs the {extra!r} extra ({exc})") from None
