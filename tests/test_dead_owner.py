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


def _live_child() -> subprocess.Popen[bytes]:
    from langgraph_durable.leases.owners import _start_ticks

    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    deadline = time.monotonic() + 10
    while True:  # until its /proc entry shows it started (ticks readable)
        if _start_ticks(proc.pid) is not None:
            return proc
        assert time.monotonic() < deadline
        time.sleep(0.01)


def test_live_owner_stays_alive_when_the_kernel_boot_time_moves(monkeypatch: pytest.MonkeyPatch) -> None:
    """The kernel's boot time (/proc/stat btime, psutil.boot_time) moves with the wall
    clock (NTP slewing, a step). psutil's create time is that boot time plus the
    process's ticks, so an owner id made from it, re-read after the move, no longer
    matched its LIVE process: judged a younger process on the same pid, i.e. dead, and
    its lease taken over while it ran. Owner ids now carry the ticks since boot."""
    import psutil

    from langgraph_durable.leases import owners

    proc = _live_child()
    try:
        host, _, _, namespace = owners.process_identity().split(":")
        owner = f"{host}:{proc.pid}:{owners._incarnation(proc.pid)}:{namespace}:abcdef123456"
        legacy = f"{host}:{proc.pid}:{owners._legacy_incarnation(proc.pid)}:{namespace}:abcdef123456"
        assert not owners.owner_is_dead(owner) and not owners.owner_is_dead(legacy)
        real = psutil.boot_time()
        monkeypatch.setattr(psutil, "boot_time", lambda: real + 1.0)  # the clock was slewed by 1 s
        # psutil's create time moved with it: the old way judged this live process dead.
        moved = owners._legacy_incarnation(proc.pid)
        assert moved is not None and moved != legacy.split(":")[2]
        assert not owners.owner_is_dead(owner)
        assert not owners.owner_is_dead(legacy)  # the legacy form is judged with a tolerance
        assert ".k" in owner  # new owner ids carry the ticks
    finally:
        proc.kill()
        proc.wait()
    # Gone: provably dead in both forms, the clock moved or not.
    assert owners.owner_is_dead(owner)
    assert owners.owner_is_dead(legacy)
    monkeypatch.undo()
    assert owners.owner_is_dead(owner) and owners.owner_is_dead(legacy)


def test_a_reused_pid_is_a_younger_process() -> None:
    """The same pid with other start ticks is another process: the holder is dead."""
    from langgraph_durable.leases import owners

    proc = _live_child()
    try:
        host, _, _, namespace = owners.process_identity().split(":")
        ticks = owners._start_ticks(proc.pid)
        assert ticks is not None
        boot = owners._incarnation(proc.pid).split(".")[0]  # type: ignore[union-attr]
        assert owners.owner_is_dead(f"{host}:{proc.pid}:{boot}.k{int(ticks) - 1}:{namespace}:abcdef123456")
        assert not owners.owner_is_dead(f"{host}:{proc.pid}:{boot}.k{ticks}:{namespace}:abcdef123456")
        # An unparsable incarnation proves nothing.
        assert not owners.owner_is_dead(f"{host}:{proc.pid}:{boot}.zz:{namespace}:abcdef123456")
    finally:
        proc.kill()
        proc.wait()


def test_a_live_process_hidden_from_proc_is_never_dead(monkeypatch: pytest.MonkeyPatch) -> None:
    """Review 28: with /proc mounted ``hidepid=2`` another user's live process has no
    /proc entry for us. Judged by the entry alone it read as dead, its lease and claims
    taken over while it ran (a run start, update_state, an operator's decision). Signal
    0 is not filtered that way: a missing entry counts as dead only when no process has
    the pid (ESRCH). Simulated: the entry of a live child made unreadable."""
    from langgraph_durable.leases import owners

    proc = _live_child()
    try:
        host, _, _, namespace = owners.process_identity().split(":")
        owner = f"{host}:{proc.pid}:{owners._incarnation(proc.pid)}:{namespace}:abcdef123456"
        real = owners._start_ticks
        monkeypatch.setattr(owners, "_start_ticks", lambda pid: None if pid == proc.pid else real(pid))
        monkeypatch.setattr(owners, "_zombie", lambda pid: False)  # its entry is hidden too
        assert not owners.owner_is_dead(owner)
    finally:
        proc.kill()
        proc.wait()
    assert owners.owner_is_dead(owner)  # gone: ESRCH


def test_a_dead_owners_thread_is_listed_under_the_state_it_is_shown_in(dsn: str, tmp_path: Path) -> None:
    """`threads list` labels a live lease of a dead local process 'recoverable': the
    filter agrees at once (not only after lease_ttl), the 'running' filter leaves it out,
    and so do the console's filtered pages; a mistyped state is a ConfigurationError
    naming the choices, not an empty page (newcomer review, stop 32)."""
    from typer.testing import CliRunner

    from langgraph_durable import ConfigurationError
    from langgraph_durable.cli import app
    from langgraph_durable.ops import inspection as lgi
    from langgraph_durable.sql import console as q

    thread = f"dead-list-{os.getpid()}"
    proc = _start_child(tmp_path, dsn, thread)
    with DurablePostgresSaver.from_conn_string(dsn) as saver:
        def ids(status: str) -> set[str]:
            return {r["thread_id"] for r in lgi.list_threads(saver, status=status, prefix=thread)}

        assert ids("running") == {thread} and ids("recoverable") == set()  # alive: running
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait()
        assert ids("recoverable") == {thread}
        assert ids("running") == set()
        listed = lgi.list_threads(saver, prefix=thread)
        assert [(r["thread_id"], r["state"]) for r in listed] == [(thread, "recoverable")]
        for statement in (q.THREADS_SQL, q.THREADS_NATURAL_SQL):
            with saver.connection() as conn, conn.cursor(row_factory=psycopg.rows.dict_row) as cur:
                for status, want in (("recoverable", [thread]), ("running", [])):
                    cur.execute(statement, {
                        "after": None, "prefix": thread, "version": None, "older": None,
                        "newer": None, "status": status, "limit": 10,
                        "dead": lgi.dead_owners(conn, status),
                    })
                    assert [r["thread_id"] for r in cur.fetchall()] == want, (statement, status)
        with pytest.raises(ConfigurationError, match="unknown thread state 'bogus'"):
            lgi.list_threads(saver, status="bogus")
    out = CliRunner().invoke(app, ["threads", "list", "--dsn", dsn, "--status", "bogus"])
    assert out.exit_code != 0 and "unknown thread state 'bogus'" in out.output, out.output
    assert "Traceback" not in out.output
