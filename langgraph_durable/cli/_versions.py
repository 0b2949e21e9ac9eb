"""CLI commands: ``versions list|migrate|log|undo|record|fingerprint``.

``list`` shows what must drain before old code can go (threads by the graph version of
their latest checkpoint); ``migrate`` applies registered migrations in batch. The CLI
finds the registry with ``--migrations module:attr`` (a ``MigrationRegistry``, a saver,
or a zero-argument factory of either), else the one ``MigrationRegistry`` defined at
module level beside the ``--graph``, else the ``migrations`` of the saver the graph was
compiled with.
"""

from __future__ import annotations

import datetime as _dt
import importlib
import importlib.util
import os
import sys
from pathlib import Path
from types import ModuleType
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
    open_saver,
    print_json,
)
from langgraph_durable.errors import DurableError

if TYPE_CHECKING:
    from langgraph_durable._view import SaverView

versions_app = typer.Typer(
    help="Graph versions of stored threads: list, migrate, log, undo, fingerprint.",
    no_args_is_help=True,
)

UNVERSIONED = "(unversioned)"

GraphOption = Annotated[
    str,
    typer.Option(
        "--graph",
        help="The graph, as module:attr or path/to/file.py:attr (a compiled graph, a "
        "StateGraph builder, or a zero-argument factory of one).",
    ),
]


# --- loading user objects -------------------------------------------------------------


def load_object(spec: str) -> tuple[Any, ModuleType]:
    """``pkg.mod:attr`` or ``path/to/file.py:attr`` -> (object, its module)."""
    target, sep, attr = spec.rpartition(":")
    if not sep or not target or not attr:
        raise typer.BadParameter(f"{spec!r}: expected module:attr or path/to/file.py:attr")
    if os.getcwd() not in sys.path:
        # As `python -m` would: the project the command runs in is importable.
        sys.path.insert(0, os.getcwd())
    if target.endswith(".py") or os.sep in target:
        path = Path(target).resolve()
        if not path.is_file():
            raise typer.BadParameter(f"{spec!r}: no file {path}")
        name = f"_lgd_user_{path.stem}_{abs(hash(str(path))) & 0xFFFFFF:x}"
        module = sys.modules.get(name)
        if module is None:
            loader_spec = importlib.util.spec_from_file_location(name, path)
            if loader_spec is None or loader_spec.loader is None:
                raise typer.BadParameter(f"{spec!r}: cannot import {path}")
            module = importlib.util.module_from_spec(loader_spec)
            sys.modules[name] = module
            sys.path.insert(0, str(path.parent))
            try:
                loader_spec.loader.exec_module(module)
            except Exception as exc:
                del sys.modules[name]
                raise typer.BadParameter(f"{spec!r}: importing {path} failed: {exc!r}") from exc
    else:
        try:
            module = importlib.import_module(target)
        except ImportError as exc:
            raise typer.BadParameter(f"{spec!r}: cannot import {target!r}: {exc}") from exc
    obj: Any = module
    for part in attr.split("."):
        try:
            obj = getattr(obj, part)
        except AttributeError:
            raise typer.BadParameter(f"{spec!r}: {module.__name__} has no attribute {attr!r}") from None
    return obj, module


def _graph(spec: str) -> tuple[Any, ModuleType]:
    from langgraph.graph.state import StateGraph
    from langgraph.pregel import Pregel

    obj, module = load_object(spec)
    if not isinstance(obj, StateGraph | Pregel) and callable(obj):
        obj = obj()
    if not isinstance(obj, StateGraph | Pregel):
        raise typer.BadParameter(f"{spec!r} is a {type(obj).__name__}, not a graph")
    return obj, module


def _as_registry(obj: Any) -> Any:
    from langgraph_durable.versioning import MigrationRegistry

    if isinstance(obj, MigrationRegistry):
        return obj
    inner = getattr(obj, "migrations", None)
    if isinstance(inner, MigrationRegistry):
        return inner
    if callable(obj):
        return _as_registry(obj())
    return None


