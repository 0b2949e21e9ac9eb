"""The connections a saver is given or opens: checks, options, schema configuration."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import psycopg
from psycopg import AsyncConnection, Connection
from psycopg.rows import dict_row
from psycopg_pool import AsyncConnectionPool, ConnectionPool

from langgraph_durable._pool import AsyncDurableConnectionPool, DurableConnectionPool
from langgraph_durable.errors import (
    ConfigurationError,
    UnsupportedConnectionError,
)
from langgraph_durable.pooler import (
    Pooler,
    prepare_threshold,
)
from langgraph_durable.sql.schema import set_search_path


def _configure_schema(schema: str | None) -> Callable[[Connection[Any]], None]:
    def configure(conn: Connection[Any]) -> None:
        if schema:
            conn.execute(set_search_path(schema))

    return configure


def _aconfigure_schema(schema: str | None) -> Callable[[AsyncConnection[Any]], Any]:
    async def configure(conn: AsyncConnection[Any]) -> None:
        if schema:
            await conn.execute(set_search_path(schema))

    return configure


_CONN_KWARGS = {"autocommit": True, "prepare_threshold": 0, "row_factory": dict_row}


def _conn_kwargs(pooler: Pooler) -> dict[str, Any]:
    """The saver's connection options; behind a transaction pooler, no prepared
    statements (see pooler.py)."""
    return {**_CONN_KWARGS, "prepare_threshold": prepare_threshold(pooler)}


def _conninfo_of(conn: Any) -> str:
    """A conninfo string that opens another connection like ``conn`` (pool or conn)."""
    if isinstance(conn, ConnectionPool | AsyncConnectionPool):
        return str(conn.conninfo)
    info = conn.info
    params = info.get_parameters()
    if info.password:
        params["password"] = info.password
    return psycopg.conninfo.make_conninfo(**params)


def _check_conn(saver: str, conn: Any, *, asynchronous: bool) -> None:
    """Refuse, with a typed error saying what to pass, a connection object the saver's
    driver cannot use. Some published tutorials hand an ``asyncpg`` pool to the saver:
    it would fail later, on the first query, with an AttributeError."""
    if asynchronous:
        good: tuple[type, ...] = (AsyncConnection, AsyncConnectionPool)
        expected = (
            "a psycopg 3 AsyncConnectionPool or AsyncConnection opened with autocommit=True"
        )
        factory = "AsyncDurablePostgresSaver.from_conn_string(dsn)"
    else:
        good = (Connection, ConnectionPool)
        expected = "a psycopg 3 ConnectionPool or Connection opened with autocommit=True"
        factory = "DurablePostgresSaver.from_conn_string(dsn)"
    if isinstance(conn, good):
        return
    kind = type(conn)
    got = f"{kind.__module__}.{kind.__qualname__}"
    root = (kind.__module__ or "").split(".")[0]
    if root == "asyncpg":
        hint = (
            "asyncpg is another driver; open the pool with psycopg_pool: "
            "AsyncConnectionPool(dsn, kwargs={'autocommit': True}, open=False), then "
            f"`async with pool:`; or let the saver open one: `async with {factory} as saver:`"
        )
    elif isinstance(conn, str | bytes):
        hint = f"For a connection string use `with {factory} as saver:`"
    elif asynchronous and isinstance(conn, Connection | ConnectionPool):
        hint = "That is a synchronous connection: use DurablePostgresSaver with it."
    elif not asynchronous and isinstance(conn, AsyncConnection | AsyncConnectionPool):
        hint = "That is an asynchronous connection: use AsyncDurablePostgresSaver with it."
    elif root in ("psycopg2", "sqlalchemy"):
        hint = f"{root} connections are not supported; use psycopg 3, or {factory}."
    else:
        hint = f"Or let the saver open a pool: {factory}."
    raise UnsupportedConnectionError(saver, got, expected, hint)


def _check_pipe(saver: str, conn: Any, pipe: Any, pool_type: type) -> None:
    """``pipe``: the stock savers take a pipeline of the connection they are given and
    run every statement through it, syncing after each write. The durable driver does
    the same on a connection in pipeline mode: each operation's statements go to the
    server as one batch inside ``pipe`` and are synced before the call returns (a put
    returns once committed), so passing a pipe changes nothing else; without one, each
    operation opens its own pipeline block. As with the stock saver, a pipe only goes
    with a single connection, never a pool."""
    if pipe is None:
        return
    if isinstance(conn, pool_type):
        raise ConfigurationError(
            f"{saver}: a Pipeline should be used only with a single connection, not a pool",
            saver=saver,
        )
    if getattr(pipe, "_conn", conn) is not conn:
        raise ConfigurationError(f"{saver}: pipe is not a pipeline of conn", saver=saver)


def open_pool(dsn: str, pool_size: int, pooled: Pooler, schema: str | None) -> DurableConnectionPool:
    """The pool ``from_conn_string`` opens (and closes): one that reconnects within a
    second of a failover (_pool.py), marked as the saver's own."""
    pool = DurableConnectionPool(
        dsn,
        min_size=1,
        max_size=pool_size,
        kwargs=_conn_kwargs(pooled),
        configure=_configure_schema(None if pooled else schema),
        # No check= on checkout: when a restart or idle-timeout kill has broken
        # several idle connections, the pool's check loop backs off 1, 2, 4... s
        # per broken one (37 s measured with 10) before giving up. The driver
        # instead retries the failed op once after pool.check() replaced them all,
        # and no op pays a SELECT 1 round trip.
        open=True,
        name="langgraph-durable",
    )
    pool._durable_own = True  # type: ignore[attr-defined]
    return pool


def aopen_pool(
    dsn: str, pool_size: int, pooled: Pooler, schema: str | None
) -> AsyncDurableConnectionPool:
    """The async ``from_conn_string``'s pool, opened by its ``async with``."""
    pool = AsyncDurableConnectionPool(
        dsn,
        min_size=1,
        max_size=pool_size,
        kwargs=_conn_kwargs(pooled),
        configure=_aconfigure_schema(None if pooled else schema),
        # No check= on checkout: see open_pool.
        open=False,
        name="langgraph-durable",
    )
    pool._durable_own = True  # type: ignore[attr-defined]
    return pool
