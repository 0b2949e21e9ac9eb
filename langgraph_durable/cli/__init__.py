"""The ``langgraph-durable`` command line (typer + rich).

Each concern registers its commands from its own module; this file only assembles them.
"""

from __future__ import annotations

import typer

from langgraph_durable.cli import (
    _demo,
    _embedded,
    _export,
    _ledger,
    _quarantine,
    _roles,
    _storage,
    _threads,
    _versions,
    _worker,
)

app = typer.Typer(
    name="langgraph-durable",
    help="Durable checkpoints for LangGraph: inspect threads, recover, migrate, compact.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_show_locals=False,
)

for module in (
    _demo, _embedded, _threads, _versions, _storage, _quarantine, _ledger, _worker, _export,
    _roles,
):
    module.register(app)


def main() -> None:
    app()


__all__ = ["app", "main"]
