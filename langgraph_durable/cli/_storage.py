"""CLI commands: ``gc`` (collect unreferenced artifacts), ``retain`` (retention,
optionally archiving what it deletes) and ``restore`` (load archived threads back).

Both print what they did, or with ``--dry-run`` what they would do (rows and bytes),
as a table or ``--json``; progress goes to stderr so ``--json`` output stays clean.
The work itself lives in ``langgraph_durable.ops.retention`` (usable from Python).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Annotated, Any

import typer

from langgraph_durable.audit import redact_url
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
from langgraph_durable.errors import DurableError

if TYPE_CHECKING:
    from rich.table import Table

    from langgraph_durable.ops import retention

GraceOption = Annotated[
    float,
    typer.Option(
        "--grace",
        min=0,
        help="Keep unreferenced artifacts younger than this many seconds.",
    ),
]
DryRunOption = Annotated[
    bool, typer.Option("--dry-run", help="Only report what would be deleted (rows and bytes).")
]


@contextmanager
def _progress(label: str, enabled: bool) -> Iterator[Callable[[int, int], None] | None]:
    """A rich progress bar on stderr, fed by the ``progress(done, total)`` callbacks."""
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
    if not enabled:
        yield None
        return
    with Progress(
        TextColumn("[bold]{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        console=err_console.resolve(),
        transient=True,
    ) as bar:
        task = bar.add_task(label, total=None)

        def update(done: int, total: int) -> None:
            bar.update(task, completed=done, total=total)

        yield update


def _fail(exc: Exception) -> None:
    err_console.print(f"[red]error:[/] {type(exc).__name__}: {escape(str(exc))}")
    raise typer.Exit(1) from None


def _gc_table(report: retention.GcReport, title: str) -> Table:
    from rich.table import Table
    verb = "would delete" if report.dry_run else "deleted"
    table = Table(title=title, show_header=True, header_style="bold")
    table.add_column("what")
    table.add_column("rows", justify="right")
    table.add_column("bytes", justify="right")
    table.add_row(f"artifacts ({verb})", str(report.artifacts), fmt_bytes(report.artifact_bytes))
    table.add_row(
        f"reference rows of {report.orphan_threads} deleted thread(s) ({verb})",
        str(report.orphan_refs),
        "-",
    )
    table.add_row("artifacts scanned", str(report.scanned), "-")
    return table


def gc_command(
    dsn: DsnOption = None,
    schema: SchemaOption = None,
    grace: GraceOption = 600.0,
    batch_size: Annotated[int, typer.Option("--batch-size", min=1, help="Artifacts per transaction.")] = 1000,
    dry_run: DryRunOption = False,
    as_json: JsonOption = False,
) -> None:
    """Delete artifacts that no checkpoint, blob or pending write references any more.

    Safe while graphs run: a reference row pins its artifact (foreign key), and a
    write that reuses a collected artifact is retried with the data."""
    from langgraph_durable.ops import retention
    try:
        with open_saver(dsn, schema) as saver, _progress("gc", not as_json) as progress:
            report = retention.gc(
                saver, grace=grace, batch_size=batch_size, dry_run=dry_run, progress=progress
            )
    except DurableError as exc:
        _fail(exc)
        return
    if as_json:
        print_json(report.as_dict())
        return
    console.print(_gc_table(report, "gc (dry run)" if dry_run else "gc"))


def retain_command(
    dsn: DsnOption = None,
    schema: SchemaOption = None,
    days: Annotated[
        float,
        typer.Option("--days", min=0, help="Delete completed threads idle for longer than this."),
    ] = 30.0,
    keep_last: Annotated[
        int | None,
        typer.Option(
            "--keep-last",
            min=1,
            help="Also trim every thread that is kept (not running, leased or quarantined) "
            "to its last K checkpoints.",
        ),
    ] = None,
    status: Annotated[
        list[str] | None,
        typer.Option(
            "--status",
            help="durable_threads statuses that count as completed (repeatable; default "
            "'done'). Threads without a status row always count. 'waiting' threads "
            "(interrupted, awaiting a human) are live unless named here.",
        ),
    ] = None,
    run_gc: Annotated[
        bool, typer.Option("--gc/--no-gc", help="Collect the freed artifacts afterwards.")
    ] = True,
    grace: GraceOption = 600.0,
    archive: Annotated[
        str | None,
        typer.Option(
            "--archive",
            metavar="URL",
            help="Before deleting a thread, write its whole history to one verified file "
            "under this directory or fsspec URL (s3://bucket/prefix needs the 'archive' "
            "extra); `langgraph-durable restore URL` loads it back.",
        ),
    ] = None,
    batch_size: Annotated[
        int, typer.Option("--batch-size", min=1, help="Threads deleted per transaction.")
    ] = 100,
    dry_run: DryRunOption = False,
    as_json: JsonOption = False,
) -> None:
    """Apply retention: delete completed threads older than --days (default 30), and
    with --keep-last K keep only the last K checkpoints of the others. Never touches a
    thread that is running, leased or quarantined. With --archive URL each deleted
    thread is archived (and verified) first."""
    from langgraph_durable.ops import retention
    statuses = status or ["done"]
    gc_report: retention.GcReport | None = None
    try:
        with open_saver(dsn, schema) as saver:
            with _progress("retain", not as_json) as progress:
                report = retention.retain(
                    saver,
                    older_than_days=days,
                    keep_last=keep_last,
                    statuses=statuses,
                    dry_run=dry_run,
                    batch_size=batch_size,
                    progress=progress,
                    archive=archive,
                )
            if run_gc and not dry_run:
                with _progress("gc", not as_json) as progress:
                    gc_report = retention.gc(saver, grace=grace, progress=progress)
    except DurableError as exc:
        _fail(exc)
        return
    if as_json:
        out: dict[str, Any] = report.as_dict()
        out["gc"] = gc_report.as_dict() if gc_report is not None else None
        print_json(out)
        return
    console.print(_retain_table(report, days, keep_last, dry_run, archive))
    for d in report.damaged:
        err_console.print(
            f"skipped damaged thread {d['thread_id']!r} (checkpoint {d['checkpoint_id']}): "
            f"{d['error']}",
            style="red",
            markup=False,
            highlight=False,
        )
    if gc_report is not None:
        console.print(_gc_table(gc_report, "gc"))


def _retain_table(
    report: Any, days: float, keep_last: int | None, dry_run: bool, archive: str | None
) -> Any:
    """What retain deleted (or would), as a table."""
    from rich.table import Table

    verb = "would delete" if dry_run else "deleted"
    table = Table(title="retain (dry run)" if dry_run else "retain", header_style="bold")
    table.add_column("what")
    table.add_column("rows", justify="right")
    table.add_column("bytes", justify="right")
    table.add_row(
        f"threads {verb} (completed, idle > {days:g} days)", str(report.threads_deleted), "-"
    )
    if keep_last is not None:
        table.add_row(
            f"threads trimmed to their last {keep_last} checkpoints", str(report.threads_trimmed), "-"
        )
    table.add_row(f"checkpoints ({verb})", str(report.checkpoints), "-")
    table.add_row(f"blobs ({verb})", str(report.blobs), "-")
    table.add_row(f"pending writes ({verb})", str(report.writes), "-")
    table.add_row("[bold]checkpoint data[/]", "", f"[bold]{fmt_bytes(report.bytes)}[/]")
    freed = "freed by gc" if not dry_run else "gc would free (deleted threads only)"
    table.add_row(f"artifacts {freed}", str(report.artifacts), fmt_bytes(report.artifact_bytes))
    table.add_row(f"expired idempotency keys ({verb})", str(report.ledger_keys_expired), "-")
    if archive is not None and not dry_run:
        table.add_row(
            f"threads archived to {redact_url(archive)}", str(report.threads_archived), fmt_bytes(report.archive_bytes)
        )
    for failed in getattr(report, "archive_failed", [])[:20]:
        table.add_row(f"[red]not archived, kept: {failed['thread_id']}[/]", "", failed["error"][:200])
    for reason, n in sorted(report.skipped.items()):
        table.add_row(f"[dim]threads skipped: {reason}[/]", str(n), "")
    return table



def restore_command(
    url: Annotated[str, typer.Argument(help="Archive directory, fsspec URL, or one .lgda.zst file.")],
    thread: Annotated[
        list[str] | None,
        typer.Option("--thread", "-t", help="Restore only this thread (repeatable)."),
    ] = None,
    dsn: DsnOption = None,
    schema: SchemaOption = None,
    dry_run: Annotated[
        bool,
        typer.Option("--dry-run", help="Only verify the files and list what they hold."),
    ] = False,
    as_json: JsonOption = False,
) -> None:
    """Load archived threads back (written by `retain --archive`), in one transaction.

    Every file is verified first (sha256, decoding, row counts); a damaged file, or a
    thread that already exists in the database, restores nothing."""
    from rich.table import Table

    from langgraph_durable import archive as _archive

    if dry_run:
        try:
            manifests = _archive.verify(url)
        except DurableError as exc:
            _fail(exc)
            return
        if thread:
            manifests = [m for m in manifests if m["thread_id"] in thread]
        if as_json:
            print_json({"files": manifests})
            return
        listing = Table(title=f"{redact_url(url)} (verified)", header_style="bold")
        for col in ("thread", "head checkpoint", "created", "checkpoints", "bytes"):
            listing.add_column(col)
        for m in manifests:
            listing.add_row(
                m["thread_id"],
                str(m["head_checkpoint_id"]),
                m["created_at"],
                str(m["counts"].get("checkpoints", 0)),
                fmt_bytes(int(m["payload_bytes"])),
            )
        console.print(listing)
        return
    try:
        with open_saver(dsn, schema) as saver:
            report = _archive.restore(saver, url, thread_ids=thread or None)
    except DurableError as exc:
        _fail(exc)
        return
    if as_json:
        print_json(report.as_dict())
        return
    table = Table(title=f"restore {redact_url(url)}", header_style="bold")
    table.add_column("what")
    table.add_column("rows", justify="right")
    table.add_row("threads restored", str(report.threads_restored))
    for name, n in sorted(report.rows.items()):
        table.add_row(f"  {name}", str(n))
    table.add_row("artifacts inserted", str(report.artifacts_inserted))
    table.add_row("artifacts already stored (shared)", str(report.artifacts_present))
    if report.superseded:
        table.add_row("[dim]older archives skipped[/]", str(len(report.superseded)))
    console.print(table)


def register(app: typer.Typer) -> None:
    """Add this module's commands to the main app."""
    app.command("gc")(gc_command)
    app.command("retain")(retain_command)
    app.command("restore")(restore_command)
