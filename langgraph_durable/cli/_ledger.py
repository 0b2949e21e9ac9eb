"""CLI commands: ``ledger list|show|resolve|forget|purge-expired`` (the operator side of
``@idempotent``; the logic is ``langgraph_durable.idempotency.Ledger``, this module
only parses and formats)."""

from __future__ import annotations

import dataclasses
import datetime as dt
import enum
import json
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
    fail,
    print_json,
    saver_or_exit,
)
from langgraph_durable.errors import DurableError

if TYPE_CHECKING:
    pass

ledger_app = typer.Typer(
    help="The @idempotent ledger: list and show recorded calls, resolve an unknown outcome "
    "(record the result you verified) or forget a key (the next call runs again).",
    no_args_is_help=True,
)

KeyArg = Annotated[str, typer.Argument(help="The idempotency key (see `ledger list`).")]


class Status(enum.StrEnum):
    started = "started"
    completed = "completed"
    failed = "failed"


class _CliError(Exception):
    """A usage problem found by the CLI itself (reported like a DurableError)."""

    def __init__(self, name: str, message: str, **fields: Any) -> None:
        super().__init__(message)
        self.name, self.message, self.fields = name, message, fields


@contextmanager
def _ledger(
    dsn: str | None, schema: str | None, json_out: bool, *, readonly: bool = False,
    reads: Reads | None = None,
) -> Iterator[Any]:
    """A ``Ledger`` on a set-up saver; a typed error becomes a message (JSON on stdout
    with --json) and exit code 1."""
    from langgraph_durable.idempotency import Ledger

    try:
        with saver_or_exit(dsn, schema, json_out, readonly=readonly, reads=reads) as saver:
            yield Ledger(saver)
    except _CliError as exc:
        raise fail(json_out, exc.name, exc.message, exc.fields) from None


def _state(entry: Any) -> str:
    if entry.in_flight:
        return "in_flight"
    if entry.outcome_unknown:
        return "unknown_outcome"
    return str(entry.status)


def _entry_dict(entry: Any) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for k, v in dataclasses.asdict(entry).items():
        out[k] = v.isoformat() if isinstance(v, dt.datetime) else v
    out["state"] = _state(entry)
    return out


def _when(value: dt.datetime | None) -> str:
    return "-" if value is None else value.strftime("%Y-%m-%d %H:%M:%S")


def _short(text: str | None, width: int = 48) -> str:
    if not text:
        return "-"
    line = text.splitlines()[0]
    return line if len(line) <= width else line[: width - 1] + "…"


_LABEL = {"in_flight": "in flight", "unknown_outcome": "UNKNOWN"}
_STATE_STYLE = {
    "completed": "green",
    "failed": "red",
    "in_flight": "cyan",
    "unknown_outcome": "bold yellow",
}


def _missing(key: str) -> _CliError:
    return _CliError(
        "IdempotencyError", f"idempotency key {key!r} is not in the ledger", key=key
    )


@ledger_app.command("list")
def list_cmd(
    thread: Annotated[
        str | None,
        typer.Option("--thread", help="Only keys of this thread (or first used by it)."),
    ] = None,
    status: Annotated[
        Status | None, typer.Option("--status", help="Only keys with this status.")
    ] = None,
    limit: Annotated[int, typer.Option("--limit", min=1, help="At most this many keys.")] = 100,
    dsn: DsnOption = None,
    read_dsn: ReadDsnOption = None,
    read_max_lag: ReadMaxLagOption = 10.0,
    read_fallback: ReadFallbackOption = False,
    schema: SchemaOption = None,
    json_out: JsonOption = False,
) -> None:
    """Recorded calls, most recent first. UNKNOWN (unknown_outcome with --json): the
    process died mid-call; resolve or forget the key."""
    from rich import box
    from rich.markup import escape
    from rich.table import Table

    with _ledger(dsn, schema, json_out, readonly=True, reads=Reads(read_dsn, read_max_lag, read_fallback)) as ledger:
        entries = ledger.entries(
            thread_id=thread, status=None if status is None else status.value, limit=limit
        )
    if json_out:
        print_json([_entry_dict(e) for e in entries])
        return
    if not entries:
        console.print("no ledger entries")
        return
    # Keys are what an operator copies into show/resolve/forget: never wrapped; the
    # other columns give way on a narrow terminal (show has the details).
    table = Table(
        title=f"{len(entries)} ledger entr{'y' if len(entries) == 1 else 'ies'}",
        box=box.SIMPLE_HEAD,
        pad_edge=False,
    )
    table.add_column("key", no_wrap=True, min_width=min(max(len(e.key) for e in entries), 46))
    table.add_column("state", no_wrap=True)
    table.add_column("tries", justify="right")
    table.add_column("name", overflow="fold", min_width=6)
    table.add_column("thread", overflow="fold", min_width=6)
    for e in entries:
        state = _state(e)
        table.add_row(
            escape(e.key), f"[{_STATE_STYLE.get(state, 'white')}]{_LABEL.get(state, state)}[/]",
            str(e.attempts), escape(e.name or "-"),
            escape(e.thread_id or (f"({e.origin_thread_id})" if e.origin_thread_id else "-")),
        )
    console.print(table)
    unknown = sum(1 for e in entries if e.outcome_unknown)
    if unknown:
        console.print(
            f"[yellow]{unknown} unknown outcome(s)[/]: check the receiving system, then "
            "`ledger resolve KEY --result-json ...` (it happened) or `ledger forget KEY` "
            "(it did not)"
        )


