"""CLI command: ``rekey`` (re-encrypt every sealed column with the current key).

The keys come from ``--key-file`` (one a line: the new key first, then the old ones) or
``$LANGGRAPH_DURABLE_KEY_FILE``. Progress goes to stderr; a wrong key stops it with a
typed error naming the thread and the column (exit 1), and a rerun resumes it. The work
lives in ``langgraph_durable.ops.rekey`` (usable from Python).
"""

from __future__ import annotations

from typing import Annotated

import typer

from langgraph_durable.cli._common import (
    DsnOption,
    JsonOption,
    KeyFileOption,
    SchemaOption,
    console,
    fail,
    open_saver,
    print_json,
    serde_from_keys,
)
from langgraph_durable.errors import DurableError


def rekey_command(
    key_file: KeyFileOption = None,
    dsn: DsnOption = None,
    schema: SchemaOption = None,
    batch_size: Annotated[int, typer.Option("--batch-size", min=1, help="Rows per transaction.")] = 500,
    as_json: JsonOption = False,
) -> None:
    """Re-encrypt every encrypted column with the current key (the key file's first).

    Rows under an old key of the file are opened with it and sealed with the current
    one, a page of rows per transaction; rows already under the current key are left
    alone, so a rerun after an interruption resumes. Audited (storage.rekey)."""
    from langgraph_durable.cli._storage import _progress
    from langgraph_durable.ops import rekey

    try:
        serde = serde_from_keys(key_file)
        if serde is None:
            raise fail(as_json, "RekeyError", "rekey needs the keys: --key-file FILE (the new key "
                       "first, then the old ones) or $LANGGRAPH_DURABLE_KEY_FILE", {})
        with open_saver(dsn, schema, serde=serde) as saver, _progress("rekey", not as_json) as progress:
            report = rekey.rekey(saver, batch_size=batch_size, progress=progress)
    except DurableError as exc:
        raise fail(as_json, type(exc).__name__, exc.message, exc.fields) from None
    if as_json:
        print_json(report.as_dict())
        return
    from rich.table import Table

    table = Table(title=f"rekey to key {report.key_id}")
    table.add_column("column")
    table.add_column("rows", justify="right")
    table.add_column("re-encrypted", justify="right")
    for name, stats in report.columns.items():
        table.add_row(name, str(stats["scanned"]), str(stats["rekeyed"]))
    console.print(table)
    console.print(
        "once this run is complete, the old keys may leave the key file: the digest secret "
        "(durable_secrets) was re-sealed with the current key too",
        highlight=False, markup=False,
    )


def register(app: typer.Typer) -> None:
    """Add this module's commands to the main app."""
    app.command("rekey")(rekey_command)
