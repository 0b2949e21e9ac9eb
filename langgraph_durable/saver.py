"""The durable savers: ``DurablePostgresSaver`` (sync) and ``AsyncDurablePostgresSaver``.

Why inheritance from the stock ``BasePostgresSaver`` rather than wrapping a stock
``PostgresSaver``: the features need to run *inside* the stock saver's transactions
(the lease's fencing check in the same transaction as the checkpoint write, artifacts
inserted atomically with the blobs that reference them, artifacts fetched in batch
between the row fetch and deserialization). A wrapper cannot reach in there, and the
stock saver never reconnects a dropped connection. So we reuse what the stock package
does well and is pure -- its SQL text, migrations, ``get_next_version``, delta-channel
walk helpers and prune statements -- and own the I/O: one sans-I/O implementation
(``_io``) with a sync and an async driver. Tables are the stock tables (plus ours), so
a database the stock saver created is adopted as is.

This module is the facade: the two public classes, with the stock constructors and the
package's options spelled out (``config.SaverOptions`` groups and validates them), and
the driver each brings. The stock API, written once for both, is ``core.base``'s
``_DurableBase``, composed of the components that do the work, each declaring what it
uses of the saver in its view (``core.view``): ``core.load``, ``core.write``,
``core.admin`` (delete/prune/copy), ``core.setup``, ``core.rewrite`` (version gate,
in-place rewrite), ``leases`` (model, owner ids, fence, acquire/release, the renewer),
``lifecycle`` (run start and run end) and ``quarantine``. Options: ``config``.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import asynccontextmanager, contextmanager
from typing import Any, ClassVar, cast

import psycopg
from langgraph.checkpoint.base import CheckpointTuple
from langgraph.checkpoint.serde.base import SerializerProtocol
from psycopg import AsyncConnection, AsyncPipeline, Capabilities, Connection, Pipeline
from psycopg_pool import AsyncConnectionPool, ConnectionPool

from langgraph_durable._io import (
    AsyncDriver,
    Flow,
    Op,
    SyncDriver,
)
from langgraph_durable.config import DEFAULT_MAX_LAG, SaverOptions
from langgraph_durable.core.base import _DurableBase as _DurableBase
from langgraph_durable.core.connections import (
    READ_POOL_WAIT,
    _check_conn,
    _check_pipe,
    _conninfo_of,
    aopen_pool,
    aopen_read_pool,
    apreflight,
    apreflight_read,
    aprobe_primary,
    aprobe_standby,
    open_pool,
    open_read_pool,
    preflight,
    preflight_read,
    probe_primary,
    probe_standby,
)
from langgraph_durable.core.jsonb import _jsonb as _jsonb
from langgraph_durable.core.reader import (
    RECHECK_AFTER,
    ReadLag,
    ReadOnlyAsyncDriver,
    ReadOnlySyncDriver,
    ReadOnlyView,
    ReadSlot,
    after_write_lag,
    fallback_lag,
    lag_of,
    make_reader,
    needs_second_look,
    note_not_standby,
    op_check_read_schema,
    op_primary_lsn,
    op_standby_lag,
    primary_lag,
    resolve_read_dsn,
    unanswered_lag,
)
from langgraph_durable.embedded import resolve_dsn
from langgraph_durable.errors import ConfigurationError, DurableError, ReadDsnUnreachableError
from langgraph_durable.granularity import CheckpointPolicy
from langgraph_durable.leases.model import _RUN_LEASE as _RUN_LEASE
from langgraph_durable.leases.model import Lease as Lease
from langgraph_durable.leases.model import claim_handoff as claim_handoff
from langgraph_durable.leases.owners import _owner_id as _owner_id
from langgraph_durable.leases.owners import owner_is_dead as owner_is_dead
from langgraph_durable.leases.owners import process_identity as process_identity
from langgraph_durable.lifecycle import OnBusy as OnBusy
from langgraph_durable.lifecycle import OnUnrecognisedRun as OnUnrecognisedRun
from langgraph_durable.pooler import (
    check_pooled_conn,
    op_check_read_search_path,
    resolve_pooler,
    session_schema,
)
from langgraph_durable.quarantine import PoisonHook as PoisonHook
from langgraph_durable.quarantine import PoisonRecord as PoisonRecord
from langgraph_durable.sql.schema import validate_schema
from langgraph_durable.versioning import (
    MigrationRegistry,
    UnversionedPolicy,
    VersionPolicy,
)

logger = logging.getLogger("langgraph_durable")


class DurablePostgresSaver(_DurableBase):
    """Synchronous durable saver. Thread-safe (LangGraph calls ``put`` from executor
    threads). Its async methods run the same code in a worker thread.

    ``DurablePostgresSaver(conn, pipe=None, serde=None, *, ...)`` takes the stock
    ``PostgresSaver`` arguments in the stock order, then the package's own options,
    keyword-only (grouped and validated by ``config.SaverOptions``). ``conn``: a psycopg 3 ``Connection`` or
    ``ConnectionPool`` (``autocommit=True``; the saver sets its own row factory per
    cursor). ``pipe``: a ``psycopg.Pipeline`` of ``conn``, as the stock saver takes it;
    see ``_check_pipe`` for what it changes."""

    # read_dsn (core/reader.py): the settings and, once opened, the standby's pool.
    _reads: ReadSlot
    _reader_class: ClassVar[type[Any]]

    def _load_checkpoint_tuple(self, value: Any) -> CheckpointTuple:
        """The stock ``PostgresSaver``'s row-to-tuple hook, same name and signature;
        what this saver adds (the artifacts a row needs, pre-v4 pending sends) rides in
        the row (``_op_load_rows``)."""
        return super()._row_tuple(value)

    def _row_tuple(self, row: Any) -> CheckpointTuple:
        return self._load_checkpoint_tuple(row)

    def __init__(
        self,
        conn: Connection[Any] | ConnectionPool[Any],
        pipe: Pipeline | None = None,
        serde: SerializerProtocol | None = None,
        *,
        schema: str | None = None,
        graph_version: str | None = None,
        version_policy: VersionPolicy = "refuse",
        unversioned_policy: UnversionedPolicy = "adopt",
        migrations: MigrationRegistry | None = None,
        max_resume_attempts: int = 3,
        on_poison: PoisonHook | None = None,
        lease_ttl: float = 30.0,
        on_busy: OnBusy = "raise",
        busy_timeout: float = 60.0,
        artifact_threshold: int | None = 1024,
        compression_level: int = 3,
        artifact_cache_bytes: int = 64 * 1024 * 1024,
        leases: bool = True,
        takeover_dead_owners: bool = True,
        on_unrecognised_run: OnUnrecognisedRun = "raise",
        pooler: str | None = None,
        run_migrations: bool = True,
        checkpoint_policy: CheckpointPolicy | None = None,
        compact_versions: bool = True,
        read_dsn: str | None = None,
        read_max_lag: float = DEFAULT_MAX_LAG,
        read_fallback: bool = False,
    ) -> None:
        options = SaverOptions.from_keywords(
            schema=schema, graph_version=graph_version,
            version_policy=version_policy, unversioned_policy=unversioned_policy,
            migrations=migrations, max_resume_attempts=max_resume_attempts,
            on_poison=on_poison, lease_ttl=lease_ttl, on_busy=on_busy,
            busy_timeout=busy_timeout, artifact_threshold=artifact_threshold,
            compression_level=compression_level, artifact_cache_bytes=artifact_cache_bytes,
            leases=leases, takeover_dead_owners=takeover_dead_owners,
            on_unrecognised_run=on_unrecognised_run,
            pooler=pooler, run_migrations=run_migrations, checkpoint_policy=checkpoint_policy,
            compact_versions=compact_versions,
            read_dsn=read_dsn, read_max_lag=read_max_lag, read_fallback=read_fallback,
        )
        super().__init__(serde=serde, options=options)
        _check_conn("DurablePostgresSaver", conn, asynchronous=False)
        _check_pipe("DurablePostgresSaver", conn, pipe, ConnectionPool)
        check_pooled_conn("DurablePostgresSaver", conn, self.pooler, (ConnectionPool,))
        self.conn = conn
        self.pipe = pipe
        self.supports_pipeline = Capabilities().has_pipeline()
        self._driver = SyncDriver(conn, session_schema(self) if not getattr(conn, "_durable_own", False) else None)
        self._conninfo = _conninfo_of(conn)
        self._reads = ReadSlot(options.reads)

    @classmethod
    @contextmanager
    def from_conn_string(
        cls,
        conn_string: str | None = None,
        *,
        pipeline: bool = False,
        serde: SerializerProtocol | None = None,
        pool_size: int = 10,
        schema: str | None = None,
        graph_version: str | None = None,
        version_policy: VersionPolicy = "refuse",
        unversioned_policy: UnversionedPolicy = "adopt",
        migrations: MigrationRegistry | None = None,
        max_resume_attempts: int = 3,
        on_poison: PoisonHook | None = None,
        lease_ttl: float = 30.0,
        on_busy: OnBusy = "raise",
        busy_timeout: float = 60.0,
        artifact_threshold: int | None = 1024,
        compression_level: int = 3,
        artifact_cache_bytes: int = 64 * 1024 * 1024,
        leases: bool = True,
        takeover_dead_owners: bool = True,
        on_unrecognised_run: OnUnrecognisedRun = "raise",
        pooler: str | None = None,
        run_migrations: bool = True,
        checkpoint_policy: CheckpointPolicy | None = None,
        compact_versions: bool = True,
        read_dsn: str | None = None,
        read_max_lag: float = DEFAULT_MAX_LAG,
        read_fallback: bool = False,
    ) -> Iterator[DurablePostgresSaver]:
        """Open a connection pool on ``conn_string`` (else ``LANGGRAPH_DURABLE_DSN``;
        ``"embedded"``: the embedded PostgreSQL; neither: ``DsnMissingError``) and yield
        a saver. A DSN that cannot connect raises ``DatabaseUnreachableError`` within
        seconds; a transaction pooler is detected unless ``pooler`` is given
        (docs/configuration.md).

        ``pipeline``: the stock parameter, accepted so stock code runs unchanged. The
        durable saver always works in pipeline mode: each operation's statements go to
        the server in one pipeline round trip, synced before the call returns (a put
        returns once committed). The stock ``pipeline=True`` instead puts its single
        connection in pipeline mode until the next sync; here a pool is kept either way
        (a dropped connection is replaced), so ``True`` and ``False`` give the same saver.

        ``read_dsn`` (else ``LANGGRAPH_DURABLE_READ_DSN``): a streaming standby for
        operator reads through ``saver.reader()`` (the console, the CLI's read commands,
        inspection, listings). Given here, it is checked at once
        (``ReadDsnUnreachableError`` in seconds); from the variable, at the first
        ``reader()``, so a process that only runs graphs never connects to it (``""``:
        ignore the variable). The run path never reads from it. ``read_max_lag``:
        seconds of replay lag above which ``reader().read_lag.over`` (the CLI and the
        console warn); ``read_fallback``: then read the primary instead
        (docs/configuration.md)."""
        if not isinstance(pipeline, bool):
            raise ConfigurationError(f"pipeline must be a bool, not {pipeline!r}", pipeline=pipeline)
        dsn = resolve_dsn(conn_string)
        read = resolve_read_dsn(read_dsn)
        schema = validate_schema(schema)
        pooled = resolve_pooler(pooler)
        # Fail in seconds on a wrong DSN; find a transaction pooler nobody mentioned.
        if preflight(dsn, pooler):
            pooler = pooled = "transaction"
        with open_pool(dsn, pool_size, pooled, schema) as pool:
            saver = cls(
                pool, serde=serde, schema=schema, graph_version=graph_version,
                version_policy=version_policy, unversioned_policy=unversioned_policy,
                migrations=migrations, max_resume_attempts=max_resume_attempts,
                on_poison=on_poison, lease_ttl=lease_ttl, on_busy=on_busy,
                busy_timeout=busy_timeout, artifact_threshold=artifact_threshold,
                compression_level=compression_level, artifact_cache_bytes=artifact_cache_bytes,
                leases=leases, takeover_dead_owners=takeover_dead_owners,
                on_unrecognised_run=on_unrecognised_run,
                pooler=pooler, run_migrations=run_migrations, checkpoint_policy=checkpoint_policy,
                compact_versions=compact_versions,
                read_dsn=read, read_max_lag=read_max_lag, read_fallback=read_fallback,
            )
            try:
                if read is not None and read_dsn:  # given: fail in seconds if wrong
                    saver._open_reads()
                yield saver
            finally:
                saver._stop_renewer()
                saver._close_reads()

    def setup(self) -> None:
        """Create or migrate the tables. Idempotent and safe to call concurrently.
        With ``run_migrations=False``: only verify them (``SchemaNotReadyError``)."""
        if not self.run_migrations or self.pooler:
            self._driver.run_flow(self._flow_setup_or_check())
        elif self.pipe is not None:
            # CREATE INDEX CONCURRENTLY cannot run in pipeline mode (the stock saver's
            # setup fails there): migrate on a short-lived connection of our own.
            with self._renew_connect() as conn:
                SyncDriver(conn, self.schema).run_op(self._op_setup, transaction=False)
        else:
            self._driver.run_op(self._op_setup, transaction=False)
        self._ensure_digest_secret()  # read (or created) once, here (digest27)

    def _ensure_digest_secret(self) -> bool:
        if self._digest_pending():
            self._driver.run_flow(self._flow_digest_secret())
        return True

    async def asetup(self) -> None:
        """``setup()`` from async code (runs in a worker thread)."""
        await asyncio.to_thread(self.setup)

    def _run_op(self, factory: Callable[[], Op[Any]], *, transaction: bool = True) -> Any:
        if not self.codec.digest.loaded:
            self._ensure_digest_secret()
        return self._driver.run_op(factory, transaction=transaction)

    async def _arun_op(self, factory: Callable[[], Op[Any]], *, transaction: bool = True) -> Any:
        return await asyncio.to_thread(self._run_op, factory, transaction=transaction)

    def _run_flow(self, flow: Flow[Any]) -> Any:
        if not self.codec.digest.loaded:
            self._ensure_digest_secret()
        return self._driver.run_flow(flow)

    async def _arun_flow(self, flow: Flow[Any]) -> Any:
        return await asyncio.to_thread(self._run_flow, flow)

    @contextmanager
    def connection(self) -> Iterator[Connection[Any]]:
        """A connection (search_path set) for package-internal and user SQL."""
        with self._driver.connection() as conn:
            yield conn

    def close(self) -> None:
        self._stop_renewer()
        self._close_reads()

    # ------------------------------------------------------------------ reads off the primary
    def reader(self) -> DurablePostgresReader:
        """A read-only view for operator listings (core/reader.py): with ``read_dsn``,
        its reads go to that standby, after measuring how far behind it is
        (``reader.read_lag``; over ``read_max_lag`` with ``read_fallback``: the primary).
        Without ``read_dsn``, the primary. The saver itself never reads the standby."""
        settings = self._reads.settings
        if settings.dsn is None:
            return cast(DurablePostgresReader, make_reader(self, self._driver, primary_lag(settings), conninfo=None, pooler=None))
        try:
            slot = self._open_reads()
            lag = self._measure_reads()
        except ReadDsnUnreachableError as exc:
            if not settings.fallback:
                raise
            return cast(DurablePostgresReader, make_reader(self, self._driver, unanswered_lag(settings, exc), conninfo=None, pooler=None))
        if lag.over and settings.fallback:
            return cast(DurablePostgresReader, make_reader(self, self._driver, fallback_lag(lag), conninfo=None, pooler=None))
        return cast(DurablePostgresReader, make_reader(self, slot.driver, lag, conninfo=slot.conninfo, pooler=slot.pooler))

    def reader_after_write(self) -> DurablePostgresReader:
        """``reader()`` for a process that has just written (the console after an
        action): the standby only once it has replayed everything the primary had
        when this was called (``read_lag.seconds == 0.0``), else the primary, saying so
        (``read_lag.after_write``). Read your own writes, whatever the lag."""
        reader = self.reader()
        lag = reader.read_lag
        if lag.source != "standby" or (lag.in_recovery and lag.seconds == 0.0 and lag.mismatch is None):
            return reader
        if lag.in_recovery is False and lag.mismatch is None:
            return reader  # read_dsn is the primary itself
        return cast(DurablePostgresReader, make_reader(self, self._driver, after_write_lag(lag), conninfo=None, pooler=None))

    async def areader(self) -> DurablePostgresReader:
        """``reader()`` from async code (in a worker thread)."""
        return await asyncio.to_thread(self.reader)

    def _measure_reads(self) -> ReadLag:
        settings = self._reads.settings
        for look in range(2):
            primary = self._primary_lsn()
            row = probe_standby(self._reads.pool, primary)
            lag = lag_of(row, settings, primary_reachable=primary is not None, primary=primary)
            if look or not needs_second_look(lag):
                break
            time.sleep(RECHECK_AFTER)
        note_not_standby(settings, lag)
        return lag

    def _primary_lsn(self) -> dict[str, Any] | None:
        """The primary's WAL position, clock and identity (``op_primary_lsn``), None
        when it does not answer: a pool within
        seconds; the user's single connection through the driver (its lock)."""
        if isinstance(self.conn, ConnectionPool):
            return probe_primary(self.conn)
        try:
            return self._driver.run_op(op_primary_lsn, transaction=False)
        except (psycopg.Error, DurableError):
            return None

    def _open_reads(self) -> ReadSlot:
        """The read_dsn pool, opened on first use (``from_conn_string``: at once):
        ``ReadDsnUnreachableError`` in seconds when its server does not answer."""
        slot = self._reads
        with slot.lock:
            if slot.driver is None:
                dsn = cast(str, slot.settings.dsn)
                pooled = preflight_read(dsn)
                pool = open_read_pool(dsn, pooled, self.schema)
                try:
                    pool.wait(READ_POOL_WAIT)  # its connection made now, not during a run
                    driver = (ReadOnlySyncDriver if pooled else SyncDriver)(pool, None)
                    if pooled and self.schema:  # no session SET behind a pooler
                        driver.run_op(lambda: op_check_read_search_path(self), transaction=False)
                    note_not_standby(slot.settings, lag_of(
                        driver.run_op(lambda: op_standby_lag(None), transaction=False),
                        slot.settings, primary_reachable=False,
                    ))
                    driver.run_op(lambda: op_check_read_schema(self.schema, pooled, dsn))
                except BaseException:
                    pool.close()
                    raise
                slot.opened(pool, driver, _conninfo_of(pool), pooled)
        return slot

    def _close_reads(self) -> None:
        slot = self._reads
        with slot.lock:
            pool, slot.pool, slot.driver = slot.pool, None, None
        if pool is not None:
            pool.close()


