"""The connections a saver is given or opens: checks, options, schema configuration."""

from __future__ import annotations

import logging
import os
import re
from collections.abc import Callable
from typing import Any

import psycopg
from psycopg import AsyncConnection, Connection
from psycopg import conninfo as ci
from psycopg.rows import dict_row
from psycopg_pool import AsyncConnectionPool, ConnectionPool, PoolTimeout

from langgraph_durable._pool import AsyncDurableConnectionPool, DurableConnectionPool
from langgraph_durable.embedded import ENV_DSN
from langgraph_durable.errors import (
    ConfigurationError,
    DatabaseUnreachableError,
    ReadDsnUnreachableError,
    UnsupportedConnectionError,
)
from langgraph_durable.pooler import (
    POOLER_ENV,
    Pooler,
    pooler_chosen,
    prepare_threshold,
    resolve_pooler,
)
from langgraph_durable.sql.replication import (
    PRIMARY_WAL_LSN_SQL,
    READ_ONLY_SESSION_SQL,
    STANDBY_LAG_SQL,
    standby_params,
)
from langgraph_durable.sql.schema import set_search_path

logger = logging.getLogger("langgraph_durable")


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


# --------------------------------------------------------------------------- preflight
# The first connection's timeout unless the DSN (connect_timeout) or PGCONNECT_TIMEOUT
# sets one: psycopg's own default is 130 s, what a silent host costs without it.
CONNECT_TIMEOUT = 5
_PROBE_SQL = "SELECT pg_backend_pid() AS pid"
# libpq's and the server's wording, to the kind DatabaseUnreachableError carries.
_KINDS = (
    # A role that does not exist is the same mistake as a wrong password: the credentials.
    ("authentication", re.compile(r"password authentication failed|no password supplied|no pg_hba\.conf entry|authentication failed|role \".*\" does not exist", re.I)),
    ("database", re.compile(r'database ".*" does not exist', re.I)),
    ("refused", re.compile(r"Connection refused|No such file or directory", re.I)),
    ("timeout", re.compile(r"timeout expired|timed out", re.I)),
    ("host", re.compile(r"resolve host|could not translate host name|Name or service not known|Network is unreachable|No route to host", re.I)),
)


def redact_dsn(dsn: str) -> str:
    """``dsn`` with its password replaced by ``***`` (key=value form), for messages."""
    try:
        params = ci.conninfo_to_dict(dsn)
    except psycopg.Error:
        return "<a DSN that does not parse>"
    if params.get("password"):
        params["password"] = "***"
    return ci.make_conninfo("", **params)


_QUOTED = re.compile(r'"[^"]*"')
_HAS_SECRET = re.compile(r"password|://[^/@\s]*:[^/@\s]*@", re.I)


def _parse_reason(exc: Exception, dsn: str) -> str:
    """libpq's one line on a DSN that does not parse. It quotes the piece it choked on,
    which can be the password (a literal '%' in a URI's password, a stray word after
    ``password=``): with a password in the DSN the quoted pieces are left out
    (review32b). The exception itself is not chained, for the same reason."""
    reason = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
    return _QUOTED.sub('"…"', reason) if _HAS_SECRET.search(dsn) else reason


def _connect_kwargs(dsn: str) -> dict[str, Any]:
    """The preflight connection's options: no prepared statements (it may go through a
    pooler), and a timeout of seconds, not minutes, unless the user set one. A DSN that
    does not parse is a ``ConfigurationError`` naming only what libpq said."""
    try:
        params = ci.conninfo_to_dict(dsn)
    except psycopg.ProgrammingError as exc:
        # Say where it came from when it is the environment's (newcomer review: a typo in
        # LANGGRAPH_DURABLE_DSN was reported without naming the variable).
        source = f" (the value of {ENV_DSN})" if (os.environ.get(ENV_DSN) or "").strip() == dsn.strip() else ""
        reason = _parse_reason(exc, dsn)
        raise ConfigurationError(f"not a PostgreSQL connection string{source}: {reason}", reason=reason) from None
    kwargs: dict[str, Any] = {"autocommit": True, "prepare_threshold": None}
    if "connect_timeout" not in params and not os.environ.get("PGCONNECT_TIMEOUT"):
        kwargs["connect_timeout"] = CONNECT_TIMEOUT
    return kwargs


def _unreachable(dsn: str, exc: psycopg.Error) -> DatabaseUnreachableError:
    text = str(exc).strip() or type(exc).__name__
    # psycopg prefixes "connection failed: "; the server's FATAL line is what matters.
    reason = " ".join(line.strip() for line in text.splitlines() if line.strip())
    reason = reason.removeprefix("connection failed: ")
    kind = next((k for k, pattern in _KINDS if pattern.search(text)), "other")
    return DatabaseUnreachableError(redact_dsn(dsn), reason, kind)


# Probe rounds: each autocommit statement is its own transaction, which a pooler may
# hand to any server connection; a busy PgBouncer gave the second client the first's
# server connection 8 times in 20 with one round, each round adds a chance.
PROBE_ROUNDS = 3


