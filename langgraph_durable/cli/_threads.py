"""CLI commands: ``threads list|show|history|diff|status`` and ``stats``.

Rich tables for people, ``--json`` for scripts. The queries live in
``langgraph_durable.ops.inspection`` (plain dicts, usable from Python); this module only
formats them.
"""

from __future__ import annotations

import datetime as _dt
from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Annotated, Any

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
    err_console,
    escape,
    fail,
    fmt_bytes,
    open_saver,
    print_json,
)
from langgraph_durable.errors import DurableError

if TYPE_CHECKING:
    from rich.text import Text


threads_app = typer.Typer(
    help="Inspect threads: list, show, history, diff, status.",
    no_args_is_help=False,
    invoke_without_command=True,
)

# uuid6 checkpoint ids share their first 8 characters within a run; 18 characters
# (down to 100 ns of timestamp) tell checkpoints of one thread apart.
SHORT_ID = 18

STATE_STYLE = {
    "running": "bold green",
    "recoverable": "bold yellow",
    "waiting": "cyan",
    "quarantined": "bold red",
    "done": "green",
    "error": "red",
    "untracked": "dim",
}


@contextmanager
def _saver(
    dsn: str | None, schema: str | None, json_out: bool = False, reads: Reads | None = None
) -> Iterator[Any]:
    """A saver for reading; typed errors (a missing thread, a checkpoint that does not
    decode) become a message and exit code 1, never a traceback. With ``--json`` the
    error is a JSON document on stdout, as the other commands print it: a script that
    reads stdout must not get an empty document."""
    from rich.text import Text
    try:
        with open_saver(dsn, schema, readonly=True, reads=reads) as saver:
            yield saver
    except DurableError as exc:
        if json_out:
            raise fail(True, type(exc).__name__, exc.message, exc.fields) from None
        # Text, not markup: a message may hold brackets (ids, reprs of values).
        err_console.print(Text.assemble(("error: ", "red"), f"{type(exc).__name__}: {exc}"), highlight=False)
        raise typer.Exit(1) from None


def _ago(ts: str | None) -> str:
    if not ts:
        return "-"
    when = _dt.datetime.fromisoformat(ts)
    secs = (_dt.datetime.now(_dt.UTC) - when).total_seconds()
    if secs < 60:
        return f"{max(secs, 0):.0f}s ago"
    if secs < 3600:
        return f"{secs / 60:.0f}m ago"
    if secs < 86400:
        return f"{secs / 3600:.1f}h ago"
    return when.strftime("%Y-%m-%d %H:%M")


# threads list's optional columns: (narrowest width they need, rich options), in the order
# shown; _LIST_DROP_ORDER is the order they are left out when the terminal is too narrow.
_LIST_COLUMNS: dict[str, tuple[int, dict[str, Any]]] = {
    "graph version": (10, {"max_width": 22, "overflow": "ellipsis"}),
    "step": (4, {"justify": "right"}),
    "ckpts": (5, {"justify": "right"}),
    "bytes": (9, {"justify": "right", "no_wrap": True}),
    "last activity": (8, {"justify": "right"}),
}
_LIST_DROP_ORDER = ("ckpts", "step", "graph version", "bytes", "last activity")


def _list_columns(thread_width: int, width: int) -> list[str]:
    """The optional columns that fit beside the thread id and the state (3 characters of
    border and padding per column, 1 for the table's edge)."""
    shown = list(_LIST_COLUMNS)

    def needed() -> int:
        return 1 + (thread_width + 3) + (11 + 3) + sum(_LIST_COLUMNS[c][0] + 3 for c in shown)

    for name in _LIST_DROP_ORDER:
        if needed() <= width:
            break
        shown.remove(name)
    return shown


def _state(state: str | None, status: str | None = None, note: str | None = None) -> Text:
    from rich.text import Text
    label = state or "-"
    if status and status not in (state, "running"):
        label += f" ({status})"
    if note:  # e.g. a lease whose owner is dead: "recoverable: owner pid N ... takeover pending"
        label += f": {note}"
    return Text(label, style=STATE_STYLE.get(state or "", ""))


