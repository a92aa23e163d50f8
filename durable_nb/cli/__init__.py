"""The ``durable-nb`` command line: one room for the terminal's surface.

- :mod:`~durable_nb.cli.main`: the parser, the commands and :func:`main`, the entry point;
- :mod:`~durable_nb.cli.show`: how runs, batches and steps are shown (shared with ``%durable``);
- :mod:`~durable_nb.cli.answer`: ``durable-nb answer``, an MCP server's question answered;
- :mod:`~durable_nb.cli.usage`: option parsing with suggestions, shared with the magics.
"""

from .main import main

__all__ = ["main"]
