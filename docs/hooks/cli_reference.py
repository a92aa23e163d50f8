"""MkDocs hook: the CLI and magics reference, rendered from the parsers themselves.

A page holding the marker ``<!-- durable-nb:cli -->`` gets ``durable-nb --help`` and the help of
every subcommand, from the argparse parser in ``durable_nb/cli/main.py``; ``<!-- durable-nb:magics -->``
gets ``%%durable_agent?`` (IPython's magic_arguments parser) and ``%durable``'s docstring. So
the reference says what the installed code accepts, and no option is copied by hand.
"""

from __future__ import annotations

import argparse
import inspect
import os
from typing import Any

CLI_MARKER = "<!-- durable-nb:cli -->"
MAGICS_MARKER = "<!-- durable-nb:magics -->"
#: argparse wraps help to the terminal's width (COLUMNS): fixed, so the page does not depend on
#: the terminal that built it.
WIDTH = "80"


def _subparsers(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    for action in parser._actions:  # argparse keeps its subcommands only here
        if isinstance(action, argparse._SubParsersAction):
            return dict(action.choices)
    return {}


def _block(title: str, text: str, level: int) -> str:
    return f"{'#' * level} `{title}`\n\n```text\n{text.rstrip()}\n```\n"


def cli_reference() -> str:
    """``durable-nb --help`` and each subcommand's help, as Markdown."""
    from durable_nb.cli.main import build_parser

    os.environ["COLUMNS"] = WIDTH
    parser = build_parser()
    parts = [_block("durable-nb", parser.format_help(), 3)]
    for name, sub in _subparsers(parser).items():
        parts.append(_block(f"durable-nb {name}", sub.format_help(), 3))
        for verb, subsub in _subparsers(sub).items():
            parts.append(_block(f"durable-nb {name} {verb}", subsub.format_help(), 4))
    return "\n".join(parts)


def magics_reference() -> str:
    """``%%durable_agent?`` and ``%durable``'s usage, as Markdown."""
    from durable_nb.notebook.magics import DurableMagics

    os.environ["COLUMNS"] = WIDTH
    agent = DurableMagics.durable_agent.parser.format_help()  # what %%durable_agent? prints
    durable = inspect.cleandoc(DurableMagics.durable.__doc__ or "")
    return "\n".join([_block("%%durable_agent", agent, 3), _block("%durable", durable, 3)])


def on_page_markdown(markdown: str, page: Any, **kwargs: Any) -> str:
    """Fill the markers of the page being built."""
    if CLI_MARKER in markdown:
        markdown = markdown.replace(CLI_MARKER, cli_reference())
    if MAGICS_MARKER in markdown:
        markdown = markdown.replace(MAGICS_MARKER, magics_reference())
    return markdown
