"""``%%durable_agent`` and ``%durable``: thin IPython magics over the runner and registry.

Errors show short (:mod:`~durable_nb.notebook.cell_errors`): durable_nb's own as their
message alone, the user's code's with the user's frames only.
"""

from __future__ import annotations

import os
import shlex
import sys
import time
from pathlib import Path
from typing import Any

from IPython.core.error import UsageError
from IPython.core.magic import Magics, cell_magic, line_magic, magics_class
from IPython.core.magic_arguments import (
    MagicArgumentParser,
    argument,
    magic_arguments,
)

from .. import registry, serde
from ..batches.batch import batch as read_batch
from ..batches.batch import item_keys
from ..cli.main import STEERING, command_list, near_runs, steer
from ..cli.show import (
    effective_states,
    format_batch,
    format_batches,
    format_run,
    format_runs,
    list_runs,
    more_runs_note,
    parse_item_status,
    parse_status,
)
from ..cli.usage import explain_usage
from ..retention.sweep import pruned_note
from ..errors import (
    ApprovalPolicyError,
    DurableError,
    NotifyConfigError,
    UnknownRun,
)
from ..export import export_batch, export_run
from ..journal import Journal, Status, default_location, open_journal
from ..approvals.state import effective_state
from ..approvals.history import history
from ..notify.audit import notifications
from ..notify.config import check_selection
from ..approvals.policy import approvers_list, parse_duration as policy_duration
from . import (
    NotebookBatch,
    NotebookRun,
    active_batch,
    active_run,
    compile_cell,
    compile_item_cell,
    describe_unfinished,
    wait_for_batch,
)
from .cell_errors import cell_syntax_error, shorten
from .check import check_cell, check_runs
from .extensions import start_check
from .watchers import wake_watchers
from .inbox import ApprovalsInbox
from ..profile import disable, enable
from ..registry import batch_rows, is_interrupted, recorded_decision
from ..runner import RunOptions, validate_run_id

__all__ = ["DurableMagics", "load_ipython_extension", "parse_cost", "parse_duration",
           "unload_ipython_extension"]

_MAGIC_COMMANDS = ["runs", "show", "inbox", "approve", "reject", "cancel", "reset", "delete",
                   "wait", "export", "check", "batches", "batch", "enable", "disable"]


def parse_duration(text: str) -> float:
    """``--timeout``'s value in seconds, in the one grammar of a duration
    (:func:`durable_nb.approvals.policy.parse_duration`); UsageError otherwise."""
    try:
        return policy_duration(text, "--timeout")
    except ApprovalPolicyError:
        raise UsageError(f"--timeout {text!r} is not a duration: write e.g. 90s, 30m, 2h "
                         f"or 1d") from None


def parse_cost(text: str) -> float:
    """``0.50``, ``$0.50``, ``2`` -> US dollars."""
    try:
        value = float(text.strip().lstrip("$"))
    except ValueError:
        raise UsageError(f"--max-cost {text!r} is not an amount: write US dollars, e.g. 0.50 "
                         f"or 2") from None
    if not value > 0:
        raise UsageError(f"--max-cost {text!r} must be more than 0")
    return value


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise UsageError(f"{text!r} is not a whole number") from None
    if value < 0:
        raise UsageError(f"{text!r} must be 0 or more")
    return value


#: Options whose value is a Python expression: written as in code (``--key item['id']``),
#: brackets and quotes kept; quoting the whole expression is allowed too.
_EXPRESSION_OPTIONS = ("--over", "--key")
_CLOSING = {"(": ")", "[": "]", "{": "}"}


def _expression_word(line: str, start: int) -> tuple[str, int]:
    """The Python expression starting at ``line[start]``: up to the first blank outside
    brackets and quotes. Returns (expression, end)."""
    stack: list[str] = []
    quote = None
    i = start
    while i < len(line):
        ch = line[i]
        if quote:
            if ch == "\\":
                i += 1
            elif ch == quote:
                quote = None
        elif ch in "'\"":
            quote = ch
        elif ch in _CLOSING:
            stack.append(_CLOSING[ch])
        elif stack and ch == stack[-1]:
            stack.pop()
        elif ch.isspace() and not stack:
            break
        i += 1
    if quote or stack:
        raise ValueError(f"unbalanced {'quote' if quote else 'brackets'} in the expression "
                         f"{line[start:]!r}")
    word = line[start:i]
    if len(word) >= 2 and word[0] == word[-1] and word[0] in "'\"":
        inner = word[1:-1]
        if word[0] not in inner:  # quoted as a whole, as a shell would: the expression inside
            word = inner
    return word, i


