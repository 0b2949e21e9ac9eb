"""CLI command: ``langgraph-durable worker`` -- run a recovery worker.

    langgraph-durable worker --graph myapp.graphs:builder --concurrency 8 --dsn postgresql://...

``--graph`` takes ``module:attr`` (``pkg.mod:attr``, or ``path/to/file.py:attr``), where
``attr`` is a ``StateGraph`` builder (compiled here with the worker's saver), a compiled
graph (its durable checkpointer is kept; one without a checkpointer gets the worker's),
or a callable ``factory(saver) -> compiled graph``. Repeat ``--graph`` to serve several
graphs from one worker (threads are routed by graph version).
"""

from __future__ import annotations

import importlib
import importlib.util
import logging
import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

from langgraph_durable.cli._common import DsnOption, JsonOption, SchemaOption, err_console, escape
from langgraph_durable.errors import ConfigurationError, DurableError

if TYPE_CHECKING:
    from langgraph_durable._view import SaverView
    from langgraph_durable.saver import _DurableBase


def load_object(spec: str) -> Any:
    """Import ``module:attr`` or ``path/to/file.py:attr`` (dotted attrs allowed)."""
    module_part, sep, attr = spec.partition(":")
    if not sep or not module_part or not attr:
        raise ConfigurationError(
            f"--graph expects module:attr or path/to/file.py:attr, got {spec!r}", spec=spec
        )
    if module_part.endswith(".py") or os.sep in module_part:
        path = Path(module_part).resolve()
        if not path.is_file():
            raise ConfigurationError(f"no such file {str(path)!r} (from {spec!r})", spec=spec)
        name = "_lgd_graph_" + path.stem
        loaded = importlib.util.spec_from_file_location(name, path)
        if loaded is None or loaded.loader is None:
            raise ConfigurationError(f"cannot import {str(path)!r}", spec=spec)
        module = importlib.util.module_from_spec(loaded)
        sys.modules[name] = module
        # The graph's own module may import its siblings.
        sys.path.insert(0, str(path.parent))
        try:
            loaded.loader.exec_module(module)
        except DurableError as exc:
            del sys.modules[name]
            raise _import_failed(str(path), spec, exc) from exc
    else:
        if os.getcwd() not in sys.path:
            sys.path.insert(0, os.getcwd())
        try:
            module = importlib.import_module(module_part)
        except ImportError as exc:
            raise ConfigurationError(f"cannot import {module_part!r}: {exc}", spec=spec) from exc
        except DurableError as exc:
            raise _import_failed(module_part, spec, exc) from exc
    obj: Any = module
    for part in attr.split("."):
        try:
            obj = getattr(obj, part)
        except AttributeError as exc:
            raise ConfigurationError(f"{module_part!r} has no attribute {attr!r}", spec=spec) from exc
    return obj


def build_graph(obj: Any, saver: _DurableBase, spec: str = "") -> Any:
    """A compiled graph checkpointed by a durable saver, from whatever ``--graph`` named."""
    from langgraph.graph.state import StateGraph
    from langgraph.pregel import Pregel

    from langgraph_durable.saver import _DurableBase

    if isinstance(obj, StateGraph):
        return obj.compile(checkpointer=saver)
    if isinstance(obj, Pregel):
        if isinstance(obj.checkpointer, _DurableBase):
            return obj
        if obj.checkpointer in (None, True, False):
            return obj.copy(update={"checkpointer": saver})
        raise ConfigurationError(
            f"{spec or 'the graph'} is compiled with {type(obj.checkpointer).__name__}: "
            "compile it without a checkpointer (the worker supplies one) or with a "
            "DurablePostgresSaver",
            spec=spec,
        )
    if callable(obj):
        return build_graph(obj(saver), saver, spec)
    raise ConfigurationError(
        f"{spec or 'the object'} is a {type(obj).__name__}, not a StateGraph, compiled graph "
        "or factory",
        spec=spec,
    )


