"""What a newcomer met on a fresh install (issue 24, second pass): each test reproduces one
finding of the newcomer24 review, on real PostgreSQL and real CLI processes.

- ``langgraph-durable ui`` without the console extra printed the install hint through
  rich markup, so ``[console]`` vanished: "pip install 'langgraph-durable'".
- ``threads list --json`` (and the other ``threads`` commands) printed a connection error
  as red text on stderr and nothing on stdout, where ``ledger list --json`` prints the
  error as JSON: a script reading stdout saw an empty document.
- A pool the user opened (prepared statements on, as psycopg's default) behind a
  transaction pooler: a statement bound to another client's ``_pg3_N`` came back as a raw
  ``psycopg.errors.ProtocolViolation`` ("bind message supplies 6 parameters, but prepared
  statement "_pg3_3" requires 14"), not ``PoolerMismatchError`` naming the setting.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from typing import TypedDict

import psycopg
import pytest
from langgraph.graph import START, StateGraph
from psycopg.rows import dict_row
from psycopg_pool import ConnectionPool

from langgraph_durable import DurablePostgresSaver
from langgraph_durable.errors import PoolerMismatchError

REFUSED = "postgresql://postgres@127.0.0.1:1/nowhere"  # port 1: nothing listens there


def _cli(*args: str, env: dict[str, str] | None = None, pre: str = "") -> subprocess.CompletedProcess[str]:
    code = f"{pre}\nimport sys\nfrom langgraph_durable.cli import main\nsys.argv = ['langgraph-durable', *{list(args)!r}]\nmain()"
    full_env = {k: v for k, v in os.environ.items() if k != "LANGGRAPH_DURABLE_DSN"}
    full_env.update(env or {})
    full_env["COLUMNS"] = "200"
    return subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, env=full_env
    )


def test_ui_without_the_console_extra_names_the_extra() -> None:
    # uvicorn made unimportable, as in an install without [console].
    res = _cli("ui", "--dsn", REFUSED, pre="import sys; sys.modules['uvicorn'] = None")
    assert res.returncode == 1, res.stderr
    assert "pip install 'langgraph-durable[console]'" in res.stderr, res.stderr
    assert "Traceback" not in res.stderr


@pytest.mark.parametrize("command", [["threads", "list"], ["threads", "status"]])
def test_threads_json_reports_a_connection_error_as_json(command: list[str]) -> None:
    res = _cli(*command, "--json", "--dsn", REFUSED)
    assert res.returncode == 1, res.stderr
    assert res.stdout.strip(), f"nothing on stdout; stderr: {res.stderr}"
    doc = json.loads(res.stdout)
    assert doc["error"] == "DatabaseUnreachableError" and doc["kind"] == "refused", doc


class S(TypedDict, total=False):
    n: int


def _graph() -> StateGraph:
    g = StateGraph(S)
    g.add_node("a", lambda s: {"n": s.get("n", 0) + 1})
    g.add_edge(START, "a")
    return g


def test_a_foreign_prepared_statement_in_a_user_pool_is_a_pooler_mismatch(dsn: str) -> None:
    """What a transaction pooler does to a client that prepares statements: its next
    statement lands on a server connection where ``_pg3_N`` is another client's. Done here
    on one real connection: after a first run has prepared the saver's statements,
    another client's statements (31 parameters: none of the saver's has that many) take
    their names, as they would on a pooler's shared server connection."""
    pool = ConnectionPool(
        dsn,
        kwargs={"autocommit": True, "row_factory": dict_row, "prepare_threshold": 0},
        min_size=1, max_size=1, open=True,
    )
    try:
        saver = DurablePostgresSaver(pool)
        saver.setup()
        graph = _graph().compile(checkpointer=saver)
        graph.invoke({"n": 0}, {"configurable": {"thread_id": "warm"}})
        foreign = "SELECT " + ", ".join(f"${i}::text" for i in range(1, 32))
        with pool.connection() as conn:
            conn.pgconn.exec_(b"DEALLOCATE ALL")
            for i in range(200):
                res = conn.pgconn.prepare(f"_pg3_{i}".encode(), foreign.encode())
                assert res.status == psycopg.pq.ExecStatus.COMMAND_OK
        with pytest.raises(PoolerMismatchError) as info:
            graph.invoke({"n": 0}, {"configurable": {"thread_id": "after"}})
        assert "pooler='transaction'" in str(info.value)
        assert isinstance(info.value.__cause__, psycopg.errors.ProtocolViolation)
    finally:
        pool.close()
