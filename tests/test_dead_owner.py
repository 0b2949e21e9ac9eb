"""A crashed run's lease on THIS machine is taken over at once, not after lease_ttl.

The owner string carries host, pid and the process incarnation (boot time + start
time), so a resume can prove the holder is dead. A live holder (even a frozen one) is
never judged dead: its lease must expire, and fencing covers the rest.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import psycopg
import pytest

from langgraph_durable import DurablePostgresSaver, ThreadBusyError

CHILD = textwrap.dedent(
    """
    import sys, time
    from typing import TypedDict
    from langgraph.graph import StateGraph, START, END
    from langgraph_durable import DurablePostgresSaver

    class S(TypedDict):
        n: int

    def slow(state):
        time.sleep(60)   # killed or stopped in here
        return {"n": state["n"] + 1}

    def build():
        b = StateGraph(S)
        b.add_node("slow", slow)
        b.add_edge(START, "slow")
        b.add_edge("slow", END)
        return b

    if __name__ == "__main__":
        with DurablePostgresSaver.from_conn_string(sys.argv[1]) as saver:
            build().compile(checkpointer=saver).invoke({"n": 1}, {"configurable": {"thread_id": sys.argv[2]}})
    """
)


def _fast(state: dict) -> dict:
    return {"n": state["n"] + 1}


def _graph(saver: DurablePostgresSaver):  # type: ignore[no-untyped-def]
    from typing import TypedDict

    from langgraph.graph import END, START, StateGraph

    class S(TypedDict):
        n: int

    b = StateGraph(S)
    b.add_node("slow", _fast)  # same topology as the child's graph, so the same version
    b.add_edge(START, "slow")
    b.add_edge("slow", END)
    return b.compile(checkpointer=saver)


def _start_child(tmp_path: Path, dsn: str, thread_id: str) -> subprocess.Popen[bytes]:
    script = tmp_path / "child_dead_owner.py"
    script.write_text(CHILD)
    proc = subprocess.Popen([sys.executable, str(script), dsn, thread_id])
    deadline = time.monotonic() + 60
    with psycopg.connect(dsn, autocommit=True) as conn:
        while time.monotonic() < deadline:
            # The lease, and the checkpoint the node runs from: the lease is one
            # autocommit statement now, committed well before the child's first put.
            row = conn.execute(
                "SELECT lease_owner FROM durable_threads WHERE thread_id = %s AND status = 'running'"
                " AND EXISTS (SELECT 1 FROM checkpoints WHERE thread_id = %s"
                " AND (metadata ->> 'step')::int >= 0)",
                (thread_id, thread_id),
            ).fetchone()
            if row and row[0]:
                return proc
            assert proc.poll() is None, "child exited early"
            time.sleep(0.1)
    proc.kill()
    raise AssertionError("child never took the lease")


def _token(dsn: str, thread_id: str) -> int:
    with psycopg.connect(dsn) as conn:
        row = conn.execute(
            "SELECT lease_token FROM durable_threads WHERE thread_id = %s", (thread_id,)
        ).fetchone()
    assert row is not None
    return int(row[0])


def test_dead_local_owner_is_taken_over_without_waiting(dsn: str, tmp_path: Path) -> None:
    proc = _start_child(tmp_path, dsn, "dead-1")
    token = _token(dsn, "dead-1")
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    # Default lease_ttl (30 s) and on_busy="raise": without the takeover this raises.
    with DurablePostgresSaver.from_conn_string(dsn) as saver:
        out = _graph(saver).invoke(None, {"configurable": {"thread_id": "dead-1"}})
    assert out == {"n": 2}
    assert _token(dsn, "dead-1") == token + 1


def test_live_owner_is_never_judged_dead(dsn: str, tmp_path: Path) -> None:
    proc = _start_child(tmp_path, dsn, "alive-1")
    try:
        os.kill(proc.pid, signal.SIGSTOP)  # frozen, not dead
        with DurablePostgresSaver.from_conn_string(dsn) as saver:
            with pytest.raises(ThreadBusyError) as info:
                _graph(saver).invoke(None, {"configurable": {"thread_id": "alive-1"}})
        assert info.value.thread_id == "alive-1"
        # The same saver with takeover disabled behaves like a remote holder: busy too.
        with DurablePostgresSaver.from_conn_string(dsn, takeover_dead_owners=False) as saver:
            with pytest.raises(ThreadBusyError):
                _graph(saver).invoke(None, {"configurable": {"thread_id": "alive-1"}})
    finally:
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait()
    with DurablePostgresSaver.from_conn_string(dsn) as saver:
        assert _graph(saver).invoke(None, {"configurable": {"thread_id": "alive-1"}}) == {"n": 2}


def test_other_machines_owner_is_not_judged(dsn: str) -> None:
    from langgraph_durable.saver import owner_is_dead, process_identity

    assert not owner_is_dead("some-other-host:1:1.1:abcdef")
    assert not owner_is_dead(process_identity() + ":abcdef")  # ourselves
    assert not owner_is_dead(None)