class AsyncDurablePostgresSaver(_DurableBase):
    """Asynchronous durable saver. Its sync methods may be called from other threads
    (as LangGraph does for sync graphs), like the stock ``AsyncPostgresSaver``.

    ``AsyncDurablePostgresSaver(conn, pipe=None, serde=None, *, ...)``: the stock
    ``AsyncPostgresSaver`` arguments in the stock order. ``conn``: a psycopg 3
    ``AsyncConnection`` or ``AsyncConnectionPool`` (``autocommit=True``); an
    ``asyncpg`` pool is refused with ``UnsupportedConnectionError``. ``pipe``: an
    ``AsyncPipeline`` of ``conn`` (see ``_check_pipe``)."""

    _reads: ReadSlot
    _reader_class: ClassVar[type[Any]]

    async def _load_checkpoint_tuple(self, value: Any) -> CheckpointTuple:
        """The stock ``AsyncPostgresSaver``'s row-to-tuple hook (a coroutine there too),
        kept for code written against it; this saver's reads do not go through it."""
        return self._row_tuple(value)

    def __init__(
        self,
        conn: AsyncConnection[Any] | AsyncConnectionPool[Any],
        pipe: AsyncPipeline | None = None,
        serde: SerializerProtocol | None = None,
        *,
        schema: str | None = None,
        graph_version: str | None = None,
        version_policy: VersionPolicy = "refuse",
        unversioned_policy: UnversionedPolicy = "adopt",
        migrations: MigrationRegistry | None = None,
        max_resume_attempts: int = 3,
        on_poison: PoisonHook | None = None,
        lease_ttl: float = 30.0,
        on_busy: OnBusy = "raise",
        busy_timeout: float = 60.0,
        artifact_threshold: int | None = 1024,
        compression_level: int = 3,
        artifact_cache_bytes: int = 64 * 1024 * 1024,
        leases: bool = True,
        takeover_dead_owners: bool = True,
        on_unrecognised_run: OnUnrecognisedRun = "raise",
        pooler: str | None = None,
        run_migrations: bool = True,
        checkpoint_policy: CheckpointPolicy | None = None,
        compact_versions: bool = True,
        read_dsn: str | None = None,
        read_max_lag: float = DEFAULT_MAX_LAG,
        read_fallback: bool = False,
    ) -> None:
        options = SaverOptions.from_keywords(
            schema=schema, graph_version=graph_version,
            version_policy=version_policy, unversioned_policy=unversioned_policy,
            migrations=migrations, max_resume_attempts=max_resume_attempts,
            on_poison=on_poison, lease_ttl=lease_ttl, on_busy=on_busy,
            busy_timeout=busy_timeout, artifact_threshold=artifact_threshold,
            compression_level=compression_level, artifact_cache_bytes=artifact_cache_bytes,
            leases=leases, takeover_dead_owners=takeover_dead_owners,
            on_unrecognised_run=on_unrecognised_run,
            pooler=pooler, run_migrations=run_migrations, checkpoint_policy=checkpoint_policy,
            compact_versions=compact_versions,
            read_dsn=read_dsn, read_max_lag=read_max_lag, read_fallback=read_fallback,
        )
        super().__init__(serde=serde, options=options)
        _check_conn("AsyncDurablePostgresSaver", conn, asynchronous=True)
        _check_pipe("AsyncDurablePostgresSaver", conn, pipe, AsyncConnectionPool)
        check_pooled_conn("AsyncDurablePostgresSaver", conn, self.pooler, (AsyncConnectionPool,))
        self.conn = conn
        self.pipe = pipe
        self.supports_pipeline = Capabilities().has_pipeline()
        self._driver = AsyncDriver(conn, session_schema(self) if not getattr(conn, "_durable_own", False) else None)
        self._conninfo = _conninfo_of(conn)
        self._reads = ReadSlot(options.reads)
        self.loop = asyncio.get_running_loop()

    @classmethod
    @asynccontextmanager
    async def from_conn_string(
        cls,
        conn_string: str | None = None,
        *,
        pipeline: bool = False,
        serde: SerializerProtocol | None = None,
        pool_size: int = 10,
        schema: str | None = None,
        graph_version: str | None = None,
        version_policy: VersionPolicy = "refuse",
        unversioned_policy: UnversionedPolicy = "adopt",
        migrations: MigrationRegistry | None = None,
        max_resume_attempts: int = 3,
        on_poison: PoisonHook | None = None,
        lease_ttl: float = 30.0,
        on_busy: OnBusy = "raise",
        busy_timeout: float = 60.0,
        artifact_threshold: int | None = 1024,
        compression_level: int = 3,
        artifact_cache_bytes: int = 64 * 1024 * 1024,
        leases: bool = True,
        takeover_dead_owners: bool = True,
        on_unrecognised_run: OnUnrecognisedRun = "raise",
        pooler: str | None = None,
        run_migrations: bool = True,
        checkpoint_policy: CheckpointPolicy | None = None,
        compact_versions: bool = True,
        read_dsn: str | None = None,
        read_max_lag: float = DEFAULT_MAX_LAG,
        read_fallback: bool = False,
    ) -> AsyncIterator[AsyncDurablePostgresSaver]:
        """Open an async pool and yield a saver (DSN resolved as the sync saver's).
        ``pipeline``: see ``DurablePostgresSaver.from_conn_string``."""
        if not isinstance(pipeline, bool):
            raise ConfigurationError(f"pipeline must be a bool, not {pipeline!r}", pipeline=pipeline)
        # In a thread: "embedded" may start a server.
        dsn = await asyncio.to_thread(resolve_dsn, conn_string)
        read = resolve_read_dsn(read_dsn)
        schema = validate_schema(schema)
        pooled = resolve_pooler(pooler)
        if await apreflight(dsn, pooler):
            pooler = pooled = "transaction"
        async with aopen_pool(dsn, pool_size, pooled, schema) as pool:
            saver = cls(
                pool, serde=serde, schema=schema, graph_version=graph_version,
                version_policy=version_policy, unversioned_policy=unversioned_policy,
                migrations=migrations, max_resume_attempts=max_resume_attempts,
                on_poison=on_poison, lease_ttl=lease_ttl, on_busy=on_busy,
                busy_timeout=busy_timeout, artifact_threshold=artifact_threshold,
                compression_level=compression_level, artifact_cache_bytes=artifact_cache_bytes,
                leases=leases, takeover_dead_owners=takeover_dead_owners,
                on_unrecognised_run=on_unrecognised_run,
                pooler=pooler, run_migrations=run_migrations, checkpoint_policy=checkpoint_policy,
                compact_versions=compact_versions,
                read_dsn=read, read_max_lag=read_max_lag, read_fallback=read_fallback,
            )
            try:
                if read is not None and read_dsn:  # given: fail in seconds if wrong
                    await saver._aopen_reads()
                yield saver
            finally:
                saver._stop_renewer()
                await saver._aclose_reads()

    async def setup(self) -> None:
        """Create or migrate the tables: ``await saver.setup()``, as with the stock
        ``AsyncPostgresSaver``. Idempotent and safe to call concurrently. From another
        thread: ``asyncio.run_coroutine_threadsafe(saver.setup(), saver.loop).result()``.
        With ``run_migrations=False``: only verify them (``SchemaNotReadyError``)."""
        if not self.run_migrations or self.pooler:
            await self._driver.run_flow(self._flow_setup_or_check())
        elif self.pipe is not None:
            # Not in pipeline mode: see DurablePostgresSaver.setup.
            async with await AsyncConnection.connect(self._conninfo, autocommit=True) as conn:
                await AsyncDriver(conn, self.schema).run_op(self._op_setup, transaction=False)
        else:
            await self._driver.run_op(self._op_setup, transaction=False)
        await self._aensure_digest_secret()  # read (or created) once, here (digest27)

    async def _aensure_digest_secret(self) -> None:
        if self._digest_pending():
            await self._driver.run_flow(self._flow_digest_secret())

    def _ensure_digest_secret(self) -> bool:
        """From another thread: read it through the loop; on the loop's own thread it
        cannot wait (False: setup() or the run's first operation reads it)."""
        if not self._digest_pending():
            return True
        try:
            if asyncio.get_running_loop() is self.loop:
                return False
        except RuntimeError:
            pass
        asyncio.run_coroutine_threadsafe(self._aensure_digest_secret(), self.loop).result()
        return True

    async def asetup(self) -> None:
        """Alias of ``setup()`` (kept for code written against earlier releases)."""
        await self.setup()

    def _check_thread(self) -> None:
        try:
            if asyncio.get_running_loop() is self.loop:
                raise asyncio.InvalidStateError(
                    "Synchronous calls to AsyncDurablePostgresSaver are only allowed from a "
                    "different thread. From the event loop, use the async methods "
                    "(await saver.aget_tuple(...), await graph.ainvoke(...))."
                )
        except RuntimeError:
            pass

    def _run_op(self, factory: Callable[[], Op[Any]], *, transaction: bool = True) -> Any:
        self._check_thread()
        return asyncio.run_coroutine_threadsafe(
            self._arun_op(factory, transaction=transaction), self.loop
        ).result()

    async def _arun_op(self, factory: Callable[[], Op[Any]], *, transaction: bool = True) -> Any:
        if not self.codec.digest.loaded:
            await self._aensure_digest_secret()
        return await self._driver.run_op(factory, transaction=transaction)

    def _run_flow(self, flow: Flow[Any]) -> Any:
        self._check_thread()
        return asyncio.run_coroutine_threadsafe(self._arun_flow(flow), self.loop).result()

    async def _arun_flow(self, flow: Flow[Any]) -> Any:
        if not self.codec.digest.loaded:
            await self._aensure_digest_secret()
        return await self._driver.run_flow(flow)

    @asynccontextmanager
    async def connection(self) -> AsyncIterator[AsyncConnection[Any]]:
        async with self._driver.connection() as conn:
            yield conn

    async def aclose(self) -> None:
        self._stop_renewer()
        await self._aclose_reads()

    # ------------------------------------------------------------------ reads off the primary
    async def areader(self) -> AsyncDurablePostgresReader:
        """A read-only view for operator listings: see ``DurablePostgresSaver.reader``."""
        settings = self._reads.settings
        if settings.dsn is None:
            return cast(AsyncDurablePostgresReader, make_reader(self, self._driver, primary_lag(settings), conninfo=None, pooler=None))
        try:
            slot = await self._aopen_reads()
            lag = await self._ameasure_reads()
        except ReadDsnUnreachableError as exc:
            if not settings.fallback:
                raise
            return cast(AsyncDurablePostgresReader, make_reader(self, self._driver, unanswered_lag(settings, exc), conninfo=None, pooler=None))
        if lag.over and settings.fallback:
            return cast(AsyncDurablePostgresReader, make_reader(self, self._driver, fallback_lag(lag), conninfo=None, pooler=None))
        return cast(AsyncDurablePostgresReader, make_reader(self, slot.driver, lag, conninfo=slot.conninfo, pooler=slot.pooler))

    def reader(self) -> AsyncDurablePostgresReader:
        """``areader()`` from another thread than the saver's event loop."""
        self._check_thread()
        return asyncio.run_coroutine_threadsafe(self.areader(), self.loop).result()

    async def _ameasure_reads(self) -> ReadLag:
        settings = self._reads.settings
        for look in range(2):
            primary = await self._aprimary_lsn()
            row = await aprobe_standby(self._reads.pool, primary)
            lag = lag_of(row, settings, primary_reachable=primary is not None, primary=primary)
            if look or not needs_second_look(lag):
                break
            await asyncio.sleep(RECHECK_AFTER)
        note_not_standby(settings, lag)
        return lag

    async def _aprimary_lsn(self) -> dict[str, Any] | None:
        """``DurablePostgresSaver._primary_lsn`` for the async saver."""
        if isinstance(self.conn, AsyncConnectionPool):
            return await aprobe_primary(self.conn)
        try:
            return cast("dict[str, Any] | None", await self._driver.run_op(op_primary_lsn, transaction=False))
        except (psycopg.Error, DurableError):
            return None

    async def _aopen_reads(self) -> ReadSlot:
        """``DurablePostgresSaver._open_reads`` for the async saver."""
        slot = self._reads
        if slot.driver is None:
            async with self._reads_lock():
                if slot.driver is None:
                    dsn = cast(str, slot.settings.dsn)
                    pooled = await apreflight_read(dsn)
                    pool = aopen_read_pool(dsn, pooled, self.schema)
                    await pool.open()
                    try:
                        await pool.wait(READ_POOL_WAIT)
                        driver = (ReadOnlyAsyncDriver if pooled else AsyncDriver)(pool, None)
                        if pooled and self.schema:  # no session SET behind a pooler
                            await driver.run_op(lambda: op_check_read_search_path(self), transaction=False)
                        row = await driver.run_op(lambda: op_standby_lag(None), transaction=False)
                        note_not_standby(slot.settings, lag_of(row, slot.settings, primary_reachable=False))
                        await driver.run_op(lambda: op_check_read_schema(self.schema, pooled, dsn))
                    except BaseException:
                        await pool.close()
                        raise
                    slot.opened(pool, driver, _conninfo_of(pool), pooled)
        return slot

    @asynccontextmanager
    async def _reads_lock(self) -> AsyncIterator[None]:
        # The slot's threading lock, taken without blocking the event loop.
        await asyncio.to_thread(self._reads.lock.acquire)
        try:
            yield
        finally:
            self._reads.lock.release()

    async def _aclose_reads(self) -> None:
        slot = self._reads
        pool, slot.pool, slot.driver = slot.pool, None, None
        if pool is not None:
            await pool.close()


class DurablePostgresReader(ReadOnlyView, DurablePostgresSaver):
    """``DurablePostgresSaver.reader()``: reads (``get_tuple``, ``list``, the inspection
    and CLI queries) on the read_dsn standby or the primary, ``read_lag`` saying which
    and how far behind; writes and graph runs raise ``ReadOnlyViewError``."""


class AsyncDurablePostgresReader(ReadOnlyView, AsyncDurablePostgresSaver):
    """``AsyncDurablePostgresSaver.areader()``: see ``DurablePostgresReader``."""


DurablePostgresSaver._reader_class = DurablePostgresReader
AsyncDurablePostgresSaver._reader_class = AsyncDurablePostgresReader


__all__ = [
    "AsyncDurablePostgresReader",
    "AsyncDurablePostgresSaver",
    "DurablePostgresReader",
    "DurablePostgresSaver",
    "Lease",
    "PoisonRecord",
]