def split_options(line: str) -> list[str]:
    """The words of a magic's line, as a shell splits them (shlex), except the values of
    ``--over`` and ``--key``, which are Python expressions kept as written."""
    words: list[str] = []
    i = 0
    while i < len(line):
        if line[i].isspace():
            i += 1
            continue
        if words and words[-1] in _EXPRESSION_OPTIONS:
            word, i = _expression_word(line, i)
            words.append(word)
            continue
        lexer = shlex.shlex(line[i:], posix=True)
        lexer.whitespace_split = True
        lexer.commenters = ""
        word = lexer.get_token()
        if word is None:
            break
        consumed = lexer.instream.tell()
        name, eq, value = word.partition("=")
        if eq and name in _EXPRESSION_OPTIONS:  # --key=item['id']: the raw text after '='
            raw_start = i + line[i:].index("=") + 1
            value, i = _expression_word(line, raw_start)
            words.append(f"{name}={value}")
            continue
        words.append(word)
        i += consumed
    return words


def _positive_number(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise UsageError(f"{text!r} is not a number") from None
    if not value > 0:
        raise UsageError(f"{text!r} must be more than 0")
    return value


#: ``%%durable_agent`` options that only a batch (``--over``) takes.
def _notify_channels(text: str) -> str:
    """``--notify``'s value, checked (an unknown channel name is refused at once)."""
    try:
        check_selection(text)
    except NotifyConfigError as exc:
        raise UsageError(str(exc)) from None
    return text


def _approvers(text: str) -> list[str]:
    """``--approvers``' value as names (an empty one is refused at once)."""
    try:
        return approvers_list(text, "--approvers")
    except ValueError as exc:
        raise UsageError(str(exc)) from None


_BATCH_OPTIONS = ("key", "concurrency", "retry_failed", "max_total_tokens", "max_total_cost",
                  "requests_per_minute", "tokens_per_minute")


def _batch_items(expression: str, namespace: dict) -> list:
    """The items of ``--over EXPR``, evaluated in the notebook's namespace, as a list."""
    try:
        value = eval(compile(expression, "<--over>", "eval"), namespace)
    except SyntaxError as exc:
        raise UsageError(f"--over {expression}: not a Python expression ({exc.msg}). Write "
                         f"e.g. --over items or --over \"tickets[:10]\"") from None
    except Exception as exc:
        raise UsageError(f"--over {expression}: {type(exc).__name__}: {exc}") from None
    if hasattr(value, "to_dict") and hasattr(value, "columns"):  # a pandas DataFrame: its rows
        return list(value.to_dict("records"))
    if isinstance(value, (str, bytes)):
        raise UsageError(f"--over {expression} is a string: give a list of items (e.g. "
                         f"--over \"text.splitlines()\")")
    if isinstance(value, dict):
        raise UsageError(f"--over {expression} is a dict: say what an item is, e.g. --over "
                         f"\"list({expression}.values())\" or \"list({expression}.items())\"")
    try:
        return list(value)
    except TypeError:
        raise UsageError(f"--over {expression}: a {type(value).__name__} is not a list of "
                         f"items (it cannot be iterated)") from None


def _batch_keys(items: list, expression: str | None, namespace: dict) -> list[str]:
    """Each item's key: ``--key EXPR`` evaluated with ``item`` and ``index``, or a digest
    of the item's content."""
    if expression is None:
        return item_keys(items)
    try:
        code = compile(expression, "<--key>", "eval")
    except SyntaxError as exc:
        raise UsageError(f"--key {expression}: not a Python expression ({exc.msg}). Write "
                         f"e.g. --key item['id'] or --key index") from None
    scope = dict(namespace)
    raw = []
    for index, item in enumerate(items):
        scope["item"], scope["index"] = item, index
        try:
            raw.append(eval(code, scope))
        except Exception as exc:
            raise UsageError(f"--key {expression} failed for item {index} ({_short(item)}): "
                             f"{type(exc).__name__}: {exc}") from None
    return item_keys(list(range(len(items))), key=lambda index: raw[index])


def _batch_plan(options: Any, namespace: dict) -> tuple[list, list[str]]:
    """A batch cell's items and their keys, from its ``--over`` and ``--key``."""
    items = _batch_items(options.over, namespace)
    return items, _batch_keys(items, options.key, namespace)


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:59] + "\u2026"


