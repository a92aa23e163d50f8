"""``%%durable_agent`` and ``%durable``: thin IPython magics over the runner and registry."""

from __future__ import annotations

import re
import shlex
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
from IPython.display import display

from . import registry
from .cli import STEERING, format_run, format_runs, steer
from .errors import DurableError, UnknownRun
from .journal import Journal, Status, default_location, open_journal
from .notebook import NotebookRun, active_run, compile_cell, describe_unfinished
from .runner import RunOptions, validate_run_id

__all__ = ["DurableMagics", "load_ipython_extension", "unload_ipython_extension"]

_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(s|sec|m|min|h|d)?\s*$")
_UNIT_SECONDS = {None: 1, "s": 1, "sec": 1, "m": 60, "min": 60, "h": 3600, "d": 86400}


def parse_duration(text: str) -> float:
    """``90``, ``90s``, ``30m``, ``2h``, ``1d`` -> seconds."""
    match = _DURATION.match(text)
    if not match:
        raise UsageError(f"--timeout {text!r} is not a duration: write e.g. 90s, 30m, 2h or 1d")
    return float(match.group(1)) * _UNIT_SECONDS[match.group(2)]


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise UsageError(f"{text!r} is not a whole number") from None
    if value < 0:
        raise UsageError(f"{text!r} must be 0 or more")
    return value


