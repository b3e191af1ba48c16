"""The `futureworld` command line. Every command takes `--db URL` (default: FW_DB_URL, else
the SQLite file in FW_DATA_DIR) and applies pending migrations before it starts. Commands
only parse options, call a stage or a flow, and print: the work lives in flows.stages.

Every way a command can end is handled here, once, for the console entry point and for
typer's test runner alike (`CommandLine.main`): a usage mistake or a UserError (unknown name,
bad value, unreachable service, bad path) prints one line on stderr and exits 2; a RunFailure
or any other exception prints one line and exits 1. Tracebacks are printed only with
`--debug` or FW_DEBUG=1. Secrets of the configuration never reach the printed line.

A SIGTERM (what `kill`, `pkill`, a container stop or a scheduler's timeout sends) ends a
command of the console entry point the way Ctrl-C does: it is raised in the main thread as
`Terminated`, which no `except Exception` handler catches, so every `with` block unwinds (a
demo's panel worker and the tracker run are stopped, Prefect's temporary server too, by its
exit hook) before the command prints one line and exits 143 (128 + SIGTERM). Python's
default action would end the process on the spot and leave its children running."""

from __future__ import annotations

import logging
import os
import signal
import sys
import traceback
from collections.abc import Callable, Sequence
from typing import Annotated, Any

import typer
from typer._click.exceptions import UsageError  # typer vendors its own click
from typer.core import TyperGroup

from flows.cli.common import RunFailure, UserError, load_settings
from flows.cli.data import agent_app, db_app, import_app, model_app
from flows.cli.demo import demo_command
from flows.cli.history import export_app, register_history_commands
from flows.cli.learning import register_learning_commands
from flows.cli.orchestration import orchestration_app
from flows.cli.pipeline import register_pipeline_commands
from flows.cli.versions import register_version_commands

USAGE_ERROR = 2
"""Exit code of the caller's mistakes (usage, unknown names, bad values, services, paths)."""
RUN_FAILURE = 1
"""Exit code of a command that ran and failed."""
TERMINATED = 128 + signal.SIGTERM
"""Exit code of a command ended by SIGTERM (the shell's convention)."""
DEBUG_ENV = "FW_DEBUG"


class Terminated(BaseException):
    """SIGTERM, raised in the main thread: a BaseException, so that no handler that records
    and continues (`except Exception`) swallows it, as KeyboardInterrupt is not swallowed."""


def _raise_terminated(signum: int, _frame: object) -> None:
    raise Terminated(signal.Signals(signum).name)


def debug_requested(args: Sequence[str]) -> bool:
    """`--debug` among the arguments, or FW_DEBUG set to 1/true/yes."""
    flag = os.environ.get(DEBUG_ENV, "").strip().lower() in ("1", "true", "yes")
    return flag or "--debug" in args


def run_guarded(invoke: Callable[[], Any], *, debug: bool) -> int:
    """Run a command and return its exit code, printing one line for whatever went wrong."""
    try:
        result = invoke()
    except UsageError as error:
        where = error.ctx.command_path if error.ctx is not None else "futureworld"
        return _fail(
            USAGE_ERROR, f"{where}: {error.format_message()} (see `{where} --help`)", debug
        )
    except typer.Abort:
        return _fail(RUN_FAILURE, "aborted", debug)
    except Terminated:
        return _fail(TERMINATED, "terminated by SIGTERM", debug)
    except UserError as error:
        return _fail(USAGE_ERROR, str(error), debug)
    except RunFailure as error:
        return _fail(RUN_FAILURE, str(error), debug)
    except Exception as error:  # the last line of defence: one line, no traceback
        hint = "" if debug else " (rerun with --debug for the traceback)"
        return _fail(RUN_FAILURE, f"failed: {type(error).__name__}: {error}{hint}", debug)
    return result if isinstance(result, int) else 0


def _fail(code: int, message: str, debug: bool) -> int:
    if debug and sys.exc_info()[0] is not None:
        traceback.print_exc()
    typer.echo(f"error: {_redact(_one_line(message))}", err=True)
    return code


def _one_line(text: str) -> str:
    return " ".join(text.split())


def _redact(text: str) -> str:
    try:
        return load_settings().redact(text)
    except UserError:
        return text


class CommandLine(TyperGroup):
    """The root command: runs every command through `run_guarded`."""

    def main(  # type: ignore[override]
        self,
        args: Sequence[str] | None = None,
        prog_name: str | None = None,
        complete_var: str | None = None,
        standalone_mode: bool = True,
        **extra: Any,
    ) -> Any:
        argv = list(sys.argv[1:] if args is None else args)
        debug = debug_requested(argv)
        if not debug:
            logging.getLogger("sqlalchemy").setLevel(logging.ERROR)
        code = run_guarded(
            lambda: super(CommandLine, self).main(
                argv, prog_name, complete_var, standalone_mode=False, **extra
            ),
            debug=debug,
        )
        if standalone_mode:
            sys.exit(code)
        return code


app = typer.Typer(no_args_is_help=True, add_completion=False, help=__doc__, cls=CommandLine)


@app.callback()
def _root(
    debug: Annotated[
        bool, typer.Option("--debug", help="Print tracebacks (also FW_DEBUG=1).")
    ] = False,
) -> None:
    """Model loading prints its own progress bars; ours are enough."""
    del debug  # read by CommandLine.main before the command runs
    os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")


app.add_typer(db_app, name="db")
app.add_typer(import_app, name="import")
app.add_typer(agent_app, name="agent")
app.add_typer(model_app, name="model")
app.add_typer(export_app, name="export")
app.add_typer(orchestration_app, name="orchestrate", help="Prefect deployments, cycles, timers.")
register_pipeline_commands(app)
register_learning_commands(app)
register_history_commands(app)
register_version_commands(app)
app.command("demo")(demo_command)


def main() -> None:
    """The console entry point (`futureworld`, `python -m flows`); SIGTERM unwinds the
    command (`Terminated`)."""
    signal.signal(signal.SIGTERM, _raise_terminated)
    app()
