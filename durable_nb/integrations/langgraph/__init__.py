"""LangGraph (``pip install "durable-nb[langgraph]"``), durable in a run:
``invoke(ctx, graph, input)``.

In a ``%%durable_agent`` cell (or a ``durable_nb.execute`` handler)::

    from durable_nb.integrations.langgraph import invoke

    result = invoke(ctx, graph, {"messages": [("user", "Email the team.")]})

is ``graph.invoke(input)`` (``ainvoke``, ``stream``, ``astream`` likewise) with these
guarantees, for a compiled ``StateGraph``, an ``@entrypoint`` with its ``@task`` calls,
``create_react_agent`` and LangChain's ``create_agent``, the graph unchanged:

- **Every model call and every tool call is a step** (:mod:`.calls`): any LangChain chat
  model (``ChatOpenAI``, ``ChatAnthropic`` ...) with its tokens, cost, budgets and input
  comparison; any LangChain tool (``@tool``, ``ToolNode``). A crash in the middle of a node
  replays the node's finished calls and goes on at the first unfinished one: the node's code
  runs again, its calls do not. Keys follow LangGraph's tasks (:mod:`.tasks`), so threads and
  parallel tool calls replay whatever their timing.
- **``interrupt()`` is a request of the run** (:mod:`.interrupts`): parked or waited for,
  decided on every path, and the decision is the value the graph resumes with (the agent-inbox
  and human-in-the-loop middleware schemas included). A node that calls ``interrupt()`` after a
  side effect makes its journaled calls once.
- **The graph's state** is kept by the run's checkpointer (:func:`.run.checkpointer_for`,
  rebuilt by each execution's replay) and, once the execution is live, on the run's journal,
  thread = run id (:mod:`.state`; :mod:`.checkpoint`'s
  :class:`~.checkpoint.JournalCheckpointer`, diskcache or PostgreSQL): :func:`.state.state`
  reads it in any process, and :func:`~.checkpoint.fork_from_checkpoint` makes time travel a
  durable_nb fork.
"""

from .run import ainvoke, astream, checkpointer_for, invoke, stream
from .state import state

__all__ = ["ainvoke", "astream", "checkpointer_for", "invoke", "state", "stream"]
