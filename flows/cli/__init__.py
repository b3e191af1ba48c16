"""The `futureworld` command line. Every command takes `--db URL` (default: FW_DB_URL, else
the SQLite file in FW_DATA_DIR) and applies pending migrations before it starts. Commands
only parse options, call a stage or a flow, and print: the work lives in flows.stages."""

from __future__ import annotations

import os

import typer

from flows.cli.data import agent_app, db_app, import_app, model_app
from flows.cli.demo import demo_command
from flows.cli.learning import register_learning_commands
from flows.cli.orchestration import orchestration_app
from flows.cli.pipeline import register_pipeline_commands

app = typer.Typer(no_args_is_help=True, add_completion=False, help=__doc__)


@app.callback()
def _quiet_libraries() -> None:
    """Model loading prints its own progress bars; ours are enough."""
    os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")


app.add_typer(db_app, name="db")
app.add_typer(import_app, name="import")
app.add_typer(agent_app, name="agent")
app.add_typer(model_app, name="model")
app.add_typer(orchestration_app, name="orchestrate", help="Prefect deployments, cycles, timers.")
register_pipeline_commands(app)
register_learning_commands(app)
app.command("demo")(demo_command)


def main() -> None:
    app()
