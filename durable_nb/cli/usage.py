"""How ``durable-nb`` reads its command line (and ``%durable`` its line): argparse without
prefix matching, ``--journal`` before or after a command's own words, positionals after
options, and errors that say what to do (the option meant by a near miss, the command that
takes an option given to another, the run id an unquoted space split in two)."""

from __future__ import annotations

import argparse
import difflib
import re
import shlex
import sys
from typing import Any, Callable, Sequence

__all__ = ["JOURNAL_HELP", "CommandParser", "SubcommandsWithJournal", "command_names",
           "explain_usage", "journal_option"]


def _option_strings(parser: argparse.ArgumentParser) -> list[str]:
    found: list[str] = []
    for action in parser._actions:
        found += [s for s in action.option_strings if s.startswith("--")]
        if isinstance(action, argparse._SubParsersAction):
            for sub in action.choices.values():
                found += _option_strings(sub)
    return sorted(set(found))


def _commands_taking(parser: argparse.ArgumentParser, option: str,
                     prefix: str = "") -> list[str]:
    """The (sub-)commands that take ``option``, as typed after the program's name."""
    found: list[str] = []
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                if any(option in a.option_strings for a in sub._actions
                       if not isinstance(a, argparse._SubParsersAction)):
                    found.append(prefix + name)
                found += _commands_taking(sub, option, f"{prefix}{name} ")
    return found


def command_names(parser: argparse.ArgumentParser) -> list[str]:
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            return list(action.choices)
    return []


def explain_usage(parser: argparse.ArgumentParser, message: str,
                  words: Sequence[str] = ()) -> str:
    """An argparse error message with what to do: the option or command meant by a near
    miss, and the run id an unquoted space split in two."""
    hints = []
    unknown = re.match(r"unrecognized arguments: (.*)$", message)
    if unknown:
        extras = unknown.group(1).split()
        options = _option_strings(parser)
        for word in extras:
            if word.startswith("-"):
                name = word.split("=", 1)[0]
                takers = _commands_taking(parser, name)
                if takers:  # right name, wrong command: no near miss to suggest
                    hints.append(f"{name} is not an option of this command; it is one of "
                                 + ", ".join(f"`{parser.prog} {c}`" for c in takers))
                    continue
                close = difflib.get_close_matches(name, options, n=1, cutoff=0.6)
                hints.append(f"{name} is not an option (options are never abbreviated)"
                             + (f": did you mean {close[0]}?" if close else ""))
        plain = [w for w in extras if not w.startswith("-")]
        if plain and not hints:
            hints.append(_split_word_hint(parser, words, plain))
    hints = [hint for hint in hints if hint]
    choice = re.search(r"invalid choice: '([^']*)'", message)
    if choice and not hints:
        close = difflib.get_close_matches(choice.group(1), command_names(parser), n=1)
        if close:
            hints.append(f"did you mean {close[0]!r}?")
    return message + "".join(f"\n  {hint}" for hint in hints)


def _split_word_hint(parser: argparse.ArgumentParser, words: Sequence[str],
                     extras: list[str]) -> str | None:
    """Words left over after an unquoted space: in an option's value (``--timeout 5
    minutes``), said about that option; else in the run id (``show sales report``)."""
    # The last place the words left over stand together: an earlier equal word (the command
    # `runs` in `runs --limit 5 runs`) was consumed.
    index = next((i for i in range(len(words) - 1, -1, -1)
                  if list(words[i:i + len(extras)]) == extras), None)
    before = words[index - 1] if index else None
    if not before:
        return None
    option, value = None, before
    if before.startswith("--") and "=" in before:
        option, value = before.split("=", 1)
    elif not before.startswith("-") and index >= 2 and words[index - 2].startswith("--"):
        option = words[index - 2]
    action = _option_action(parser, option) if option else None
    if action is not None and action.nargs is None:
        spaced = " ".join([value] + extras)
        left = f"{' '.join(extras)!r} is left over after {option} {value}: an option's value " \
               f"is one word"
        try:
            if callable(action.type):
                action.type(spaced)
        except Exception as exc:  # noqa: BLE001 - the option's own words for a bad value
            problem = str(exc)
            if not problem.startswith(option):
                problem = f"{option} {spaced!r}: {problem}"
            return f"{left}, and {problem}"
        return f"{left}; quote a value with a space: {option} {shlex.quote(spaced)}"
    if before.startswith("-"):
        return None
    glued = "-".join([before] + extras)
    return f"a run id is one word without spaces: did you mean {glued!r}?"


def _option_action(parser: argparse.ArgumentParser, option: str) -> argparse.Action | None:
    """The action of ``option`` in the parser or any of its sub-commands."""
    for action in parser._actions:
        if option in action.option_strings:
            return action
        if isinstance(action, argparse._SubParsersAction):
            for sub in action.choices.values():
                found = _option_action(sub, option)
                if found is not None:
                    return found
    return None


class SubcommandsWithJournal:
    """``add_parser`` of a sub-command group, each command taking ``--journal`` too."""

    def __init__(self, group: Any) -> None:
        self._group = group

    def add_parser(self, name: str, **kwargs: Any) -> argparse.ArgumentParser:
        return self._group.add_parser(name, parents=[journal_option()], **kwargs)


class CommandParser(argparse.ArgumentParser):
    """argparse without prefix matching, with suggestions in its errors. ``list_commands``
    (set on the top-level parser: ``(prog, names) -> text``) answers a line without a
    command."""

    list_commands: Callable[[str, list[str]], str] | None = None

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs["allow_abbrev"] = False
        super().__init__(*args, **kwargs)
        self._words: list[str] = []
        self._intermixing = False

    def parse_known_args(self, args: Any = None, namespace: Any = None) -> Any:
        if not self._words:
            self._words = list(sys.argv[1:] if args is None else args)
        if self._intermixing or self._subparsers is not None:
            return super().parse_known_args(args, namespace)
        # A command's own words: positionals may follow options (``approve RUN --by bo
        # NOTE``), as argparse does not allow for an optional positional otherwise.
        self._intermixing = True
        try:
            return super().parse_known_intermixed_args(args, namespace)
        finally:
            self._intermixing = False

    def error(self, message: str) -> Any:  # type: ignore[override]
        if "required: COMMAND" in message and self.list_commands is not None:
            # nothing asked: say what can be
            self.exit(2, self.list_commands(self.prog, command_names(self)) + "\n")
        self.print_usage(sys.stderr)
        self.exit(2, f"{self.prog}: error: {explain_usage(self, message, self._words)}\n")


JOURNAL_HELP = ("the journal: a directory or a postgresql:// URL (default: "
                 "$DURABLE_NB_JOURNAL, $DURABLE_NB_DIR or ./.durable_nb)")


def journal_option() -> argparse.ArgumentParser:
    """``--journal`` for every command, so that it may come before or after the command's
    own words (``durable-nb show --json RUN --journal DIR``). SUPPRESS: given only before the
    command, the value set there is not overwritten with None."""
    common = argparse.ArgumentParser(add_help=False, allow_abbrev=False)
    common.add_argument("--journal", metavar="JOURNAL", default=argparse.SUPPRESS,
                        help=JOURNAL_HELP)
    return common