def _channel_labels(channels: list[str]) -> list[str]:
    """State channels as they are; of LangGraph's internal ones only the telling ones."""
    from langgraph_durable.ops import inspection as lgi
    marks = {"__interrupt__": "(interrupt)", "__error__": "(error)"}
    return [marks.get(ch, ch) for ch in channels if ch in marks or not lgi.is_internal(ch)]


def _lease(lease: dict[str, Any] | None) -> str:
    if not lease:
        return "none"
    left = lease.get("expires_in")
    when = f"expires in {left:.1f}s" if left is not None and left > 0 else "expired"
    text = f"token {lease['token']}, {when}, held by {lease['owner']}"
    return text + f" ({lease['note']})" if lease.get("note") else text


# Untracked threads (checkpoints, no durable_threads row) are found only by reading every
# thread id in checkpoints: 3-3.8 s at 1M threads, whatever the answer (issue 14; a cap
# would not bound it: with none untracked, the usual case, the scan still reads them all).
# So `threads status` counts them only when asked, and says so when it did not.
UntrackedOption = Annotated[
    bool,
    typer.Option(
        "--untracked",
        help="Also count untracked threads (checkpoints without run tracking): reads every "
        "thread id in checkpoints, seconds at a million threads.",
    ),
]


# ------------------------------------------------------------------ threads
@threads_app.callback()
def threads_root(
    ctx: typer.Context,
    status_view: Annotated[
        bool, typer.Option("--status", help="Same as `threads status`: counts per state.")
    ] = False,
    dsn: DsnOption = None,
    read_dsn: ReadDsnOption = None,
    read_max_lag: ReadMaxLagOption = 10.0,
    read_fallback: ReadFallbackOption = False,
    schema: SchemaOption = None,
    json_out: JsonOption = False,
    untracked: UntrackedOption = False,
) -> None:
    """Inspect threads. Without a subcommand: `--status` prints the counts per state."""
    if ctx.invoked_subcommand is not None:
        return
    if status_view:
        _print_status(dsn, schema, json_out, untracked, Reads(read_dsn, read_max_lag, read_fallback))
        return
    console.print(ctx.get_help())


@threads_app.command("list")
def threads_list(
    status: Annotated[
        str | None,
        typer.Option(
            "--status",
            "-s",
            help="Only threads in this state (running, recoverable, waiting, quarantined, "
            "done, untracked) or with this raw status (error, stopped).",
        ),
    ] = None,
    prefix: Annotated[str | None, typer.Option(help="Only thread ids starting with this.")] = None,
    limit: Annotated[int, typer.Option(help="At most this many threads (one page).")] = 50,
    after: Annotated[
        str | None,
        typer.Option(
            "--after",
            help="Only threads after this thread_id (the next page: pass the last "
            "thread_id of the previous one; in --json output, the last row's thread_id).",
        ),
    ] = None,
    dsn: DsnOption = None,
    read_dsn: ReadDsnOption = None,
    read_max_lag: ReadMaxLagOption = 10.0,
    read_fallback: ReadFallbackOption = False,
    schema: SchemaOption = None,
    json_out: JsonOption = False,
) -> None:
    """Threads in thread_id order, a page at a time: state, graph version, step, size
    and last activity."""
    from rich.table import Table

    from langgraph_durable.ops import inspection as lgi
    with _saver(dsn, schema, json_out, Reads(read_dsn, read_max_lag, read_fallback)) as saver:
        rows = lgi.list_threads(saver, status=status, prefix=prefix, limit=limit, after=after)
    if json_out:
        print_json(rows)
        return
    table = Table(title=f"threads ({len(rows)} shown)", title_justify="left")
    # Thread ids and states are what people read and copy: never truncate them. On a narrow
    # terminal the version gives way first (shortened), then whole columns are left out,
    # least useful first, rather than crop the table's right-hand side.
    widest = max((len(r["thread_id"]) for r in rows), default=6)
    columns = _list_columns(widest, console.width)
    table.add_column("thread", no_wrap=True, min_width=widest)
    table.add_column("state", min_width=11)
    for name in columns:
        table.add_column(name, **_LIST_COLUMNS[name][1])
    for r in rows:
        cells = {
            "graph version": r["graph_version"] or "-",
            "step": "-" if r["step"] is None else str(r["step"]),
            "ckpts": str(r["checkpoints"]),
            "bytes": fmt_bytes(r["bytes"]),
            "last activity": _ago(r["last_activity"]),
        }
        table.add_row(r["thread_id"], _state(r["state"], r["status"]), *(cells[c] for c in columns))
    console.print(table)
    _print_notes(rows)
    if not rows:
        console.print("[dim]no threads match[/]")
    elif len(rows) == limit:
        console.print(f"[dim]next page: --after {rows[-1]['thread_id']}[/]", highlight=False)