def worker(
    graph: Annotated[
        list[str],
        typer.Option(
            "--graph", "-g",
            help="module:attr (or file.py:attr) of a StateGraph, compiled graph or "
            "factory(saver). Repeatable.",
        ),
    ],
    dsn: DsnOption = None,
    schema: SchemaOption = None,
    concurrency: Annotated[
        int, typer.Option("--concurrency", "-c", min=1, help="Threads resumed at once.")
    ] = 4,
    lease_ttl: Annotated[
        float, typer.Option("--lease-ttl", help="Lease time-to-live in seconds.")
    ] = 30.0,
    poll_interval: Annotated[
        float, typer.Option("--poll-interval", help="Seconds between claims when idle.")
    ] = 1.0,
    max_resume_attempts: Annotated[
        int, typer.Option("--max-resume-attempts", help="Quarantine after this many.")
    ] = 3,
    retry_errors: Annotated[
        bool,
        typer.Option(
            "--retry-errors/--no-retry-errors",
            help="Retry threads whose last run raised (with backoff, up to quarantine).",
        ),
    ] = True,
    error_backoff: Annotated[
        float, typer.Option("--error-backoff", help="Seconds before the first retry.")
    ] = 5.0,
    shutdown: Annotated[
        str,
        typer.Option(
            "--shutdown",
            help="On SIGTERM: 'step' hands runs back at the next step boundary; "
            "'finish' lets them complete.",
        ),
    ] = "step",
    until_idle: Annotated[
        bool, typer.Option("--until-idle", help="Exit when nothing is left to recover.")
    ] = False,
    use_async: Annotated[
        bool, typer.Option("--async", help="Asyncio tasks and the async saver.")
    ] = False,
    pool_size: Annotated[
        int, typer.Option(
            "--pool-size", help="Connections (default max(10, concurrency + 2)).", show_default=False
        )
    ] = 0,
    log_level: Annotated[str, typer.Option("--log-level", help="Logging level.")] = "INFO",
    no_migrate: Annotated[
        bool,
        typer.Option(
            "--no-migrate",
            help="Run no DDL: only verify the schema version (for an application role "
            "without DDL rights; the owner runs `langgraph-durable setup`).",
        ),
    ] = False,
    metrics_port: Annotated[
        int | None,
        typer.Option(
            "--metrics-port",
            help="Serve Prometheus /metrics and a /healthz probe on this port "
            "(needs the 'prometheus' extra for /metrics).",
        ),
    ] = None,
    metrics_host: Annotated[
        str, typer.Option("--metrics-host", help="Address the metrics endpoint binds.")
    ] = "0.0.0.0",  # all interfaces: the kubelet probes the pod IP
) -> None:
    """Resume crashed, handed-back and queued threads; many workers may share one DB."""
    from langgraph_durable.embedded import resolve_dsn

    _configure_logging(log_level)
    if shutdown not in ("step", "finish"):
        raise typer.BadParameter("--shutdown must be 'step' or 'finish'")
    objects = _load_graphs(graph)
    url = resolve_dsn(dsn)
    options: dict[str, Any] = {
        "lease_ttl": lease_ttl,
        "max_resume_attempts": max_resume_attempts,
        "run_migrations": not no_migrate,
    }
    worker_options: dict[str, Any] = {
        "concurrency": concurrency,
        "poll_interval": poll_interval,
        "retry_errors": retry_errors,
        "error_backoff": error_backoff,
        "shutdown": shutdown,
    }
    size = pool_size or max(10, concurrency + 2)
    endpoint = (metrics_host, metrics_port) if metrics_port is not None else None
    if use_async:
        import asyncio

        asyncio.run(_arun(url, schema, size, options, objects, worker_options, until_idle, endpoint))
    else:
        _run(url, schema, size, options, objects, worker_options, until_idle, endpoint)


def _configure_logging(log_level: str) -> None:
    logging.basicConfig(
        level=getattr(logging, log_level.upper(), logging.INFO),
        format="%(asctime)s %(levelname)s %(name)s [%(process)d] %(message)s",
        stream=sys.stderr,
    )


def _import_failed(where: str, spec: str, exc: DurableError) -> ConfigurationError:
    """A package error raised while the graph's module was imported (its own saver
    built at import time without a DSN, say): said to come from that import, not as
    if the worker's own --dsn were missing (newcomer review). Other exceptions keep
    their traceback: a bug in the user's module needs it."""
    return ConfigurationError(
        f"importing {where} (--graph {spec}) failed: {type(exc).__name__}: {exc.message}", spec=spec
    )


def _load_graphs(specs: list[str]) -> list[tuple[str, Any]]:
    """Every ``--graph`` imported; an unusable one is a message and exit code 2."""
    try:
        return [(spec, load_object(spec)) for spec in specs]
    except ConfigurationError as exc:
        err_console.print(f"[red]error:[/red] {type(exc).__name__}: {escape(str(exc))}")
        raise typer.Exit(2) from exc


