"""Adoption: a database written by the STOCK ``PostgresSaver`` is resumed by the durable
saver with the same result as the stock saver would give (issue 12).

One database is written by the stock saver only (its own ``setup()``), with threads:
SIGKILLed inside a node (child processes), paused at an interrupt, a ``Send`` fan-out
killed mid-way (three workers' writes committed, the fourth running), a fan-out paused
by an interrupt in one worker, and a ``DeltaChannel`` conversation killed mid-turn.
The database is then copied twice (``CREATE DATABASE ... TEMPLATE``): one copy is
resumed with the stock saver, the other with the durable saver (after its ``setup()``
on the stock tables). Per thread: final values, ``next``, the history's values, and the
nodes each resume ran must be equal. Real PostgreSQL, real SIGKILLs, no mocks.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import _child_adoption as A
import psycopg
import pytest
from conftest import drop_database, make_database
from langgraph.checkpoint.postgres import PostgresSaver
from langgraph.types import Command
from psycopg import sql

from langgraph_durable import DurablePostgresSaver

CHILD = Path(__file__).with_name("_child_adoption.py")

# thread -> (builder, how to resume it, turns to add after the resume)
Resume = Callable[[Any, Any], Any]
THREADS: dict[str, tuple[Callable[[], Any], Any]] = {
    "killed-linear": (A.linear, None),
    "killed-fanout": (A.fanout, None),
    "killed-chat": (A.chat, None),
    "interrupt": (A.asking, Command(resume="yes")),
    "interrupt-fanout": (lambda: A.fanout(ask_in=2), Command(resume="ok")),
}


def cfg(thread_id: str) -> Any:
    return {"configurable": {"thread_id": thread_id}}


def _writes_of_head(dsn: str, thread_id: str) -> int:
    """Tasks with committed writes at the thread's latest checkpoint."""
    with psycopg.connect(dsn) as conn:
        row = conn.execute(
            "SELECT count(DISTINCT task_id) FROM checkpoint_writes w WHERE thread_id = %s "
            "AND checkpoint_id = (SELECT max(checkpoint_id) FROM checkpoints WHERE thread_id = %s "
            "AND checkpoint_ns = '')",
            (thread_id, thread_id),
        ).fetchone()
    assert row is not None
    return int(row[0])