def _print_notes(rows: list[dict[str, Any]], limit: int = 20) -> None:
    """One line per thread whose state needs its reason (a lease whose owner is dead:
    ``recoverable: owner pid N on host H is dead; takeover pending``), below a table:
    a table cell would wrap it into pieces."""
    from rich.text import Text

    noted = [r for r in rows if r.get("note")]
    for r in noted[:limit]:
        console.print(
            Text.assemble(_state(r.get("state") or "recoverable", None, r["note"]), f"  thread {r['thread_id']}"),
            highlight=False, soft_wrap=True,
        )
    if len(noted) > limit:
        console.print(f"[dim]... and {len(noted) - limit} more whose owner is dead[/]")


@threads_app.command("show")
def threads_show(
    thread_id: Annotated[str, typer.Argument(help="The thread id.")],
    show_all: Annotated[
        bool, typer.Option("--all", help="Also list LangGraph's internal trigger channels.")
    ] = False,
    dsn: DsnOption = None,
    read_dsn: ReadDsnOption = None,
    read_max_lag: ReadMaxLagOption = 10.0,
    read_fallback: ReadFallbackOption = False,
    schema: SchemaOption = None,
    json_out: JsonOption = False,
) -> None:
    """Latest state of a thread: channels and sizes, next nodes, lease, quarantine."""
    from langgraph_durable.ops import inspection as lgi
    with _saver(dsn, schema, json_out, Reads(read_dsn, read_max_lag, read_fallback)) as saver:
        info = lgi.show_thread(saver, thread_id)
    if json_out:
        print_json(info)
        return
    console.print(_show_summary(info))
    if (info.get("load_error") or {}).get("encrypted"):
        console.print(
            "[yellow]the checkpoint's values are encrypted and this command was given no key "
            "that opens them: pass --key-file FILE (or set LANGGRAPH_DURABLE_KEY_FILE); "
            f"{escape(info['load_error']['message'])}[/]"
        )
        return
    if info.get("load_error"):
        console.print(
            "[red]the latest checkpoint cannot be decoded: its values are not shown; a run "
            "from it is quarantined (see `langgraph-durable quarantine show`, then rewind)[/]"
        )
        return
    console.print(_show_channels(info, show_all))
    if info["finished_tasks"]:
        console.print(_show_finished(info, show_all))
    for i in info["interrupts"]:
        console.print(f"[cyan]interrupt[/] in {i['node'] or i['task_id']}: {i['value']}")
    for e in info["errors"]:
        console.print(f"[red]error write[/] from {e['node'] or e['task_id']}: {e['error']}")


def _show_summary(info: dict[str, Any]) -> Any:
    """The thread's facts, one per row: state, version, checkpoint, lease, quarantine."""
    from rich.table import Table
    from rich.text import Text

    cp = info["checkpoint"] or {}
    grid = Table.grid(padding=(0, 2))
    grid.add_column(style="bold")
    grid.add_column()
    grid.add_row("thread", info["thread_id"])
    grid.add_row("state", _state(info["state"], info["status"], (info["lease"] or {}).get("note")))
    grid.add_row("graph version", info["graph_version"] or "-")
    grid.add_row(
        "checkpoint",
        f"{cp.get('id', '-')}  step {cp.get('step', '-')}  source {cp.get('source', '-')}  "
        f"({info['checkpoints']} checkpoints)",
    )
    grid.add_row("written", cp.get("ts") or "-")
    grid.add_row("attempts", f"{info['attempts'] if info['attempts'] is not None else '-'}")
    grid.add_row("lease", _lease(info["lease"]))
    q = info["quarantine"]
    grid.add_row(
        "quarantine",
        Text("none")
        if not q
        else Text(
            f"since {q['quarantined_at']} at checkpoint {q['checkpoint_id']} after "
            f"{q['attempts']} attempts: {q['last_error']}",
            style="red",
        ),
    )
    if info["last_error"]:
        grid.add_row("last error", Text(info["last_error"], style="red"))
    if info["ledger"]:
        grid.add_row("idempotent calls", ", ".join(f"{k}: {v}" for k, v in info["ledger"].items()))
    damage = info.get("load_error")
    if damage and damage.get("encrypted"):
        grid.add_row("values", Text("encrypted (no key given that opens them)", style="yellow"))
    elif damage:
        grid.add_row("damaged", Text(damage["message"], style="bold red"))
    else:
        grid.add_row("next", ", ".join(info["next"]) or "(nothing: the run is complete)")
    return grid


