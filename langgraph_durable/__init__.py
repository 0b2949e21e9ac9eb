"""langgraph-durable: a drop-in durable checkpointer for LangGraph on Postgres.

The public names load lazily (PEP 562): ``import langgraph_durable.cli`` must not pay for
langgraph, langchain-core and psycopg (about 2 s on a loaded machine) just to print
``--help``. ``from langgraph_durable import X`` and ``langgraph_durable.X`` work as before.
"""

from __future__ import annotations

import importlib
import sys
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from langgraph_durable import audit
    from langgraph_durable.archive import RestoreReport, arestore, restore
    from langgraph_durable.artifacts import ArtifactConfig
    from langgraph_durable.embedded import embedded_dsn, resolve_dsn, stop_embedded
    from langgraph_durable.errors import (
        ArchiveConflictError,
        ArchiveError,
        ArchiveIntegrityError,
        ArchiveVersionError,
        ArtifactIntegrityError,
        ArtifactNotFoundError,
        CallInFlightError,
        CheckpointLoadError,
        CheckpointNotFoundError,
        ClockSkewError,
        ConfigurationError,
        DurableError,
        GraphVersionMismatchError,
        IdempotencyConflictError,
        IdempotencyError,
        IdempotentCallFailedError,
        InsufficientPrivilegeError,
        InvalidIdempotencyKeyError,
        InvalidIdentifierError,
        InvalidThreadIdError,
        LeaseLostError,
        MigrationError,
        NoLedgerError,
        NotQuarantinedError,
        OrphanedWorkError,
        OutcomeUnknownError,
        PoisonCheckpointError,
        SchemaNotReadyError,
        SerializationError,
        StatementCanceledError,
        ThreadBusyError,
        ThreadExistsError,
        UnencodableValueError,
        UnstableKeyError,
        UnsupportedConnectionError,
        UnsupportedLangGraphError,
    )
    from langgraph_durable.errors import (
        ArtifactError as ArtifactError,
    )
    from langgraph_durable.errors import (
        EmbeddedPostgresError as EmbeddedPostgresError,
    )
    from langgraph_durable.export import ExportReport, aexport_stock, export_stock
    from langgraph_durable.granularity import CheckpointPolicy, ReworkBudget
    from langgraph_durable.idempotency import (
        IdempotentTool,
        Ledger,
        LedgerEntry,
        apurge_expired_keys,
        idempotent,
        purge_expired_keys,
    )
    from langgraph_durable.journal import JournaledRunnable, journaled
    from langgraph_durable.ops import poison
    from langgraph_durable.ops.migrations import (
        MigrationReport,
        amigrate_threads,
        aundo_migration,
        migrate_threads,
        undo_migration,
    )
    from langgraph_durable.ops.poison import QuarantineEntry, RewindResult, ThreadReport
    from langgraph_durable.ops.retention import (
        GcReport,
        RetentionReport,
        agc,
        arecompute_refs,
        aretain,
        gc,
        recompute_refs,
        retain,
    )
    from langgraph_durable.recovery import (
        RecoveryResult,
        RecoveryWorker,
        WorkerStats,
        arecover,
        astatus_counts,
        asubmit,
        recover,
        status_counts,
        submit,
    )
    from langgraph_durable.saver import (
        AsyncDurablePostgresSaver,
        DurablePostgresSaver,
        Lease,
        PoisonRecord,
    )
    from langgraph_durable.versioning import (
        Migration,
        MigrationRegistry,
        graph_fingerprint,
    )