def find_registry(migrations: str | None, graph: Any, module: ModuleType | None) -> Any:
    """The registry the CLI uses; see the module docstring for the search order."""
    from langgraph_durable.versioning import MigrationRegistry

    if migrations:
        obj, _ = load_object(migrations)
        reg = _as_registry(obj)
        if reg is None:
            raise typer.BadParameter(f"{migrations!r} is not a MigrationRegistry (nor a saver with one)")
        return reg
    if module is not None:
        found = {
            name: value
            for name, value in vars(module).items()
            if isinstance(value, MigrationRegistry) and value
        }
        if len(found) == 1:
            return next(iter(found.values()))
        if len(found) > 1:
            raise typer.BadParameter(
                f"several migration registries in {module.__name__} ({sorted(found)}): "
                "choose one with --migrations module:attr"
            )
    reg = getattr(getattr(graph, "checkpointer", None), "migrations", None)
    if isinstance(reg, MigrationRegistry) and reg:
        return reg
    raise typer.BadParameter(
        "no migration registry found: pass --migrations module:attr, or define one "
        "MigrationRegistry at module level beside the graph"
    )


# --- formatting ---------------------------------------------------------------------------


def _when(ts: Any) -> str:
    if ts is None:
        return "-"
    if isinstance(ts, _dt.datetime):
        return ts.astimezone(_dt.UTC).strftime("%Y-%m-%d %H:%M:%S")
    return str(ts)


def _label(version: str | None) -> str:
    return UNVERSIONED if version is None else version


def _fail(message: str, code: int = 2) -> typer.Exit:
    err_console.print(f"[red]error:[/] {escape(message)}")
    return typer.Exit(code)


# --- commands -----------------------------------------------------------------------------


@versions_app.command("list")
def list_cmd(
    dsn: DsnOption = None,
    read_dsn: ReadDsnOption = None,
    read_max_lag: ReadMaxLagOption = 10.0,
    read_fallback: ReadFallbackOption = False,
    schema: SchemaOption = None,
    version: Annotated[
        str | None, typer.Option("--version", help="Only threads at this version (lists threads).")
    ] = None,
    unversioned: Annotated[
        bool, typer.Option("--unversioned", help="Only threads with no version (lists threads).")
    ] = False,
    threads: Annotated[bool, typer.Option("--threads", help="List threads, not version groups.")] = False,
    status: Annotated[
        str | None, typer.Option("--status", help="Only threads in this status (waiting, done, ...).")
    ] = None,
    limit: Annotated[int, typer.Option("--limit", min=1, help="At most this many threads.")] = 200,
    graph: Annotated[
        str | None,
        typer.Option(
            "--graph",
            help="Classify each thread against this graph (module:attr or file.py:attr): "
            "identical / compatible / incompatible / unknown, as a run start would.",
        ),
    ] = None,
    as_json: JsonOption = False,
) -> None:
    """Threads grouped by the graph version of their latest checkpoint (what must drain
    before the old code goes), or one row per thread with --version/--threads. With
    --graph, how that graph would treat each thread (its pending work included)."""
    if version is not None and unversioned:
        raise _fail("--version and --unversioned exclude each other")
    per_thread = threads or version is not None or unversioned or status is not None
    g = _graph(graph)[0] if graph else None
    with open_saver(dsn, schema, readonly=True, reads=Reads(read_dsn, read_max_lag, read_fallback)) as saver:
        if not per_thread:
            groups = _version_groups(saver, g)
        else:
            rows = _thread_rows(saver, g, version, unversioned, status, limit)
    if not per_thread:
        if as_json:
            print_json(groups)
        else:
            _print_groups(groups, g is not None)
        return
    if as_json:
        print_json(rows)
        return
    _print_threads(rows, g is not None, version, unversioned, limit)


