"""What both drivers share with psycopg: capability checks and error classification.

Not generated: ``_async.py`` (the async driver, the source) and the generated
``_sync.py`` import from here; names come in pairs only where sync and async truly
differ (``AsyncLock``/``Lock``, ``asleep``/``sleep``, ``settle``/``settle_sync``), and
tools/async_to_sync.py maps the first of each pair to the second.
"""

from __future__ import annotations

import asyncio
import re
import time
from asyncio import Lock as AsyncLock
from threading import Lock
from typing import Any

import psycopg
from psycopg import Capabilities

from langgraph_durable._io.protocol import Batch

HAS_PIPELINE = Capabilities().has_pipeline()

# libpq's status codes, compared as the ints ``conn.pgconn`` returns: ``conn.info``
# builds a ConnectionInfo and an enum member per read (~0.4 us, issue 14: per op).
PIPELINE_OFF = int(psycopg.pq.PipelineStatus.OFF)
TX_IDLE = int(psycopg.pq.TransactionStatus.IDLE)

asleep = asyncio.sleep
sleep = time.sleep


async def settle(value: Any) -> Any:
    """User code's result: awaited when it is a coroutine."""
    if asyncio.iscoroutine(value):
        return await value
    return value


def settle_sync(value: Any) -> Any:
    """User code's result on the sync driver: a coroutine runs to completion on a new
    event loop (``asyncio.run``)."""
    if asyncio.iscoroutine(value):
        return asyncio.run(value)
    return value


def privilege_error(exc: psycopg.Error, conn: Any) -> Exception:
    """A missing GRANT as a typed error naming the role (a read-only role ran a write,
    an application role ran DDL); the psycopg error stays as ``__cause__``."""
    from langgraph_durable.errors import InsufficientPrivilegeError

    try:
        role = conn.info.user if conn is not None else None
    except Exception:
        role = None
    return InsufficientPrivilegeError(role, str(exc).strip().splitlines()[0] if str(exc) else type(exc).__name__)


def pooler_clash(exc: BaseException) -> Exception | None:
    """A prepared-statement clash, another client's ``_pg3_N`` met on this server
    connection (or ours gone from it): the connection goes through a transaction pooler
    the saver was not told about. ``PoolerMismatchError`` naming the setting; None for
    any other error."""
    from langgraph_durable.errors import PoolerMismatchError

    # ProtocolViolation: our cached _pg3_N is another client's statement on this server
    # connection ("bind message supplies 6 parameters, but prepared statement ... requires 14").
    clash = isinstance(exc, psycopg.errors.DuplicatePreparedStatement) or (
        isinstance(exc, psycopg.errors.InvalidSqlStatementName | psycopg.errors.ProtocolViolation)
        and "_pg3_" in str(exc)
    )
    return PoolerMismatchError(str(exc).strip().splitlines()[0]) if clash else None


# The package's tables and functions: a statement that misses one of them means setup()
# has not run (a user's own table missing in a transactional @idempotent body is not it).
_MISSING = re.compile(r'(?:relation|function) "?((?:[a-z_][a-z0-9_]*\.)?[a-z_][a-z0-9_]*)"?')
_OURS = re.compile(r"(?:durable_\w+|checkpoints|checkpoint_blobs|checkpoint_writes|checkpoint_migrations)")


def schema_missing(exc: BaseException, schema: str | None) -> Exception | None:
    """``relation "durable_threads" does not exist`` (or a missing ``durable_*``
    function) as ``SchemaMissingError`` naming ``setup()``; None for anything else."""
    if not isinstance(exc, psycopg.errors.UndefinedTable | psycopg.errors.UndefinedFunction):
        return None
    found = _MISSING.search(str(exc))
    if found is None:
        return None
    relation = found.group(1)
    name = relation.rsplit(".", 1)[-1]
    if not _OURS.fullmatch(name):
        return None
    from langgraph.checkpoint.postgres.base import MIGRATIONS as STOCK_MIGRATIONS

    from langgraph_durable.errors import SchemaMissingError
    from langgraph_durable.sql.schema import MIGRATIONS

    component = "durable" if name.startswith("durable_") else "checkpoint"
    expected = len(MIGRATIONS if component == "durable" else STOCK_MIGRATIONS) - 1
    return SchemaMissingError(schema, component, relation, expected)


def is_connection_failure(exc: BaseException, conn: Any) -> bool:
    if isinstance(exc, psycopg.errors.AdminShutdown | psycopg.errors.CannotConnectNow):
        return True
    if isinstance(exc, psycopg.OperationalError | psycopg.InterfaceError):
        return conn is None or conn.closed or conn.broken
    return False


def in_pipeline(conn: Any) -> bool:
    """Whether ``conn`` is in pipeline mode (the user handed the saver a ``pipe``).
    Every batch then runs in a nested ``conn.pipeline()`` block, whose exit syncs: a
    lone statement sent without one would wait, unsent or unchecked, for a later sync."""
    return bool(conn.pgconn.pipeline_status != PIPELINE_OFF)


def implicit(conn: Any, item: Any) -> bool:
    """Whether an op whose first item is ``item`` can run as one pipeline with no
    BEGIN/COMMIT: its only batch (``final``), on an idle autocommit connection. The
    statements up to the pipeline's sync are then one implicit transaction, all or
    nothing, like the stock saver's puts. Saves two statements and their round trips,
    ~0.08 ms of a ~0.3 ms put (bench/bench_storage.py, small-state graph). Checks that
    must abort the write (the lease fence) therefore fail server-side (durable_fence)."""
    return (
        isinstance(item, Batch)
        and item.final
        and HAS_PIPELINE
        and conn.autocommit
        and conn.pgconn.transaction_status == TX_IDLE
    )


__all__ = [
    "HAS_PIPELINE",
    "PIPELINE_OFF",
    "TX_IDLE",
    "AsyncLock",
    "Lock",
    "asleep",
    "implicit",
    "in_pipeline",
    "is_connection_failure",
    "pooler_clash",
    "privilege_error",
    "schema_missing",
    "settle",
    "settle_sync",
    "sleep",
]