# public name -> the module defining it (a submodule itself when the name is the module's)
_LAZY: dict[str, str] = {
    "CheckpointPolicy": "langgraph_durable.granularity",
    "ReworkBudget": "langgraph_durable.granularity",
    "poison": "langgraph_durable.ops.poison",
    "audit": "langgraph_durable.audit",
    "RestoreReport": "langgraph_durable.archive",
    "arestore": "langgraph_durable.archive",
    "restore": "langgraph_durable.archive",
    "ArtifactConfig": "langgraph_durable.artifacts",
    "embedded_dsn": "langgraph_durable.embedded",
    "resolve_dsn": "langgraph_durable.embedded",
    "stop_embedded": "langgraph_durable.embedded",
    "ArchiveConflictError": "langgraph_durable.errors",
    "ArchiveError": "langgraph_durable.errors",
    "ArchiveIntegrityError": "langgraph_durable.errors",
    "ArchiveVersionError": "langgraph_durable.errors",
    "ArtifactError": "langgraph_durable.errors",
    "ArtifactIntegrityError": "langgraph_durable.errors",
    "ArtifactNotFoundError": "langgraph_durable.errors",
    "CallInFlightError": "langgraph_durable.errors",
    "CheckpointLoadError": "langgraph_durable.errors",
    "CheckpointNotFoundError": "langgraph_durable.errors",
    "ClockSkewError": "langgraph_durable.errors",
    "ConfigurationError": "langgraph_durable.errors",
    "DurableError": "langgraph_durable.errors",
    "EmbeddedPostgresError": "langgraph_durable.errors",
    "GraphVersionMismatchError": "langgraph_durable.errors",
    "IdempotencyConflictError": "langgraph_durable.errors",
    "IdempotencyError": "langgraph_durable.errors",
    "IdempotentCallFailedError": "langgraph_durable.errors",
    "InsufficientPrivilegeError": "langgraph_durable.errors",
    "InvalidIdempotencyKeyError": "langgraph_durable.errors",
    "InvalidIdentifierError": "langgraph_durable.errors",
    "InvalidThreadIdError": "langgraph_durable.errors",
    "LeaseLostError": "langgraph_durable.errors",
    "MigrationError": "langgraph_durable.errors",
    "NoLedgerError": "langgraph_durable.errors",
    "NotQuarantinedError": "langgraph_durable.errors",
    "OrphanedWorkError": "langgraph_durable.errors",
    "OutcomeUnknownError": "langgraph_durable.errors",
    "PoisonCheckpointError": "langgraph_durable.errors",
    "SchemaNotReadyError": "langgraph_durable.errors",
    "SerializationError": "langgraph_durable.errors",
    "StatementCanceledError": "langgraph_durable.errors",
    "ThreadBusyError": "langgraph_durable.errors",
    "ThreadExistsError": "langgraph_durable.errors",
    "UnencodableValueError": "langgraph_durable.errors",
    "UnstableKeyError": "langgraph_durable.errors",
    "UnsupportedConnectionError": "langgraph_durable.errors",
    "UnsupportedLangGraphError": "langgraph_durable.errors",
    "ExportReport": "langgraph_durable.export",
    "aexport_stock": "langgraph_durable.export",
    "export_stock": "langgraph_durable.export",
    "IdempotentTool": "langgraph_durable.idempotency",
    "Ledger": "langgraph_durable.idempotency",
    "LedgerEntry": "langgraph_durable.idempotency",
    "apurge_expired_keys": "langgraph_durable.idempotency",
    "idempotent": "langgraph_durable.idempotency",
    "purge_expired_keys": "langgraph_durable.idempotency",
    "JournaledRunnable": "langgraph_durable.journal",
    "journaled": "langgraph_durable.journal",
    "QuarantineEntry": "langgraph_durable.ops.poison",
    "RewindResult": "langgraph_durable.ops.poison",
    "ThreadReport": "langgraph_durable.ops.poison",
    "RecoveryResult": "langgraph_durable.recovery",
    "RecoveryWorker": "langgraph_durable.recovery",
    "WorkerStats": "langgraph_durable.recovery",
    "arecover": "langgraph_durable.recovery",
    "astatus_counts": "langgraph_durable.recovery",
    "asubmit": "langgraph_durable.recovery",
    "recover": "langgraph_durable.recovery",
    "status_counts": "langgraph_durable.recovery",
    "submit": "langgraph_durable.recovery",
    "GcReport": "langgraph_durable.ops.retention",
    "RetentionReport": "langgraph_durable.ops.retention",
    "agc": "langgraph_durable.ops.retention",
    "arecompute_refs": "langgraph_durable.ops.retention",
    "aretain": "langgraph_durable.ops.retention",
    "gc": "langgraph_durable.ops.retention",
    "recompute_refs": "langgraph_durable.ops.retention",
    "retain": "langgraph_durable.ops.retention",
    "AsyncDurablePostgresSaver": "langgraph_durable.saver",
    "DurablePostgresSaver": "langgraph_durable.saver",
    "Lease": "langgraph_durable.saver",
    "PoisonRecord": "langgraph_durable.saver",
    "Migration": "langgraph_durable.versioning",
    "MigrationRegistry": "langgraph_durable.versioning",
    "MigrationReport": "langgraph_durable.ops.migrations",
    "amigrate_threads": "langgraph_durable.ops.migrations",
    "aundo_migration": "langgraph_durable.ops.migrations",
    "graph_fingerprint": "langgraph_durable.versioning",
    "migrate_threads": "langgraph_durable.ops.migrations",
    "undo_migration": "langgraph_durable.ops.migrations",
}


# Modules that do not touch LangGraph: loading them needs no compatibility check.
_NO_LANGGRAPH = frozenset({"langgraph_durable.errors", "langgraph_durable.embedded", "langgraph_durable.audit"})
_checked = False


def _check_langgraph() -> None:
    """A LangGraph release that dropped a name the savers rely on is reported as one
    UnsupportedLangGraphError listing them all, not as an ImportError deep in saver.py
    (_compat). Run once, before the first module that imports LangGraph loads."""
    global _checked
    if not _checked:
        from langgraph_durable import _compat

        _compat.check()
        _checked = True


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    if module not in _NO_LANGGRAPH:
        _check_langgraph()
    if module.rsplit(".", 1)[-1] == name:  # a submodule: `from langgraph_durable import poison`
        value: Any = importlib.import_module(module)
    else:
        value = getattr(importlib.import_module(module), name)
    globals()[name] = value  # later lookups skip __getattr__
    return value


if "langgraph" in sys.modules:
    _check_langgraph()


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))


from langgraph_durable._version import __version__ as __version__

