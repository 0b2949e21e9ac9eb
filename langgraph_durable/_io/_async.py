"""The async driver: runs ops and flows (``protocol``) on psycopg's async API.

This file is the SOURCE of the sync driver: ``_sync.py`` is generated from it by
tools/async_to_sync.py (``async``/``await`` dropped, async names mapped to their sync
twins), and ``python dev.py lint`` fails when the generated file is stale. Edit this
file, then run ``python tools/async_to_sync.py``. The drivers are the only code that
differs between the two savers (psycopg's own design: I/O-free core, thin I/O layers),
so every rule (fencing, artifacts, poison counting, versioning) exists in one place.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Callable
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from typing import Any, TypeVar

import psycopg
from psycopg import AsyncConnection
from psycopg.rows import dict_row
from psycopg_pool import AsyncConnectionPool

from langgraph_durable._io import protocol
from langgraph_durable._io._base import (
    HAS_PIPELINE,
    PIPELINE_OFF,
    AsyncLock,
    asleep,
    implicit,
    is_connection_failure,
    pooler_clash,
    privilege_error,
    schema_missing,
    settle,
)
from langgraph_durable._io.protocol import (
    AfterCommit,
    Batch,
    Call,
    Flow,
    Hook,
    Op,
    Results,
    Sleep,
    Started,
    Tx,
    finish,
)
from langgraph_durable.sql.schema import set_search_path

logger = logging.getLogger("langgraph_durable")

T = TypeVar("T")

ConnectionSource = Callable[[], AbstractAsyncContextManager[AsyncConnection[Any]]]


@asynccontextmanager
async def aconnect(
    conninfo: str, *, prepare_threshold: int | None, schema: str | None
) -> AsyncIterator[AsyncConnection[Any]]:
    """A connection of its own, opened like the saver's (autocommit, dict rows, the
    saver's prepare_threshold and search_path), closed on exit."""
    conn = await AsyncConnection.connect(
        conninfo, autocommit=True, prepare_threshold=prepare_threshold, row_factory=dict_row
    )
    try:
        if schema:
            await conn.execute(set_search_path(schema))
        yield conn
    finally:
        await conn.close()