def _show_channels(info: dict[str, Any], show_all: bool) -> Any:
    from rich.table import Table

    channels = [c for c in info["channels"] if show_all or not c["internal"]]
    table = Table(title="channels", title_justify="left")
    table.add_column("channel", no_wrap=True)
    table.add_column("type")
    table.add_column("size", justify="right")
    table.add_column("stored", justify="right")
    table.add_column("value")
    for c in channels:
        stored = fmt_bytes(c["stored"])
        if c["storage"] != "inline":
            stored += f" ({c['storage']})"
        table.add_row(c["channel"], c["type"], fmt_bytes(c["size"]), stored, c["preview"])
    return table


def _show_finished(info: dict[str, Any], show_all: bool) -> Any:
    from rich.table import Table

    done = Table(
        title="tasks already finished in this step (restored on resume, not re-run)",
        title_justify="left",
    )
    done.add_column("node")
    done.add_column("task id", no_wrap=True)
    done.add_column("writes")
    done.add_column("bytes", justify="right")
    for t in info["finished_tasks"]:
        done.add_row(
            t["node"] or "(push)",
            t["task_id"],
            ", ".join(t["channels"] if show_all else _channel_labels(t["channels"])),
            fmt_bytes(t["bytes"]),
        )
    return done


@threads_app.command("history")
def threads_history(
    thread_id: Annotated[str, typer.Argument(help="The thread id.")],
    limit: Annotated[int, typer.Option(help="At most this many checkpoints (newest first).")] = 50,
    dsn: DsnOption = None,
    read_dsn: ReadDsnOption = None,
    read_max_lag: ReadMaxLagOption = 10.0,
    read_fallback: ReadFallbackOption = False,
    schema: SchemaOption = None,
    json_out: JsonOption = False,
) -> None:
    """Checkpoints of a thread: step, source, graph version, updated channels, writes."""
    from rich.table import Table

    from langgraph_durable.ops import inspection as lgi
    with _saver(dsn, schema, json_out, Reads(read_dsn, read_max_lag, read_fallback)) as saver:
        rows = lgi.thread_history(saver, thread_id, limit=limit)
    if json_out:
        print_json(rows)
        return
    versions = {r["graph_version"] for r in rows}
    one_version = len(versions) == 1
    title = f"history of {thread_id} (newest first)"
    if one_version:
        title += f", graph version {next(iter(versions)) or '-'}"
    table = Table(title=title, title_justify="left")
    table.add_column("checkpoint", no_wrap=True)
    table.add_column("step", justify="right")
    table.add_column("source")
    if not one_version:
        table.add_column("version")
    table.add_column("updated")
    table.add_column("bytes", justify="right")
    table.add_column("tasks run next → writes")
    for r in rows:
        writes = "; ".join(
            f"{t['node'] or '(push)'}: "
            + (", ".join(_channel_labels(t["channels"])) or "-")
            for t in r["writes"]
        )
        cells = [
            r["checkpoint_id"][:SHORT_ID] + (" (damaged)" if r.get("damaged") else ""),
            "-" if r["step"] is None else str(r["step"]),
            r["source"] or "-",
        ]
        if not one_version:
            cells.append(r["graph_version"] or "-")
        cells += [
            ", ".join(r["updated_channels"]) or "-",
            fmt_bytes(r["bytes"] + r["write_bytes"]),
            writes or "-",
        ]
        table.add_row(*cells)
    console.print(table)
    if rows:
        console.print(
            f"[dim]checkpoint ids shortened to {SHORT_ID} characters: `threads diff` accepts any "
            "unique prefix, `latest` and `latest~N` (--json prints full ids)[/]"
        )