# The documented surface: every name a README/docs example uses, the types those
# functions return (``Lease`` from ``lease_for``), and the ``a*`` twin of each sync
# function. Names resolvable from _LAZY but not listed (ArtifactError,
# EmbeddedPostgresError: base/internal errors no example catches) stay importable for
# existing code; ``langgraph_durable.errors`` lists every error.
__all__ = [
    "ArchiveConflictError",
    "ArchiveError",
    "ArchiveIntegrityError",
    "ArchiveVersionError",
    "RestoreReport",
    "arestore",
    "restore",
    "ArtifactConfig",
    "ArtifactIntegrityError",
    "ArtifactNotFoundError",
    "AsyncDurablePostgresSaver",
    "CallInFlightError",
    "CheckpointLoadError",
    "CheckpointNotFoundError",
    "ConfigurationError",
    "DurableError",
    "DurablePostgresSaver",
    "ExportReport",
    "GcReport",
    "GraphVersionMismatchError",
    "IdempotencyConflictError",
    "IdempotencyError",
    "IdempotentCallFailedError",
    "InsufficientPrivilegeError",
    "IdempotentTool",
    "InvalidIdempotencyKeyError",
    "InvalidIdentifierError",
    "InvalidThreadIdError",
    "JournaledRunnable",
    "ReworkBudget",
    "CheckpointPolicy",
    "Ledger",
    "LedgerEntry",
    "LeaseLostError",
    "ClockSkewError",
    "Migration",
    "MigrationError",
    "MigrationRegistry",
    "MigrationReport",
    "NoLedgerError",
    "NotQuarantinedError",
    "OrphanedWorkError",
    "OutcomeUnknownError",
    "PoisonCheckpointError",
    "SchemaNotReadyError",
    "Lease",
    "PoisonRecord",
    "QuarantineEntry",
    "RecoveryResult",
    "RecoveryWorker",
    "RetentionReport",
    "RewindResult",
    "SerializationError",
    "StatementCanceledError",
    "ThreadBusyError",
    "ThreadExistsError",
    "UnencodableValueError",
    "UnstableKeyError",
    "UnsupportedConnectionError",
    "UnsupportedLangGraphError",
    "ThreadReport",
    "WorkerStats",
    "agc",
    "aexport_stock",
    "amigrate_threads",
    "aundo_migration",
    "arecompute_refs",
    "arecover",
    "aretain",
    "astatus_counts",
    "asubmit",
    "apurge_expired_keys",
    "embedded_dsn",
    "gc",
    "graph_fingerprint",
    "idempotent",
    "export_stock",
    "journaled",
    "migrate_threads",
    "poison",
    "audit",
    "purge_expired_keys",
    "recompute_refs",
    "recover",
    "resolve_dsn",
    "retain",
    "status_counts",
    "stop_embedded",
    "submit",
    "undo_migration",
]


# --- config branch --- (the configuration errors, docs/configuration.md)
if TYPE_CHECKING:
    from langgraph_durable.errors import (
        DatabaseUnreachableError,
        DsnMissingError,
        EmbeddedNotInstalledError,
        PoolerMismatchError,
        SchemaMissingError,
    )
__all__ += [
    "DatabaseUnreachableError",
    "DsnMissingError",
    "EmbeddedNotInstalledError",
    "PoolerMismatchError",
    "SchemaMissingError",
]
_LAZY.update(dict.fromkeys(__all__[-5:], "langgraph_durable.errors"))

# The edges' errors (issue 23): acknowledged work lost in a failover, hostile archives.
if TYPE_CHECKING:
    from langgraph_durable.errors import (
        AcknowledgedWorkLostError,
        ArchiveRejectedError,
        ArchiveTooLargeError,
    )
__all__ += ["AcknowledgedWorkLostError", "ArchiveRejectedError", "ArchiveTooLargeError"]
_LAZY.update(dict.fromkeys(__all__[-3:], "langgraph_durable.errors"))

# --- ctl25 --- The operator decisions' errors (issue 25, ops.control).
if TYPE_CHECKING:
    from langgraph_durable.errors import ControlRefusedError, RunCancelledError
__all__ += ["ControlRefusedError", "RunCancelledError"]
_LAZY.update(dict.fromkeys(__all__[-2:], "langgraph_durable.errors"))

# --- standby26 --- (reads off the primary: read_dsn, saver.reader(); docs/configuration.md)
if TYPE_CHECKING:
    from langgraph_durable.core.reader import ReadLag
    from langgraph_durable.errors import ReadDsnUnreachableError, ReadOnlyViewError
    from langgraph_durable.saver import AsyncDurablePostgresReader, DurablePostgresReader
__all__ += ["ReadDsnUnreachableError", "ReadOnlyViewError"]
_LAZY.update(dict.fromkeys(__all__[-2:], "langgraph_durable.errors"))
__all__ += ["AsyncDurablePostgresReader", "DurablePostgresReader"]
_LAZY.update(dict.fromkeys(__all__[-2:], "langgraph_durable.saver"))
__all__ += ["ReadLag"]
_LAZY["ReadLag"] = "langgraph_durable.core.reader"
