"""``SaverView``: what the operator modules may use of a saver (issue 13).

The operator APIs (poison, retention, migrations, archive, export, compat, pooler,
inspection, telemetry's queue collector) take a saver and run ops on it. They used to
take ``saver: Any``; this Protocol names the members they use, so mypy checks every
access and a reader sees the surface in one place. Both ``DurablePostgresSaver`` and
``AsyncDurablePostgresSaver`` satisfy it structurally (no registration, no import of
saver.py here: this module sits below the facade).

Members with a leading underscore are the saver's internals the ops still reach into
(``_known_refs``, ``_op_get_tuple``, ``_op_resolve``, ``_decode``, ``_op_rewrite``); the
saver's decomposition (core/) gives them public names, and this Protocol follows.

``connection()`` and ``setup()`` are not members: they are sync on the sync saver and
async on the async one, and the shared base has neither; code that needs one (the CLI,
inspection) takes the concrete class.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from langchain_core.runnables import RunnableConfig
    from langgraph.checkpoint.base import CheckpointTuple
    from langgraph.checkpoint.serde.base import SerializerProtocol

    from langgraph_durable._io import Flow, Op
    from langgraph_durable.artifacts import ArtifactCodec, KnownRefs
    from langgraph_durable.pooler import Pooler
    from langgraph_durable.versioning import MigrationRegistry, MigrationResult


class SchemaView(Protocol):
    """What setup behind a pooler and the DDL-free schema check use (pooler.py)."""

    @property
    def schema(self) -> str | None: ...

    @property
    def pooler(self) -> Pooler: ...


class RefsView(Protocol):
    """What the artifact reference ops use (_refs.py: closure, recompute)."""

    @property
    def serde(self) -> SerializerProtocol: ...

    @property
    def codec(self) -> ArtifactCodec: ...

    @property
    def _known_refs(self) -> KnownRefs: ...


class GateView(Protocol):
    """What the version gate's migration of one checkpoint uses (versioning.gate)."""

    def get_next_version(self, current: Any, channel: Any) -> Any: ...

    def _op_get_tuple(self, config: RunnableConfig) -> Op[CheckpointTuple | None]: ...

    def _op_rewrite(
        self,
        saved: CheckpointTuple,
        result: MigrationResult,
        metadata: dict[str, Any],
        *,
        expected: str,
        origin: str,
    ) -> Op[None]: ...


class SaverView(SchemaView, RefsView, GateView, Protocol):
    """The members of a durable saver the operator modules use (read-only view). The
    saver's components, typed by narrower views of their own (core.view), call the
    functions below the operator APIs with those: SchemaView, RefsView, GateView."""

    # ------------------------------------------------------------------ settings
    @property
    def schema(self) -> str | None: ...

    @property
    def serde(self) -> SerializerProtocol: ...

    @property
    def codec(self) -> ArtifactCodec: ...

    @property
    def pooler(self) -> Pooler: ...

    @property
    def graph_version(self) -> str | None: ...

    @property
    def migrations(self) -> MigrationRegistry: ...

    @property
    def leases_enabled(self) -> bool: ...

    @property
    def _known_refs(self) -> KnownRefs: ...

    # ------------------------------------------------------------------ running ops
    def run_op(self, factory: Callable[[], Op[Any]], *, transaction: bool = True) -> Any: ...

    async def arun_op(self, factory: Callable[[], Op[Any]], *, transaction: bool = True) -> Any: ...

    def run_flow(self, flow: Flow[Any]) -> Any: ...

    async def arun_flow(self, flow: Flow[Any]) -> Any: ...

    # ------------------------------------------------------------------ checkpoint access
    def get_tuple(self, config: RunnableConfig) -> CheckpointTuple | None: ...

    def get_next_version(self, current: Any, channel: Any) -> Any: ...

    def _op_get_tuple(self, config: RunnableConfig) -> Op[CheckpointTuple | None]: ...

    def _op_resolve(
        self,
        pairs: list[tuple[str, bytes]],
        where: Mapping[str, Any],
        locate: Callable[[bytes], Mapping[str, Any] | None] | None = None,
    ) -> Op[dict[bytes, bytes]]: ...

    def _decode(
        self, tag: str, data: bytes, where: Mapping[str, Any], local: Mapping[bytes, bytes] | None = None
    ) -> Any: ...

    def _op_rewrite(
        self,
        saved: CheckpointTuple,
        result: MigrationResult,
        metadata: dict[str, Any],
        *,
        expected: str,
        origin: str,
    ) -> Op[None]: ...


    # ------------------------------------------------------------------ writes (ops.control: fork, delete)
    def _op_put(
        self, config: RunnableConfig, checkpoint: Any, metadata: Any, new_versions: Any
    ) -> Op[RunnableConfig]: ...

    def _op_put_writes(
        self, config: RunnableConfig, writes: Any, task_id: str, task_path: str
    ) -> Op[None]: ...

    def _op_delete_thread(self, thread_id: str) -> Op[None]: ...

    # last: a method named ``list`` shadows the builtin in the annotations after it
    def list(
        self,
        config: RunnableConfig | None,
        *,
        filter: dict[str, Any] | None = None,
        before: RunnableConfig | None = None,
        limit: int | None = None,
    ) -> Iterator[CheckpointTuple]: ...


__all__ = ["GateView", "RefsView", "SaverView", "SchemaView"]