@ledger_app.command("show")
def show_cmd(
    key: KeyArg,
    dsn: DsnOption = None,
    read_dsn: ReadDsnOption = None,
    read_max_lag: ReadMaxLagOption = 10.0,
    read_fallback: ReadFallbackOption = False,
    schema: SchemaOption = None,
    json_out: JsonOption = False,
) -> None:
    """One key: its state, call site, arguments preview, and the recorded result or
    error."""
    from rich.markup import escape
    result: Any = None
    result_error: str | None = None
    with _ledger(dsn, schema, json_out, readonly=True, reads=Reads(read_dsn, read_max_lag, read_fallback)) as ledger:
        entry = ledger.get(key)
        if entry is None:
            raise _missing(key)
        if entry.status == "completed":
            try:
                result = ledger.result(key)
            except DurableError as exc:  # undecodable: show the entry anyway
                result_error = exc.message
    state = _state(entry)
    if json_out:
        data = _entry_dict(entry)
        if entry.status == "completed":
            data["result"] = result
            data["result_error"] = result_error
        print_json(data)
        return
    console.print(f"[bold]key[/] {escape(entry.key)}", highlight=False)
    console.print(f"state [{_STATE_STYLE.get(state, 'white')}]{state}[/]  (status {entry.status})")
    rows = [
        ("name", entry.name),
        ("thread", entry.thread_id),
        ("origin thread", entry.origin_thread_id),
        ("task", entry.task_id),
        ("attempts", str(entry.attempts)),
        ("created", _when(entry.created_at)),
        ("completed", _when(entry.completed_at)),
        ("expires", _when(entry.expires_at)),
        ("fingerprint", entry.fingerprint),
        ("arguments", entry.args_preview),
    ]
    for label, value in rows:
        console.print(f"{label}: {value or '-'}", highlight=False, markup=False)
    if entry.status == "completed":
        shown = result_error or json.dumps(result, default=str)
        console.print(f"result: {_short(shown, 400)}", highlight=False, markup=False)
    if entry.status == "failed":
        console.print(f"error: {entry.error_type}: {entry.error}", highlight=False, markup=False)
    if entry.outcome_unknown:
        console.print(
            "[yellow]the process died mid-call: nobody knows whether the effect happened.[/]\n"
            "[dim]next: check the receiving system, then `ledger resolve KEY --result-json "
            "'<json>'` (it happened) or `ledger forget KEY` (it did not)[/]"
        )
    elif entry.in_flight:
        console.print("[dim]a live process is running this call: wait for it[/]")


@ledger_app.command("resolve")
def resolve_cmd(
    key: KeyArg,
    result_json: Annotated[
        str,
        typer.Option(
            "--result-json",
            help="The call's result as JSON (what the function would have returned).",
        ),
    ],
    dsn: DsnOption = None,
    schema: SchemaOption = None,
    json_out: JsonOption = False,
) -> None:
    """The effect happened: record the --result-json value as the call's outcome. The
    next call replays it instead of raising OutcomeUnknownError. Refuses a completed
    key and a call in flight."""
    try:
        value = json.loads(result_json)
    except ValueError as exc:
        raise fail(
            json_out, "JSONDecodeError", f"--result-json is not valid JSON: {exc}", {"key": key}
        ) from None
    with _ledger(dsn, schema, json_out) as ledger:
        ledger.resolve(key, value)
        entry = ledger.get(key)
    if json_out:
        print_json({"resolved": True, **(_entry_dict(entry) if entry else {"key": key}), "result": value})
        return
    console.print(
        f"resolved {key}: recorded as completed; the next call replays this result",
        highlight=False, markup=False,
    )


@ledger_app.command("forget")
def forget_cmd(
    key: KeyArg,
    dsn: DsnOption = None,
    schema: SchemaOption = None,
    json_out: JsonOption = False,
) -> None:
    """The effect did not happen (or must happen again): drop the key, so the next call
    runs the function. Refuses a call in flight."""
    with _ledger(dsn, schema, json_out) as ledger:
        before = ledger.get(key)
        if before is None:
            raise _missing(key)
        if not ledger.forget(key):  # gone meanwhile
            raise _missing(key)
    state = _state(before)
    if json_out:
        print_json({"forgotten": True, "key": key, "was": state})
        return
    console.print(
        f"forgot {key} (was {state}): the next call runs the function again",
        highlight=False, markup=False,
    )


@ledger_app.command("purge-expired")
def purge_cmd(
    dsn: DsnOption = None,
    schema: SchemaOption = None,
    json_out: JsonOption = False,
) -> None:
    """Delete keys whose TTL ran out (calls in flight are kept)."""
    with _ledger(dsn, schema, json_out) as ledger:
        purged = ledger.purge_expired()
    if json_out:
        print_json({"purged": purged})
        return
    console.print(f"purged {purged} expired key(s)")


def register(app: typer.Typer) -> None:
    """Add this module's commands to the main app."""
    app.add_typer(ledger_app, name="ledger")

