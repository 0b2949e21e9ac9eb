"""The typed views of the saver its components take: one class per component, listing
exactly the members of the saver it uses.

The saver (``saver._DurableBase``) is composed of small components (``core.load``,
``core.write``, ``core.admin``, ``core.setup``, ``core.rewrite``, ``leases.fence``,
``leases.ops``, ``lifecycle``, ``quarantine``). Each is a class of ops over the saver's
state; each subclasses its view here, so mypy checks every ``self.x`` a component uses
against the view's typed list (attributes set by ``_DurableBase.__init__``, the driver
entry points the two public savers provide, and other components' ops). A member a
component starts using must be added to its view. Nothing here exists at run time: the
attributes are annotations, the methods are declared for the type checker only.
Generated once from the components (issue 13); edit by hand since.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from langgraph_durable._io import Flow, Op, Stmt
from langgraph_durable.artifacts import ArtifactCodec, KnownRefs

if TYPE_CHECKING:
    from langchain_core.runnables import RunnableConfig
    from langgraph.checkpoint.base import (
        CheckpointTuple,
    )
    from langgraph.checkpoint.serde.base import SerializerProtocol
    from psycopg import Connection

    from langgraph_durable.errors import DurableError
    from langgraph_durable.granularity import Deferrals
    from langgraph_durable.leases.model import Lease, _Handoff, _LeaseRegistry, _RenewerSlot
    from langgraph_durable.lifecycle import OnBusy, OnUnrecognisedRun, _RunContext
    from langgraph_durable.pooler import Pooler
    from langgraph_durable.quarantine import PoisonHook, PoisonRecord
    from langgraph_durable.sql.checkpoints import GuardMode
    from langgraph_durable.versioning import (
        MigrationRegistry,
        UnversionedPolicy,
        VersionPolicy,
    )


class QuarantineView:
    """What ``quarantine.QuarantineOps`` uses of the saver."""

    _leases: _LeaseRegistry
    on_poison: PoisonHook | None
    serde: SerializerProtocol


class FenceView:
    """What ``leases.fence.FenceOps`` uses of the saver."""

    _leases: _LeaseRegistry
    leases_enabled: bool


class LeaseView:
    """What ``leases.ops.LeaseOps`` uses of the saver."""

    _leases: _LeaseRegistry
    _renewer_slot: _RenewerSlot
    lease_ttl: float
    pooler: Pooler
    schema: str | None
    serde: SerializerProtocol
    takeover_dead_owners: bool

    if TYPE_CHECKING:
        # The renewer it starts takes the saver as its RenewerHost.
        def _renew_connect(self) -> Connection[Any]: ...


class LoadView:
    """What ``core.load.LoadOps`` uses of the saver."""

    codec: ArtifactCodec
    serde: SerializerProtocol


class WriteView:
    """What ``core.write.WriteOps`` uses of the saver."""

    _known_refs: KnownRefs
    codec: ArtifactCodec
    graph_version: str | None
    leases_enabled: bool
    serde: SerializerProtocol
    takeover_dead_owners: bool

    if TYPE_CHECKING:
        async def _arun_op(self, factory: Callable[[], Op[Any]], *, transaction: bool = True) -> Any: ...
        def _fence_error(self, thread_id: str, lease: Lease | None, exc: BaseException) -> DurableError | None: ...
        def _guard(self, thread_id: str, config: RunnableConfig, checkpoint_ns: str | None, checkpoint_id: str | None, parent_id: str | None = None) -> tuple[GuardMode, tuple[Any, ...], Lease | None]: ...
        def _gone_error(self, thread_id: str, checkpoint_ns: str, checkpoint_id: str, parent_id: str | None, lease: Lease | None, exc: BaseException) -> DurableError | None: ...
        @staticmethod
        def _order_error(thread_id: str, checkpoint_ns: str, checkpoint_id: str, exc: BaseException) -> DurableError | None: ...
        def _run_op(self, factory: Callable[[], Op[Any]], *, transaction: bool = True) -> Any: ...


class AdminView:
    """What ``core.admin.AdminOps`` uses of the saver."""

    _known_refs: KnownRefs
    codec: ArtifactCodec
    serde: SerializerProtocol
    busy_timeout: float
    on_busy: OnBusy


class SetupView:
    """What ``core.setup.SetupOps`` uses of the saver."""

    pooler: Pooler
    run_migrations: bool
    schema: str | None


class VersionGateView:
    """What ``core.rewrite.VersionGate`` uses of the saver."""

    _known_refs: KnownRefs
    _recorded_versions: set[str]
    codec: ArtifactCodec
    leases_enabled: bool
    migrations: MigrationRegistry
    serde: SerializerProtocol
    unversioned_policy: UnversionedPolicy

    if TYPE_CHECKING:
        def get_next_version(self, current: Any, channel: Any) -> Any: ...
        def _op_get_tuple(self, config: RunnableConfig) -> Op[CheckpointTuple | None]: ...
        def _artifact_stmts(self, thread_id: str, artifacts: dict[bytes, bytes]) -> tuple[list[Stmt], list[bytes]]: ...
        def _check_fence(self, thread_id: str, lease: Lease | None, rows: list[Any]) -> None: ...
        def _fence(self, thread_id: str, *, raising: bool=False, config: RunnableConfig | None=None) -> tuple[Stmt, Lease | None]: ...
        def _inline(self, value: Any) -> bool: ...


class RunLifecycleView:
    """What ``lifecycle.RunLifecycle`` uses of the saver."""

    _granularity: Deferrals | None
    _leases: _LeaseRegistry
    _unrecognised_logged: set[str]
    busy_timeout: float
    graph_version: str | None
    leases_enabled: bool
    max_resume_attempts: int
    on_busy: OnBusy
    on_unrecognised_run: OnUnrecognisedRun
    serde: SerializerProtocol
    version_policy: VersionPolicy

    if TYPE_CHECKING:
        async def _arun_flow(self, flow: Flow[Any]) -> Any: ...
        async def _arun_op(self, factory: Callable[[], Op[Any]], *, transaction: bool = True) -> Any: ...
        def _ensure_renewer(self) -> None: ...
        def _flow_check_version(self, thread_id: str, saved: CheckpointTuple, current: str | None, policy: str) -> Flow[CheckpointTuple]: ...
        def _flow_quarantine(self, lease: Lease, record: PoisonRecord, cause: BaseException | None=None) -> Flow[None]: ...
        def _flow_record_version(self, version: str | None, ctx: _RunContext) -> Flow[None]: ...
        def _op_abandon(self, lease: Lease) -> Op[None]: ...
        def _op_acquire(self, thread_id: str, owner: str, version: str | None, checkpoint_id: str | None, handoff: _Handoff | None=None, load: Stmt | None=None) -> Op[dict[str, Any]]: ...
        def _op_acquire_contended(self, thread_id: str, owner: str, version: str | None, checkpoint_id: str | None, handoff: _Handoff | None=None) -> Op[dict[str, Any]]: ...
        def _get_tuple_stmt(self, config: RunnableConfig) -> Stmt: ...
        def _op_get_tuple(self, config: RunnableConfig) -> Op[CheckpointTuple | None]: ...
        def _op_tuple_of(self, rows: list[Any]) -> Op[CheckpointTuple | None]: ...
        def _op_quarantine_row(self, thread_id: str) -> Op[dict[str, Any] | None]: ...
        def _op_release(self, lease: Lease, status: str, *, reset: bool, undo: bool, error: str | None, checkpoint_id: str | None=None, first: Sequence[Stmt]=(), head: str | None=None) -> Op[None]: ...
        def _renew_connect(self) -> Connection[Any]: ...
        def _run_flow(self, flow: Flow[Any]) -> Any: ...
        def _run_op(self, factory: Callable[[], Op[Any]], *, transaction: bool = True) -> Any: ...