@threads_app.command("diff")
def threads_diff(
    thread_id: Annotated[str, typer.Argument(help="The thread id.")],
    cp1: Annotated[
        str, typer.Argument(help="Checkpoint id, unique prefix, `latest` or `latest~N`.")
    ],
    cp2: Annotated[
        str, typer.Argument(help="Checkpoint id, unique prefix, `latest` or `latest~N`.")
    ],
    show_all: Annotated[
        bool, typer.Option("--all", help="Also list unchanged and internal channels.")
    ] = False,
    dsn: DsnOption = None,
    read_dsn: ReadDsnOption = None,
    read_max_lag: ReadMaxLagOption = 10.0,
    read_fallback: ReadFallbackOption = False,
    schema: SchemaOption = None,
    json_out: JsonOption = False,
) -> None:
    """Which channels changed between two checkpoints, with sizes."""
    from rich.table import Table
    from rich.text import Text

    from langgraph_durable.ops import inspection as lgi
    with _saver(dsn, schema, json_out, Reads(read_dsn, read_max_lag, read_fallback)) as saver:
        diff = lgi.diff_checkpoints(saver, thread_id, cp1, cp2)
    if json_out:
        print_json(diff)
        return
    a, b = diff["a"], diff["b"]
    console.print(
        f"[bold]{thread_id}[/]: {a['checkpoint_id']} (step {a['step']}) → "
        f"{b['checkpoint_id']} (step {b['step']})"
    )
    if a["graph_version"] != b["graph_version"]:
        console.print(f"[yellow]graph version {a['graph_version']} → {b['graph_version']}[/]")
    table = Table(title_justify="left")
    table.add_column("channel", no_wrap=True)
    table.add_column("change")
    table.add_column("size A", justify="right")
    table.add_column("size B", justify="right")
    table.add_column("Δ", justify="right")
    table.add_column("before → after")
    styles = {
        "added": "green",
        "removed": "red",
        "changed": "yellow",
        "rewritten": "dim",
        "same": "dim",
    }
    shown = 0
    for c in diff["channels"]:
        if not show_all and (c["internal"] or c["change"] == "same"):
            continue
        shown += 1
        table.add_row(
            c["channel"],
            Text(c["change"], style=styles.get(c["change"], "")),
            fmt_bytes(c["size_a"]),
            fmt_bytes(c["size_b"]),
            f"{c['delta']:+d}",
            f"{c['before'] or '∅'} → {c['after'] or '∅'}",
        )
    if shown:
        console.print(table)
    else:
        console.print("no channel changed")


def _print_status(
    dsn: str | None, schema: str | None, json_out: bool, untracked: bool = False,
    reads: Reads | None = None,
) -> None:
    from rich.table import Table
    from rich.text import Text

    from langgraph_durable.ops import inspection as lgi
    with _saver(dsn, schema, json_out, reads) as saver:
        counts: dict[str, int | None] = dict(lgi.thread_status_counts(saver, untracked=untracked))
        pending = [] if json_out else lgi.takeover_pending(saver)
    if not untracked:
        counts["untracked"] = None  # not counted (JSON null), never a 0 that was not measured
    if json_out:
        print_json(counts)
        return
    table = Table(title="threads by state", title_justify="left")
    table.add_column("state")
    table.add_column("threads", justify="right")
    table.add_column("meaning")
    meaning = {
        "running": "a live lease: a worker is executing it now",
        "recoverable": "unfinished, no live lease (or its owner is dead): invoke(None, config) "
        "or a worker resumes it",
        "waiting": "interrupted, waiting for Command(resume=...)",
        "quarantined": "poisoned: not resumed until an operator releases it",
        "done": "finished",
        "untracked": "written without run tracking (stock saver or leases=False)",
        "error": "  of which the last run raised (counted in recoverable)",
    }
    for key in (*lgi.STATES[:5], "error", "untracked"):
        if key == "untracked" and counts.get(key) is None:
            table.add_row(_state(key), "not counted", "--untracked counts them (reads every thread id)")
            continue
        if key == "untracked" and not counts.get(key):
            continue
        table.add_row(_state(key), str(counts.get(key, 0)), meaning[key])
    total = "total" if untracked else "total tracked"
    table.add_row(Text(total, style="bold"), str(counts["total"]), "")
    console.print(table)
    _print_notes(pending)  # leases this machine knows to be dead (counted recoverable)


