"""The sans-I/O protocol shared by the sync and async savers.

Saver logic is written once, as generators:

* an *op* runs inside one transaction. It yields ``Batch`` objects (statements sent in
  one pipeline round trip) and receives their rows; it may yield ``AfterCommit`` to
  schedule pure work once the transaction is committed. Its return value is the result.
* a *flow* spans several transactions. It yields ``Tx`` (run an op, get its result),
  ``Hook`` (call user code, awaited if it is a coroutine) and ``Sleep``.

``SyncDriver`` and ``AsyncDriver`` execute them against a psycopg connection or pool.
They are the only code that differs between the two savers (psycopg's own design:
I/O-free core, thin I/O layers), so every rule (fencing, artifacts, poison counting,
versioning) exists in exactly one place.
"""

from __future__ import annotations

import asyncio
import contextvars
import logging
import threading
import time
from collections.abc import AsyncIterator, Callable, Generator, Iterator, Sequence
from contextlib import asynccontextmanager, contextmanager
from dataclasses import dataclass, field
from typing import Any, TypeVar

import psycopg
from psycopg import AsyncConnection, Capabilities, Connection
from psycopg.rows import DictRow, dict_row
from psycopg_pool import AsyncConnectionPool, ConnectionPool

from langgraph_durable.sql.schema import set_search_path

logger = logging.getLogger("langgraph_durable")

T = TypeVar("T")


@dataclass(frozen=True)
class Stmt:
    sql: Any
    params: Any = None
    fetch: bool = False
    many: bool = False
    prepare: bool | None = None


@dataclass(frozen=True)
class Batch:
    stmts: Sequence[Stmt]
    # The op's only batch (it yields nothing but AfterCommit afterwards): the driver may
    # then send it as one implicit transaction, without BEGIN/COMMIT (see _transact).
    final: bool = False


@dataclass(frozen=True)
class AfterCommit:
    fn: Callable[[], None]


@dataclass(frozen=True)
class Tx:
    factory: Callable[[], Generator[Any, Any, Any]]
    transaction: bool = True


@dataclass(frozen=True)
class Hook:
    fn: Callable[..., Any]
    args: tuple[Any, ...] = ()


@dataclass(frozen=True)
class Sleep:
    seconds: float


Op = Generator[Any, Any, T]
Flow = Generator[Any, Any, T]

# How many times an operation is retried on a fresh connection after the connection
# itself failed (server restart, idle-timeout kill, pgbouncer hiccup).
CONNECTION_RETRIES = 3

_HAS_PIPELINE = Capabilities().has_pipeline()

# Fault injection for tests (None in production): called with (connection, attempt)
# once an op's transaction has committed, before its result is returned. A hook that
# closes the connection and raises psycopg.OperationalError simulates the connection
# dropping between COMMIT and its reply: the driver then retries the whole op on a
# fresh connection, so every op must recognise its own committed work (see
# tests/test_seams_lease.py). Set with set_after_commit_hook.
AfterCommitHook = Callable[[Any, int], None]
_after_commit_hook: AfterCommitHook | None = None


def set_after_commit_hook(hook: AfterCommitHook | None) -> AfterCommitHook | None:
    """Install (or with None remove) the test-only after-commit hook; returns the old one."""
    global _after_commit_hook
    previous, _after_commit_hook = _after_commit_hook, hook
    return previous


_OP_MEMO: contextvars.ContextVar[dict[str, Any] | None] = contextvars.ContextVar(
    "langgraph_durable_op_memo", default=None
)


def op_memo() -> dict[str, Any]:
    """A dict the running op keeps across the driver's retries of it (one per run_op).

    A retry after a connection failure cannot tell whether the failed attempt's COMMIT
    happened. An op whose effect is not naturally idempotent (it counts, consumes or
    creates something) stores here, just before it returns, what it did; its retry
    checks the database for that effect and, when it is there, returns the remembered
    result instead of doing it again. (In an explicit transaction every result arrives
    before COMMIT is sent, so the memo is complete whenever the COMMIT may have
    succeeded.) Outside a driver's run_op it is a fresh dict: nothing is retried."""
    memo = _OP_MEMO.get()
    return memo if memo is not None else {}


