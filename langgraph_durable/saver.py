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
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import asynccontextmanager, contextmanager
from typing import Any

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
from langgraph_durable.config import SaverOptions
from langgraph_durable.core.base import _DurableBase as _DurableBase
from langgraph_durable.core.connections import (
    _check_conn,
    _check_pipe,
    _conninfo_of,
    aopen_pool,
    apreflight,
    open_pool,
    preflight,
)
from langgraph_durable.core.jsonb import _jsonb as _jsonb
from langgraph_durable.embedded import resolve_dsn
from langgraph_durable.errors import ConfigurationError
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
    ) -> None:
        super().__init__(serde=serde, options=SaverOptions.from_keywords(
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
        ))
        _check_conn("DurablePostgresSaver", conn, asynchronous=False)
        _check_pipe("DurablePostgresSaver", conn, pipe, ConnectionPool)
        check_pooled_conn("DurablePostgresSaver", conn, self.pooler, (ConnectionPool,))
        self.conn = conn
        self.pipe = pipe
        self.supports_pipeline = Capabilities().has_pipeline()
        self._driver = SyncDriver(conn, session_schema(self) if not getattr(conn, "_durable_own", False) else None)
        self._conninfo = _conninfo_of(conn)

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
        (a dropped connection is replaced), so ``True`` and ``False`` give the same saver."""
        if not isinstance(pipeline, bool):
            raise ConfigurationError(f"pipeline must be a bool, not {pipeline!r}", pipeline=pipeline)
        dsn = resolve_dsn(conn_string)
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
            )
            try:
                yield saver
            finally:
                saver._stop_renewer()

    def setup(self) -> None:
        """Create or migrate the tables. Idempotent and safe to call concurrently.
        With ``run_migrations=False``: only verify them (``SchemaNotReadyError``)."""
        if not self.run_migrations or self.pooler:
            self._run_flow(self._flow_setup_or_check())
            return
        if self.pipe is not None:
            # CREATE INDEX CONCURRENTLY cannot run in pipeline mode (the stock saver's
            # setup fails there): migrate on a short-lived connection of our own.
            with self._renew_connect() as conn:
                SyncDriver(conn, self.schema).run_op(self._op_setup, transaction=False)
            return
        self._run_op(self._op_setup, transaction=False)

    async def asetup(self) -> None:
        """``setup()`` from async code (runs in a worker thread)."""
        await asyncio.to_thread(self.setup)

    def _run_op(self, factory: Callable[[], Op[Any]], *, transaction: bool = True) -> Any:
        return self._driver.run_op(factory, transaction=transaction)

    async def _arun_op(self, factory: Callable[[], Op[Any]], *, transaction: bool = True) -> Any:
        return await asyncio.to_thread(self._driver.run_op, factory, transaction=transaction)

    def _run_flow(self, flow: Flow[Any]) -> Any:
        return self._driver.run_flow(flow)

    async def _arun_flow(self, flow: Flow[Any]) -> Any:
        return await asyncio.to_thread(self._driver.run_flow, flow)

    @contextmanager
    def connection(self) -> Iterator[Connection[Any]]:
        """A connection (search_path set) for package-internal and user SQL."""
        with self._driver.connection() as conn:
            yield conn

    def close(self) -> None:
        self._stop_renewer()


class AsyncDurablePostgresSaver(_DurableBase):
    """Asynchronous durable saver. Its sync methods may be called from other threads
    (as LangGraph does for sync graphs), like the stock ``AsyncPostgresSaver``.

    ``AsyncDurablePostgresSaver(conn, pipe=None, serde=None, *, ...)``: the stock
    ``AsyncPostgresSaver`` arguments in the stock order. ``conn``: a psycopg 3
    ``AsyncConnection`` or ``AsyncConnectionPool`` (``autocommit=True``); an
    ``asyncpg`` pool is refused with ``UnsupportedConnectionError``. ``pipe``: an
    ``AsyncPipeline`` of ``conn`` (see ``_check_pipe``)."""

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
    ) -> None:
        super().__init__(serde=serde, options=SaverOptions.from_keywords(
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
        ))
        _check_conn("AsyncDurablePostgresSaver", conn, asynchronous=True)
        _check_pipe("AsyncDurablePostgresSaver", conn, pipe, AsyncConnectionPool)
        check_pooled_conn("AsyncDurablePostgresSaver", conn, self.pooler, (AsyncConnectionPool,))
        self.conn = conn
        self.pipe = pipe
        self.supports_pipeline = Capabilities().has_pipeline()
        self._driver = AsyncDriver(conn, session_schema(self) if not getattr(conn, "_durable_own", False) else None)
        self._conninfo = _conninfo_of(conn)
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
    ) -> AsyncIterator[AsyncDurablePostgresSaver]:
        """Open an async pool and yield a saver (DSN resolved as the sync saver's).
        ``pipeline``: see ``DurablePostgresSaver.from_conn_string``."""
        if not isinstance(pipeline, bool):
            raise ConfigurationError(f"pipeline must be a bool, not {pipeline!r}", pipeline=pipeline)
        # In a thread: "embedded" may start a server.
        dsn = await asyncio.to_thread(resolve_dsn, conn_string)
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
            )
            try:
                yield saver
            finally:
                saver._stop_renewer()

    async def setup(self) -> None:
        """Create or migrate the tables: ``await saver.setup()``, as with the stock
        ``AsyncPostgresSaver``. Idempotent and safe to call concurrently. From another
        thread: ``asyncio.run_coroutine_threadsafe(saver.setup(), saver.loop).result()``.
        With ``run_migrations=False``: only verify them (``SchemaNotReadyError``)."""
        if not self.run_migrations or self.pooler:
            await self._arun_flow(self._flow_setup_or_check())
            return
        if self.pipe is not None:
            # Not in pipeline mode: see DurablePostgresSaver.setup.
            async with await AsyncConnection.connect(self._conninfo, autocommit=True) as conn:
                await AsyncDriver(conn, self.schema).run_op(self._op_setup, transaction=False)
            return
        await self._arun_op(self._op_setup, transaction=False)

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
            self._driver.run_op(factory, transaction=transaction), self.loop
        ).result()

    async def _arun_op(self, factory: Callable[[], Op[Any]], *, transaction: bool = True) -> Any:
        return await self._driver.run_op(factory, transaction=transaction)

    def _run_flow(self, flow: Flow[Any]) -> Any:
        self._check_thread()
        return asyncio.run_coroutine_threadsafe(self._driver.run_flow(flow), self.loop).result()

    async def _arun_flow(self, flow: Flow[Any]) -> Any:
        return await self._driver.run_flow(flow)

    @asynccontextmanager
    async def connection(self) -> AsyncIterator[AsyncConnection[Any]]:
        async with self._driver.connection() as conn:
            yield conn

    async def aclose(self) -> None:
        self._stop_renewer()


__all__ = [
    "AsyncDurablePostgresSaver",
    "DurablePostgresSaver",
    "Lease",
    "PoisonRecord",
]