@threads_app.command("status")
def threads_status(
    dsn: DsnOption = None,
    read_dsn: ReadDsnOption = None,
    read_max_lag: ReadMaxLagOption = 10.0,
    read_fallback: ReadFallbackOption = False,
    schema: SchemaOption = None,
    json_out: JsonOption = False,
    untracked: UntrackedOption = False,
) -> None:
    """Counts of running / recoverable / waiting / quarantined / done / error threads
    (untracked ones too with --untracked)."""
    _print_status(dsn, schema, json_out, untracked, Reads(read_dsn, read_max_lag, read_fallback))


# ------------------------------------------------------------------ stats
def stats(
    dsn: DsnOption = None,
    read_dsn: ReadDsnOption = None,
    read_max_lag: ReadMaxLagOption = 10.0,
    read_fallback: ReadFallbackOption = False,
    schema: SchemaOption = None,
    json_out: JsonOption = False,
) -> None:
    """Table sizes (stock and package tables) and the artifact dedup ratio."""
    from rich.table import Table
    from rich.text import Text

    from langgraph_durable.ops import inspection as lgi
    with _saver(dsn, schema, json_out, Reads(read_dsn, read_max_lag, read_fallback)) as saver:
        data = lgi.storage_stats(saver)
    if json_out:
        print_json(data)
        return
    table = Table(title=f"storage of database {data['database']}", title_justify="left")
    table.add_column("table")
    table.add_column("rows", justify="right")
    table.add_column("total", justify="right")
    table.add_column("heap", justify="right")
    table.add_column("indexes", justify="right")
    for t in data["tables"]:
        table.add_row(
            t["table"],
            f"{t['rows']:,}",
            fmt_bytes(t["total"]),
            fmt_bytes(t["heap"]),
            fmt_bytes(t["indexes"]),
        )
    table.add_section()
    table.add_row(Text("all tables", style="bold"), "", fmt_bytes(data["total_bytes"]), "", "")
    console.print(table)
    art = data["artifacts"]
    if art:
        ratio = "n/a (no artifacts)" if art["dedup_ratio"] is None else f"{art['dedup_ratio']:.1f}x"
        grid = Table.grid(padding=(0, 2))
        grid.add_column(style="bold")
        grid.add_column(justify="right")
        grid.add_column(style="dim")
        grid.add_row("artifacts", f"{art['artifacts']:,}", "distinct content-addressed values")
        grid.add_row("references", f"{art['references']:,}", "from checkpoint blobs and writes")
        grid.add_row(
            "logical bytes", fmt_bytes(art["logical_bytes"]), "what the references stand for"
        )
        grid.add_row(
            "unique bytes", fmt_bytes(art["unique_bytes"]), "distinct content, uncompressed"
        )
        grid.add_row(
            "stored bytes", fmt_bytes(art["stored_bytes"]), "artifact table data, compressed"
        )
        grid.add_row("dedup ratio", ratio, "logical / stored")
        console.print(grid)
        for d in art.get("damaged") or ():
            where = (
                f"artifact {d['artifact'][:16]} (threads {', '.join(d['thread_ids']) or '-'})"
                if "artifact" in d
                else f"thread {d['thread_id']!r} {d['row']} {d['channel']!r}"
            )
            if d.get("encrypted"):  # issue 27: no key given, not damage
                err_console.print(Text(f"encrypted (not counted without the key: --key-file): {where}",
                                       style="yellow"))
                continue
            err_console.print(
                Text(f"damaged (not counted): {where}: {d['error']}", style="red")
            )


def register(app: typer.Typer) -> None:
    """Add this module's commands to the main app."""
    app.add_typer(threads_app, name="threads")
    app.command("stats")(stats)