def _privilege_error(exc: psycopg.Error, conn: Any) -> Exception:
    """A missing GRANT as a typed error naming the role (a read-only role ran a write,
    an application role ran DDL); the psycopg error stays as ``__cause__``."""
    from langgraph_durable.errors import InsufficientPrivilegeError

    try:
        role = conn.info.user if conn is not None else None
    except Exception:
        role = None
    return InsufficientPrivilegeError(role, str(exc).strip().splitlines()[0] if str(exc) else type(exc).__name__)


def _is_connection_failure(exc: BaseException, conn: Any) -> bool:
    if isinstance(exc, psycopg.errors.AdminShutdown | psycopg.errors.CannotConnectNow):
        return True
    if isinstance(exc, psycopg.OperationalError | psycopg.InterfaceError):
        return conn is None or conn.closed or conn.broken
    return False


@dataclass
class _Pending:
    after: list[Callable[[], None]] = field(default_factory=list)


def _in_pipeline(conn: Any) -> bool:
    """Whether ``conn`` is in pipeline mode (the user handed the saver a ``pipe``).
    Every batch then runs in a nested ``conn.pipeline()`` block, whose exit syncs: a
    lone statement sent without one would wait, unsent or unchecked, for a later sync."""
    return bool(conn.pgconn.pipeline_status != psycopg.pq.PipelineStatus.OFF)


def _implicit(conn: Any, item: Any) -> bool:
    """Whether an op whose first item is ``item`` can run as one pipeline with no
    BEGIN/COMMIT: its only batch (``final``), on an idle autocommit connection. The
    statements up to the pipeline's sync are then one implicit transaction, all or
    nothing, like the stock saver's puts. Saves two statements and their round trips,
    ~0.08 ms of a ~0.3 ms put (bench/bench_storage.py, small-state graph). Checks that
    must abort the write (the lease fence) therefore fail server-side (durable_fence)."""
    return (
        isinstance(item, Batch)
        and item.final
        and _HAS_PIPELINE
        and conn.autocommit
        and conn.info.transaction_status == psycopg.pq.TransactionStatus.IDLE
    )


def _finish(op: Op[T], pending: _Pending, send: Any, throw: BaseException | None) -> T:
    """Drive an op past its final batch: only AfterCommit may follow."""
    while True:
        try:
            item = op.throw(throw) if throw is not None else op.send(send)
        except StopIteration as stop:
            return stop.value
        send, throw = None, None
        if not isinstance(item, AfterCommit):
            raise TypeError(f"op yielded {item!r} after its final batch")
        pending.after.append(item.fn)


