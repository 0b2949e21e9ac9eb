"""CLI commands for the embedded PostgreSQL."""

from __future__ import annotations

from typing import Annotated

import typer

from langgraph_durable.cli._common import console
from langgraph_durable.embedded import default_home, embedded_dsn, stop_embedded

embedded_app = typer.Typer(
    help="The embedded PostgreSQL (the DSN 'embedded'; needs the 'embedded' extra)."
)


@embedded_app.command("start")
def start(
    data_dir: Annotated[str | None, typer.Option(help="Data folder (default: $LANGGRAPH_DURABLE_HOME/pgdata).")] = None,
) -> None:
    """Start (or reuse) the embedded server, leave it running, and print its DSN."""
    console.print(embedded_dsn(data_dir, keep=True), soft_wrap=True)


@embedded_app.command("stop")
def stop(data_dir: Annotated[str | None, typer.Option(help="Data folder.")] = None) -> None:
    """Stop the embedded server if it runs."""
    stopped = stop_embedded(data_dir)
    console.print("stopped" if stopped else "not running")


@embedded_app.command("where")
def where() -> None:
    """Print the default data folder."""
    console.print(str(default_home() / "pgdata"))


def register(app: typer.Typer) -> None:
    app.add_typer(embedded_app, name="embedded")