def _kill_when(
    dsn: str, scenario: str, thread_id: str, hang: str, ready: Callable[[], bool]
) -> None:
    env = {**os.environ, A.DSN_ENV: dsn, A.HANG_ENV: hang}
    child = subprocess.Popen(
        [sys.executable, str(CHILD), dsn, scenario, thread_id],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    try:
        deadline = time.monotonic() + 120
        while not (hang in A.ran(dsn, thread_id) and ready()):
            assert child.poll() is None, child.communicate()
            assert time.monotonic() < deadline, f"child never reached {hang}"
            time.sleep(0.05)
        os.kill(child.pid, signal.SIGKILL)
    finally:
        if child.poll() is None:
            child.kill()
        child.wait()
    assert child.returncode == -signal.SIGKILL


def _copy(admin_dsn: str, source: str, label: str) -> str:
    target = make_database(admin_dsn, label)
    src = psycopg.conninfo.conninfo_to_dict(source)["dbname"]
    dst = psycopg.conninfo.conninfo_to_dict(target)["dbname"]
    with psycopg.connect(admin_dsn, autocommit=True) as conn:
        conn.execute(sql.SQL("DROP DATABASE {}").format(sql.Identifier(dst)))
        # A killed child's backend may still be closing: TEMPLATE needs no session on it.
        conn.execute(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = %s", (src,)
        )
        conn.execute(
            sql.SQL("CREATE DATABASE {} TEMPLATE {}").format(
                sql.Identifier(dst), sql.Identifier(src)
            )
        )
    return target


@pytest.fixture(scope="module")
def stock_db(admin_dsn: str) -> Iterator[str]:
    """A database only the stock saver ever wrote to, with the five paused threads."""
    url = make_database(admin_dsn, "adoption_stock")
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(A.SIDE_TABLE)
    with PostgresSaver.from_conn_string(url) as stock:
        stock.setup()
    _kill_when(url, "linear", "killed-linear", "b", lambda: True)
    _kill_when(
        url,
        "fanout",
        "killed-fanout",
        "worker:3",
        lambda: _writes_of_head(url, "killed-fanout") >= 3,
    )
    _kill_when(url, "chat", "killed-chat", "reply:8", lambda: True)
    os.environ[A.DSN_ENV] = url
    with PostgresSaver.from_conn_string(url) as stock:
        for tid in ("interrupt", "interrupt-fanout"):
            out = THREADS[tid][0]().compile(checkpointer=stock).invoke({"log": []}, cfg(tid))
            assert "__interrupt__" in out
    yield url
    os.environ.pop(A.DSN_ENV, None)
    drop_database(admin_dsn, url)


def _resume(dsn: str, saver: Any) -> dict[str, Any]:
    """Resume every thread on ``saver``; what each looks like after, and what ran."""
    os.environ[A.DSN_ENV] = dsn
    out: dict[str, Any] = {}
    for tid, (build, how) in THREADS.items():
        g = build().compile(checkpointer=saver)
        before = g.get_state(cfg(tid))
        with psycopg.connect(dsn) as conn:
            row = conn.execute("SELECT coalesce(max(id), 0) FROM adopt_ran").fetchone()
        mark = int(row[0]) if row else 0
        g.invoke(how, cfg(tid))
        if tid == "killed-chat":
            g.invoke(A.turn(3), cfg(tid))  # and the conversation goes on
        after = g.get_state(cfg(tid))
        out[tid] = {
            "paused_at": before.next,  # tasks still to run (finished ones excluded)
            "paused_tasks": len(before.tasks),
            "values": after.values,
            "next": after.next,
            "history": [s.values for s in g.get_state_history(cfg(tid))],
            "ran": Counter(A.ran(dsn, tid, mark)),
        }
    return out


def test_durable_saver_resumes_stock_threads_like_the_stock_saver(
    admin_dsn: str, stock_db: str
) -> None:
    with_stock = _copy(admin_dsn, stock_db, "adopt_with_stock")
    with_durable = _copy(admin_dsn, stock_db, "adopt_with_durable")
    try:
        with PostgresSaver.from_conn_string(with_stock) as stock:
            expected = _resume(with_stock, stock)
        with DurablePostgresSaver.from_conn_string(with_durable) as durable:
            durable.setup()  # adds its tables beside the stock ones, touches none of them
            got = _resume(with_durable, durable)
            # Adopted: the new checkpoints are stamped, the old ones left as they were.
            head = durable.get_tuple(cfg("interrupt"))
            assert head is not None and head.metadata.get("graph_version")
    finally:
        os.environ[A.DSN_ENV] = stock_db
        drop_database(admin_dsn, with_stock)
        drop_database(admin_dsn, with_durable)
    assert got.keys() == expected.keys()
    for tid in THREADS:
        assert got[tid] == expected[tid], tid
    # The scenarios really were paused where they claim.
    assert expected["killed-linear"]["paused_at"] == ("b",)
    assert expected["killed-linear"]["ran"] == Counter({"b": 1, "c": 1})
    assert expected["killed-fanout"]["paused_at"] == ("worker",)
    assert expected["killed-fanout"]["paused_tasks"] == 4
    # Only the killed worker runs again: the three others' writes were committed.
    assert expected["killed-fanout"]["ran"] == Counter({"worker:3": 1, "join": 1})
    assert expected["killed-chat"]["ran"] == Counter({"reply:8": 1, "think:10": 1, "reply:11": 1})
    assert expected["interrupt"]["values"]["answer"] == "yes"
    assert expected["interrupt-fanout"]["ran"] == Counter({"worker:2": 1, "join": 1})
    assert [m.id for m in expected["killed-chat"]["values"]["messages"]][-3:] == [
        "h3",
        "t10",
        "r11",
    ]