class SyncDriver:
    """Runs ops and flows on a psycopg ``Connection`` or ``ConnectionPool``."""

    def __init__(self, conn: Connection[Any] | ConnectionPool[Any], schema: str | None) -> None:
        self.conn = conn
        self.schema = schema
        self.lock = threading.Lock()  # a single connection is used by one thread at a time
        self._schema_set: set[int] = set()

    @contextmanager
    def connection(self) -> Iterator[Connection[Any]]:
        if isinstance(self.conn, ConnectionPool):
            with self.conn.connection() as conn:
                self._ensure_schema(conn)
                yield conn
        else:
            with self.lock:
                self._ensure_schema(self.conn)
                yield self.conn

    def _ensure_schema(self, conn: Connection[Any]) -> None:
        # Connections from our own pool get search_path in the pool's configure hook;
        # a connection the user handed us gets it once, the first time we use it.
        if self.schema and id(conn) not in self._schema_set:
            was = conn.autocommit
            if not was and conn.info.transaction_status == psycopg.pq.TransactionStatus.IDLE:
                conn.autocommit = True
            conn.execute(set_search_path(self.schema))
            conn.autocommit = was
            self._schema_set.add(id(conn))

    def run_op(self, factory: Callable[[], Op[T]], *, transaction: bool = True) -> T:
        memo = _OP_MEMO.set({})
        try:
            return self._run_op(factory, transaction)
        finally:
            _OP_MEMO.reset(memo)

    def _run_op(self, factory: Callable[[], Op[T]], transaction: bool) -> T:
        for attempt in range(CONNECTION_RETRIES + 1):
            conn = None
            try:
                pending = _Pending()
                with self.connection() as conn:
                    if transaction:
                        result = self._transact(conn, factory(), pending)
                    else:
                        result = self._drive(conn, factory(), pending)
                    if _after_commit_hook is not None:
                        _after_commit_hook(conn, attempt)
                for fn in pending.after:
                    fn()
                return result
            except psycopg.errors.InsufficientPrivilege as exc:
                raise _privilege_error(exc, conn) from exc
            except Exception as exc:
                if attempt < CONNECTION_RETRIES and _is_connection_failure(exc, conn):
                    logger.warning("connection lost (%s); retrying on a fresh connection", exc)
                    if isinstance(self.conn, ConnectionPool):
                        # The pool's other idle connections most likely died with this
                        # one (server restart, idle-timeout kill): test and replace them
                        # all now, so the retry gets a live connection.
                        try:
                            self.conn.check()
                        except Exception:
                            logger.debug("pool check failed", exc_info=True)
                    time.sleep(min(0.2 * 2**attempt, 2.0))
                    continue
                raise
        raise AssertionError("unreachable")

    def _transact(self, conn: Connection[Any], op: Op[T], pending: _Pending) -> T:
        """Run ``op`` in one transaction (one pipeline when ``_implicit`` allows)."""
        try:
            item = op.send(None)
        except StopIteration as stop:
            return stop.value
        if _implicit(conn, item):
            try:
                rows = self._execute(conn, item)
            except Exception as exc:
                return _finish(op, pending, None, exc)
            return _finish(op, pending, rows, None)
        with conn.transaction():
            return self._drive(conn, op, pending, item)

    def _drive(self, conn: Connection[Any], op: Op[T], pending: _Pending, first: Any = None) -> T:
        send: Any = None
        throw: BaseException | None = None
        while True:
            if first is not None:
                item, first = first, None
            else:
                try:
                    item = op.throw(throw) if throw is not None else op.send(send)
                except StopIteration as stop:
                    return stop.value
            send, throw = None, None
            if isinstance(item, Batch):
                # A failed batch is thrown into the op (as run_flow does for flows), so an
                # op can clean up on its connection (setup releases its session lock);
                # an op that does not catch it re-raises it unchanged.
                try:
                    send = self._execute(conn, item)
                except Exception as exc:
                    throw = exc
            elif isinstance(item, AfterCommit):
                pending.after.append(item.fn)
                send = None
            else:
                raise TypeError(f"op yielded {item!r}")

    @staticmethod
    def _execute(conn: Connection[Any], batch: Batch) -> list[list[DictRow]]:
        stmts = batch.stmts
        if (len(stmts) == 1 and not _in_pipeline(conn)) or not _HAS_PIPELINE:
            out = []
            for s in stmts:
                with conn.cursor(binary=True, row_factory=dict_row) as cur:
                    if s.many:
                        cur.executemany(s.sql, s.params)
                    else:
                        cur.execute(s.sql, s.params, prepare=s.prepare)
                    out.append(cur.fetchall() if s.fetch else [])
            return out
        # Results are read after the block: leaving it syncs once and receives them
        # all. An explicit pipe.sync() inside it cost a second round trip (the exit
        # syncs again), ~0.05 ms per op: a third of a small put.
        curs = []
        failed: psycopg.Error | None = None
        try:
            with conn.pipeline():
                try:
                    for s in stmts:
                        cur = conn.cursor(binary=True, row_factory=dict_row)
                        curs.append(cur)
                        if s.many:
                            cur.executemany(s.sql, s.params)
                        else:
                            cur.execute(s.sql, s.params, prepare=s.prepare)
                except psycopg.Error as exc:
                    failed = exc
        except psycopg.errors.PipelineAborted:
            if failed is None:
                raise
        except BaseException:
            for cur in curs:
                cur.close()
            raise
        if failed is not None:
            # A statement failed while the block was still sending (psycopg reads
            # results as they arrive, e.g. in executemany). The block was left without
            # an exception, so psycopg does not log "error ignored terminating Pipeline"
            # about the PipelineAborted its closing sync reports: the statement's own
            # error is the only one the op (and the user) sees.
            for cur in curs:
                cur.close()
            raise failed
        out = [cur.fetchall() if s.fetch else [] for s, cur in zip(stmts, curs, strict=True)]
        for cur in curs:
            cur.close()
        return out

    def run_flow(self, flow: Flow[T]) -> T:
        send: Any = None
        throw: BaseException | None = None
        while True:
            try:
                item = flow.throw(throw) if throw is not None else flow.send(send)
            except StopIteration as stop:
                return stop.value
            send, throw = None, None
            try:
                if isinstance(item, Tx):
                    send = self.run_op(item.factory, transaction=item.transaction)
                elif isinstance(item, Hook):
                    send = item.fn(*item.args)
                    if asyncio.iscoroutine(send):
                        send = asyncio.run(send)
                elif isinstance(item, Sleep):
                    time.sleep(item.seconds)
                else:
                    raise TypeError(f"flow yielded {item!r}")
            except Exception as exc:
                throw = exc


