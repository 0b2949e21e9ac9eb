"""Everything through a real PgBouncer 1.18 in transaction pooling mode (no prepared
statement support, search_path not carried between server connections): LangGraph's
conformance suite, the SIGKILL crash-resume test, the multi-worker SIGKILL chaos test,
a workload with @idempotent (plain and transactional), a worker, retention and GC, and
the CLI's read commands. The savers run with ``LANGGRAPH_DURABLE_POOLER=transaction``
(the documented switch; children inherit it). Skipped where pgbouncer is not installed,
a failure with CI=true."""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest
import test_crash_resume
from _pgbouncer import pgbouncer, require_pgbouncer
from _workload import EFFECTS_DDL, check_workload, run_workload
from conftest import drop_database, make_database
from psycopg import sql

# Reused as they are, with this module's ``dsn`` (through the pooler).
from test_conformance import test_conformance_async  # noqa: F401
from test_crash_resume import crash_db, reference, test_sigkill_at_random_moments_then_resume  # noqa: F401
from test_recovery import _clear_hooks, db, test_three_workers_recover_30_threads_under_sigkill  # noqa: F401
from typer.testing import CliRunner

from langgraph_durable import ConfigurationError, DurablePostgresSaver
from langgraph_durable.cli import app
from langgraph_durable.errors import PoolerMismatchError

SITE = str(Path(__file__).parent / "_pgbouncer_site")
# psycopg's own connect(), whatever this module patches later.
_ORIGINAL_CONNECT = {cls: cls.__dict__["connect"] for cls in (psycopg.Connection, psycopg.AsyncConnection)}


@pytest.fixture(scope="module")
def direct_dsn(admin_dsn: str) -> Iterator[str]:
    require_pgbouncer()
    url = make_database(admin_dsn, "pgbouncer")
    yield url
    drop_database(admin_dsn, url)


def _wait_backends_idle(conn: psycopg.Connection[Any], run_no: int) -> None:
    """test_crash_resume.wait_backends_gone behind a pooler: the server connections
    outlive the killed client (they return to the pool, keeping its application_name,
    which the next client of the pool may inherit: this very query's backend, for
    one); wait until none of them is still in the killed child's transaction
    (pgbouncer closes such a one)."""
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        row = conn.execute(
            "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
            "AND application_name = %s AND state <> 'idle' AND pid <> pg_backend_pid()",
            (f"crash_child_{run_no}",),
        ).fetchone()
        if row is not None and row[0] == 0:
            return
        time.sleep(0.02)
    pytest.fail(f"backends of crash child {run_no} still busy after 30 s")


def _no_prepare_by_default() -> Any:
    """This process's own raw connections (the tests' checks), as the children's (see
    _pgbouncer_site/sitecustomize.py): ``prepare_threshold=None`` unless given.
    Returns the undo."""
    saved = {cls: cls.__dict__["connect"] for cls in _ORIGINAL_CONNECT}
    for cls, orig in _ORIGINAL_CONNECT.items():
        func = orig.__func__

        def connect(klass: Any, *args: Any, __f: Any = func, **kwargs: Any) -> Any:
            kwargs.setdefault("prepare_threshold", None)
            return __f(klass, *args, **kwargs)

        cls.connect = classmethod(connect)  # type: ignore[method-assign,assignment]
    saved_alias = psycopg.connect  # psycopg.connect is Connection.connect, bound at import
    psycopg.connect = psycopg.Connection.connect  # type: ignore[assignment]

    def undo() -> None:
        for cls, orig in saved.items():
            cls.connect = orig  # type: ignore[method-assign]
        psycopg.connect = saved_alias  # type: ignore[assignment]

    return undo


