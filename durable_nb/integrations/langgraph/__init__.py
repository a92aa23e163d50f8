"""LangGraph graphs made durable in a cell (``pip install langgraph``).

- :mod:`durable_nb.integrations.langgraph.checkpoint`: LangGraph's own state on the run's
  journal, :class:`~durable_nb.integrations.langgraph.checkpoint.JournalCheckpointer` (a
  ``BaseCheckpointSaver`` on the diskcache or PostgreSQL journal), and
  :func:`~durable_nb.integrations.langgraph.checkpoint.fork_from_checkpoint`, time travel as a
  durable_nb fork.
"""
