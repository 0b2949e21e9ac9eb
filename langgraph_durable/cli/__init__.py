"""The ``langgraph-durable`` command line (typer + rich).

Each concern registers its commands from its own module; this file only assembles them.
To add commands: a new ``_x.py`` with ``register(app)``, appended to the tuple below.
Keep a command module's top level light (typer, the stdlib, ``_common``, ``errors``):
import rich, psycopg, langgraph and the package's own modules inside the command
functions, so ``--help`` stays fast (tests/test_cli_startup.py checks it).
"""

from __future__ import annotations

import sys
from typing import Any

import typer

from langgraph_durable.cli import (
    _common,
    _control,
    _demo,
    _embedded,
    _export,
    _keys,
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

@app.callback()
def _root(
    key_file: _common.KeyFileOption = None,
) -> None:
    """Durable checkpoints for LangGraph: inspect threads, recover, migrate, compact."""
    # Every command that opens a saver reads the keys from here (set on each invocation,
    # so one in a long-lived process, a test's runner, does not leak into the next).
    _common.KEY_FILE_FLAG[0] = key_file


for module in (
    _demo, _embedded, _threads, _versions, _storage, _quarantine, _ledger, _worker, _export,
    _roles, _ui, _keys, _control,
):
    module.register(app)


def _one_line_summaries(typer_app: typer.Typer) -> None:
    """A command's line in its group's list is its docstring's first paragraph as one line:
    typer keeps the docstring's own line breaks there, which broke sentences mid-way."""
    for info in typer_app.registered_commands:
        doc = info.help or (info.callback.__doc__ if info.callback else None)
        if info.short_help is None and doc:
            info.short_help = " ".join(doc.split("\n\n", 1)[0].split())
    for group in typer_app.registered_groups:
        if group.typer_instance is not None:
            _one_line_summaries(group.typer_instance)


_SHORT_TYPES = {
    "<str>": "TEXT", "<int>": "INT", "<float>": "FLOAT", "<list[str]>": "TEXT",
    "<int range>": "INT", "<float range>": "FLOAT", "<Path>": "PATH",
}


def _flags_without_placeholders() -> None:
    """A flag takes no value, so its help row shows none (typer 0.29 prints ``--json <bool>``).
    A test (tests/test_cli_help.py) fails if typer stops honouring this."""
    from typer.core import TyperOption

    shown = TyperOption.display_type_rich

    def display_type_rich(self: TyperOption, ctx: Any) -> str | None:
        if self.is_flag:
            return None
        label = shown(self, ctx)
        # Short value names (click's own style): "<list[str]>", "<int range>" took the
        # width an 80-column help needs for the descriptions (issue 24 review).
        return _SHORT_TYPES.get(label, label) if isinstance(label, str) else label

    TyperOption.display_type_rich = display_type_rich  # type: ignore[method-assign]


_one_line_summaries(app)
_flags_without_placeholders()


def main() -> None:
    # The submodule itself, not ``from langgraph_durable import audit``: that goes through
    # the package's lazy __getattr__, which checks (so imports) LangGraph first, ~1 s
    # before --help could print. audit imports nothing of LangGraph.
    import langgraph_durable.audit as audit

    audit.set_default_via("cli")  # operator actions run from here are audited as such
    try:
        app()
    except Exception as exc:
        code = one_line_error(exc, as_json="--json" in sys.argv[1:])
        if code is None:
            raise
        sys.exit(code)


def one_line_error(exc: BaseException, *, as_json: bool) -> int | None:
    """A typed error (or the database going away) that reached the top of a command:
    one line on stderr (a JSON object on stdout with --json), exit code 1; None for
    anything else, a bug, whose traceback is worth seeing. Modules are looked up, not
    imported: a command that never loaded psycopg cannot have raised its errors."""
    from langgraph_durable.errors import DurableError

    kinds: tuple[type[BaseException], ...] = (DurableError,)
    if "psycopg" in sys.modules:
        import psycopg

        kinds += (psycopg.OperationalError,)
    if "psycopg_pool" in sys.modules:
        import psycopg_pool

        kinds += (psycopg_pool.PoolTimeout,)
    if not isinstance(exc, kinds):
        return None
    message = getattr(exc, "message", None) or str(exc) or type(exc).__name__
    message = " ".join(message.split())  # one line, whatever the server sent
    if as_json:
        from langgraph_durable.cli._common import print_json

        print_json({"error": type(exc).__name__, "message": message, **getattr(exc, "fields", {})})
    else:
        sys.stderr.write(f"error: {type(exc).__name__}: {message}\n")
    return 1


__all__ = ["app", "main", "one_line_error"]