@pytest.fixture(scope="module")
def dsn(direct_dsn: str) -> Iterator[str]:
    """The module's database through pgbouncer, set up through it (pooled setup)."""
    saved_env = {k: os.environ.get(k) for k in ("LANGGRAPH_DURABLE_POOLER", "PYTHONPATH")}
    saved_wait = test_crash_resume.wait_backends_gone
    with pgbouncer(direct_dsn, pool_size=40) as through:
        os.environ["LANGGRAPH_DURABLE_POOLER"] = "transaction"
        os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (SITE, saved_env["PYTHONPATH"]) if p)
        undo = _no_prepare_by_default()
        test_crash_resume.wait_backends_gone = _wait_backends_idle
        try:
            with DurablePostgresSaver.from_conn_string(through) as saver:
                saver.setup()
            with psycopg.connect(through, autocommit=True) as conn:
                conn.execute(EFFECTS_DDL)
            yield through
        finally:
            test_crash_resume.wait_backends_gone = saved_wait
            undo()
            for k, v in saved_env.items():
                if v is None:
                    os.environ.pop(k, None)
                else:
                    os.environ[k] = v


def test_package_connections_never_prepare(dsn: str) -> None:
    """Every connection the package opens pooled has prepare_threshold None, passed by
    the package itself: checked with psycopg's own default (5) restored."""
    wrapped = {cls: cls.__dict__["connect"] for cls in _ORIGINAL_CONNECT}
    for cls, orig in _ORIGINAL_CONNECT.items():
        cls.connect = orig  # type: ignore[method-assign]
    try:
        with psycopg.Connection.connect(dsn, autocommit=True) as plain:
            assert plain.prepare_threshold == 5  # psycopg's default is really back
        with DurablePostgresSaver.from_conn_string(dsn) as saver:
            assert saver.pooler == "transaction"
            with saver.connection() as conn:
                assert conn.prepare_threshold is None
            with saver._renew_connect() as conn:
                assert conn.prepare_threshold is None
            from langgraph_durable.idempotency import _prepare_threshold

            assert _prepare_threshold(saver) is None
        with psycopg.Connection.connect(dsn, autocommit=True) as own:
            DurablePostgresSaver(own, pooler="transaction")
            assert own.prepare_threshold is None
        from psycopg_pool import ConnectionPool

        with ConnectionPool(dsn, kwargs={"autocommit": True}, min_size=1, open=True) as pool:
            with pytest.raises(ConfigurationError, match="prepare_threshold"):
                DurablePostgresSaver(pool, pooler="transaction")
    finally:
        for cls, orig in wrapped.items():
            cls.connect = orig  # type: ignore[method-assign]


def test_workload_through_pgbouncer(dsn: str) -> None:
    out = run_workload(dsn)
    check_workload(out)
    print("pgbouncer workload:", out["worker"], "retained", out["retained"].threads_deleted)


def test_cli_read_commands_through_pgbouncer(dsn: str) -> None:
    run_workload(dsn)
    runner = CliRunner()
    for args in (["threads", "list"], ["stats"], ["ledger", "list"], ["quarantine", "list"],
                 ["versions", "list"], ["threads", "status"]):
        res = runner.invoke(app, [*args, "--dsn", dsn])
        assert res.exit_code == 0, (args, res.output)
    res = runner.invoke(app, ["ledger", "list", "--dsn", dsn, "--json"])
    assert res.exit_code == 0 and '"key"' in res.output, res.output


def test_without_pooler_mode_pgbouncer_breaks(dsn: str) -> None:
    """The regression: the saver as it was (prepare_threshold=0, no pooler option)
    fails through a transaction pooler once a statement is prepared; forced with
    pooler="none" (else from_conn_string detects the pooler), the clash is a typed
    PoolerMismatchError naming the setting (tests/test_config_fail_fast.py)."""
    with DurablePostgresSaver.from_conn_string(dsn, pooler="none") as saver:
        assert saver.pooler is None
        with pytest.raises(PoolerMismatchError) as info:
            for i in range(50):
                saver.get_tuple({"configurable": {"thread_id": f"nope-{i}"}})
    assert isinstance(
        info.value.__cause__,
        psycopg.errors.DuplicatePreparedStatement | psycopg.errors.InvalidSqlStatementName,
    )


