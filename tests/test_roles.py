"""Least privilege with real roles: an owner runs setup(), an application role with
only the printed GRANTs runs a leased graph, @idempotent (plain and transactional), a
worker and retention/GC with run_migrations=False; a read-only role runs the CLI's
read commands (no DDL) and gets a typed error on a write."""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import psycopg
import pytest
from _workload import check_workload, run_workload
from conftest import drop_database, make_database
from psycopg import conninfo as ci
from psycopg import sql
from typer.testing import CliRunner

from langgraph_durable import DurablePostgresSaver
from langgraph_durable.cli import app
from langgraph_durable.errors import InsufficientPrivilegeError, SchemaNotReadyError
from langgraph_durable.grants import grant_statements

SCHEMA = "lgd_app"


@pytest.fixture(scope="module")
def roles(admin_dsn: str) -> Iterator[dict[str, str]]:
    tag = uuid.uuid4().hex[:8]
    names = {k: f"lgd_{k}_{tag}" for k in ("owner", "app", "ro")}
    url = make_database(admin_dsn, "roles")
    dbname = ci.conninfo_to_dict(url)["dbname"]
    with psycopg.connect(admin_dsn, autocommit=True) as conn:
        for n in names.values():
            conn.execute(sql.SQL("CREATE ROLE {} LOGIN").format(sql.Identifier(n)))
        conn.execute(sql.SQL("GRANT CREATE ON DATABASE {} TO {}").format(
            sql.Identifier(dbname), sql.Identifier(names["owner"])))
    dsns = {k: ci.make_conninfo(url, user=n) for k, n in names.items()}
    try:
        yield {**dsns, **{f"{k}_role": n for k, n in names.items()}, "url": url}
    finally:
        drop_database(admin_dsn, url)
        with psycopg.connect(admin_dsn, autocommit=True) as conn:
            for n in names.values():
                conn.execute(sql.SQL("DROP ROLE IF EXISTS {}").format(sql.Identifier(n)))


def test_roles_end_to_end(roles: dict[str, str]) -> None:
    # Before setup, a process that must not migrate gets a typed error, no DDL.
    with DurablePostgresSaver.from_conn_string(roles["app"], schema=SCHEMA, run_migrations=False) as saver:
        with pytest.raises(SchemaNotReadyError) as info:
            saver.setup()
        assert info.value.found is None and info.value.component == "checkpoint"
    # The application role cannot run setup's DDL: typed, not a psycopg error.
    with DurablePostgresSaver.from_conn_string(roles["app"], schema=SCHEMA) as saver:
        with pytest.raises(InsufficientPrivilegeError) as denied:
            saver.setup()
        assert denied.value.role == roles["app_role"]
        assert isinstance(denied.value.__cause__, psycopg.errors.InsufficientPrivilege)

    res = CliRunner().invoke(app, ["setup", "--dsn", roles["owner"], "--schema", SCHEMA])
    assert res.exit_code == 0, res.output
    app_grants = CliRunner().invoke(app, ["grants", "--role", roles["app_role"], "--schema", SCHEMA])
    ro_grants = CliRunner().invoke(
        app, ["grants", "--role", roles["ro_role"], "--schema", SCHEMA, "--readonly"]
    )
    assert app_grants.exit_code == 0 and ro_grants.exit_code == 0
    assert app_grants.output.strip().splitlines() == grant_statements(roles["app_role"], schema=SCHEMA)
    with psycopg.connect(roles["owner"], autocommit=True) as conn:
        conn.execute(f"CREATE TABLE {SCHEMA}.wl_effects (k TEXT PRIMARY KEY, n INT NOT NULL)")
        conn.execute(sql.SQL("GRANT SELECT, INSERT, UPDATE ON {}.wl_effects TO {}").format(
            sql.Identifier(SCHEMA), sql.Identifier(roles["app_role"])))
        for stmt in (app_grants.output + ro_grants.output).strip().splitlines():
            conn.execute(stmt)

    out = run_workload(roles["app"], schema=SCHEMA, run_migrations=False)
    check_workload(out)
    # The application role still cannot alter the schema.
    with psycopg.connect(roles["app"], autocommit=True) as conn, pytest.raises(psycopg.errors.InsufficientPrivilege):
        conn.execute(f"CREATE TABLE {SCHEMA}.nope (x int)")

    runner = CliRunner()
    # Every read-only command: the role has no CREATE right and SELECT only, so any DDL
    # (or any write) on the way would fail the command.
    for args in (["threads", "list"], ["stats"], ["ledger", "list"], ["quarantine", "list"],
                 ["versions", "list"], ["threads", "status"], ["versions", "log"]):
        res = runner.invoke(app, [*args, "--dsn", roles["ro"], "--schema", SCHEMA])
        assert res.exit_code == 0, (args, res.output)
    # Retention deleted the workload's threads: the per-thread read commands open the
    # saver (no DDL) and then report the missing thread, not a privilege error.
    for args in (["threads", "show", "wl-gone"], ["threads", "history", "wl-gone"]):
        res = runner.invoke(app, [*args, "--dsn", roles["ro"], "--schema", SCHEMA])
        assert res.exit_code == 1 and "'wl-gone' not found" in res.output, (args, res.output)
    res = runner.invoke(app, ["ledger", "list", "--dsn", roles["ro"], "--schema", SCHEMA, "--json"])
    assert res.exit_code == 0 and '"key"' in res.output, res.output
    # A write as the read-only role: a typed error naming the role, exit 1.
    run = out["threads"][0].rsplit("-", 1)[0]
    res = runner.invoke(
        app, ["ledger", "forget", f"pay:{run}-0", "--dsn", roles["ro"], "--schema", SCHEMA, "--json"]
    )
    assert res.exit_code == 1 and "InsufficientPrivilegeError" in res.output, res.output
    assert roles["ro_role"] in res.output


async def test_async_saver_as_app_role_runs_no_ddl(roles: dict[str, str]) -> None:
    """After test_roles_end_to_end: the async saver with run_migrations=False verifies
    the schema and serves reads as the application role."""
    from langgraph_durable import AsyncDurablePostgresSaver

    async with AsyncDurablePostgresSaver.from_conn_string(
        roles["app"], schema=SCHEMA, run_migrations=False
    ) as saver:
        await saver.setup()
        assert await saver.aget_tuple({"configurable": {"thread_id": "nope"}}) is None