def _version_groups(saver: SaverView, g: Any) -> list[dict[str, Any]]:
    """The version groups, each with whether its topology is stored and, with a graph,
    how that graph would treat its threads."""
    from langgraph_durable import compat
    from langgraph_durable.ops import migrations as mig

    recorded = compat.recorded_versions(saver)
    groups = mig.version_summary(saver)
    for grp in groups:
        row = recorded.get(grp["graph_version"] or "")
        grp["topology"] = "ambiguous" if row and row["ambiguous"] else "stored" if row else "none"
    if g is not None:
        verdicts = _classify_all(saver, g)
        for grp in groups:
            counts: dict[str, int] = {}
            for ver, verdict in verdicts:
                if ver == grp["graph_version"]:
                    counts[verdict] = counts.get(verdict, 0) + 1
            grp["vs_graph"] = counts
    return groups


def _thread_rows(
    saver: SaverView, g: Any, version: str | None, unversioned: bool, status: str | None, limit: int
) -> list[dict[str, Any]]:
    from langgraph_durable import compat
    from langgraph_durable.ops import migrations as mig

    rows = mig.list_threads(
        saver,
        version=None if unversioned else version,
        any_version=version is None and not unversioned,
        status=status,
        limit=limit,
    )
    if g is not None:
        found = compat.classify_threads(saver, g, [r["thread_id"] for r in rows])
        for r in rows:
            c = found.get(r["thread_id"])
            r["compatibility"] = c.as_dict() if c is not None else None
    return rows


def _print_groups(groups: list[dict[str, Any]], vs_graph: bool) -> None:
    from rich.table import Table

    table = Table(title="Threads by graph version (latest checkpoint)")
    cols = ["graph version", "threads", "unfinished", "by status", "last activity", "topology"]
    if vs_graph:
        cols.append("vs --graph")
    for col in cols:
        table.add_column(col, justify="right" if col in ("threads", "unfinished") else "left")
    for grp in groups:
        cells = [
            _label(grp["graph_version"]),
            str(grp["threads"]),
            str(grp["unfinished"]),
            ", ".join(f"{k} {n}" for k, n in sorted(grp["by_status"].items())),
            _when(grp["last_activity"]),
            grp["topology"],
        ]
        if vs_graph:
            cells.append(", ".join(f"{k} {n}" for k, n in sorted(grp["vs_graph"].items())))
        table.add_row(*cells)
    console.print(table)
    if not groups:
        console.print("no threads")


def _print_threads(
    rows: list[dict[str, Any]], vs_graph: bool, version: str | None, unversioned: bool, limit: int
) -> None:
    from rich.table import Table

    table = Table(title=f"Threads{f' at {version}' if version else ''}{' (unversioned)' if unversioned else ''}")
    cols = ["thread", "graph version", "status", "step", "migrated from", "last activity"]
    if vs_graph:
        cols.append("vs --graph")
    for col in cols:
        table.add_column(col)
    for r in rows:
        cells = [
            r["thread_id"],
            _label(r["graph_version"]),
            r["status"],
            "-" if r["step"] is None else str(r["step"]),
            r["migrated_from"] or "-",
            _when(r["last_activity"]),
        ]
        if vs_graph:
            cells.append(_verdict_cell(r.get("compatibility")))
        table.add_row(*cells)
    console.print(table)
    console.print(f"{len(rows)} thread(s)" + (" (limit reached)" if len(rows) >= limit else ""))


def _classify_all(saver: SaverView, graph: Any) -> list[tuple[str | None, str]]:
    """(stored version, verdict) of every thread, classified against ``graph``."""
    from langgraph_durable import compat
    from langgraph_durable.ops import migrations as mig

    rows = mig.list_threads(saver, any_version=True)
    found = compat.classify_threads(saver, graph, [r["thread_id"] for r in rows])
    return [(r["graph_version"], found[r["thread_id"]].verdict) for r in rows if r["thread_id"] in found]


def _verdict_cell(c: dict[str, Any] | None) -> str:
    if c is None:
        return "-"
    detail = c["reasons"] or c["changes"]
    resumes = c["verdict"] == "identical" or (c["verdict"] == "compatible" and c["automatic"])
    text = c["verdict"] + ("" if resumes or c["verdict"] != "compatible" else " (named versions: needs a migration)")
    return text + (f": {'; '.join(detail)}" if detail else "")


