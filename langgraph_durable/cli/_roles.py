"""``langgraph-durable setup`` (the owner role's job) and ``grants`` (the GRANTs the
application and read-only roles need; see langgraph_durable/grants.py)."""

from __future__ import annotations

from typing import Annotated

import typer

from langgraph_durable.cli._common import DsnOption, SchemaOption, console, fail


def setup_command(dsn: DsnOption = None, schema: SchemaOption = None) -> None:
    """Create or migrate the tables (run as the schema's owner role)."""
    from langgraph_durable.cli._common import open_saver
    from langgraph_durable.errors import DurableError

    try:
        with open_saver(dsn, schema):
            pass
    except DurableError as exc:
        raise fail(False, type(exc).__name__, exc.message, exc.fields) from None
    console.print("schema is up to date", highlight=False)


def grants_command(
    role: Annotated[str, typer.Option("--role", help="The role to grant to.")],
    readonly: Annotated[
        bool, typer.Option("--readonly", help="SELECT only (dashboards, the CLI's read commands).")
    ] = False,
    schema: SchemaOption = None,
) -> None:
    """Print the GRANTs a role needs: DML for the application and workers (default),
    SELECT only with --readonly. Run them as the owner, after `setup`."""
    from langgraph_durable.errors import DurableError
    from langgraph_durable.grants import grant_statements

    try:
        lines = grant_statements(role, schema=schema, readonly=readonly)
    except DurableError as exc:
        raise fail(False, type(exc).__name__, exc.message, exc.fields) from None
    typer.echo("\n".join(lines))


def register(app: typer.Typer) -> None:
    app.command("setup")(setup_command)
    app.command("grants")(grants_command)