def _batch_stopped(batch_id: str, interrupted: list[str]) -> str:
    kept = (f"{len(interrupted)} item{'s' if len(interrupted) != 1 else ''} in flight "
            f"{'were' if len(interrupted) != 1 else 'was'} interrupted and kept; "
            if interrupted else "")
    return (f"batch {batch_id!r} stopped: {kept}re-run the cell to finish the batch (DONE items "
            f"are answered from the journal, the others resume)")


def _parse(parser: Any, line: str) -> Any:
    # shlex rather than IPython's arg_split, which keeps the quotes of quoted values.
    try:
        words = split_options(line)
    except ValueError as exc:
        raise UsageError(f"cannot parse the options {line!r}: {exc}") from None
    try:
        return parser.parse_args(words)
    except UsageError as exc:
        raise UsageError(explain_usage(parser, str(exc), words)) from None


@magics_class
class DurableMagics(Magics):
    """The durable_nb magics. The cell id of the running cell is tracked so that a
    ``%%durable_agent`` cell without RUN_ID keeps its run across re-runs."""

    def __init__(self, shell: Any) -> None:
        super().__init__(shell)
        self.cell_id: str | None = None

    def pre_run_cell(self, info: Any) -> None:
        self.cell_id = getattr(info, "cell_id", None)

    @magic_arguments()
    @argument("run_id", nargs="?", metavar="RUN_ID",
              help="the run's id (one word, no spaces); re-running the cell with the same id "
                   "resumes or replays the run. Default: derived from the notebook cell's id, "
                   "so re-running this cell continues its run.")
    @argument("--title", help="a title shown in the panel and in `%%durable runs`")
    @argument("--max-iterations", type=_positive_int, metavar="N",
              help="stop the run (FAILED) before LLM call N+1")
    @argument("--max-tokens", type=_positive_int, metavar="N",
              help="token budget: stop the run (FAILED) before an LLM call that would pass it")
    @argument("--max-cost", type=parse_cost, metavar="DOLLARS",
              help="cost budget in US dollars (e.g. 0.50): stop the run (FAILED) before an LLM "
                   "call that would pass it")
    @argument("--timeout", type=parse_duration, metavar="DURATION",
              help="total time allowed from the run's creation (90s, 30m, 2h); an expired run is "
                   "marked FAILED and never resumed")
    @argument("--journal", metavar="JOURNAL",
              help="the journal: a directory or a postgresql:// URL (default: "
                   "$DURABLE_NB_JOURNAL, $DURABLE_NB_DIR or ./.durable_nb)")
    @argument("--model", help="default model for ctx.chat in this run")
    @argument("--wait", action="store_true",
              help="keep the cell running while an approval is pending, until it is decided "
                   "from outside (durable-nb approve, another notebook). For headless runs "
                   "(nbclient, papermill); without it the cell ends and the panel's buttons "
                   "resume the run")
    @argument("--notify", type=_notify_channels, metavar="CHANNELS",
              help="where a request for approval is sent when the run starts waiting: "
                   "channel names (webhook, slack, email, or an installed plug-in's; "
                   "comma-separated) or none; "
                   "default: every channel configured for the journal or the user "
                   "(notify.toml, DURABLE_NB_NOTIFY_*)")
    @argument("--approvers", type=_approvers, metavar="NAMES",
              help="who may decide the run's approvals: Jupyter user names or e-mail "
                   "addresses, comma-separated (ana,bo@example.com); anyone else is refused. "
                   "A tool's or a request's own approvers take their place")
    @argument("--four-eyes", action="store_true",
              help="whoever started the run may not decide its approvals")
    @argument("--on-change", choices=["error", "rerun", "replay"], default="error",
              help="when a step is asked differently than the journal holds it (an edited "
                   "prompt, other arguments, another step): stop before returning a stale "
                   "result, naming what changed (error, the default); execute again from the "
                   "first changed step, the steps before it replayed and the old ones kept as "
                   "a fork of the run (rerun); or return the journaled results anyway when "
                   "only inputs changed (replay)")
    @argument("--on-journal-error", choices=["continue", "stop"], default="stop",
              help="when a journal write fails (disk full, the database unreachable): stop "
                   "the run once the step in flight is done, nothing reported DONE that the "
                   "journal does not hold (stop, the default); or go on NOT durable, with a "
                   "loud warning, retrying the writes at every step (continue)")
    @argument("--over", metavar="ITEMS",
              help="a batch: run the cell once per item of ITEMS (a Python expression: a list, "
                   "any iterable, a pandas DataFrame gives one dict per row), each item its "
                   "own run RUN_ID/KEY, with `item` and `index` in scope; the cell's value is "
                   "the Batch. Re-running the cell answers DONE items from the journal and "
                   "resumes the rest. Options above (budgets, --timeout, --model) apply to "
                   "each item")
    @argument("--key", metavar="EXPR",
              help="with --over: an item's key, a Python expression of `item` (and `index`), "
                   "e.g. item['id']; `index` keys items by their place in the list (which "
                   "shifts when the list changes). Default: a digest of the item's content")
    @argument("--check", action="store_true",
              help="execute nothing: check the run (with --over, the batch's items) against "
                   "the cell as written now, by a dry replay of its journal, and print per "
                   "run: replays, would execute (where), or diverges (what changed)")
    @argument("--concurrency", type=_positive_int, default=None, metavar="N",
              help="with --over: how many items run at once (default 8)")
    @argument("--retry-failed", choices=["yes", "no"], default=None,
              help="with --over: run FAILED items again when the cell is re-run (yes, the "
                   "default) or keep them as they are (no); interrupted items always resume")
    @argument("--max-total-tokens", type=_positive_int, metavar="N",
              help="with --over: the batch's token budget, shared by all items: an item stops "
                   "(FAILED) before an LLM call that could pass it")
    @argument("--max-total-cost", type=parse_cost, metavar="DOLLARS",
              help="with --over: the batch's cost budget in US dollars, shared by all items")
    @argument("--requests-per-minute", type=_positive_number, metavar="N",
              help="with --over: the endpoint's request rate limit, shared by all items (a "
                   "429's retry-after pauses them all)")
    @argument("--tokens-per-minute", type=_positive_number, metavar="N",
              help="with --over: the endpoint's token rate limit, shared by all items")
    @cell_magic
    def durable_agent(self, line: str, cell: str) -> Any:
        """Run the cell as a durable agent loop, with ``ctx`` in scope.

        Every side effect goes through ``ctx``: ``ctx.run(name, fn, *args)``,
        ``ctx.chat(**openai_kwargs)``, ``ctx.call_tools(message, tools)``,
        ``ctx.approval(name, details)``, ``ctx.state``, ``ctx.now()``, ``ctx.sleep(s)``. Each step's
        result is journaled before the loop goes on. After a kernel restart, re-running the
        cell replays the completed steps from the journal (no LLM or tool call is made again)
        and continues at the first step that never finished. A DONE run replays instantly and
        shows its result (the value of the cell's last expression).

        A live panel under the cell shows status, iteration, tokens, cost, the step timeline
        (click a step to see what it was asked and what came back) and pending approvals with
        Approve / Reject buttons. When an approval is pending the cell ends and the run waits
        in the journal; a click (or ``durable-nb approve RUN`` from anywhere) resumes it in
        the background with the same panel. Stop a running cell with the kernel's stop button
        (the run is kept, FAILED "interrupted", and resumes when re-run), or with the panel's
        Cancel button. The cell's prints go to the cell's output (the panel's log takes only
        what a run prints when resumed in the background). Right after the panel, a saved view
        (static HTML) shows the run in a notebook reopened without its kernel.
        """
        args = _parse(self.durable_agent.parser, line)
        run_id = args.run_id or self._run_id_from_cell()
        try:
            validate_run_id(run_id)
        except ValueError as exc:
            raise UsageError(str(exc)) from None
        if args.check:
            return self._check_cell(run_id, args, cell)
        if args.over is not None:
            return self._batch_cell(run_id, args, cell)
        batch_only = [name for name in _BATCH_OPTIONS if getattr(args, name) is not None]
        if batch_only:
            option = "--" + batch_only[0].replace("_", "-")
            raise UsageError(f"{option} is an option of a batch: add --over ITEMS to run the "
                             f"cell once per item (e.g. `%%durable_agent {run_id} --over items "
                             f"{option} ...`)")
        run = None
        try:
            journal = open_journal(args.journal)
            options = RunOptions(
                title=args.title, timeout=args.timeout, max_iterations=args.max_iterations,
                max_tokens=args.max_tokens, max_cost=args.max_cost, model=args.model,
                source=cell, on_approval="wait" if args.wait else "park",
                on_change=args.on_change, on_journal_error=args.on_journal_error,
                notebook=self._notebook_path(), cell_id=self.cell_id, notify=args.notify,
                approvers=args.approvers, four_eyes=args.four_eyes)
            try:
                handler = compile_cell(cell, run_id, self.shell.user_ns)
            except SyntaxError as exc:
                raise cell_syntax_error(exc, self.shell) from None
            run = NotebookRun(run_id, handler, options, journal)
            run.show()
            outcome = run.start()
        except BaseException as exc:
            stopped = None
            if isinstance(exc, KeyboardInterrupt) and run is not None:
                try:
                    record = run.journal.find_run(run_id)
                    stopped = f"run {run_id!r} {record.error}" if record and record.error else None
                except DurableError:
                    pass
            shorten(exc, self.shell, interrupted=stopped)
            raise
        return outcome.result if outcome.status is Status.DONE else None

    def _batch_cell(self, batch_id: str, args: Any, cell: str) -> Any:
        """``%%durable_agent BATCH --over ITEMS``: the cell once per item, as a batch."""
        if args.concurrency == 0:
            raise UsageError("--concurrency 0 would run nothing: give 1 or more")
        namespace = self.shell.user_ns
        items = _batch_items(args.over, namespace)
        keys = _batch_keys(items, args.key, namespace)
        batch = None
        try:
            journal = open_journal(args.journal)
            try:
                body = compile_item_cell(cell, batch_id, namespace, items)
            except SyntaxError as exc:
                raise cell_syntax_error(exc, self.shell) from None
            batch = NotebookBatch(
                batch_id, lambda ctx, index: body(ctx, index), keys, journal=journal,
                concurrency=args.concurrency or 8, retry_failed=args.retry_failed != "no",
                wait=args.wait, title=args.title,
                limits={"max_total_tokens": args.max_total_tokens,
                        "max_total_cost": args.max_total_cost,
                        "requests_per_minute": args.requests_per_minute,
                        "tokens_per_minute": args.tokens_per_minute},
                options={"timeout": args.timeout, "max_iterations": args.max_iterations,
                         "max_tokens": args.max_tokens, "max_cost": args.max_cost,
                         "model": args.model, "source": cell,
                         "on_change": args.on_change,
                         "on_journal_error": args.on_journal_error, "notify": args.notify,
                         "approvers": args.approvers, "four_eyes": args.four_eyes,
                         "notebook": self._notebook_path(), "cell_id": self.cell_id})
            batch.show()
            return batch.start()
        except BaseException as exc:
            stopped = None
            if isinstance(exc, KeyboardInterrupt) and batch is not None:
                stopped = _batch_stopped(batch_id, batch.interrupted_items())
            shorten(exc, self.shell, interrupted=stopped)
            raise

    def _check_cell(self, run_id: str, args: Any, cell: str) -> None:
        """``--check``: the cell's run (or batch) checked against the cell as written now."""
        namespace = self.shell.user_ns
        items = keys = None
        if args.over is not None:
            items = _batch_items(args.over, namespace)
            keys = _batch_keys(items, args.key, namespace)
        try:
            report = check_cell(cell, run_id, open_journal(args.journal, read_only=True),
                                namespace, model=args.model, items=items, keys=keys)
        except SyntaxError as exc:
            raise cell_syntax_error(exc, self.shell) from None
        except UnknownRun as exc:
            raise UsageError(f"{exc} Nothing to check yet: run the cell without --check to "
                             f"start it.") from None
        print(report.text(diff=True))

    def _check_runs(self, args: Any, journal: Journal) -> None:
        """``%durable check``: runs checked against their cells in this notebook, as saved."""
        if args.run_ids:
            records = [journal.find_run(run_id) for run_id in args.run_ids]
            missing = [run_id for run_id, r in zip(args.run_ids, records) if r is None]
            if missing:
                raise UnknownRun(missing[0], journal.location)
        else:
            notebook = None if args.prefix else self._notebook_path()
            records = [r for r in journal.list_runs(args.prefix or "") if r.parent is None
                       and (notebook is None or r.notebook == notebook)]
        report, notes = check_runs(
            records, journal, self.shell.user_ns,
            lambda line: _parse(self.durable_agent.parser, line),
            lambda options: _batch_plan(options, self.shell.user_ns), args,
            self._notebook_path())
        print("\n".join(notes + [report.text(diff=args.diff)]))

    def _notebook_path(self) -> str | None:
        """The notebook this kernel runs, as Jupyter Server told it (``__session__``, set by
        ipykernel from ``JPY_SESSION_NAME``); None outside a server's notebook."""
        session = self.shell.user_ns.get("__session__") or os.environ.get("JPY_SESSION_NAME")
        return session if isinstance(session, str) and session else None

    def _run_id_from_cell(self) -> str:
        if not self.cell_id:
            raise UsageError("%%durable_agent needs a RUN_ID here: this frontend does not send "
                             "cell ids. Write e.g. `%%durable_agent sales-report`.")
        return f"cell-{self.cell_id[:12]}"

    @line_magic
    def durable(self, line: str) -> Any:
        """Inspect and steer durable runs.

        %durable runs [--status STATUS]     list runs (status in any case: done, DONE)
        %durable show RUN                   one run: status, tokens, cost, its steps
        %durable inbox                      the requests waiting, across runs and notebooks,
                                            with Approve / Reject (for VS Code, Colab)
        %durable approve RUN [NOTE]         approve the pending approval (once; --replace
                                            changes a decision the run has not taken)
                                            (--args JSON: with edited arguments)
        %durable reject RUN [NOTE]          reject it (--message TEXT: what the model is told)
        %durable cancel RUN                 stop the run at its next step (status CANCELLED)
        %durable reset RUN --from N         forget steps N and later, so they run again
        %durable delete RUN                 delete the run and its journal
        %durable wait RUN [--timeout DUR]   block until the run finishes (for headless runs);
                                            returns its result, raises if it FAILED
        %durable export RUN PATH            write the run as a notebook (.ipynb) or .json
        %durable check [RUN ...] [--prefix P] [--diff]
                                            check runs against their cells in this
                                            notebook as saved, executing nothing (a
                                            dry replay): replays,
                                            would execute, or diverges; default: this
                                            notebook's runs (--over, --key, --model as in
                                            the cell)
        %durable batches                    list batches with their items' counts
        %durable batch show ID [--status S] [--limit N]
                                            a batch's totals and items
        %durable batch wait ID [--timeout DUR]
                                            block until every item finished (headless
                                            notebooks); returns the Batch
        %durable batch export ID PATH       the items as .jsonl, or a notebook report (.ipynb)
        %durable enable                     load durable_nb in every kernel from now on
                                            (writes your IPython profile); disable undoes it

        Every command takes --journal JOURNAL, a directory or a postgresql:// URL (default:
        $DURABLE_NB_JOURNAL, $DURABLE_NB_DIR or ./.durable_nb).
        ``runs``, ``show``, ``export``, ``batches`` and ``batch show/export`` only read the
        journal (never create or change it). A batch's items are runs ``BATCH/KEY``: approve
        one with ``%durable approve BATCH/KEY``.
        """
        if not line.strip():
            print(command_list("%durable", _MAGIC_COMMANDS))
            return None
        args = _parse(self._line_parser(), line)
        try:
            return self._dispatch(args)
        except UnknownRun as exc:
            raise UsageError(f"{exc}{near_runs(exc.run_id, args.journal)}") from None
        except ValueError as exc:  # a step number outside the run, and the like
            raise UsageError(str(exc)) from None
        except BaseException as exc:
            shorten(exc, self.shell)
            raise

    def _line_parser(self) -> MagicArgumentParser:
        parser = _no_abbrev(MagicArgumentParser(prog="%durable", add_help=False))
        sub = parser.add_subparsers(dest="command", metavar="COMMAND")
        sub.required = True

        def command(name: str, *run_args: str) -> Any:
            p = _no_abbrev(sub.add_parser(name, add_help=False))
            p.add_argument("--journal", metavar="JOURNAL")
            for arg in run_args:
                p.add_argument(arg, metavar=arg.upper())
            return p

        runs = command("runs")
        runs.add_argument("--status", type=parse_status, metavar="STATUS")
        runs.add_argument("--prefix", metavar="P")
        runs.add_argument("--limit", type=_positive_int, default=50, metavar="N")
        command("batches")
        batch = _no_abbrev(sub.add_parser("batch", add_help=False))
        verbs = batch.add_subparsers(dest="batch_command", metavar="show|wait|export")
        verbs.required = True
        for verb in ("show", "wait", "export"):
            p = _no_abbrev(verbs.add_parser(verb, add_help=False))
            p.add_argument("--journal", metavar="JOURNAL")
            p.add_argument("batch_id", metavar="ID")
            if verb == "show":
                p.add_argument("--status", type=parse_item_status, metavar="STATUS")
                p.add_argument("--limit", type=_positive_int, default=50, metavar="N")
            elif verb == "wait":
                p.add_argument("--timeout", type=parse_duration)
            else:
                p.add_argument("path", metavar="PATH")
        check = command("check")
        check.add_argument("run_ids", nargs="*", metavar="RUN")
        for option in ("--prefix", "--over", "--key", "--model"):
            check.add_argument(option, metavar=option[2:].upper())
        check.add_argument("--diff", action="store_true")
        command("show", "run_id")
        command("inbox")
        for verb in ("approve", "reject"):
            # default=[]: without it argparse reports the optional note as required (fix).
            decide = command(verb, "run_id")
            decide.add_argument("note", nargs="*", default=[])
            decide.add_argument("--replace", action="store_true")
            if verb == "approve":
                decide.add_argument("--args", dest="edited_args", metavar="JSON")
            else:
                decide.add_argument("--message", metavar="TEXT")
        command("cancel", "run_id")
        command("reset", "run_id").add_argument("--from", dest="from_step", type=int,
                                                required=True)
        command("delete", "run_id")
        command("wait", "run_id").add_argument("--timeout", type=parse_duration)
        command("export", "run_id", "path")
        for name in ("enable", "disable"):
            _no_abbrev(sub.add_parser(name, add_help=False)).add_argument(
                "--profile", default="default")
        return parser

    def _dispatch(self, args: Any) -> Any:
        if args.command in ("enable", "disable"):
            print(enable(args.profile) if args.command == "enable" else disable(args.profile))
            return None
        if args.command == "inbox":  # a widget over the journal, opened per click
            return ApprovalsInbox(args.journal)
        read_only = args.command in ("runs", "show", "export", "batches", "check") or (
            args.command == "batch" and args.batch_command in ("show", "export"))
        journal = open_journal(args.journal, read_only=read_only)
        if args.command == "runs":
            records, more = list_runs(journal, status=args.status, prefix=args.prefix,
                                      limit=args.limit)
            print(format_runs(records, [r.run_id for r in records
                                        if is_interrupted(r, journal)
                                        and active_run(r.run_id) is None],
                              effective_states(journal, records)))
            for note in (more_runs_note(len(records), more, "%durable runs"),
                         pruned_note(journal)):
                if note:
                    print(note)
        elif args.command == "check":
            self._check_runs(args, journal)
        elif args.command == "batches":
            print(format_batches(batch_rows(journal)))
        elif args.command == "batch":
            return self._batch(args, journal)
        elif args.command == "show":
            info = registry.get_run(args.run_id, journal=journal)
            print(format_run(info, is_interrupted(info, journal),
                             recorded_decision(info, journal),
                             notifications(journal, args.run_id),
                             history(journal, args.run_id), effective_state(journal, info)))
        elif args.command in STEERING:
            note = " ".join(args.note) if getattr(args, "note", None) else None
            print(steer(args.command, args.run_id, journal, note=note,
                        from_step=getattr(args, "from_step", 0),
                        replace=getattr(args, "replace", False), via="%durable",
                        args=getattr(args, "edited_args", None),
                        message=getattr(args, "message", None)))
            # A parked run (or batch item) of this kernel resumes without waiting for its poll.
            wake_watchers(args.run_id)
        elif args.command == "wait":
            return self._wait(args.run_id, args.timeout, journal)
        elif args.command == "export":
            print(f"wrote {export_run(args.run_id, args.path, journal=journal)}")
        return None

    def _batch(self, args: Any, journal: Journal) -> Any:
        if args.batch_command == "wait":
            return wait_for_batch(args.batch_id, journal, args.timeout)
        if args.batch_command == "export":
            print(f"wrote {export_batch(args.batch_id, args.path, journal=journal)}")
            return None
        batch = read_batch(args.batch_id, journal=journal)
        active = active_batch(args.batch_id)
        interrupted = [item.run_id for item in batch if item.status is Status.RUNNING
                       and not (active is not None and active.executing)
                       and registry.lease_holder(item.run_id, journal=journal) is None]
        print(format_batch(batch, status=args.status, limit=args.limit, interrupted=interrupted))
        return None

    def _wait(self, run_id: str, timeout: float | None, journal: Journal) -> Any:
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            info = journal.get_run(run_id)  # the record only: this polls
            run = active_run(run_id)
            busy = (registry.lease_holder(run_id, journal=journal) is not None
                    or (run is not None and run.executing))
            if not busy and run is not None and info.status in (
                    Status.DONE, Status.FAILED, Status.CANCELLED):
                run.refresh_display()  # the panel's text summary tells the end, headless too
            if not busy and info.status is Status.DONE:
                return serde.decode(info.result)
            if not busy and info.status in (Status.FAILED, Status.CANCELLED):
                raise DurableError(f"run {run_id!r} is {info.status}: {info.error}. "
                                   f"`%durable show {run_id}` tells more; re-run its cell to "
                                   f"resume it.")
            if deadline is not None and time.monotonic() > deadline:
                raise DurableError(
                    f"run {run_id!r} is still {info.status} after {timeout:g} s"
                    + (f" (waiting for approval of "
                       f"{(info.pending_approval or {}).get('name')!r}: approve it with "
                       f"`%durable approve {run_id}`)"
                       if info.status is Status.WAITING_APPROVAL else "")
                    + ". Wait longer with --timeout, or look at it: "
                      f"`%durable show {run_id}`.")
            time.sleep(0.1)


