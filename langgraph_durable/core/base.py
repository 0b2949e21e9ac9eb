"""``_DurableBase``: the stock checkpointer API (``get_tuple``, ``put``, ``list``, ... and
their ``a*`` twins) written once for both savers, over the components it is composed
of. Everything but I/O: the two public savers (``saver.py``) add the driver."""

from __future__ import annotations

import builtins
import logging
from collections.abc import AsyncIterator, Callable, Iterator, Mapping, Sequence
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
from psycopg import Connection

from langgraph_durable import _chanver, _sealing
from langgraph_durable import telemetry as _telemetry
from langgraph_durable._compat import DURABILITY_KEY
from langgraph_durable._compat import RUNTIME_KEY as _RUNTIME_KEY
from langgraph_durable._io import (
    Flow,
    Op,
    Tx,
)
from langgraph_durable.artifacts import (
    ArtifactCodec,
    KnownRefs,
)
from langgraph_durable.config import SaverOptions
from langgraph_durable.core.admin import AdminOps
from langgraph_durable.core.load import LoadOps, _canceled_as_typed, _threads_config
from langgraph_durable.core.rewrite import VersionGate
from langgraph_durable.core.setup import SetupOps
from langgraph_durable.core.write import WriteOps
from langgraph_durable.errors import RunCancelledError
from langgraph_durable.granularity import CheckpointPolicy, Deferrals
from langgraph_durable.leases.fence import FenceOps
from langgraph_durable.leases.model import _HANDOFF, _RUN_LEASE, Lease, _LeaseRegistry, _RenewerSlot
from langgraph_durable.leases.ops import LeaseOps
from langgraph_durable.lifecycle import OnBusy, OnUnrecognisedRun, RunLifecycle
from langgraph_durable.pooler import (
    Pooler,
    prepare_threshold,
    resolve_pooler,
)
from langgraph_durable.quarantine import QuarantineOps
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
        # Channel versions in the compact form (_chanver); False: the stock form.
        self.compact_versions = bool(opts.compact_versions)
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

    # ------------------------------------------------------------------ digest secret
    # False on a reader (a standby): it reads the secret, never creates it.
    _digest_writable = True

    def _digest_pending(self) -> bool:
        """Whether the database's digest secret still has to be read (digest27): once
        per saver, its clones and reader sharing it through the codec. Without an
        encrypting serializer there is none (plain sha256) and nothing to read."""
        slot = self.codec.digest
        if slot.loaded:
            return False
        if _sealing.keyring_of(self.serde) is None:
            slot.set(None)
            return False
        return True

    def _flow_digest_secret(self) -> Flow[None]:
        slot = self.codec.digest
        ring = _sealing.keyring_of(self.serde)
        if slot.loaded or ring is None:
            return
        writable = self._digest_writable
        try:
            secret = yield Tx(lambda: _sealing.op_digest_secret(ring, writable=writable))
        except _sealing.DecryptionError as exc:
            # No configured key opens it (a wrong key): reads go on and refuse typed,
            # naming the thread, at the first encrypted value; writes raise this.
            slot.set(None, exc)
            return
        if secret is not None:
            ring.remember_secret(secret)
        if secret is not None or writable:
            slot.set(secret)

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
        """Compact versions (``compact_versions``, see ``_chanver``; else the stock
        versioning), plus the zombie guard: LangGraph calls this on the
        loop's own thread when it applies a step's writes, before the next step's tasks
        start. A run whose lease was lost stops here with ``LeaseLostError`` instead of
        running further nodes (and their side effects) whose writes would be rejected."""
        lease = _RUN_LEASE.get()
        if lease is not None and not lease.released:
            self._confirm_lease(lease)
            if lease.cancel and lease.exit_durability:
                # Not under durability="exit" (review 28): LangGraph calls this inside
                # apply_writes, after it marked the step's tasks as having seen their
                # triggers and before it applied their writes, and under "exit" it then
                # stores that in-memory checkpoint on the way out: a thread that resumed
                # as finished, the rest of the run silently lost. The run finishes instead.
                if not lease.cancel_ignored:
                    lease.cancel_ignored = True
                    logger.warning(
                        "thread %s: an operator's cancel arrived, but this run uses "
                        "durability='exit' and cannot stop at a step boundary without "
                        "losing its progress; it runs to its end", lease.thread_id,
                    )
            elif lease.cancel:
                # An operator's cancel (issue 25, ops.control.request_cancel), learnt
                # from a put or a renewal: stop at this step boundary, before the
                # next step's tasks start; the exit releases the thread as 'stopped'.
                raise RunCancelledError(lease.thread_id, lease.token, lease.acked.get("") or lease.checkpoint_id)
        if self.compact_versions:
            # The compact form (issue 26, see _chanver): ~14 characters instead of 51.
            return _chanver.next_compact(current)
        return super().get_next_version(current, channel)

    def _raise_if_cancelled(self, config: RunnableConfig, written: RunnableConfig) -> None:
        """A root put (stored, committed) whose RETURNING said an operator cancelled the
        run (issue 25): raise now. Under durability="sync" LangGraph waits for this put
        before the next step, so the run stops at this boundary with this checkpoint
        stored; otherwise get_next_version stops it at the next boundary at the latest."""
        configurable = config["configurable"]
        if configurable.get("checkpoint_ns") or configurable.get(DURABILITY_KEY) != "sync":
            # Under "async" LangGraph reads this put's outcome only at the next put or at
            # the run's exit: raising would only fail a run that has just finished.
            return
        thread_id = str(configurable["thread_id"])
        lease = _RUN_LEASE.get()
        if lease is None or lease.thread_id != thread_id:
            lease = self._leases.for_runtime(configurable.get(_RUNTIME_KEY), thread_id)
        if lease is not None and lease.cancel and not lease.released:
            raise RunCancelledError(thread_id, lease.token, written["configurable"].get("checkpoint_id"))

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
        # .runs: runs with something to defer (empty: nothing to ask, the usual case).
        if self._granularity is not None and self._granularity.runs and (
            flow := self._granularity.put_flow(self, config, checkpoint, metadata, new_versions)
        ) is not None:
            return cast(RunnableConfig, self._run_flow(flow))
        # (No typing.cast here: a function call per put.)
        written: RunnableConfig = self._write(
            str(config["configurable"]["thread_id"]),
            lambda: self._op_put(config, checkpoint, metadata, new_versions),
        )
        self._raise_if_cancelled(config, written)
        return written

    @_telemetry.instrument("put_writes")
    def put_writes(
        self,
        config: RunnableConfig,
        writes: Sequence[tuple[str, Any]],
        task_id: str,
        task_path: str = "",
    ) -> None:
        if self._granularity is not None and self._granularity.runs and (
            flow := self._granularity.writes_flow(self, config, writes, task_id, task_path)
        ) is not None:
            self._run_flow(flow)
            return
        self._write(
            str(config["configurable"]["thread_id"]),
            lambda: self._op_put_writes(config, writes, task_id, task_path),
        )

    def delete_thread(self, thread_id: str) -> None:
        with _canceled_as_typed("delete_thread", _threads_config(thread_id)):
            self._run_op(lambda: self._op_delete_thread(thread_id))

    def delete_for_runs(self, run_ids: Sequence[str]) -> None:
        with _canceled_as_typed("delete_for_runs", _threads_config(())):
            self._run_flow(self._flow_delete_for_runs(run_ids))

    def copy_thread(self, source_thread_id: str, target_thread_id: str) -> None:
        self._run_op(lambda: self._op_copy_thread(source_thread_id, target_thread_id))

    def prune(self, thread_ids: Sequence[str], *, strategy: str = "keep_latest") -> None:
        with _canceled_as_typed("prune", _threads_config(thread_ids)):
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
        # .runs: runs with something to defer (empty: nothing to ask, the usual case).
        if self._granularity is not None and self._granularity.runs and (
            flow := self._granularity.put_flow(self, config, checkpoint, metadata, new_versions)
        ) is not None:
            return cast(RunnableConfig, await self._arun_flow(flow))
        written: RunnableConfig = await self._awrite(
            str(config["configurable"]["thread_id"]),
            lambda: self._op_put(config, checkpoint, metadata, new_versions),
        )
        self._raise_if_cancelled(config, written)
        return written

    @_telemetry.instrument("put_writes")
    async def aput_writes(
        self,
        config: RunnableConfig,
        writes: Sequence[tuple[str, Any]],
        task_id: str,
        task_path: str = "",
    ) -> None:
        if self._granularity is not None and self._granularity.runs and (
            flow := self._granularity.writes_flow(self, config, writes, task_id, task_path)
        ) is not None:
            await self._arun_flow(flow)
            return
        await self._awrite(
            str(config["configurable"]["thread_id"]),
            lambda: self._op_put_writes(config, writes, task_id, task_path),
        )

    async def adelete_thread(self, thread_id: str) -> None:
        with _canceled_as_typed("delete_thread", _threads_config(thread_id)):
            await self._arun_op(lambda: self._op_delete_thread(thread_id))

    async def adelete_for_runs(self, run_ids: Sequence[str]) -> None:
        with _canceled_as_typed("delete_for_runs", _threads_config(())):
            await self._arun_flow(self._flow_delete_for_runs(run_ids))

    async def acopy_thread(self, source_thread_id: str, target_thread_id: str) -> None:
        await self._arun_op(lambda: self._op_copy_thread(source_thread_id, target_thread_id))

    async def aprune(self, thread_ids: Sequence[str], *, strategy: str = "keep_latest") -> None:
        with _canceled_as_typed("prune", _threads_config(thread_ids)):
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
        """Run a package-internal op (used by the ledger, CLI, retention, recovery).
        The op sees this saver's keyring as ``_sealing.RING`` (the audit trail's)."""
        token = _sealing.RING.set(_sealing.keyring_of(self.serde))
        try:
            return self._run_op(factory, transaction=transaction)
        finally:
            _sealing.RING.reset(token)

    async def arun_op(self, factory: Callable[[], Op[Any]], *, transaction: bool = True) -> Any:
        token = _sealing.RING.set(_sealing.keyring_of(self.serde))
        try:
            return await self._arun_op(factory, transaction=transaction)
        finally:
            _sealing.RING.reset(token)

    def run_flow(self, flow: Flow[Any]) -> Any:
        token = _sealing.RING.set(_sealing.keyring_of(self.serde))
        try:
            return self._run_flow(flow)
        finally:
            _sealing.RING.reset(token)

    async def arun_flow(self, flow: Flow[Any]) -> Any:
        token = _sealing.RING.set(_sealing.keyring_of(self.serde))
        try:
            return await self._arun_flow(flow)
        finally:
            _sealing.RING.reset(token)

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
