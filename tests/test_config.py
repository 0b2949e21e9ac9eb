"""config.py: the typed option groups validate themselves, and the savers' flat keyword
options map onto them one to one (no database needed)."""

from __future__ import annotations

import inspect
from typing import Any

import pytest

from langgraph_durable import ArtifactConfig, ConfigurationError, DurablePostgresSaver
from langgraph_durable.config import LeaseOptions, PoisonOptions, SaverOptions, VersionOptions
from langgraph_durable.errors import InvalidIdentifierError
from langgraph_durable.versioning import MigrationRegistry


@pytest.mark.parametrize(
    ("make", "needle"),
    [
        (lambda: VersionOptions(policy="sometimes"), "version_policy"),  # type: ignore[arg-type]
        (lambda: VersionOptions(unversioned_policy="maybe"), "unversioned_policy"),  # type: ignore[arg-type]
        (lambda: LeaseOptions(on_busy="queue"), "on_busy"),  # type: ignore[arg-type]
        (lambda: LeaseOptions(on_unrecognised_run="ignore"), "on_unrecognised_run"),  # type: ignore[arg-type]
        (lambda: LeaseOptions(ttl=0.5), "lease_ttl"),
        (lambda: PoisonOptions(max_resume_attempts=0), "max_resume_attempts"),
        (lambda: SaverOptions.from_keywords(compression_level=99), "compression_level"),
        (lambda: SaverOptions.from_keywords(lease_ttl=0.1), "lease_ttl"),
    ],
)
def test_each_group_refuses_a_bad_value(make: Any, needle: str) -> None:
    with pytest.raises(ConfigurationError, match=needle):
        make()


def test_schema_is_validated_in_both_ways_of_building() -> None:
    with pytest.raises(InvalidIdentifierError):
        SaverOptions(schema="bad-name;")
    with pytest.raises(InvalidIdentifierError):
        SaverOptions.from_keywords(schema="pg_catalog")
    assert SaverOptions.from_keywords(schema="tenant_1").schema == "tenant_1"


def test_flat_keywords_land_in_their_groups() -> None:
    hook = print
    registry = MigrationRegistry()
    opts = SaverOptions.from_keywords(
        graph_version="v2", version_policy="warn", unversioned_policy="refuse",
        migrations=registry, max_resume_attempts=5, on_poison=hook, lease_ttl=12.5,
        on_busy="wait", busy_timeout=3.0, artifact_threshold=None, compression_level=7,
        artifact_cache_bytes=1024, leases=False, takeover_dead_owners=False,
        on_unrecognised_run="log", pooler="pgbouncer", run_migrations=False,
        checkpoint_policy="always",
    )
    assert opts.versions == VersionOptions("v2", "warn", "refuse", registry)
    assert opts.poison == PoisonOptions(5, hook)
    assert opts.leases == LeaseOptions(False, 12.5, "wait", 3.0, False, "log")
    assert opts.artifacts == ArtifactConfig(threshold=None, compression_level=7, cache_bytes=1024)
    assert (opts.pooler, opts.run_migrations, opts.checkpoint_policy) == ("pgbouncer", False, "always")


def test_group_defaults_are_the_savers_defaults() -> None:
    """SaverOptions() (what _DurableBase uses when given no options) is exactly what the
    savers build from their default keyword values."""
    defaults = {
        n: p.default
        for n, p in inspect.signature(DurablePostgresSaver.__init__).parameters.items()
        if p.kind is p.KEYWORD_ONLY
    }
    assert SaverOptions.from_keywords(**defaults) == SaverOptions()