@versions_app.command("migrate")
def migrate_cmd(
    from_version: Annotated[str, typer.Option("--from", help="Migrate threads at this version.")],
    graph: GraphOption,
    to_version: Annotated[
        str | None,
        typer.Option("--to", help="Target version (default: the fingerprint of --graph)."),
    ] = None,
    migrations: Annotated[
        str | None,
        typer.Option("--migrations", help="The MigrationRegistry (or saver) as module:attr."),
    ] = None,
    dry_run: Annotated[
        bool, typer.Option("--dry-run", help="Run the migrations in memory only; write nothing.")
    ] = False,
    thread: Annotated[
        list[str] | None, typer.Option("--thread", help="Only this thread (repeatable).")
    ] = None,
    limit: Annotated[int | None, typer.Option("--limit", min=1, help="At most this many threads.")] = None,
    dsn: DsnOption = None,
    schema: SchemaOption = None,
    as_json: JsonOption = False,
) -> None:
    """Apply registered migrations to every thread whose latest checkpoint is at --from.

    Each thread is migrated in its own transaction with a backup in the migration log
    (undo with `versions undo`). Threads a live run holds are skipped as busy. Exit
    code 1 when any thread failed or was busy."""
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    from langgraph_durable import versioning as v
    from langgraph_durable.ops import migrations as mig

    g, module = _graph(graph)
    registry = find_registry(migrations, g, module)
    target = to_version or v.graph_fingerprint(g)
    chain = registry.path(from_version, target)
    if not chain:
        raise _fail(
            f"no registered migration path from {from_version!r} to {target!r} "
            f"(registered: {[m.label for m in registry]})"
        )
    with open_saver(dsn, schema) as saver:
        ids = mig.thread_ids_at(saver, from_version, thread_ids=thread or None, limit=limit)
        if as_json:
            report = mig.migrate_threads(
                saver, from_version, target, graph=g, registry=registry, dry_run=dry_run,
                thread_ids=ids,
            )
        else:
            verb = "checking" if dry_run else "migrating"
            with Progress(
                TextColumn(f"{verb} {from_version} -> {target}"),
                BarColumn(),
                MofNCompleteColumn(),
                TextColumn("{task.fields[last]}"),
                TimeElapsedColumn(),
                console=console.resolve(),
            ) as progress:
                task = progress.add_task(verb, total=len(ids), last="")
                report = mig.migrate_threads(
                    saver, from_version, target, graph=g, registry=registry, dry_run=dry_run,
                    thread_ids=ids,
                    on_progress=lambda tid, outcome: progress.update(
                        task, advance=1, last=f"{tid}: {outcome}"
                    ),
                )
    if as_json:
        print_json(report.as_dict())
    else:
        done = "would migrate" if dry_run else "migrated"
        console.print(
            f"{done} {len(report.migrated)}, failed {len(report.failed)}, busy {len(report.busy)}, "
            f"skipped {len(report.skipped)} ({' then '.join(report.steps)})"
        )
        for tid, err in report.failed.items():
            err_console.print(f"[red]failed[/] {escape(tid)}: {escape(str(err))}")
        for tid in report.busy:
            err_console.print(f"[yellow]busy[/] {tid}: a live run holds it; run again later")
    if not report.ok:
        raise typer.Exit(1)