def _parse(parser: Any, line: str) -> Any:
    # shlex rather than IPython's arg_split, which keeps the quotes of quoted values.
    try:
        words = shlex.split(line)
    except ValueError as exc:
        raise UsageError(f"cannot parse the options {line!r}: {exc}") from None
    return parser.parse_args(words)


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
              help="the run's id; re-running the cell with the same id resumes or replays the "
                   "run. Default: derived from the notebook cell's id, so re-running this cell "
                   "continues its run.")
    @argument("--title", help="a title shown in the panel and in `%%durable runs`")
    @argument("--max-iterations", type=_positive_int, metavar="N",
              help="stop the run (FAILED) before LLM call N+1")
    @argument("--max-tokens", type=_positive_int, metavar="N",
              help="token budget: stop the run (FAILED) before an LLM call that would pass it")
    @argument("--timeout", type=parse_duration, metavar="DURATION",
              help="total time allowed from the run's creation (90s, 30m, 2h); an expired run is "
                   "marked FAILED and never resumed")
    @argument("--journal", metavar="DIR",
              help="journal directory (default: $DURABLE_NB_DIR or ./.durable_nb)")
    @argument("--model", help="default model for ctx.chat in this run")
    @argument("--wait", action="store_true",
              help="keep the cell running while an approval is pending, until it is decided "
                   "from outside (durable-nb approve, another notebook). For headless runs "
                   "(nbclient, papermill); without it the cell ends and the panel's buttons "
                   "resume the run")
    @argument("--on-change", choices=["error", "rerun", "replay"], default="error",
              help="when a step is asked differently than the journal holds it (an edited "
                   "prompt, other arguments, another step): stop before returning a stale "
                   "result, naming what changed (error, the default); execute again from the "
                   "first changed step, the steps before it replayed and the old ones kept as "
                   "a fork of the run (rerun); or return the journaled results anyway when "
                   "only inputs changed (replay)")
    @argument("--on-journal-error", choices=["continue", "stop"], default="continue",
              help="when a journal write fails (disk full): go on with a loud warning and retry "
                   "(default), or stop before passing the unrecorded step")
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

        A live panel under the cell shows status, iteration, tokens, the step timeline and
        pending approvals with Approve / Reject buttons. When an approval is pending the cell
        ends and the run waits in the journal; a click (or ``durable-nb approve RUN`` from
        anywhere) resumes it in the background with the same panel. Stop a running cell
        with the kernel's stop button (the run is kept, FAILED "interrupted", and resumes
        when re-run), or with the panel's Cancel button.
        """
        args = _parse(self.durable_agent.parser, line)
        run_id = args.run_id or self._run_id_from_cell()
        try:
            validate_run_id(run_id)
        except ValueError as exc:
            raise UsageError(str(exc)) from None
        journal = open_journal(args.journal)
        options = RunOptions(
            title=args.title, timeout=args.timeout, max_iterations=args.max_iterations,
            max_tokens=args.max_tokens, model=args.model, source=cell,
            on_approval="wait" if args.wait else "park", on_change=args.on_change,
            on_journal_error=args.on_journal_error)
        handler = compile_cell(cell, run_id, self.shell.user_ns)
        run = NotebookRun(run_id, handler, options, journal)
        display(run.panel.widget)
        outcome = run.start()
        return outcome.result if outcome.status is Status.DONE else None

    def _run_id_from_cell(self) -> str:
        if not self.cell_id:
            raise UsageError("%%durable_agent needs a RUN_ID here: this frontend does not send "
                             "cell ids. Write e.g. `%%durable_agent sales-report`.")
        return f"cell-{self.cell_id[:12]}"

    @line_magic
    def durable(self, line: str) -> Any:
        """Inspect and steer durable runs.

        %durable runs [--status STATUS]     list runs
        %durable show RUN                   one run and its steps
        %durable approve RUN [NOTE]         approve the pending approval
        %durable reject RUN [NOTE]          reject it
        %durable cancel RUN                 stop the run at its next step (status CANCELLED)
        %durable reset RUN --from N         forget steps N and later, so they run again
        %durable delete RUN                 delete the run and its journal
        %durable wait RUN [--timeout DUR]   block until the run finishes (for headless runs);
                                            returns its result, raises if it FAILED
        %durable export RUN PATH            write the run as a notebook (.ipynb) or .json

        Every command takes --journal DIR (default: $DURABLE_NB_DIR or ./.durable_nb).
        """
        args = _parse(self._line_parser(), line)
        journal = open_journal(args.journal)
        try:
            return self._dispatch(args, journal)
        except UnknownRun as exc:
            raise UsageError(str(exc)) from None

    def _line_parser(self) -> MagicArgumentParser:
        parser = MagicArgumentParser(prog="%durable", add_help=False)
        sub = parser.add_subparsers(dest="command", metavar="COMMAND")
        sub.required = True

        def command(name: str, *run_args: str) -> Any:
            p = sub.add_parser(name, add_help=False)
            p.add_argument("--journal", metavar="DIR")
            for arg in run_args:
                p.add_argument(arg, metavar=arg.upper())
            return p

        command("runs").add_argument("--status", choices=[s.value for s in Status])
        command("show", "run_id")
        for verb in ("approve", "reject"):
            # default=[]: without it argparse reports the optional note as required (fix).
            command(verb, "run_id").add_argument("note", nargs="*", default=[])
        command("cancel", "run_id")
        command("reset", "run_id").add_argument("--from", dest="from_step", type=int,
                                                required=True)
        command("delete", "run_id")
        command("wait", "run_id").add_argument("--timeout", type=parse_duration)
        command("export", "run_id", "path")
        return parser

    def _dispatch(self, args: Any, journal: Journal) -> Any:
        if args.command == "runs":
            print(format_runs(registry.runs(args.status, journal=journal)))
        elif args.command == "show":
            print(format_run(registry.get_run(args.run_id, journal=journal)))
        elif args.command in STEERING:
            note = " ".join(args.note) if getattr(args, "note", None) else None
            print(steer(args.command, args.run_id, journal, note=note,
                        from_step=getattr(args, "from_step", 0)))
            run = active_run(args.run_id)
            if run is not None:
                run.wake()  # a parked run in this kernel resumes without waiting for its poll
        elif args.command == "wait":
            return self._wait(args.run_id, args.timeout, journal)
        elif args.command == "export":
            from .export import export_run

            print(f"wrote {export_run(args.run_id, args.path, journal=journal)}")
        return None

    def _wait(self, run_id: str, timeout: float | None, journal: Journal) -> Any:
        from . import serde

        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            info = journal.get_run(run_id)  # the record only: this polls
            run = active_run(run_id)
            busy = (registry.lease_holder(run_id, journal=journal) is not None
                    or (run is not None and run.executing))
            if not busy and info.status is Status.DONE:
                return serde.decode(info.result)
            if not busy and info.status in (Status.FAILED, Status.CANCELLED):
                raise DurableError(f"run {run_id!r} is {info.status}: {info.error}")
            if deadline is not None and time.monotonic() > deadline:
                raise TimeoutError(f"run {run_id!r} is still {info.status} after {timeout:g} s")
            time.sleep(0.1)


def load_ipython_extension(ipython: Any) -> None:
    """``%load_ext durable_nb``: register the magics; report runs a dead kernel left behind."""
    magics = DurableMagics(ipython)
    ipython.register_magics(magics)
    ipython.events.register("pre_run_cell", magics.pre_run_cell)
    directory = Path(default_location())
    if directory.is_dir():
        lines = describe_unfinished(open_journal(directory))
        if lines:
            print("durable_nb: unfinished runs in " + str(directory.resolve()) + ":\n  "
                  + "\n  ".join(lines))


def unload_ipython_extension(ipython: Any) -> None:
    """Unregister the cell-id tracking (IPython has no way to remove magics)."""
    for callback in list(ipython.events.callbacks["pre_run_cell"]):
        if isinstance(getattr(callback, "__self__", None), DurableMagics):
            ipython.events.unregister("pre_run_cell", callback)
