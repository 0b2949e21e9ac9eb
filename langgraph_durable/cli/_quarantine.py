"""CLI commands: ``quarantine list|show|release|rewind`` (the operator side of poison
detection; the logic is in ``langgraph_durable.ops.poison``, this module only formats)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated

import typer

from langgraph_durable.cli._common import (
    DsnOption,
    JsonOption,
    ReadDsnOption,
    ReadFallbackOption,
    ReadMaxLagOption,
    Reads,
    SchemaOption,
    console,
    print_json,
    saver_or_exit,
)

if TYPE_CHECKING:
    pass

quarantine_app = typer.Typer(
    help="Poisoned threads: list, show, release (run again), rewind (fork from an earlier "
    "checkpoint).",
    no_args_is_help=True,
)

ThreadArg = Annotated[str, typer.Argument(help="The thread_id.")]


def _short(text: str | None, width: int = 60) -> str:
    if not text:
        return "-"
    line = text.splitlines()[0]
    return line if len(line) <= width else line[: width - 1] + "…"


@quarantine_app.command("list")
def list_cmd(
    limit: Annotated[int | None, typer.Option(help="At most this many threads.")] = None,
    dsn: DsnOption = None,
    read_dsn: ReadDsnOption = None,
    read_max_lag: ReadMaxLagOption = 10.0,
    read_fallback: ReadFallbackOption = False,
    schema: SchemaOption = None,
    json_out: JsonOption = False,
) -> None:
    """Quarantined threads, most recent first."""
    from rich.table import Table

    from langgraph_durable.ops import poison

    with saver_or_exit(dsn, schema, json_out, readonly=True, reads=Reads(read_dsn, read_max_lag, read_fallback)) as saver:
        entries = poison.list_quarantined(saver, limit=limit)
    if json_out:
        print_json([e.to_dict() for e in entries])
        return
    if not entries:
        console.print("no quarantined threads")
        return
    table = Table(title=f"{len(entries)} quarantined thread(s)")
    for col in ("thread", "checkpoint", "attempts", "reason", "version", "since", "last error"):
        table.add_column(col)
    for e in entries:
        table.add_row(
            e.thread_id, e.checkpoint_id or "-", str(e.attempts), e.reason,
            e.graph_version or "-", e.quarantined_at.strftime("%Y-%m-%d %H:%M:%S"),
            _short(e.last_error),
        )
    console.print(table)


@quarantine_app.command("show")
def show_cmd(
    thread_id: ThreadArg,
    history: Annotated[int, typer.Option(help="How many recent checkpoints to list.")] = 10,
    dsn: DsnOption = None,
    read_dsn: ReadDsnOption = None,
    read_max_lag: ReadMaxLagOption = 10.0,
    read_fallback: ReadFallbackOption = False,
    schema: SchemaOption = None,
    json_out: JsonOption = False,
) -> None:
    """A thread's quarantine record, attempt count and recent checkpoints (pick one to
    rewind to)."""
    from rich.table import Table

    from langgraph_durable.ops import poison

    with saver_or_exit(dsn, schema, json_out, readonly=True, reads=Reads(read_dsn, read_max_lag, read_fallback)) as saver:
        report = poison.show(saver, thread_id, history=history)
    if json_out:
        print_json(report.to_dict())
        return
    q = report.quarantine
    console.print(f"[bold]thread[/] {report.thread_id}  status [bold]{report.status or '-'}[/]")
    if q is not None:
        console.print(
            f"quarantined {q.quarantined_at:%Y-%m-%d %H:%M:%S} at checkpoint {q.checkpoint_id} "
            f"after {q.attempts} failed attempt(s) (reason: {q.reason}, version: "
            f"{q.graph_version or '-'})"
        )
        console.print(f"last error: {q.last_error or 'unknown (the process died)'}")
        hint = (
            "its checkpoint cannot be decoded: rewind to an earlier one"
            if q.reason == "load_error"
            else "fix the cause, then release (run it again) or rewind"
        )
        console.print(f"[dim]next: {hint}[/]")
    else:
        console.print(
            f"not quarantined; {report.attempts} attempt(s) counted at "
            f"{report.attempts_checkpoint_id or '-'}"
        )
    table = Table(title="recent checkpoints (newest first)")
    for col in ("checkpoint", "step", "source", "version", "writes", "errors", ""):
        table.add_column(col)
    poisoned = q.checkpoint_id if q else None
    for c in report.history:
        table.add_row(
            c.checkpoint_id, "-" if c.step is None else str(c.step), c.source or "-",
            c.graph_version or "-", str(c.writes), str(c.errors),
            "[red]quarantined here[/]" if c.checkpoint_id == poisoned else "",
        )
    console.print(table)


@quarantine_app.command("release")
def release_cmd(
    thread_id: ThreadArg,
    dsn: DsnOption = None,
    schema: SchemaOption = None,
    json_out: JsonOption = False,
) -> None:
    """Lift the quarantine and reset the attempt count: the next run starts from the same
    checkpoint again."""
    from langgraph_durable.ops import poison
    with saver_or_exit(dsn, schema, json_out) as saver:
        entry = poison.release(saver, thread_id)
    if json_out:
        print_json({"released": True, **entry.to_dict()})
        return
    console.print(
        f"released {entry.thread_id}: the next run starts again from checkpoint "
        f"{entry.checkpoint_id} (count reset)"
    )


@quarantine_app.command("rewind")
def rewind_cmd(
    thread_id: ThreadArg,
    to: Annotated[
        str, typer.Option("--to", help="The earlier checkpoint id to continue from (see show).")
    ],
    dsn: DsnOption = None,
    schema: SchemaOption = None,
    json_out: JsonOption = False,
) -> None:
    """Fork the thread from an earlier checkpoint: a copy of it becomes the head (history
    is kept), the count is reset and the quarantine lifted."""
    from langgraph_durable.ops import poison
    with saver_or_exit(dsn, schema, json_out) as saver:
        result = poison.rewind(saver, thread_id, to)
    if json_out:
        print_json(result.to_dict())
        return
    console.print(
        f"rewound {result.thread_id} to {result.rewound_to}: new head {result.checkpoint_id}"
        + (" (quarantine lifted)" if result.released else "")
    )


def register(app: typer.Typer) -> None:
    """Add this module's commands to the main app."""
    app.add_typer(quarantine_app, name="quarantine")