@versions_app.command("log")
def log_cmd(
    thread: Annotated[str | None, typer.Option("--thread", help="Only this thread.")] = None,
    limit: Annotated[int, typer.Option("--limit", min=1)] = 50,
    dsn: DsnOption = None,
    read_dsn: ReadDsnOption = None,
    read_max_lag: ReadMaxLagOption = 10.0,
    read_fallback: ReadFallbackOption = False,
    schema: SchemaOption = None,
    as_json: JsonOption = False,
) -> None:
    """Migrations applied (newest first), each with a backup of the rows it replaced."""
    from rich.table import Table

    from langgraph_durable.ops import migrations as mig

    with open_saver(dsn, schema, readonly=True, reads=Reads(read_dsn, read_max_lag, read_fallback)) as saver:
        rows = mig.migration_log(saver, thread_id=thread, limit=limit)
    if as_json:
        print_json(rows)
        return
    table = Table(title="Migration log")
    for col in ("id", "thread", "from", "to", "steps", "by", "at", "undone"):
        table.add_column(col)
    for r in rows:
        table.add_row(
            str(r["id"]), r["thread_id"], _label(r["from_version"]), r["to_version"],
            " then ".join(r["steps"] or []), r["origin"], _when(r["migrated_at"]),
            _when(r["undone_at"]) if r["undone_at"] else "-",
        )
    console.print(table)


@versions_app.command("undo")
def undo_cmd(
    thread_id: Annotated[str, typer.Argument(help="The thread whose last migration to undo.")],
    migration_id: Annotated[int | None, typer.Option("--id", help="A specific migration id.")] = None,
    dsn: DsnOption = None,
    schema: SchemaOption = None,
    as_json: JsonOption = False,
) -> None:
    """Put back the checkpoint a migration rewrote, byte for byte (only while the thread
    has not run since: its latest checkpoint must still be the migrated one)."""
    from langgraph_durable.ops import migrations as mig

    with open_saver(dsn, schema) as saver:
        try:
            out = mig.undo_migration(saver, thread_id, migration_id)
        except DurableError as exc:
            raise _fail(str(exc), 1) from None
    if as_json:
        print_json(out)
        return
    console.print(
        f"thread {thread_id}: migration {out['migration_id']} undone, back at "
        f"{out['restored_version']} (was {out['undone_version']})"
    )


@versions_app.command("record")
def record_cmd(
    graph: GraphOption,
    version: Annotated[
        str | None,
        typer.Option("--version", help="The version name to record it under (default: its fingerprint)."),
    ] = None,
    dsn: DsnOption = None,
    schema: SchemaOption = None,
    as_json: JsonOption = False,
) -> None:
    """Store a graph's topology for its version, as a run start does. For versions written
    before topologies were stored: with the old code at hand, record it once and their
    threads are classified (compatible ones then resume) instead of refused as unknown."""
    from langgraph_durable import compat
    from langgraph_durable import versioning as v

    g, _ = _graph(graph)
    topology = compat.graph_topology(g)
    name = version or v.graph_fingerprint(g)
    with open_saver(dsn, schema) as saver:
        saver.run_op(lambda: compat.op_record_version(name, topology))
        row = compat.recorded_versions(saver).get(name) or {}
    out = {"version": name, "fingerprint": topology["fingerprint"], "ambiguous": bool(row.get("ambiguous"))}
    if as_json:
        print_json(out)
        return
    console.print(
        f"recorded the topology of {name}"
        + (" [yellow](ambiguous: this name was recorded for another topology)[/]" if out["ambiguous"] else "")
    )


@versions_app.command("fingerprint")
def fingerprint_cmd(
    graph: GraphOption,
    describe: Annotated[bool, typer.Option("--describe", help="Also print what is hashed.")] = False,
    include_source: Annotated[
        bool, typer.Option("--include-source", help="Hash node source code too.")
    ] = False,
    as_json: JsonOption = False,
) -> None:
    """Print the graph's fingerprint (its version when none is given); put it in CI to
    see which changes need a migration."""
    from langgraph_durable import versioning as v

    g, _ = _graph(graph)
    fp = v.graph_fingerprint(g, include_source=include_source)
    if as_json:
        out: dict[str, Any] = {"fingerprint": fp}
        if describe:
            out["description"] = v.describe_graph(g, include_source=include_source)
        print_json(out)
        return
    console.print(fp)
    if describe:
        console.print_json(data=v.describe_graph(g, include_source=include_source))


def register(app: typer.Typer) -> None:
    """Add this module's commands to the main app."""
    app.add_typer(versions_app, name="versions")