class AsyncDriver:
    """Runs ops and flows on an ``AsyncConnection`` or ``AsyncConnectionPool``.

    ``source``: where connections come from instead (a context manager factory: a
    connection of its own, opened like the saver's); ``conn`` is then only the pool to
    check after a connection failure, or None."""

    def __init__(
        self,
        conn: AsyncConnection[Any] | AsyncConnectionPool[Any] | None,
        schema: str | None,
        *,
        source: ConnectionSource | None = None,
    ) -> None:
        self.conn = conn
        self.schema = schema
        self.source = source
        self.lock = AsyncLock()  # a single connection is used by one caller at a time
        self._schema_set: set[int] = set()
        self._ops: Callable[..., Any] | None = None
        # What run_op checks a connection out of itself, rather than through
        # connection() (a generator context manager around it: ~0.6 us per op, issue
        # 14: 25 ops per invoke): the user's single connection, or a pool. Both None:
        # connection() (a source; a subclass's own, e.g. ScriptedDriver's).
        pool = conn if source is None and isinstance(conn, AsyncConnectionPool) else None
        self._pool: AsyncConnectionPool[Any] | None = pool
        self._single: AsyncConnection[Any] | None = (
            conn if source is None and conn is not None and pool is None else None  # type: ignore[assignment]
        )

    @classmethod
    def over(cls, run_op: Callable[..., Any]) -> AsyncDriver:
        """A driver that runs flows here and hands their ops to ``run_op`` (a saver's
        ``arun_op``, which may run them on another thread or event loop): user code
        (``Hook``) and ``Sleep`` stay with the caller, in its thread, loop and context."""
        driver = cls(None, None)
        driver._ops = run_op
        return driver

    @classmethod
    def for_saver(cls, saver: Any) -> AsyncDriver:
        """``over`` the saver's own op runner (``run_op`` / ``arun_op``)."""
        return cls.over(saver.arun_op)

    @asynccontextmanager
    async def connection(self) -> AsyncIterator[AsyncConnection[Any]]:
        if self.source is not None:
            async with self.source() as conn:
                yield conn
        elif isinstance(self.conn, AsyncConnectionPool):
            async with self.conn.connection() as conn:
                await self._ensure_schema(conn)
                yield conn
        else:
            single: Any = self.conn
            async with self.lock:
                await self._ensure_schema(single)
                yield single

    async def _ensure_schema(self, conn: AsyncConnection[Any]) -> None:
        # Connections from our own pool get search_path in the pool's configure hook;
        # a connection the user handed us gets it once, the first time we use it.
        if self.schema and id(conn) not in self._schema_set:
            was = conn.autocommit
            if not was and conn.info.transaction_status == psycopg.pq.TransactionStatus.IDLE:
                await conn.set_autocommit(True)
            await conn.execute(set_search_path(self.schema))
            await conn.set_autocommit(was)
            self._schema_set.add(id(conn))

    async def _sleep(self, seconds: float) -> None:
        await asleep(seconds)

    async def _check_pool(self) -> None:
        if isinstance(self.conn, AsyncConnectionPool):
            # The pool's other idle connections most likely died with this one (server
            # restart, idle-timeout kill): test and replace them all now, so the retry
            # gets a live connection.
            try:
                await self.conn.check()
            except Exception:
                logger.debug("pool check failed", exc_info=True)

    async def run_op(self, factory: Callable[[], Op[T]], *, transaction: bool = True) -> T:
        if self._ops is not None:
            ran: T = await self._ops(factory, transaction=transaction)
            return ran
        memo = protocol.OP_MEMO.set({})
        try:
            for attempt in range(protocol.CONNECTION_RETRIES + 1):
                # The op's pure work before its first statement runs before a connection
                # is checked out; an op with no statements needs none.
                started = Started(factory())
                if started.done:
                    done: T = started.value
                    return done
                single, pool = self._single, self._pool
                conn = None
                try:
                    after: list[Callable[[], None]] = []
                    if single is not None:
                        # The user's own connection: one caller at a time (what
                        # connection() does, written out).
                        async with self.lock:
                            if self.schema and id(single) not in self._schema_set:
                                await self._ensure_schema(single)
                            conn = single
                            result = await self._attempt(conn, started, transaction, after, attempt)
                    elif pool is not None:
                        async with pool.connection() as conn:
                            if self.schema and id(conn) not in self._schema_set:
                                await self._ensure_schema(conn)
                            result = await self._attempt(conn, started, transaction, after, attempt)
                    else:
                        async with self.connection() as conn:
                            result = await self._attempt(conn, started, transaction, after, attempt)
                    for fn in after:
                        fn()
                    return result
                except psycopg.errors.InsufficientPrivilege as exc:
                    raise privilege_error(exc, conn) from exc
                except Exception as exc:
                    typed = pooler_clash(exc) or schema_missing(exc, self.schema)
                    if typed is not None:
                        raise typed from exc
                    if attempt < protocol.CONNECTION_RETRIES and is_connection_failure(exc, conn):
                        logger.warning("connection lost (%s); retrying on a fresh connection", exc)
                        await self._check_pool()
                        await self._sleep(min(0.2 * 2**attempt, 2.0))
                        continue
                    raise
            raise AssertionError("unreachable")
        finally:
            protocol.OP_MEMO.reset(memo)

    async def _attempt(
        self,
        conn: AsyncConnection[Any],
        started: Started,
        transaction: bool,
        after: list[Callable[[], None]],
        attempt: int,
    ) -> Any:
        """One attempt of a started op on ``conn``, then the test-only after-commit hook."""
        if transaction:
            result = await self._transact(conn, started, after)
        else:
            result = await self._drive(conn, started.op, after, started.first)
        hook = protocol._after_commit_hook
        if hook is not None:
            hook(conn, attempt)
        return result

    async def _transact(
        self, conn: AsyncConnection[Any], started: Started, after: list[Callable[[], None]]
    ) -> Any:
        """Run the started op in one transaction (one pipeline when ``implicit`` allows)."""
        if implicit(conn, started.first):
            item: Batch = started.first
            while True:
                # Each final batch is an implicit transaction of its own (see finish).
                rows: Any = None
                failed: BaseException | None = None
                try:
                    rows = await self._execute(conn, item)
                except Exception as exc:
                    failed = exc
                done, got = finish(started.op, after, rows, failed)
                if done:
                    return got
                item = got
        async with conn.transaction():
            return await self._drive(conn, started.op, after, started.first)

    async def _drive(
        self, conn: AsyncConnection[Any], op: Op[Any], after: list[Callable[[], None]], item: Any
    ) -> Any:
        """The op interpreter: ``item`` is the op's first item (see ``Started``)."""
        while True:
            send: Any = None
            throw: BaseException | None = None
            if isinstance(item, Batch):
                # A failed batch is thrown into the op (as run_flow does for flows), so an
                # op can clean up on its connection (setup releases its session lock);
                # an op that does not catch it re-raises it unchanged.
                try:
                    send = await self._execute(conn, item)
                except Exception as exc:
                    throw = exc
            elif isinstance(item, AfterCommit):
                after.append(item.fn)
            elif isinstance(item, Call):
                # A savepoint: a failing call's writes roll back, the op's stay.
                try:
                    async with conn.transaction():
                        send = await settle(item.fn(conn))
                except Exception as exc:
                    throw = exc
            else:
                raise TypeError(f"op yielded {item!r}")
            try:
                item = op.throw(throw) if throw is not None else op.send(send)
            except StopIteration as stop:
                return stop.value

    @staticmethod
    async def _execute(conn: AsyncConnection[Any], batch: Batch) -> Results:
        stmts = batch.stmts
        # (in_pipeline, inline: once per op.)
        if (len(stmts) == 1 and conn.pgconn.pipeline_status == PIPELINE_OFF) or not HAS_PIPELINE:
            out, counts = [], []
            for s in stmts:
                async with conn.cursor(binary=True, row_factory=dict_row) as cur:
                    if s.many:
                        await cur.executemany(s.sql, s.params)
                    else:
                        await cur.execute(s.sql, s.params, prepare=s.prepare)
                    out.append(await cur.fetchall() if s.fetch else [])
                    counts.append(cur.rowcount)
            return Results(out, stmts, counts)
        # Results are read after the block: leaving it syncs once and receives them
        # all. An explicit pipe.sync() inside it cost a second round trip (the exit
        # syncs again), ~0.05 ms per op: a third of a small put.
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
        if failed is not None:
            # A statement failed while the block was still sending (psycopg reads
            # results as they arrive, e.g. in executemany). The block was left without
            # an exception, so psycopg does not log "error ignored terminating Pipeline"
            # about the PipelineAborted its closing sync reports: the statement's own
            # error is the only one the op (and the user) sees.
            for cur in curs:
                await cur.close()
            raise failed
        out = [(await cur.fetchall()) if s.fetch else [] for s, cur in zip(stmts, curs, strict=True)]
        counts = [cur.rowcount for cur in curs]
        for cur in curs:
            await cur.close()
        return Results(out, stmts, counts)

    async def run_flow(self, flow: Flow[T]) -> T:
        """The flow interpreter: an item's failure is thrown into the flow."""
        send: Any = None
        throw: BaseException | None = None
        while True:
            try:
                item = flow.throw(throw) if throw is not None else flow.send(send)
            except StopIteration as stop:
                value: T = stop.value
                return value
            send, throw = None, None
            try:
                if isinstance(item, Tx):
                    send = await self.run_op(item.factory, transaction=item.transaction)
                elif isinstance(item, Hook):
                    send = await settle(item.fn(*item.args))
                elif isinstance(item, Sleep):
                    await self._sleep(item.seconds)
                else:
                    raise TypeError(f"flow yielded {item!r}")
            except Exception as exc:
                throw = exc
            except BaseException as exc:
                if not (isinstance(item, Hook) and item.interrupts):
                    raise
                throw = exc