class AsyncDriver:
    """Runs the same ops and flows on an ``AsyncConnection`` or ``AsyncConnectionPool``."""

    def __init__(
        self, conn: AsyncConnection[Any] | AsyncConnectionPool[Any], schema: str | None
    ) -> None:
        self.conn = conn
        self.schema = schema
        self.lock = asyncio.Lock()
        self._schema_set: set[int] = set()

    @asynccontextmanager
    async def connection(self) -> AsyncIterator[AsyncConnection[Any]]:
        if isinstance(self.conn, AsyncConnectionPool):
            async with self.conn.connection() as conn:
                await self._ensure_schema(conn)
                yield conn
        else:
            async with self.lock:
                await self._ensure_schema(self.conn)
                yield self.conn

    async def _ensure_schema(self, conn: AsyncConnection[Any]) -> None:
        if self.schema and id(conn) not in self._schema_set:
            was = conn.autocommit
            if not was and conn.info.transaction_status == psycopg.pq.TransactionStatus.IDLE:
                await conn.set_autocommit(True)
            await conn.execute(set_search_path(self.schema))
            await conn.set_autocommit(was)
            self._schema_set.add(id(conn))

    async def run_op(self, factory: Callable[[], Op[T]], *, transaction: bool = True) -> T:
        memo = _OP_MEMO.set({})
        try:
            return await self._run_op(factory, transaction)
        finally:
            _OP_MEMO.reset(memo)

    async def _run_op(self, factory: Callable[[], Op[T]], transaction: bool) -> T:
        for attempt in range(CONNECTION_RETRIES + 1):
            conn = None
            try:
                pending = _Pending()
                async with self.connection() as conn:
                    if transaction:
                        result = await self._transact(conn, factory(), pending)
                    else:
                        result = await self._drive(conn, factory(), pending)
                    if _after_commit_hook is not None:
                        _after_commit_hook(conn, attempt)
                for fn in pending.after:
                    fn()
                return result
            except psycopg.errors.InsufficientPrivilege as exc:
                raise _privilege_error(exc, conn) from exc
            except Exception as exc:
                if attempt < CONNECTION_RETRIES and _is_connection_failure(exc, conn):
                    logger.warning("connection lost (%s); retrying on a fresh connection", exc)
                    if isinstance(self.conn, AsyncConnectionPool):
                        try:
                            await self.conn.check()
                        except Exception:
                            logger.debug("pool check failed", exc_info=True)
                    await asyncio.sleep(min(0.2 * 2**attempt, 2.0))
                    continue
                raise
        raise AssertionError("unreachable")

    async def _transact(self, conn: AsyncConnection[Any], op: Op[T], pending: _Pending) -> T:
        try:
            item = op.send(None)
        except StopIteration as stop:
            return stop.value
        if _implicit(conn, item):
            try:
                rows = await self._execute(conn, item)
            except Exception as exc:
                return _finish(op, pending, None, exc)
            return _finish(op, pending, rows, None)
        async with conn.transaction():
            return await self._drive(conn, op, pending, item)

    async def _drive(
        self, conn: AsyncConnection[Any], op: Op[T], pending: _Pending, first: Any = None
    ) -> T:
        send: Any = None
        throw: BaseException | None = None
        while True:
            if first is not None:
                item, first = first, None
            else:
                try:
                    item = op.throw(throw) if throw is not None else op.send(send)
                except StopIteration as stop:
                    return stop.value
            send, throw = None, None
            if isinstance(item, Batch):
                try:
                    send = await self._execute(conn, item)
                except Exception as exc:
                    throw = exc
            elif isinstance(item, AfterCommit):
                pending.after.append(item.fn)
                send = None
            else:
                raise TypeError(f"op yielded {item!r}")

    @staticmethod
    async def _execute(conn: AsyncConnection[Any], batch: Batch) -> list[list[DictRow]]:
        stmts = batch.stmts
        if (len(stmts) == 1 and not _in_pipeline(conn)) or not _HAS_PIPELINE:
            out = []
            for s in stmts:
                async with conn.cursor(binary=True, row_factory=dict_row) as cur:
                    if s.many:
                        await cur.executemany(s.sql, s.params)
                    else:
                        await cur.execute(s.sql, s.params, prepare=s.prepare)
                    out.append(await cur.fetchall() if s.fetch else [])
            return out
        # Results are read after the block: one sync (see SyncDriver._execute).
        curs = []
        failed: psycopg.Error | None = None
        try:
            async with conn.pipeline():
                try:
                    for s in stmts:
                        cur = conn.cursor(binary=True, row_factory=dict_row)
                        curs.append(cur)
                        if s.many:
                            await cur.executemany(s.sql, s.params)
                        else:
                            await cur.execute(s.sql, s.params, prepare=s.prepare)
                except psycopg.Error as exc:
                    failed = exc
        except psycopg.errors.PipelineAborted:
            if failed is None:
                raise
        except BaseException:
            for cur in curs:
                await cur.close()
            raise
        if failed is not None:  # see SyncDriver._execute
            for cur in curs:
                await cur.close()
            raise failed
        out = [
            (await cur.fetchall()) if s.fetch else []
            for s, cur in zip(stmts, curs, strict=True)
        ]
        for cur in curs:
            await cur.close()
        return out

    async def run_flow(self, flow: Flow[T]) -> T:
        send: Any = None
        throw: BaseException | None = None
        while True:
            try:
                item = flow.throw(throw) if throw is not None else flow.send(send)
            except StopIteration as stop:
                return stop.value
            send, throw = None, None
            try:
                if isinstance(item, Tx):
                    send = await self.run_op(item.factory, transaction=item.transaction)
                elif isinstance(item, Hook):
                    send = item.fn(*item.args)
                    if asyncio.iscoroutine(send):
                        send = await send
                elif isinstance(item, Sleep):
                    await asyncio.sleep(item.seconds)
                else:
                    raise TypeError(f"flow yielded {item!r}")
            except Exception as exc:
                throw = exc
