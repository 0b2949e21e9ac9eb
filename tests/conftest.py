"""Shared fixtures: a real PostgreSQL for every test, never a mock.

DSN resolution (session scope): ``LANGGRAPH_DURABLE_TEST_DSN`` if set, else a server on
127.0.0.1:5432 if one answers, else the embedded PostgreSQL. Each test module gets a
fresh database. With ``CI`` set (see ``in_ci``) a missing database is a failure, never a skip.

Skips: one rule, here. A test that needs something the machine may lack (pgbouncer, a
browser, the notebook kernel, Studio, ``unshare``, a standby cluster, PostgreSQL) calls
``require_or_skip(reason)`` (``missing(reason)`` at module level): a skip locally, a
failure in CI. The terminal summary lists what was skipped, by reason, in the last lines.

Mutants (``LGD_MUTANT``, tests/mutants/): the package deliberately broken, to show the
property and chaos tests catch it; see tests/mutants/__init__.py.
"""

from __future__ import annotations

import os
import re
import tempfile
import uuid
from collections.abc import Callable, Iterator
from typing import Any, NoReturn, TypeVar

import psycopg
import pytest
from psycopg import conninfo as ci

F = TypeVar("F", bound=Callable[..., Any])
LOCAL_DSN = "postgresql://postgres@127.0.0.1:5432/postgres"


# The usual truthy spellings of CI=...: GitHub, GitLab and most runners set "true", others
# "1" or "yes"; a missing dependency must fail the run under each of them.
_TRUTHY = frozenset({"true", "1", "yes", "on", "y"})


def in_ci() -> bool:
    """Whether this run is CI (``CI`` truthy, case-insensitive): skips become failures."""
    return os.environ.get("CI", "").strip().lower() in _TRUTHY


def require_or_skip(reason: str, *, module_level: bool = False) -> NoReturn:
    """The one skip rule: ``reason`` names what is missing. CI fails; locally, a skip
    (listed by the terminal summary)."""
    if in_ci():
        pytest.fail(f"CI: {reason} (a skip is not allowed in CI)", pytrace=False)
    pytest.skip(reason, allow_module_level=module_level)


def missing_mark(reason: str | None) -> list[pytest.MarkDecorator]:
    """Marks for a module or test whose dependency may be missing (None: present): a skip
    mark locally; in CI a mark that fails it (``require_or_skip`` at setup)."""
    if reason is None:
        return []
    if in_ci():
        return [pytest.mark.usefixtures("_fail_missing"), pytest.mark.lgd_missing(reason)]
    return [pytest.mark.skip(reason=reason)]


def needs(reason: str | None) -> Callable[[F], F]:
    """A test decorator: ``missing_mark(reason)`` applied (None: the dependency is there)."""

    def apply(fn: F) -> F:
        for mark in missing_mark(reason):
            fn = mark(fn)
        return fn

    return apply


@pytest.fixture
def _fail_missing(request: pytest.FixtureRequest) -> None:
    mark = request.node.get_closest_marker("lgd_missing")
    require_or_skip(mark.args[0] if mark else "a dependency is missing")


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
        require_or_skip(f"no PostgreSQL available: {exc}")


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
# --- standby26 ---
SLOW_FIRST += ("test_read_dsn.py",)  # 26 (one primary + standby, 13 CLI processes)
# --- seal27 branch ---
SLOW_FIRST += ("test_rekey.py",)  # 20 (threads written, a rekey child SIGKILLed, three rekeys)
SLOW_FIRST += ("test_encryption_at_rest.py",)  # 30 (the canary workload, once per mode: plain + 2 serializers)
# --- ctl25 ---
SLOW_FIRST += ("test_control.py",)  # 78 serial (worker processes SIGKILLed, cancels across processes)
# --- ui25 ---
SLOW_FIRST += ("test_console_walk.py",)  # ~50 (a worker process, Chromium, a 12 s run cancelled and resumed)
# --- revread ---
SLOW_FIRST += ("test_read_dsn_review.py",)  # 14-25 (two primary + standby pairs, pgbouncer)
# --- rev27 ---
SLOW_FIRST += ("test_encryption_paths.py",)  # 42 serial (two canary workloads, a rekey child SIGKILLed, rekeys beside runs)
# --- rev25 ---
SLOW_FIRST += ("test_review25.py",)  # 22 serial (a run SIGKILLed after a cancel, gated runs, forks racing)
# --- digest27 branch ---
SLOW_FIRST += ("test_digest_secret.py",)  # 35 (9 graph child processes, 4 SIGKILLed; a rekey)

# The newest slow files (78, 50, 42 s serial) ahead of the older ones: a file started
# last on its worker sets the wall time of the run.
_NEWEST_SLOW = ("test_control.py", "test_console_walk.py", "test_encryption_paths.py")
SLOW_FIRST = _NEWEST_SLOW + tuple(n for n in SLOW_FIRST if n not in _NEWEST_SLOW)

def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "collect_mode(env): collected only when the env variable is 1")
    config.addinivalue_line("markers", "lgd_missing(reason): a missing dependency, a failure in CI")
    if os.environ.get("LGD_MUTANT"):
        import mutants

        mutants.apply(os.environ["LGD_MUTANT"])


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    # A test that only means something in a collect mode (e.g. LGD_VALUE_COLLECT=1: fail
    # once listing every failure found) is not collected otherwise: never a pass that
    # checked nothing.
    off = [i for i in items if (m := i.get_closest_marker("collect_mode")) and os.environ.get(m.args[0]) != "1"]
    if off:
        config.hook.pytest_deselected(items=off)
        items[:] = [i for i in items if i not in off]
    rank = {name: i for i, name in enumerate(SLOW_FIRST)}
    items.sort(key=lambda item: rank.get(item.path.name, len(rank)))  # stable: files stay whole


def pytest_terminal_summary(terminalreporter: Any, exitstatus: int, config: pytest.Config) -> None:
    """The last lines say what did not run: every skip, grouped by reason (which
    dependency was missing), with its files. ``python3 dev.py test`` ends with it."""
    reasons: dict[str, set[str]] = {}
    count: dict[str, int] = {}
    for rep in terminalreporter.stats.get("skipped", []):
        reason = rep.longrepr[2] if isinstance(rep.longrepr, tuple) else str(rep.longrepr)
        reason = reason.removeprefix("Skipped: ")
        reasons.setdefault(reason, set()).add(rep.nodeid.split("::", 1)[0])
        count[reason] = count.get(reason, 0) + 1
    if not reasons:
        terminalreporter.write_line("skipped parts: none")
        return
    terminalreporter.write_sep("=", f"skipped parts ({sum(count.values())} tests; CI would fail them)")
    for reason in sorted(reasons):
        files = ", ".join(sorted(reasons[reason]))
        terminalreporter.write_line(f"SKIPPED {count[reason]:4d} x {reason[:160]}  [{files[:200]}]")