def _detected(first: list[int], second: list[int]) -> Pooler:
    """A direct connection is one server process for its life, and two live ones are
    two: a connection that changed process, or two that met on one, went through a
    transaction pooler."""
    if len(set(first)) == 1 and len(set(second)) == 1 and first[0] != second[0]:
        return None
    logger.info(
        "langgraph-durable: connections share server processes (%s / %s), so a "
        "transaction pooler (e.g. PgBouncer pool_mode=transaction) is in between: running "
        "with pooler='transaction' (pass pooler= or set %s to choose)",
        sorted(set(first)), sorted(set(second)), POOLER_ENV,
    )
    return "transaction"


def _pid(conn: psycopg.Connection[Any]) -> int:
    row = conn.execute(_PROBE_SQL).fetchone()
    assert row is not None
    return int(row[0])


async def _apid(conn: psycopg.AsyncConnection[Any]) -> int:
    row = await (await conn.execute(_PROBE_SQL)).fetchone()
    assert row is not None
    return int(row[0])


def preflight(dsn: str, pooler: str | None) -> Pooler | None:
    """Before ``from_conn_string`` opens its pool: one connection within seconds, or
    ``DatabaseUnreachableError`` (no pool retrying in the background until
    ``PoolTimeout``); then, unless the mode was chosen, the pooler probe (pooler.py).
    Returns ``"transaction"`` when a pooler was detected, else None (keep the choice)."""
    kwargs = _connect_kwargs(dsn)
    first: list[int] = []
    second: list[int] = []
    try:
        with psycopg.Connection.connect(dsn, **kwargs) as conn:
            if pooler_chosen(pooler):
                return None
            first.append(_pid(conn))
            with psycopg.Connection.connect(dsn, **kwargs) as other:
                for _ in range(PROBE_ROUNDS):
                    second.append(_pid(other))
                    first.append(_pid(conn))
    except psycopg.OperationalError as exc:
        raise _unreachable(dsn, exc) from exc
    return _detected(first, second)


async def apreflight(dsn: str, pooler: str | None) -> Pooler | None:
    """``preflight`` for the async ``from_conn_string``."""
    kwargs = _connect_kwargs(dsn)
    first: list[int] = []
    second: list[int] = []
    try:
        async with await psycopg.AsyncConnection.connect(dsn, **kwargs) as conn:
            if pooler_chosen(pooler):
                return None
            first.append(await _apid(conn))
            async with await psycopg.AsyncConnection.connect(dsn, **kwargs) as other:
                for _ in range(PROBE_ROUNDS):
                    second.append(await _apid(other))
                    first.append(await _apid(conn))
    except psycopg.OperationalError as exc:
        raise _unreachable(dsn, exc) from exc
    return _detected(first, second)


# --------------------------------------------------------------------------- read_dsn
# --- standby26 ---
# The pool behind read_dsn (core/reader.py) is small: operator reads, a console's
# few concurrent pages; never a run's statement.
READ_POOL_SIZE = 4
# Seconds to wait for the read pool's first connection once the preflight has connected.
READ_POOL_WAIT = 2 * CONNECT_TIMEOUT
# A read waits this long for a connection of the read pool (the pool's own default is
# 30 s); the lag probe before each reader() this long at most, so a standby that went
# away mid-session is a typed error in seconds (not the driver's retries, each waiting).
READ_POOL_TIMEOUT = 2 * CONNECT_TIMEOUT
PROBE_TIMEOUT = 3.0


def _configure_read(schema: str | None, pooled: Pooler) -> Callable[[Connection[Any]], None]:
    def configure(conn: Connection[Any]) -> None:
        if pooled:  # session settings would leak to the pooler's other clients
            return
        if schema:
            conn.execute(set_search_path(schema))
        conn.execute(READ_ONLY_SESSION_SQL)

    return configure


def _aconfigure_read(schema: str | None, pooled: Pooler) -> Callable[[AsyncConnection[Any]], Any]:
    async def configure(conn: AsyncConnection[Any]) -> None:
        if pooled:
            return
        if schema:
            await conn.execute(set_search_path(schema))
        await conn.execute(READ_ONLY_SESSION_SQL)

    return configure


def _read_failed(exc: ConfigurationError) -> ConfigurationError:
    if isinstance(exc, DatabaseUnreachableError):
        return ReadDsnUnreachableError(exc.fields["dsn"], exc.fields["reason"], exc.fields["kind"])
    return ConfigurationError(f"read_dsn: {exc.message}", **exc.fields, setting="read_dsn")


def preflight_read(dsn: str) -> Pooler:
    """``preflight`` for ``read_dsn``: one connection within seconds, or
    ``ReadDsnUnreachableError``; the pooler probe unless ``LANGGRAPH_DURABLE_POOLER``
    chose. Returns the read pool's pooler mode."""
    try:
        found = preflight(dsn, None)
    except ConfigurationError as exc:
        raise _read_failed(exc) from exc.__cause__
    return "transaction" if found else resolve_pooler(None)


