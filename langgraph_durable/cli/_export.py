"""CLI command ``export-stock``: rewrite threads into plain stock rows (no lock-in).

``langgraph-durable export-stock [--thread T ...] [--dry-run] [--verify]``: every value
stored by reference is inlined in the stock format, so the stock ``PostgresSaver`` reads
every thread as this package does. ``--dry-run`` shows what would change (rows, bytes,
channels) and writes nothing; ``--verify`` reads each thread with this package before
and with the stock saver after, checkpoint by checkpoint, and counts mismatches (exit
code 1 if any). The work lives in ``langgraph_durable.export`` (usable from Python).
"""

from __future__ import annotations

from typing import Annotated, Any

import typer

from langgraph_durable.cli._common import (
    DsnOption,
    JsonOption,
    SchemaOption,
    console,
    err_console,
    escape,
    fmt_bytes,
    open_saver,
    print_json,
)
from langgraph_durable.embedded import resolve_dsn


def _stock_saver(dsn: str, schema: str | None, serde: Any = None) -> Any:
    import psycopg
    from langgraph.checkpoint.postgres import PostgresSaver
    from psycopg.rows import dict_row

    from langgraph_durable.pooler import prepare_threshold, resolve_pooler
    from langgraph_durable.sql.schema import set_search_path

    # Behind a transaction pooler ($LANGGRAPH_DURABLE_POOLER): no prepared statements,
    # no session search_path (the role's default names the schema; see pooler.py).
    pooled = resolve_pooler(None)
    conn = psycopg.connect(
        dsn, autocommit=True, prepare_threshold=prepare_threshold(pooled), row_factory=dict_row
    )
    if schema and not pooled:
        conn.execute(set_search_path(schema))
    # The serializer the package read with (the --key-file one): an encrypted export is
    # the serializer's `<type>+aes` rows, which the stock saver reads only through it.
    return conn, PostgresSaver(conn, serde=serde)


def export_stock_command(
    thread: Annotated[
        list[str] | None, typer.Option("--thread", help="Only this thread (repeatable).")
    ] = None,
    dry_run: Annotated[
        bool, typer.Option("--dry-run", help="Show what would change; write nothing.")
    ] = False,
    verify: Annotated[
        bool,
        typer.Option(
            "--verify",
            help="Read each thread before (this package) and after (the stock saver) and "
            "compare every checkpoint.",
        ),
    ] = False,
    dsn: DsnOption = None,
    schema: SchemaOption = None,
    as_json: JsonOption = False,
) -> None:
    """Rewrite threads into plain stock rows (artifacts inlined, envelopes removed) so
    the stock PostgresSaver reads them unchanged. Run before uninstalling the package."""
    from langgraph_durable import export

    url = resolve_dsn(dsn)
    with open_saver(url, schema) as saver:
        ids = thread or None
        before: dict[str, Any] = {}
        if verify and not dry_run:
            listed = saver.run_op(lambda: export.op_thread_ids(ids))
            before = {tid: export.snapshot_thread(saver, tid) for tid in listed}
        report = export.export_stock(saver, thread_ids=ids, dry_run=dry_run)
        serde = saver.serde
    mismatches = _verify_with_stock(url, schema, before, serde) if before else {}
    out = report.as_dict()
    if verify and not dry_run:
        out["verified"] = {"threads": len(before), "mismatches": sum(map(len, mismatches.values()))}
        out["mismatches"] = mismatches
    if as_json:
        print_json(out)
    else:
        _print_report(report, dry_run, verify, before, mismatches)
    if not report.ok or mismatches:
        raise typer.Exit(1)



def _verify_with_stock(
    url: str, schema: str | None, before: dict[str, Any], serde: Any = None
) -> dict[str, list[str]]:
    """Each exported thread as the stock saver reads it, against its snapshot taken
    through this package before the export: the differences, by thread."""
    from langgraph_durable import export

    mismatches: dict[str, list[str]] = {}
    conn, stock = _stock_saver(url, schema, serde)
    with conn:
        for tid, snap in before.items():
            problems = export.compare_snapshots(snap, export.snapshot_thread(stock, tid))
            if problems:
                mismatches[tid] = problems
    return mismatches


def _print_report(
    report: Any, dry_run: bool, verify: bool, before: dict[str, Any], mismatches: dict[str, list[str]]
) -> None:
    totals = report.totals()
    verb = "would inline" if dry_run else "inlined"
    from rich.table import Table

    table = Table(title="export-stock" + (" (dry run: nothing written)" if dry_run else ""))
    for col in (
        "thread",
        "checkpoints",
        "blobs",
        "writes",
        "envelopes",
        "stock rows",
        "versions",
        "channels",
    ):
        table.add_column(col)
    for t in report.threads:
        if t.changed:
            table.add_row(
                t.thread_id,
                str(t.checkpoints),
                str(t.blobs),
                str(t.writes),
                fmt_bytes(t.envelope_bytes),
                fmt_bytes(t.stock_bytes),
                str(t.versions),
                ", ".join(t.channels),
            )
    if totals["threads_changed"]:
        console.print(table)
    console.print(
        f"{totals['threads']} thread(s), {totals['checkpoints']} checkpoint(s): {verb} "
        f"{totals['blobs']} blob(s) and {totals['writes']} write(s) in "
        f"{totals['threads_changed']} thread(s) ({fmt_bytes(totals['envelope_bytes'])} of "
        f"envelopes -> {fmt_bytes(totals['stock_bytes'])} of stock rows), "
        f"{totals['versions']} row(s) of compact versions put in the stock form; busy {len(report.busy)}, failed {len(report.failed)}"
    )
    if verify and not dry_run:
        n = sum(map(len, mismatches.values()))
        console.print(
            f"verified with the stock saver: {len(before)} thread(s), {n} mismatch(es)"
        )
    for tid, err in report.failed.items():
        err_console.print(f"[red]failed[/] {escape(tid)}: {escape(str(err))}")
    for tid in report.busy:
        err_console.print(f"[yellow]busy[/] {tid}: a live run holds it; run again later")
    for tid, problems in mismatches.items():
        err_console.print(f"[red]mismatch[/] {escape(tid)}: {escape('; '.join(problems[:5]))}")


def register(app: typer.Typer) -> None:
    """Add this module's commands to the main app."""
    app.command("export-stock")(export_stock_command)
