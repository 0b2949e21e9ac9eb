"""The saver's options, in typed groups with their validation.

The two savers keep flat, explicit keyword-only parameters (``lease_ttl=...``,
``version_policy=...``: what users write and what the stock savers' callers expect);
``SaverOptions.from_keywords`` turns them into these groups, each of which validates
itself, and ``_DurableBase.__init__`` takes the groups. Constructing a group directly
validates it the same way (``LeaseOptions(ttl=0.1)`` raises ``ConfigurationError``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Literal

from langgraph_durable.artifacts import ArtifactConfig
from langgraph_durable.errors import ConfigurationError
from langgraph_durable.sql.schema import validate_schema

if TYPE_CHECKING:
    from langgraph_durable.granularity import CheckpointPolicy
    from langgraph_durable.quarantine import PoisonHook
    from langgraph_durable.versioning import MigrationRegistry, UnversionedPolicy, VersionPolicy

# What a run start on a thread another live run holds does.
OnBusy = Literal["raise", "wait"]
# What a root run start the saver did not recognise does (see lifecycle._unrecognised_run).
OnUnrecognisedRun = Literal["raise", "log"]


@dataclass(frozen=True)
class VersionOptions:
    """Graph versions: the version stamped on checkpoints (``None``: the graph's
    fingerprint), what a run start on a thread of another version does, and the
    registered migrations."""

    graph_version: str | None = None
    policy: VersionPolicy = "refuse"
    unversioned_policy: UnversionedPolicy = "adopt"
    migrations: MigrationRegistry | None = None

    def __post_init__(self) -> None:
        # The policy list lives with the version gate (versioning sits above config).
        from langgraph_durable.versioning import VERSION_POLICIES

        if self.policy not in VERSION_POLICIES:
            raise ConfigurationError(f"unknown version_policy {self.policy!r}")
        if self.unversioned_policy not in ("adopt", "refuse"):
            raise ConfigurationError(f"unknown unversioned_policy {self.unversioned_policy!r}")


@dataclass(frozen=True)
class LeaseOptions:
    """Leases: on (``enabled``) or off, their time to live, what a run start on a busy
    thread does, dead-owner takeover, and what an unrecognised run start does."""

    enabled: bool = True
    ttl: float = 30.0
    on_busy: OnBusy = "raise"
    busy_timeout: float = 60.0
    takeover_dead_owners: bool = True
    on_unrecognised_run: OnUnrecognisedRun = "raise"

    def __post_init__(self) -> None:
        if self.on_busy not in ("raise", "wait"):
            raise ConfigurationError(f"unknown on_busy {self.on_busy!r}")
        if self.on_unrecognised_run not in ("raise", "log"):
            raise ConfigurationError(
                f"unknown on_unrecognised_run {self.on_unrecognised_run!r} (use 'raise' or 'log')",
                on_unrecognised_run=self.on_unrecognised_run,
            )
        if self.ttl <= 0.5:
            raise ConfigurationError("lease_ttl must be above 0.5 s")


@dataclass(frozen=True)
class PoisonOptions:
    """Poison detection: failed runs from one checkpoint before the thread is
    quarantined, and the hook told when it is."""

    max_resume_attempts: int = 3
    on_poison: PoisonHook | None = None

    def __post_init__(self) -> None:
        if self.max_resume_attempts < 1:
            raise ConfigurationError("max_resume_attempts must be >= 1")


# --- standby26 --- reads off the primary (core/reader.py)
# Seconds behind above which read commands warn (or read the primary with read_fallback).
DEFAULT_MAX_LAG = 10.0


@dataclass(frozen=True)
class ReadOptions:
    """``read_dsn`` (a streaming standby for operator reads; None: the primary),
    ``read_max_lag`` (seconds), ``read_fallback`` (read the primary above it)."""

    dsn: str | None = None
    max_lag: float = DEFAULT_MAX_LAG
    fallback: bool = False

    def __post_init__(self) -> None:
        if self.dsn is not None and not isinstance(self.dsn, str):
            raise ConfigurationError(
                f"read_dsn must be a connection string, not {type(self.dsn).__name__}",
                read_dsn=repr(self.dsn),
            )
        object.__setattr__(self, "dsn", (self.dsn or "").strip() or None)
        try:
            lag = float(self.max_lag)
        except (TypeError, ValueError):
            lag = math.nan
        if not lag >= 0 or math.isinf(lag):
            raise ConfigurationError(
                f"read_max_lag must be a number of seconds >= 0, not {self.max_lag!r}",
                read_max_lag=self.max_lag,
            )
        object.__setattr__(self, "max_lag", lag)
        if not isinstance(self.fallback, bool):
            raise ConfigurationError(
                f"read_fallback must be a bool, not {self.fallback!r}", read_fallback=self.fallback
            )


@dataclass(frozen=True)
class SaverOptions:
    """Every option of a saver: the groups, and the few that stand alone."""

    schema: str | None = None
    pooler: str | None = None
    run_migrations: bool = True
    checkpoint_policy: CheckpointPolicy | None = None
    versions: VersionOptions = field(default_factory=VersionOptions)
    poison: PoisonOptions = field(default_factory=PoisonOptions)
    leases: LeaseOptions = field(default_factory=LeaseOptions)
    artifacts: ArtifactConfig = field(default_factory=ArtifactConfig)
    # Channel versions in the compact form (issue 26, _chanver); False: the stock form.
    compact_versions: bool = True
    reads: ReadOptions = field(default_factory=ReadOptions)

    def __post_init__(self) -> None:
        validate_schema(self.schema)

    @classmethod
    def from_keywords(
        cls,
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
    ) -> SaverOptions:
        """The groups for the savers' flat keyword options (same names, same defaults).
        Validated group by group: schema, versions, poison, leases, artifacts."""
        validate_schema(schema)
        versions = VersionOptions(graph_version, version_policy, unversioned_policy, migrations)
        poison = PoisonOptions(max_resume_attempts, on_poison)
        lease_options = LeaseOptions(
            leases, lease_ttl, on_busy, busy_timeout, takeover_dead_owners, on_unrecognised_run
        )
        return cls(
            schema=schema,
            pooler=pooler,
            run_migrations=run_migrations,
            checkpoint_policy=checkpoint_policy,
            versions=versions,
            poison=poison,
            leases=lease_options,
            artifacts=ArtifactConfig(
                threshold=artifact_threshold,
                compression_level=compression_level,
                cache_bytes=artifact_cache_bytes,
            ),
            compact_versions=compact_versions,
            reads=ReadOptions(read_dsn, read_max_lag, read_fallback),
        )


__all__ = [
    "LeaseOptions", "OnBusy", "OnUnrecognisedRun", "PoisonOptions", "ReadOptions", "SaverOptions",
    "VersionOptions",
]