async def apreflight_read(dsn: str) -> Pooler:
    try:
        found = await apreflight(dsn, None)
    except ConfigurationError as exc:
        raise _read_failed(exc) from exc.__cause__
    return "transaction" if found else resolve_pooler(None)


def open_read_pool(dsn: str, pooled: Pooler, schema: str | None) -> DurableConnectionPool:
    """The read_dsn pool: sessions read-only (``default_transaction_read_only``), the
    saver's schema, opened now."""
    pool = DurableConnectionPool(
        dsn, min_size=1, max_size=READ_POOL_SIZE, kwargs=_conn_kwargs(pooled),
        configure=_configure_read(schema, pooled), open=True, name="langgraph-durable-read",
        timeout=READ_POOL_TIMEOUT,
    )
    pool._durable_own = True  # type: ignore[attr-defined]
    return pool


def aopen_read_pool(dsn: str, pooled: Pooler, schema: str | None) -> AsyncDurableConnectionPool:
    """``open_read_pool`` for the async saver (the caller awaits ``open()``)."""
    pool = AsyncDurableConnectionPool(
        dsn, min_size=1, max_size=READ_POOL_SIZE, kwargs=_conn_kwargs(pooled),
        configure=_aconfigure_read(schema, pooled), open=False, name="langgraph-durable-read",
        timeout=READ_POOL_TIMEOUT,
    )
    pool._durable_own = True  # type: ignore[attr-defined]
    return pool


def read_unreachable(dsn: str, exc: BaseException) -> ReadDsnUnreachableError:
    """The standby stopped answering after a good start (a restart, a network cut): the
    same typed error as at the start, with what the driver or the pool said."""
    if isinstance(exc, psycopg.Error):
        err = _unreachable(dsn, exc)
        return ReadDsnUnreachableError(err.fields["dsn"], err.fields["reason"], err.fields["kind"])
    reason = " ".join(str(exc).split()) or type(exc).__name__
    kind = "timeout" if "timeout" in type(exc).__name__.lower() else "other"
    return ReadDsnUnreachableError(redact_dsn(dsn), reason, kind)


def probe_standby(pool: ConnectionPool[Any], primary: dict[str, Any] | None) -> dict[str, Any]:
    """The lag statement (``STANDBY_LAG_SQL``) on the read pool, within
    ``PROBE_TIMEOUT`` seconds and one retry after a broken connection, else
    ``ReadDsnUnreachableError``."""
    for attempt in range(2):
        try:
            with pool.connection(timeout=PROBE_TIMEOUT) as conn:
                row = conn.execute(STANDBY_LAG_SQL, standby_params(primary)).fetchone()
                return dict(row) if row else {}
        except psycopg.OperationalError as exc:
            if attempt:
                raise read_unreachable(str(pool.conninfo), exc) from exc
            pool.check()
        except PoolTimeout as exc:
            raise read_unreachable(str(pool.conninfo), exc) from exc
    raise AssertionError("unreachable")


async def aprobe_standby(pool: AsyncConnectionPool[Any], primary: dict[str, Any] | None) -> dict[str, Any]:
    """``probe_standby`` for the async saver's read pool."""
    for attempt in range(2):
        try:
            async with pool.connection(timeout=PROBE_TIMEOUT) as conn:
                cur = await conn.execute(STANDBY_LAG_SQL, standby_params(primary))
                return dict(await cur.fetchone() or {})
        except psycopg.OperationalError as exc:
            if attempt:
                raise read_unreachable(str(pool.conninfo), exc) from exc
            await pool.check()
        except PoolTimeout as exc:
            raise read_unreachable(str(pool.conninfo), exc) from exc
    raise AssertionError("unreachable")


def _row_dict(cur: Any, row: Any) -> dict[str, Any] | None:
    if row is None:
        return None
    if isinstance(row, dict):
        return dict(row)
    return {d.name: v for d, v in zip(cur.description, row, strict=True)}


def probe_primary(pool: ConnectionPool[Any]) -> dict[str, Any] | None:
    """The primary's ``pg_current_wal_lsn()``, clock and identity for the lag
    (``PRIMARY_WAL_LSN_SQL``), within ``PROBE_TIMEOUT``
    seconds (a primary that does not answer must not hold an operator's read for the
    driver's retries); None when it did not answer."""
    try:
        with pool.connection(timeout=PROBE_TIMEOUT) as conn:
            cur = conn.execute(PRIMARY_WAL_LSN_SQL)
            return _row_dict(cur, cur.fetchone())
    except (psycopg.Error, PoolTimeout):
        return None


async def aprobe_primary(pool: AsyncConnectionPool[Any]) -> dict[str, Any] | None:
    """``probe_primary`` for the async saver's pool."""
    try:
        async with pool.connection(timeout=PROBE_TIMEOUT) as conn:
            cur = await conn.execute(PRIMARY_WAL_LSN_SQL)
            return _row_dict(cur, await cur.fetchone())
    except (psycopg.Error, PoolTimeout):
        return None
