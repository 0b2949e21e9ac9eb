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

This module is the facade: the two public classes and the stock API, written once for
both. ``_DurableBase`` is composed of the components that do the work, each declaring
what it uses of the saver in its view (``core.view``): ``core.load``, ``core.write``,
``core.admin`` (delete/prune/copy), ``core.setup``, ``core.rewrite`` (version gate,
in-place rewrite), ``leases`` (model, owner ids, fence, acquire/release, the renewer),
``lifecycle`` (run start and run end) and ``quarantine``. Options: ``config``.
"""

from __future__ import annotations

import asyncio
import builtins
import logging
import os
from collections.abc import AsyncIterator, Callable, Iterator, Mapping, Sequence
from contextlib import asynccontextmanager, contextmanager
from typing import Any, cast

from langchain_core.runnables import RunnableConfig
from langgraph.checkpoint.base import (
    ChannelVersions,
    Checkpoint,
    CheckpointMetadata,
    CheckpointTuple,
    DeltaChannelHistory,
)
from langgraph.checkpoint.postgres.base import BasePostgresSaver
from langgraph.checkpoint.serde.base import SerializerProtocol
from psycopg import AsyncConnection, AsyncPipeline, Capabilities, Connection, Pipeline
from psycopg_pool import AsyncConnectionPool, ConnectionPool

from langgraph_durable import telemetry as _telemetry
from langgraph_durable._io import (
    AsyncDriver,
    Flow,
    Op,
    SyncDriver,
)
from langgraph_durable.artifacts import (
    ArtifactCodec,
    KnownRefs,
)
from langgraph_durable.config import SaverOptions
from langgraph_durable.core.admin import AdminOps
from langgraph_durable.core.connections import (
    _check_conn,
    _check_pipe,
    _conninfo_of,
    aopen_pool,
    open_pool,
)
from langgraph_durable.core.jsonb import _jsonb as _jsonb
from langgraph_durable.core.load import LoadOps, _canceled_as_typed
from langgraph_durable.core.rewrite import VersionGate
from langgraph_durable.core.setup import SetupOps
from langgraph_durable.core.write import WriteOps
from langgraph_durable.embedded import resolve_dsn
from langgraph_durable.errors import ConfigurationError
from langgraph_durable.granularity import CheckpointPolicy, Deferrals
from langgraph_durable.leases.fence import FenceOps
from langgraph_durable.leases.model import _HANDOFF, _LeaseRegistry, _RenewerSlot
from langgraph_durable.leases.model import _RUN_LEASE as _RUN_LEASE
from langgraph_durable.leases.model import Lease as Lease
from langgraph_durable.leases.model import claim_handoff as claim_handoff
from langgraph_durable.leases.ops import LeaseOps
from langgraph_durable.leases.owners import _owner_id as _owner_id
from langgraph_durable.leases.owners import owner_is_dead as owner_is_dead
from langgraph_durable.leases.owners import process_identity as process_identity
from langgraph_durable.lifecycle import OnBusy as OnBusy
from langgraph_durable.lifecycle import OnUnrecognisedRun as OnUnrecognisedRun
from langgraph_durable.lifecycle import RunLifecycle
from langgraph_durable.pooler import (
    Pooler,
    check_pooled_conn,
    prepare_threshold,
    resolve_pooler,
    session_schema,
)
from langgraph_durable.quarantine import PoisonHook as PoisonHook
from langgraph_durable.quarantine import PoisonRecord as PoisonRecord
from langgraph_durable.quarantine import QuarantineOps
from langgraph_durable.sql.schema import validate_schema
from langgraph_durable.versioning import (
    MigrationRegistry,
    MigrationResult,
    UnversionedPolicy,
    VersionPolicy,
    graph_fingerprint,
)

logger = logging.getLogger("langgraph_durable")


class _DurableBase(
    RunLifecycle,
    VersionGate,
    QuarantineOps,
    LeaseOps,
    FenceOps,
    WriteOps,
    AdminOps,
    LoadOps,
    SetupOps,
    BasePostgresSaver,
):
    """Everything but I/O. Subclasses provide ``_run_op``/``_arun_op`` and the flow
    equivalents; every public method below is written once for both."""

    # Checkpoint deferral (granularity.py); None: every checkpoint is written (stock).
    # Set per saver by checkpoint_policy (the class default serves savers built
    # without __init__, e.g. by copy).
    _granularity: Deferrals | None = None
    # Set by each saver's __init__ from the connection it is given.
    _conninfo: str

    @property
    def checkpoint_policy(self) -> CheckpointPolicy | None:
        """Which checkpoints may be deferred (see langgraph_durable.granularity)."""
        return "always" if self._granularity is None else self._granularity.policy

    @checkpoint_policy.setter
    def checkpoint_policy(self, policy: CheckpointPolicy | None) -> None:
        # None (the default) honours node metadata ({"checkpoint": "defer"}) only;
        # "always" turns deferral off entirely.
        self._granularity = None if policy == "always" else Deferrals(policy)

    def __init__(
        self, *, serde: SerializerProtocol | None = None, options: SaverOptions | None = None
    ) -> None:
        """The options come validated, in their groups (``config.SaverOptions``); the
        public savers build them from their flat keyword-only parameters."""
        opts = options if options is not None else SaverOptions()
        super().__init__(serde=serde)
        self.checkpoint_policy = opts.checkpoint_policy
        self.schema = opts.schema
        versions, poison, leases = opts.versions, opts.poison, opts.leases
        self.graph_version = versions.graph_version
        self.version_policy: VersionPolicy = versions.policy
        self.unversioned_policy: UnversionedPolicy = versions.unversioned_policy
        self.migrations = versions.migrations if versions.migrations is not None else MigrationRegistry()
        self.max_resume_attempts = poison.max_resume_attempts
        self.on_poison = poison.on_poison
        self.lease_ttl = float(leases.ttl)
        self.on_busy: OnBusy = leases.on_busy
        self.busy_timeout = leases.busy_timeout
        self.leases_enabled = leases.enabled
        # A lease held by a process of this machine that is provably dead is taken over
        # at once (see owner_is_dead); leases of other machines always run to expiry.
        self.takeover_dead_owners = leases.takeover_dead_owners
        # A root run start the saver failed to recognise (LangGraph changed how runs
        # start): "raise" refuses the run with UnsupportedLangGraphError before any node
        # runs; "log" logs an error and lets it run without a lease (unprotected).
        self.on_unrecognised_run: OnUnrecognisedRun = leases.on_unrecognised_run
        # Behind a transaction pooler (pooler.py): no session state across transactions.
        self.pooler: Pooler = resolve_pooler(opts.pooler)
        # False: setup() only verifies the schema version (no DDL; SchemaNotReadyError).
        self.run_migrations = bool(opts.run_migrations)
        self.codec = ArtifactCodec(opts.artifacts)
        self._known_refs = KnownRefs()
        self._leases = _LeaseRegistry()
        self._unrecognised_logged: set[str] = set()
        # Graph versions whose topology this saver (and its bind() views) stored.
        self._recorded_versions: set[str] = set()
        # One renewer for a saver and all its bind()/with_allowlist clones (they share
        # the slot, as they share the lease registry): closing any of them stops it. A
        # clone with a renewer of its own outlived the saver's close by up to 60 s.
        self._renewer_slot = _RenewerSlot()

    # ------------------------------------------------------------------ drivers
    def _run_op(self, factory: Callable[[], Op[Any]], *, transaction: bool = True) -> Any:
        raise NotImplementedError

    async def _arun_op(self, factory: Callable[[], Op[Any]], *, transaction: bool = True) -> Any:
        raise NotImplementedError

    def _run_flow(self, flow: Flow[Any]) -> Any:
        raise NotImplementedError

    async def _arun_flow(self, flow: Flow[Any]) -> Any:
        raise NotImplementedError

    # ------------------------------------------------------------------ views
    def bind(
        self,
        *,
        graph_version: str | None = None,
        graph: Any = None,
        version_policy: VersionPolicy | None = None,
        migrations: MigrationRegistry | None = None,
    ) -> Any:
        """A view of this saver for one graph: same pool, leases and caches, its own
        version. ``saver.bind(graph=builder)`` stamps ``graph_fingerprint(builder)``;
        one saver serves any number of graphs this way."""
        clone = self._clone()
        if graph is not None:
            clone.graph_version = graph_fingerprint(graph)
        if graph_version is not None:
            clone.graph_version = graph_version
        if version_policy is not None:
            clone.version_policy = version_policy
        if migrations is not None:
            clone.migrations = migrations
        return clone

    def _clone(self) -> Any:
        import copy

        return copy.copy(self)

    def with_allowlist(self, extra_allowlist: Any) -> Any:
        """Clone with a derived msgpack allowlist. There is no inner saver to clone:
        the codec reads ``self.serde`` at call time, so the clone's serde is used."""
        return super().with_allowlist(extra_allowlist)

    def get_next_version(self, current: Any, channel: Any) -> Any:
        """The stock versioning, plus the zombie guard: LangGraph calls this on the
        loop's own thread when it applies a step's writes, before the next step's tasks
        start. A run whose lease was lost stops here with ``LeaseLostError`` instead of
        running further nodes (and their side effects) whose writes would be rejected."""
        lease = _RUN_LEASE.get()
        if lease is not None and not lease.released:
            self._confirm_lease(lease)
        return super().get_next_version(current, channel)

    # ------------------------------------------------------------------ public API (sync)

    @_telemetry.instrument("get")
    def get_tuple(self, config: RunnableConfig) -> CheckpointTuple | None:
        ctx = self._run_context(config)
        with _canceled_as_typed("get_tuple", config):
            if ctx is not None:
                outer = _RUN_LEASE.get()
                saved, lease = self._run_flow(self._flow_run_start(config, ctx, _HANDOFF.get()))
                self._run_started(config, ctx, lease, outer, saved)
                return cast("CheckpointTuple | None", saved)
            if config.get("configurable", {}).get("checkpoint_ns"):
                self._bind_run(config, None)
            # Reads run without BEGIN/COMMIT: each statement has its own snapshot either
            # way (READ COMMITTED) and artifacts are immutable; two round trips less.
            return cast(
                "CheckpointTuple | None",
                self._run_op(lambda: self._op_get_tuple(config), transaction=False),
            )

    def list(
        self,
        config: RunnableConfig | None,
        *,
        filter: dict[str, Any] | None = None,
        before: RunnableConfig | None = None,
        limit: int | None = None,
    ) -> Iterator[CheckpointTuple]:
        with _canceled_as_typed("list", config):
            items = self._run_op(lambda: self._op_list(config, filter, before, limit), transaction=False)
        yield from items

    @_telemetry.instrument("put")
    def put(
        self,
        config: RunnableConfig,
        checkpoint: Checkpoint,
        metadata: CheckpointMetadata,
        new_versions: ChannelVersions,
    ) -> RunnableConfig:
        self._check_unrecognised_put(config, metadata)
        if self._granularity is not None and (
            flow := self._granularity.put_flow(self, config, checkpoint, metadata, new_versions)
        ) is not None:
            return cast(RunnableConfig, self._run_flow(flow))
        return cast(
            RunnableConfig,
            self._write(
                str(config["configurable"]["thread_id"]),
                lambda: self._op_put(config, checkpoint, metadata, new_versions),
            ),
        )

    @_telemetry.instrument("put_writes")
    def put_writes(
        self,
        config: RunnableConfig,
        writes: Sequence[tuple[str, Any]],
        task_id: str,
        task_path: str = "",
    ) -> None:
        if self._granularity is not None and (
            flow := self._granularity.writes_flow(self, config, writes, task_id, task_path)
        ) is not None:
            self._run_flow(flow)
            return
        self._write(
            str(config["configurable"]["thread_id"]),
            lambda: self._op_put_writes(config, writes, task_id, task_path),
        )

    def delete_thread(self, thread_id: str) -> None:
        self._run_op(lambda: self._op_delete_thread(thread_id))

    def delete_for_runs(self, run_ids: Sequence[str]) -> None:
        self._run_flow(self._flow_delete_for_runs(run_ids))

    def copy_thread(self, source_thread_id: str, target_thread_id: str) -> None:
        self._run_op(lambda: self._op_copy_thread(source_thread_id, target_thread_id))

    def prune(self, thread_ids: Sequence[str], *, strategy: str = "keep_latest") -> None:
        self._run_flow(self._flow_prune(thread_ids, strategy))

    def get_delta_channel_history(
        self, *, config: RunnableConfig, channels: Sequence[str]
    ) -> Mapping[str, DeltaChannelHistory]:
        return cast(
            "Mapping[str, DeltaChannelHistory]",
            self._run_op(lambda: self._op_delta_history(config, channels), transaction=False),
        )

    # ------------------------------------------------------------------ public API (async)
    @_telemetry.instrument("get")
    async def aget_tuple(self, config: RunnableConfig) -> CheckpointTuple | None:
        ctx = self._run_context(config)
        with _canceled_as_typed("get_tuple", config):
            if ctx is not None:
                outer = _RUN_LEASE.get()
                saved, lease = await self._arun_flow(self._flow_run_start(config, ctx, _HANDOFF.get()))
                self._run_started(config, ctx, lease, outer, saved)
                return cast("CheckpointTuple | None", saved)
            if config.get("configurable", {}).get("checkpoint_ns"):
                self._bind_run(config, None)
            return cast(
                "CheckpointTuple | None",
                await self._arun_op(lambda: self._op_get_tuple(config), transaction=False),
            )

    async def alist(
        self,
        config: RunnableConfig | None,
        *,
        filter: dict[str, Any] | None = None,
        before: RunnableConfig | None = None,
        limit: int | None = None,
    ) -> AsyncIterator[CheckpointTuple]:
        with _canceled_as_typed("list", config):
            items = await self._arun_op(
                lambda: self._op_list(config, filter, before, limit), transaction=False
            )
        for item in items:
            yield item

    @_telemetry.instrument("put")
    async def aput(
        self,
        config: RunnableConfig,
        checkpoint: Checkpoint,
        metadata: CheckpointMetadata,
        new_versions: ChannelVersions,
    ) -> RunnableConfig:
        self._check_unrecognised_put(config, metadata)
        if self._granularity is not None and (
            flow := self._granularity.put_flow(self, config, checkpoint, metadata, new_versions)
        ) is not None:
            return cast(RunnableConfig, await self._arun_flow(flow))
        return cast(
            RunnableConfig,
            await self._awrite(
                str(config["configurable"]["thread_id"]),
                lambda: self._op_put(config, checkpoint, metadata, new_versions),
            ),
        )

    @_telemetry.instrument("put_writes")
    async def aput_writes(
        self,
        config: RunnableConfig,
        writes: Sequence[tuple[str, Any]],
        task_id: str,
        task_path: str = "",
    ) -> None:
        if self._granularity is not None and (
            flow := self._granularity.writes_flow(self, config, writes, task_id, task_path)
        ) is not None:
            await self._arun_flow(flow)
            return
        await self._awrite(
            str(config["configurable"]["thread_id"]),
            lambda: self._op_put_writes(config, writes, task_id, task_path),
        )

    async def adelete_thread(self, thread_id: str) -> None:
        await self._arun_op(lambda: self._op_delete_thread(thread_id))

    async def adelete_for_runs(self, run_ids: Sequence[str]) -> None:
        await self._arun_flow(self._flow_delete_for_runs(run_ids))

    async def acopy_thread(self, source_thread_id: str, target_thread_id: str) -> None:
        await self._arun_op(lambda: self._op_copy_thread(source_thread_id, target_thread_id))

    async def aprune(self, thread_ids: Sequence[str], *, strategy: str = "keep_latest") -> None:
        await self._arun_flow(self._flow_prune(thread_ids, strategy))

    async def aget_delta_channel_history(
        self, *, config: RunnableConfig, channels: Sequence[str]
    ) -> Mapping[str, DeltaChannelHistory]:
        return cast(
            "Mapping[str, DeltaChannelHistory]",
            await self._arun_op(lambda: self._op_delta_history(config, channels), transaction=False),
        )

    # ------------------------------------------------------------------ generic access
    def run_op(self, factory: Callable[[], Op[Any]], *, transaction: bool = True) -> Any:
        """Run a package-internal op (used by the ledger, CLI, retention, recovery)."""
        return self._run_op(factory, transaction=transaction)

    async def arun_op(self, factory: Callable[[], Op[Any]], *, transaction: bool = True) -> Any:
        return await self._arun_op(factory, transaction=transaction)

    def run_flow(self, flow: Flow[Any]) -> Any:
        return self._run_flow(flow)

    async def arun_flow(self, flow: Flow[Any]) -> Any:
        return await self._arun_flow(flow)

    def lease_for(self, thread_id: str) -> Lease | None:
        """The lease this process holds on ``thread_id`` (inside a run), if any."""
        return self._leases.get(str(thread_id))

    # Public names for what the package's other modules use of a saver (versioning,
    # export, granularity, retention, the ledger). The private names stay until the
    # last caller has moved to these.
    @property
    def known_refs(self) -> KnownRefs:
        """The artifact references this process knows stored, per thread."""
        return self._known_refs

    @property
    def lease_registry(self) -> _LeaseRegistry:
        """The leases this process holds (shared by the saver and its views)."""
        return self._leases

    @property
    def conninfo(self) -> str:
        """A conninfo string that opens another connection like the saver's."""
        return self._conninfo

    def op_get_tuple(self, config: RunnableConfig) -> Op[CheckpointTuple | None]:
        """The op behind a ``get_tuple`` that is not a run start, to compose with others."""
        return self._op_get_tuple(config)

    def op_resolve(
        self, pairs: builtins.list[tuple[str, bytes]], where: Mapping[str, Any]
    ) -> Op[dict[bytes, bytes]]:
        """The op fetching every artifact the (type, data) pairs need (see ``decode``)."""
        return self._op_resolve(pairs, where)

    def decode(
        self, tag: str, data: bytes, where: Mapping[str, Any], local: Mapping[bytes, bytes] | None = None
    ) -> Any:
        """One stored (type, data) value, artifacts resolved (``CheckpointLoadError``)."""
        return self._decode(tag, data, where, local)

    def op_rewrite(
        self,
        saved: CheckpointTuple,
        result: MigrationResult,
        metadata: dict[str, Any],
        *,
        expected: str,
        origin: str,
    ) -> Op[None]:
        """The op replacing a checkpoint in place with its migrated form."""
        return self._op_rewrite(saved, result, metadata, expected=expected, origin=origin)

    def _renew_connect(self) -> Connection[Any]:
        """A short-lived connection of its own (the renewer's, setup's behind a pipe)."""
        return Connection.connect(
            self._conninfo, autocommit=True, prepare_threshold=prepare_threshold(self.pooler)
        )


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
    ) -> Iterator[DurablePostgresSaver]:
        """Open a connection pool on ``conn_string`` (else
        ``LANGGRAPH_DURABLE_DSN``, else the embedded PostgreSQL) and yield a saver.

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
    ) -> AsyncIterator[AsyncDurablePostgresSaver]:
        """Open an async pool and yield a saver (DSN resolved as the sync saver's).
        ``pipeline``: see ``DurablePostgresSaver.from_conn_string``."""
        if not isinstance(pipeline, bool):
            raise ConfigurationError(f"pipeline must be a bool, not {pipeline!r}", pipeline=pipeline)
        dsn = conn_string or os.environ.get("LANGGRAPH_DURABLE_DSN")
        if not dsn:
            dsn = await asyncio.to_thread(resolve_dsn, None)
        schema = validate_schema(schema)
        pooled = resolve_pooler(pooler)
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

