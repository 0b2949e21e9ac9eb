"""Running behind a transaction-pooling connection pooler (PgBouncer ``pool_mode =
transaction``, most managed poolers), and without DDL rights.

A transaction pooler hands each *transaction* to whichever server connection is free,
so nothing that lives in a server session survives from one transaction to the next:

* server-side prepared statements (psycopg prepares a query after ``prepare_threshold``
  executions; the saver's own connections used 0, "prepare at once"). PgBouncer 1.18
  (Debian 12's) cannot track them: "prepared statement _pg3_0 does not exist". Pooled,
  every connection the package opens gets ``prepare_threshold=None`` (never prepare).
* ``SET search_path``: a session setting lands on one server connection and leaks to
  whichever client gets it next. Pooled, the package never sets it; with ``schema=`` the
  role's own default must name the schema (``ALTER ROLE app IN DATABASE db SET
  search_path = myschema``, which every server connection the pooler opens for that role
  starts with) and ``setup()`` verifies it, raising ``ConfigurationError`` otherwise.
* session advisory locks: ``setup()`` serialises concurrent callers with one. Pooled,
  it takes a transaction-level lock instead (``pg_try_advisory_xact_lock``, polled) and
  runs every migration in that one transaction, so ``CREATE INDEX CONCURRENTLY`` becomes
  a plain ``CREATE INDEX`` (instant on a fresh install; an upgrade of large tables
  should run ``setup()`` on a direct connection, which keeps CONCURRENTLY).

The rest of the package needs nothing: every other lock is transaction-scoped
(``pg_advisory_xact_lock``, row locks), there is no ``LISTEN`` and no temp table, and the
lease renewer's dedicated connection sends one autocommit statement at a time.

Pooled mode is chosen with one option: ``pooler="transaction"`` on the savers (and
``from_conn_string``), defaulting to the ``LANGGRAPH_DURABLE_POOLER`` environment
variable (``transaction``, or ``none`` for a direct connection), which the CLI and the
workers read too. When neither is set, ``from_conn_string`` finds out by itself
(``core.connections.preflight``): it opens two connections, the second while the first
is still open, and asks each for ``pg_backend_pid()``. Two live direct connections are
always two server processes; the same pid means one server connection handed from
client to client, i.e. a transaction (or statement) pooler, and the saver switches to
pooled mode with one INFO line. Not guessed from the port (6432 is a convention) nor by
``SHOW`` (PgBouncer answers it only on its admin database). A busy pooler may hand the
second client another server connection (a miss, never a false alarm); the clash then
met on the first prepared statement is raised as ``PoolerMismatchError`` naming the
setting (``_io._base.pooler_clash``), and so is one on a connection or pool the user opened.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterator
from typing import Any, Literal

from psycopg import sql

from langgraph_durable._io import Batch, Op, Sleep, Stmt, Tx
from langgraph_durable._view import SchemaView
from langgraph_durable.errors import ConfigurationError, SchemaNotReadyError
from langgraph_durable.sql.schema import (
    CURRENT_SCHEMA_SQL,
    MIGRATIONS,
    SETUP_LOCK_KEY,
    TABLE_EXISTS_SQL,
    TRY_SETUP_XACT_LOCK_SQL,
    create_schema,
    migration_version_sql,
    record_migration_sql,
)

POOLER_ENV = "LANGGRAPH_DURABLE_POOLER"
Pooler = Literal["transaction"] | None
_VALUES = ("transaction", "none", "")


def resolve_pooler(pooler: str | None) -> Pooler:
    """``pooler`` if given, else ``$LANGGRAPH_DURABLE_POOLER``; ``None`` means direct."""
    value = pooler if pooler is not None else os.environ.get(POOLER_ENV, "")
    value = value.strip().lower()
    if value not in _VALUES:
        raise ConfigurationError(
            f"unknown pooler {value!r}: use 'transaction' (PgBouncer pool_mode=transaction "
            f"and other transaction poolers) or 'none' (also via ${POOLER_ENV})",
            pooler=value,
        )
    return "transaction" if value == "transaction" else None


def pooler_chosen(pooler: str | None) -> bool:
    """Whether the user chose the mode (the argument or ``$LANGGRAPH_DURABLE_POOLER``,
    ``none`` included); if not, ``from_conn_string`` probes for a pooler."""
    value = pooler if pooler is not None else os.environ.get(POOLER_ENV, "")
    return bool(value.strip())


def prepare_threshold(pooler: Pooler) -> int | None:
    """psycopg's ``prepare_threshold`` for the connections the package opens: prepare at
    once when direct (the saver's statements repeat), never behind a transaction pooler."""
    return None if pooler else 0


def session_schema(saver: object) -> str | None:
    """The schema a connection of ``saver`` should ``SET search_path`` to, per session:
    none behind a transaction pooler (the role's default search_path serves there)."""
    return None if getattr(saver, "pooler", None) else getattr(saver, "schema", None)


def check_pooled_conn(saver: str, conn: Any, pooler: Pooler, pool_types: tuple[type, ...]) -> None:
    """Pooled, a connection the user hands the saver must not prepare statements: a
    single connection is switched off here; a pool cannot be (its connections exist
    already), so it must be opened with ``prepare_threshold=None``."""
    if not pooler or getattr(conn, "_durable_own", False):
        return
    if isinstance(conn, pool_types):
        kwargs = getattr(conn, "kwargs", None) or {}
        if kwargs.get("prepare_threshold", 5) is not None:
            raise ConfigurationError(
                f"{saver}: behind a transaction pooler the pool's connections must not "
                "prepare statements: open it with kwargs={'autocommit': True, "
                "'prepare_threshold': None}",
                saver=saver, pooler=pooler,
            )
        return
    conn.prepare_threshold = None


# --------------------------------------------------------------------------- setup
_CONCURRENTLY = re.compile(r"\bCONCURRENTLY\b", re.IGNORECASE)


def _in_transaction(statement: str) -> str:
    # CREATE/DROP INDEX CONCURRENTLY cannot run in a transaction block.
    return _CONCURRENTLY.sub("", statement)


def _op_pooled_migrate(saver: SchemaView, stock: list[str]) -> Op[bool]:
    """One attempt: take the setup lock for this transaction or give up at once (False),
    then run every pending migration in this transaction. Never waits in the server for
    the lock: a waiter holds a snapshot, which a direct-connection setup's CREATE INDEX
    CONCURRENTLY would wait for (see ``_DurableBase._op_setup``)."""
    rows = yield Batch(
        [Stmt(TRY_SETUP_XACT_LOCK_SQL, (SETUP_LOCK_KEY,), fetch=True)]
    )
    if not rows[0][0]["ok"]:
        return False
    if saver.schema:
        yield Batch([Stmt(create_schema(saver.schema))])
        yield from _op_check_search_path(saver)
    for table, migrations in (("checkpoint_migrations", stock), ("durable_migrations", MIGRATIONS)):
        yield Batch([Stmt(_in_transaction(migrations[0]))])
        rows = yield Batch([Stmt(migration_version_sql(sql.Identifier(table)), fetch=True)])
        version = rows[0][0]["v"] if rows[0][0]["v"] is not None else -1
        for v in range(version + 1, len(migrations)):
            yield Batch([Stmt(_in_transaction(migrations[v]))])
            yield Batch([Stmt(record_migration_sql(sql.Identifier(table)), (v,))])
    return True


def flow_pooled_setup(saver: SchemaView, stock: list[str]) -> Iterator[Any]:
    """``setup()`` behind a transaction pooler: polls ``_op_pooled_migrate``."""
    while not (yield Tx(lambda: _op_pooled_migrate(saver, stock))):
        yield Sleep(0.05)


def _op_check_search_path(saver: SchemaView) -> Op[None]:
    rows = yield Batch([Stmt(CURRENT_SCHEMA_SQL, fetch=True)])
    current, role = rows[0][0]["s"], rows[0][0]["u"]
    if current != saver.schema:
        raise ConfigurationError(
            f"behind a transaction pooler, schema={saver.schema!r} needs the role's default "
            f"search_path (a session SET would leak to other clients of the pooler): run "
            f"ALTER ROLE {role} IN DATABASE <db> SET search_path = {saver.schema} "
            f"(current schema: {current!r})",
            schema=saver.schema, role=role, current_schema=current,
        )


def op_check_read_search_path(saver: SchemaView) -> Op[None]:
    """``read_dsn`` behind a transaction pooler (core/reader.py): the read pool sets no
    search_path there either, so ``schema=`` must be the role's default on the read
    server too, else the reader would read another schema's tables (public: another
    tenant's threads) as this saver's."""
    try:
        yield from _op_check_search_path(saver)
    except ConfigurationError as exc:
        raise ConfigurationError(
            f"read_dsn: {exc.message}; run it on the primary (its standbys replay it)",
            **exc.fields, setting="read_dsn",
        ) from exc


def op_check_schema(saver: SchemaView, stock: list[str]) -> Op[None]:
    """``setup()`` with ``run_migrations=False``: read the recorded versions, run no DDL,
    raise ``SchemaNotReadyError`` when a table set is missing or behind this release."""
    if saver.pooler and saver.schema:
        yield from _op_check_search_path(saver)
    for component, table, migrations in (
        ("checkpoint", "checkpoint_migrations", stock),
        ("durable", "durable_migrations", MIGRATIONS),
    ):
        ident = sql.Identifier(saver.schema, table) if saver.schema else sql.Identifier(table)
        regclass = f"{saver.schema}.{table}" if saver.schema else table
        rows = yield Batch([Stmt(TABLE_EXISTS_SQL, (regclass,), fetch=True)])
        found: int | None = None
        if rows[0][0]["ok"]:
            rows = yield Batch([Stmt(migration_version_sql(ident), fetch=True)])
            found = rows[0][0]["v"]
        if found is None or found < len(migrations) - 1:
            raise SchemaNotReadyError(saver.schema, component, found, len(migrations) - 1)


__all__ = [
    "POOLER_ENV",
    "Pooler",
    "check_pooled_conn",
    "flow_pooled_setup",
    "op_check_schema",
    "pooler_chosen",
    "prepare_threshold",
    "resolve_pooler",
    "session_schema",
]
