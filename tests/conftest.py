"""Shared fixtures: a real PostgreSQL for every test, never a mock.

DSN resolution (session scope): ``LANGGRAPH_DURABLE_TEST_DSN`` if set, else a server on
127.0.0.1:5432 if one answers, else the embedded PostgreSQL. Each test module gets a
fresh database. With ``CI=true`` a missing database is a failure, never a skip.
"""

from __future__ import annotations

import os
import re
import tempfile
import uuid
from collections.abc import Iterator

import psycopg
import pytest
from psycopg import conninfo as ci

LOCAL_DSN = "postgresql://postgres@127.0.0.1:5432/postgres"


def _answers(dsn: str) -> bool:
    try:
        with psycopg.connect(dsn, connect_timeout=3) as conn:
            conn.execute("SELECT 1")
        return True
    except psycopg.Error:
        return False


@pytest.fixture(scope="session")
def admin_dsn() -> Iterator[str]:
    """A DSN with rights to create databases."""
    env = os.environ.get("LANGGRAPH_DURABLE_TEST_DSN")
    if env:
        yield env
        return
    if _answers(LOCAL_DSN):
        yield LOCAL_DSN
        return
    try:
        from langgraph_durable.embedded import embedded_dsn

        home = os.environ.get("LANGGRAPH_DURABLE_TEST_HOME") or tempfile.mkdtemp(prefix="lgd-test-")
        yield embedded_dsn(os.path.join(home, "pgdata"))
    except Exception as exc:  # pragma: no cover - depends on the machine
        if os.environ.get("CI") == "true":
            pytest.fail(f"no PostgreSQL available in CI: {exc}")
        pytest.skip(f"no PostgreSQL available: {exc}")


def make_database(admin_dsn: str, label: str) -> str:
    name = "lgd_" + re.sub(r"[^a-z0-9_]", "_", label.lower())[-30:] + "_" + uuid.uuid4().hex[:8]
    with psycopg.connect(admin_dsn, autocommit=True) as conn:
        conn.execute(psycopg.sql.SQL("CREATE DATABASE {}").format(psycopg.sql.Identifier(name)))
    params = ci.conninfo_to_dict(admin_dsn)
    params["dbname"] = name
    return ci.make_conninfo(**params)


def drop_database(admin_dsn: str, dsn: str) -> None:
    name = ci.conninfo_to_dict(dsn)["dbname"]
    with psycopg.connect(admin_dsn, autocommit=True) as conn:
        conn.execute(
            psycopg.sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(psycopg.sql.Identifier(name))
        )


@pytest.fixture(scope="module")
def dsn(admin_dsn: str, request: pytest.FixtureRequest) -> Iterator[str]:
    """A fresh database for this test module, set up with the package's tables."""
    url = make_database(admin_dsn, request.module.__name__.rsplit(".", 1)[-1])
    from langgraph_durable import DurablePostgresSaver

    with DurablePostgresSaver.from_conn_string(url) as saver:
        saver.setup()
    yield url
    drop_database(admin_dsn, url)


@pytest.fixture
def saver(dsn: str) -> Iterator[object]:
    from langgraph_durable import DurablePostgresSaver

    with DurablePostgresSaver.from_conn_string(dsn) as s:
        yield s


@pytest.fixture
async def asaver(dsn: str):  # type: ignore[no-untyped-def]
    from langgraph_durable import AsyncDurablePostgresSaver

    async with AsyncDurablePostgresSaver.from_conn_string(dsn) as s:
        yield s


# Test files by measured duration, slowest first (serial run, 2-core machine; seconds):
# under ``dev.py test`` xdist hands whole files to workers in collection order (--dist
# loadfile --no-loadscope-reorder), so the long ones start first and the short ones fill in
# at the end instead of one long file starting last. Only the order changes; a file not
# listed keeps its place after these. Refresh with --durations when the list goes stale.
SLOW_FIRST = (
    "test_seams_chaos_regressions.py",  # 55
    "test_recovery.py",  # 49
    "test_pgbouncer.py",  # 45
    "test_granularity.py",  # 45
    "test_model_chaos.py",  # 38
    "test_idempotency_chaos.py",  # 36
    "test_crash_resume.py",  # 34
    "test_demo.py",  # 33
    "test_seams_lease.py",  # 28
    "test_failover.py",  # 28
    "test_value_roundtrip.py",  # 25
    "test_setup_and_connections.py",  # 23
    "test_leases.py",  # 23
    "test_archive.py",  # 23
    "test_journal.py",  # 22
    "test_seams_delete.py",  # 20
    "test_console.py",  # 18
    "test_status_counts.py",  # 15
    "test_bench_reference.py",  # 15
    "test_telemetry.py",  # 14
    "test_studio.py",  # 12
    "test_poison.py",  # 11
    "test_notebook.py",  # 11
)
# --- failover branch ---
SLOW_FIRST += ("test_failover_async.py",)  # 20-45 (one primary + standby, 4 worker processes)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    rank = {name: i for i, name in enumerate(SLOW_FIRST)}
    items.sort(key=lambda item: rank.get(item.path.name, len(rank)))  # stable: files stay whole