def workers(
    dsn: DsnOption = None,
    schema: SchemaOption = None,
    json_out: JsonOption = False,
    all_rows: Annotated[
        bool, typer.Option("--all", help="Stopped and dead workers too (until pruned).")
    ] = False,
    limit: Annotated[int, typer.Option("--limit", min=1, help="At most this many rows.")] = 100,
) -> None:
    """The registered recovery workers: host, pid, versions served, concurrency, runs
    claimed now, last poll and heartbeat (idle workers too; dead ones with --all)."""
    from rich.table import Table

    from langgraph_durable.cli._common import console, print_json, saver_or_exit
    from langgraph_durable.ops.control import list_workers

    with saver_or_exit(dsn, schema, json_out, readonly=True) as saver:
        rows = list_workers(saver, include_dead=all_rows, limit=limit)
    if json_out:
        print_json([w.to_dict() for w in rows])
        return
    if not rows:
        console.print("no live workers" + ("" if all_rows else " (--all shows stopped and dead ones)"))
        return
    table = Table(title="recovery workers", title_justify="left")
    for col in ("worker", "state", "host", "pid", "graphs", "versions", "conc.", "claimed", "last poll", "heartbeat"):
        table.add_column(col)
    for w in rows:
        state = "alive" if w.alive else ("stopped" if w.stopped_at is not None else "dead")
        versions = ", ".join(v[:14] for v in w.versions[:4]) + (" ..." if len(w.versions) > 4 else "")
        table.add_row(
            escape(w.name or w.worker_id[:12]), state, escape(w.host), str(w.pid),
            escape(", ".join(w.graph_names) or "-"), escape(versions or "-"), str(w.concurrency),
            str(w.claimed), w.last_poll_at.isoformat(timespec="seconds") if w.last_poll_at else "-",
            w.heartbeat_at.isoformat(timespec="seconds"),
        )
    console.print(table)


def register(app: typer.Typer) -> None:
    """Add this module's commands to the main app."""
    app.command("worker")(worker)
    app.command("workers")(workers)


def _serve_metrics(
    endpoint: tuple[str, int] | None, url: str, saver: SaverView, worker: Any
) -> Any:
    """Start ``/metrics`` and ``/healthz`` (see langgraph_durable.telemetry.serve).
    Healthy: the worker loop runs (not stopping, its thread alive) and a NEW connection
    to the database answers ``SELECT 1`` within the timeout (a pooled connection could
    still answer when the database no longer accepts clients)."""
    if endpoint is None:
        return None
    import threading

    import psycopg

    from langgraph_durable import telemetry

    loop_thread = threading.current_thread()

    def health() -> tuple[bool, str]:
        if worker.stopping or not loop_thread.is_alive():
            return False, "worker loop stopped"
        try:
            with psycopg.connect(url, connect_timeout=2, autocommit=True) as conn:
                conn.execute("SELECT 1")
        except Exception as exc:
            return False, f"database unreachable: {type(exc).__name__}: {exc}".splitlines()[0]
        return True, "ok"

    from langgraph_durable.ops.metrics import register_queue_collector

    register_queue_collector(saver)
    server = telemetry.serve(endpoint[1], health, host=endpoint[0])
    logging.getLogger("langgraph_durable.worker").info(
        "metrics on http://%s:%d/metrics, probe on /healthz", *server.server_address[:2]
    )
    return server


def _run(
    url: str,
    schema: str | None,
    size: int,
    options: dict[str, Any],
    objects: list[tuple[str, Any]],
    worker_options: dict[str, Any],
    until_idle: bool,
    endpoint: tuple[str, int] | None = None,
) -> None:
    from langgraph_durable.recovery import RecoveryWorker
    from langgraph_durable.saver import DurablePostgresSaver

    with DurablePostgresSaver.from_conn_string(url, schema=schema, pool_size=size, **options) as saver:
        saver.setup()
        graphs = [build_graph(obj, saver, spec) for spec, obj in objects]
        worker = RecoveryWorker(graphs, **worker_options)
        server = _serve_metrics(endpoint, url, saver, worker)
        try:
            worker.run(until_idle=until_idle)
        finally:
            if server is not None:
                server.shutdown()


async def _arun(
    url: str,
    schema: str | None,
    size: int,
    options: dict[str, Any],
    objects: list[tuple[str, Any]],
    worker_options: dict[str, Any],
    until_idle: bool,
    endpoint: tuple[str, int] | None = None,
) -> None:
    from langgraph_durable.recovery import RecoveryWorker
    from langgraph_durable.saver import AsyncDurablePostgresSaver

    async with AsyncDurablePostgresSaver.from_conn_string(
        url, schema=schema, pool_size=size, **options
    ) as saver:
        await saver.setup()
        graphs = [build_graph(obj, saver, spec) for spec, obj in objects]
        worker = RecoveryWorker(graphs, **worker_options)
        server = _serve_metrics(endpoint, url, saver, worker)
        try:
            await worker.arun(until_idle=until_idle)
        finally:
            if server is not None:
                server.shutdown()
