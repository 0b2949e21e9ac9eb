"""The version gate's migration of one stored checkpoint (``flow_migrate``): run start
and batch migration both go through it."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from langgraph_durable import telemetry as _telemetry
from langgraph_durable._io import Flow, Tx
from langgraph_durable._view import GateView
from langgraph_durable.errors import (
    MigrationError,
    OrphanedWorkError,
)

if TYPE_CHECKING:
    from langgraph.checkpoint.base import CheckpointTuple
from langgraph_durable.versioning.keys import (
    MIGRATED_FROM_KEY,
    VERSION_KEY,
)
from langgraph_durable.versioning.registry import (
    Migration,
)
from langgraph_durable.versioning.transform import (
    _OrphanedWork,
    apply_migrations,
)

logger = logging.getLogger("langgraph_durable.versioning")

# --- migrating stored threads ----------------------------------------------------------

@_telemetry.instrument("migration")
def flow_migrate(
    saver: GateView,
    saved: CheckpointTuple,
    stored: str,
    current: str,
    chain: Sequence[Migration],
    *,
    graph: Any = None,
    origin: str = "run",
    dry_run: bool = False,
) -> Flow[Any]:
    """Apply ``chain`` to ``saved`` and write the result in place (one transaction,
    backup in ``durable_migration_log``). Returns the reloaded tuple, or the
    ``MigrationResult`` when ``dry_run``. Raises ``MigrationError`` / ``OrphanedWorkError``
    with the stored rows untouched."""
    thread_id = str(saved.config["configurable"]["thread_id"])
    try:
        result = apply_migrations(
            chain,
            saved.checkpoint,
            list(saved.pending_writes or []),
            next_version=lambda v: saver.get_next_version(v, None),
            metadata=saved.metadata,
            graph=graph,
        )
    except _OrphanedWork as exc:
        raise OrphanedWorkError(
            thread_id=thread_id, from_version=stored, to_version=current, nodes=exc.nodes
        ) from None
    except Exception as exc:
        raise MigrationError(
            f"migration {stored!r} -> {current!r} ({' then '.join(m.label for m in chain)}) of "
            f"thread {thread_id!r} failed: {type(exc).__name__}: {exc}; the stored checkpoint "
            "is untouched",
            thread_id=thread_id,
            from_version=stored,
            to_version=current,
        ) from exc
    if dry_run:
        return result
    md = dict(saved.metadata or {})
    md[VERSION_KEY] = current
    md[MIGRATED_FROM_KEY] = stored
    yield Tx(lambda: saver._op_rewrite(saved, result, md, expected=stored, origin=origin))
    logger.info(
        "thread %s migrated from graph version %s to %s (%s)",
        thread_id, stored, current, ", ".join(result.steps),
    )
    reloaded = yield Tx(lambda: saver._op_get_tuple(saved.config))
    return reloaded
