"""The ``langgraph-durable`` command line (typer + rich).

Each concern registers its commands from its own module; this file only assembles them.
To add commands: a new ``_x.py`` with ``register(app)``, appended to the tuple below.
Keep a command module's top level light (typer, the stdlib, ``_common``, ``errors``):
import rich, psycopg, langgraph and the package's own modules inside the command
functions, so ``--help`` stays fast (tests/test_cli_startup.py checks it).
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
    _ui,
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
    _roles, _ui,
):
    module.register(app)


def main() -> None:
    # The submodule itself, not ``from langgraph_durable import audit``: that goes through
    # the package's lazy __getattr__, which checks (so imports) LangGraph first, ~1 s
    # before --help could print. audit imports nothing of LangGraph.
    import langgraph_durable.audit as audit

    audit.set_default_via("cli")  # operator actions run from here are audited as such
    app()


__all__ = ["app", "main"]