def _no_abbrev(parser: Any) -> Any:
    # MagicArgumentParser takes no allow_abbrev; argparse reads the attribute when parsing.
    parser.allow_abbrev = False
    return parser


_no_abbrev(DurableMagics.durable_agent.parser)


def load_ipython_extension(ipython: Any) -> None:
    """``%load_ext durable_nb``: register the magics; report runs a dead kernel left behind.
    Silent and changing nothing where they are registered already (``durable-nb enable``'s
    profile loads this module at start, and the notebook's own ``%load_ext durable_nb``
    follows)."""
    if any(isinstance(getattr(callback, "__self__", None), DurableMagics)
           for callback in ipython.events.callbacks["pre_run_cell"]):
        return
    start_check()  # what the Jupyter server lacks, asked once, before a panel needs it
    magics = DurableMagics(ipython)
    ipython.register_magics(magics)
    ipython.events.register("pre_run_cell", magics.pre_run_cell)
    directory = Path(default_location())
    if (directory / "cache.db").is_file():
        try:
            lines = describe_unfinished(open_journal(directory))
        except DurableError as exc:
            print(f"durable_nb: {exc}", file=sys.stderr)
            return
        if lines:
            print("durable_nb: unfinished runs in " + str(directory.resolve()) + ":\n  "
                  + "\n  ".join(lines))


def unload_ipython_extension(ipython: Any) -> None:
    """Unregister the cell-id tracking (IPython has no way to remove magics)."""
    for callback in list(ipython.events.callbacks["pre_run_cell"]):
        if isinstance(getattr(callback, "__self__", None), DurableMagics):
            ipython.events.unregister("pre_run_cell", callback)
