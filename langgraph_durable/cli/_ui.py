"""``langgraph-durable ui``: the operator console in the browser (docs/console.md)."""

from __future__ import annotations

import os
import socket
from typing import Annotated

import typer

from langgraph_durable.cli._common import (
    DsnOption,
    ReadDsnOption,
    ReadFallbackOption,
    ReadMaxLagOption,
    SchemaOption,
    err_console,
)

ENV_TOKEN = "LGD_CONSOLE_TOKEN"


def ui_command(
    dsn: DsnOption = None,
    read_dsn: ReadDsnOption = None,
    read_max_lag: ReadMaxLagOption = 10.0,
    read_fallback: ReadFallbackOption = False,
    schema: SchemaOption = None,
    host: Annotated[str, typer.Option(help="Address to bind (keep 127.0.0.1 unless behind a proxy).")] = "127.0.0.1",
    port: Annotated[int, typer.Option(help="Port to listen on.")] = 8765,
    allow_actions: Annotated[
        bool,
        typer.Option(
            "--allow-actions",
            help="Enable the decisions (resume, answer, cancel, fork, delete, release, rewind, "
            "resolve, forget), signed in with the token. "
            "Without it the console only reads.",
        ),
    ] = False,
    graph: Annotated[
        str | None,
        typer.Option(help="module:builder of the current graph: the versions page's migrate dry-run, "
                     "and an interrupt's answer run by the console itself (else it is queued for a worker)."),
    ] = None,
    archive: Annotated[
        str | None,
        typer.Option(help="Archive URL (file:///dir or s3://bucket/prefix): a thread deleted from the "
                     "console is archived there first."),
    ] = None,
    migrations: Annotated[
        str | None,
        typer.Option(help="The MigrationRegistry as module:attr (default: found as `versions migrate` finds it)."),
    ] = None,
    sample_interval: Annotated[
        float, typer.Option(help="Seconds between samples for the overview charts.")
    ] = 10.0,
) -> None:
    """Serve the operator console (read-only unless --allow-actions)."""
    try:
        import uvicorn

        from langgraph_durable.console import create_app
    except ImportError as exc:
        from langgraph_durable.cli._common import fail

        # Through fail(): the message is text, so rich does not eat "[console]" as markup.
        hint = f"the console needs the 'console' extra: pip install 'langgraph-durable[console]' ({exc})"
        raise fail(False, "ImportError", hint, {}) from None
    from langgraph_durable.cli._common import Reads, saver_or_exit
    from langgraph_durable.console._security import new_token

    graph_obj = registry = None
    if graph:
        from langgraph_durable.cli._versions import find_registry, load_object

        graph_obj, module = load_object(graph)
        registry = find_registry(migrations, graph_obj, module)
    token = None
    if allow_actions:
        token = os.environ.get(ENV_TOKEN) or new_token()
    reads = Reads(read_dsn, read_max_lag, read_fallback)
    with saver_or_exit(dsn, schema, False, readonly=not allow_actions, reads=reads) as saver:
        app = create_app(
            saver, allow_actions=allow_actions, token=token, sample_interval=sample_interval,
            graph=graph_obj, registry=registry, archive_url=archive,
            allowed_hosts=None if host in ("0.0.0.0", "::") else [host, "127.0.0.1", "localhost", "::1"],
        )
        sock = _listen(host, port)  # before the URL is printed: a busy port says so, alone
        url = f"http://{host}:{port}/"
        if allow_actions:
            source = f"${ENV_TOKEN}" if os.environ.get(ENV_TOKEN) else "this run"
            err_console.print(f"console on {url} (actions enabled; token from {source})")
            if not os.environ.get(ENV_TOKEN):
                err_console.print(f"token: [bold]{token}[/]", highlight=False)
        else:
            err_console.print(f"console on {url} (read-only)")
        uvicorn.Server(uvicorn.Config(app, log_level="warning")).run(sockets=[sock])


def _listen(host: str, port: int) -> socket.socket:
    """The console's listening socket. Bound here, not by uvicorn after the URL was
    printed: on a busy port the URL printed first was the other console's, maybe of
    another database (newcomer review)."""
    from langgraph_durable.cli._common import fail

    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    try:
        return socket.create_server((host, port), family=family)
    except OSError as exc:
        why = exc.strerror or str(exc)
        raise fail(False, "OSError", f"cannot listen on {host}:{port}: {why} (another console? pass --port)", {}) from None


def register(app: typer.Typer) -> None:
    app.command("ui")(ui_command)
