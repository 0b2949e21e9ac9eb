"""langgraph-durable: a drop-in durable checkpointer for LangGraph on Postgres."""

from langgraph_durable.artifacts import ArtifactConfig
from langgraph_durable.embedded import embedded_dsn, resolve_dsn, stop_embedded
from langgraph_durable.errors import (
    ArtifactError,
    ArtifactIntegrityError,
    ArtifactNotFoundError,
    CallInFlightError,
    CheckpointLoadError,
    ConfigurationError,
    DurableError,
    EmbeddedPostgresError,
    GraphVersionMismatchError,
    IdempotencyConflictError,
    IdempotencyError,
    InvalidIdentifierError,
    LeaseLostError,
    MigrationError,
    NoLedgerError,
    OutcomeUnknownError,
    PoisonCheckpointError,
    SerializationError,
    ThreadBusyError,
)
from langgraph_durable.saver import AsyncDurablePostgresSaver, DurablePostgresSaver, PoisonRecord
from langgraph_durable.versioning import MigrationRegistry, graph_fingerprint

__version__ = "0.1.0"

__all__ = [
    "ArtifactConfig",
    "ArtifactError",
    "ArtifactIntegrityError",
    "ArtifactNotFoundError",
    "AsyncDurablePostgresSaver",
    "CallInFlightError",
    "CheckpointLoadError",
    "ConfigurationError",
    "DurableError",
    "DurablePostgresSaver",
    "EmbeddedPostgresError",
    "GraphVersionMismatchError",
    "IdempotencyConflictError",
    "IdempotencyError",
    "InvalidIdentifierError",
    "LeaseLostError",
    "MigrationError",
    "MigrationRegistry",
    "NoLedgerError",
    "OutcomeUnknownError",
    "PoisonCheckpointError",
    "PoisonRecord",
    "SerializationError",
    "ThreadBusyError",
    "embedded_dsn",
    "graph_fingerprint",
    "resolve_dsn",
    "stop_embedded",
]