def test_schema_behind_pooler_needs_the_roles_search_path(dsn: str, direct_dsn: str) -> None:
    """schema= behind a pooler: a session SET search_path would leak; the saver refuses
    with the ALTER ROLE to run, and works once the role's default names the schema."""
    with DurablePostgresSaver.from_conn_string(dsn, schema="bouncer_s") as saver:
        with pytest.raises(ConfigurationError, match="ALTER ROLE"):
            saver.setup()
    dbname = psycopg.conninfo.conninfo_to_dict(direct_dsn)["dbname"]
    with psycopg.connect(direct_dsn, autocommit=True) as conn:
        conn.execute(
            sql.SQL("ALTER ROLE postgres IN DATABASE {} SET search_path = bouncer_s, public").format(
                sql.Identifier(dbname)
            )
        )
        conn.execute("CREATE SCHEMA IF NOT EXISTS bouncer_s")
        conn.execute("CREATE TABLE bouncer_s.wl_effects (k TEXT PRIMARY KEY, n INT NOT NULL)")
    try:
        # Fresh server connections get the role's setting: a new pgbouncer pool.
        with pgbouncer(direct_dsn) as through:
            out = run_workload(through, schema="bouncer_s")
            check_workload(out)
            with psycopg.connect(direct_dsn) as conn:
                n = conn.execute("SELECT count(*) FROM bouncer_s.checkpoints").fetchone()
                assert n is not None and n[0] >= 0
                assert conn.execute("SELECT to_regclass('bouncer_s.durable_threads')").fetchone() != (None,)
    finally:
        with psycopg.connect(direct_dsn, autocommit=True) as conn:
            conn.execute(
                sql.SQL("ALTER ROLE postgres IN DATABASE {} RESET search_path").format(sql.Identifier(dbname))
            )


def test_pooler_option_values(monkeypatch: pytest.MonkeyPatch) -> None:
    """One switch: the option, else $LANGGRAPH_DURABLE_POOLER; anything else is refused."""
    from langgraph_durable.pooler import POOLER_ENV, resolve_pooler

    monkeypatch.delenv(POOLER_ENV, raising=False)
    assert resolve_pooler(None) is None
    assert resolve_pooler("transaction") == "transaction"
    monkeypatch.setenv(POOLER_ENV, "Transaction")
    assert resolve_pooler(None) == "transaction"
    assert resolve_pooler("none") is None  # the option wins over the environment
    with pytest.raises(ConfigurationError) as info:
        resolve_pooler("session-ish")
    assert info.value.pooler == "session-ish"


def test_concurrent_setup_through_pgbouncer_and_direct(admin_dsn: str, dsn: str) -> None:
    """Fresh database, six setup() calls at once: four through the pooler (transaction
    lock, one transaction each), two direct (session lock, CONCURRENTLY). The two locks
    share one key, so exactly one runs each migration; everyone returns."""
    import threading

    url = make_database(admin_dsn, "pgb_setup_race")
    try:
        with pgbouncer(url) as through:
            errors: list[BaseException] = []
            barrier = threading.Barrier(6)

            def run(target: str, pooler: str) -> None:
                try:
                    with DurablePostgresSaver.from_conn_string(target, pooler=pooler) as saver:
                        barrier.wait()
                        saver.setup()
                except BaseException as exc:  # reported below
                    errors.append(exc)

            workers = [threading.Thread(target=run, args=(through, "transaction")) for _ in range(4)]
            workers += [threading.Thread(target=run, args=(url, "none")) for _ in range(2)]
            for w in workers:
                w.start()
            for w in workers:
                w.join(120)
            assert errors == [] and not any(w.is_alive() for w in workers)
        from langgraph_durable.sql import schema as _sql

        with psycopg.connect(url) as conn:
            rows = conn.execute("SELECT v FROM durable_migrations ORDER BY v").fetchall()
            assert [r[0] for r in rows] == list(range(len(_sql.MIGRATIONS)))
            # No session lock left behind by anyone (pg_locks is cluster-wide: this database).
            held = conn.execute(
                "SELECT count(*) FROM pg_locks l JOIN pg_database d ON d.oid = l.database "
                "WHERE l.locktype = 'advisory' AND d.datname = current_database()"
            ).fetchone()
            assert held == (0,)
    finally:
        drop_database(admin_dsn, url)
