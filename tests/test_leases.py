"""Leases and fencing on real PostgreSQL: the lease row's lifecycle, busy threads,
renewal, fenced writes, zombies (in-process and a SIGSTOPped worker process)."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import _child_recovery as cr
import psycopg
import pytest
from _db import done_nodes, q, thread_row

from langgraph_durable import (
    DurablePostgresSaver,
    GraphVersionMismatchError,
    LeaseLostError,
    ThreadBusyError,
)
from langgraph_durable.recovery import RecoveryWorker, submit
from langgraph_durable.sql import threads as _sql

CHILD = str(Path(__file__).with_name("_child_recovery.py"))
INPUT = {"done": []}


def cfg(thread_id: str) -> Any:
    return {"configurable": {"thread_id": thread_id}}


@pytest.fixture(scope="module")
def db(dsn: str) -> str:
    cr.setup_tables(dsn)
    cr.use_dsn(dsn)
    return dsn


@pytest.fixture(autouse=True)
def _clear_hooks() -> Iterator[None]:
    yield
    cr.BEFORE.clear()




def log_rows(dsn: str, thread_id: str) -> list[dict[str, Any]]:
    return q(dsn, "SELECT * FROM rec_log WHERE thread_id = %s ORDER BY id", (thread_id,))


# --------------------------------------------------------------------------- lifecycle


def test_lease_row_lifecycle_and_release_statuses(db: str) -> None:
    inside: dict[str, Any] = {}

    def look(state: Any, config: Any) -> None:
        inside.setdefault(config["configurable"]["thread_id"], thread_row(db, config["configurable"]["thread_id"]))

    cr.BEFORE["s1"] = look
    with DurablePostgresSaver.from_conn_string(db, lease_ttl=7) as saver:
        graph = cr.make_builder(3, 0).compile(checkpointer=saver)
        graph.invoke(INPUT, cfg("life-done"))
        held = inside["life-done"]
        # host:pid:incarnation(boot.start):namespace(ns<pid-ns inode>.<boot id>):random
        host, pid, incarnation, namespace, rand = held["lease_owner"].split(":")
        assert (host, int(pid), len(rand)) == (socket.gethostname(), os.getpid(), 12)
        assert "." in incarnation and namespace.startswith("ns") and "." in namespace
        assert held["status"] == "running" and 0 < held["expires_in"] <= 7
        after = thread_row(db, "life-done")
        assert after["status"] == "done" and after["lease_owner"] is None
        assert after["lease_expires_at"] is None and after["lease_token"] == held["lease_token"]
        # Every acquisition bumps the fencing token.
        graph.invoke(None, cfg("life-done"))
        assert thread_row(db, "life-done")["lease_token"] == held["lease_token"] + 1

        paused = cr.make_builder(3, 0).compile(checkpointer=saver, interrupt_before=["s2"])
        paused.invoke(INPUT, cfg("life-wait"))
        assert thread_row(db, "life-wait")["status"] == "waiting"

        def boom(state: Any, config: Any) -> None:
            if config["configurable"]["thread_id"] == "life-err":
                raise RuntimeError("boom")

        cr.BEFORE["s1"] = boom
        with pytest.raises(RuntimeError):
            graph.invoke(INPUT, cfg("life-err"))
        err = thread_row(db, "life-err")
        assert err["status"] == "error" and "boom" in err["last_error"] and err["lease_owner"] is None

        for _ in graph.stream(INPUT, cfg("life-stop"), stream_mode="values"):
            break  # the caller walks away: the run is handed back
        stopped = thread_row(db, "life-stop")
        assert stopped["status"] == "stopped" and stopped["lease_owner"] is None


def test_second_invoke_is_busy_or_waits(db: str) -> None:
    gate, entered = threading.Event(), threading.Event()

    def block(state: Any, config: Any) -> None:
        if threading.current_thread().name == "run-a":
            entered.set()
            assert gate.wait(60)

    cr.BEFORE["s0"] = block
    out: dict[str, Any] = {}
    with (
        DurablePostgresSaver.from_conn_string(db, lease_ttl=5) as saver,
        DurablePostgresSaver.from_conn_string(db, on_busy="wait", busy_timeout=120) as waiting,
    ):
        builder = cr.make_builder(3, 0)
        graph, patient = builder.compile(checkpointer=saver), builder.compile(checkpointer=waiting)
        a = threading.Thread(
            target=lambda: out.update(a=graph.invoke(INPUT, cfg("busy-1"))), name="run-a"
        )
        a.start()
        assert entered.wait(60)
        owner = thread_row(db, "busy-1")["lease_owner"]
        with pytest.raises(ThreadBusyError) as info:
            graph.invoke(None, cfg("busy-1"))
        assert info.value.thread_id == "busy-1" and info.value.owner == owner
        assert info.value.expires_in is not None and info.value.expires_in > 0
        b = threading.Thread(target=lambda: out.update(b=patient.invoke(None, cfg("busy-1"))))
        b.start()
        time.sleep(1.0)  # let B poll against A's live lease (not an assertion on time)
        gate.set()
        a.join(60)
        b.join(60)
    assert done_nodes(out["a"]) == ["s0", "s1", "s2"]
    # B waited, then found nothing left to run: no node ran twice.
    assert out["b"] == out["a"]
    assert sorted(r["node"] for r in log_rows(db, "busy-1")) == ["s0", "s1", "s2"]


# The lease of the renewal test: long enough that a loaded machine's scheduling pauses
# (the renewer renews every ttl/3) do not let it lapse; LGD_TEST_LEASE_TTL overrides it.
RENEW_TTL = float(os.environ.get("LGD_TEST_LEASE_TTL", "2.0"))


def _lease_outlived(db: str, thread_id: str, expires_at: Any, timeout: float = 60) -> None:
    """Wait (an event, not a sleep) until the server's clock is past ``expires_at``."""
    deadline = time.monotonic() + timeout
    while not q(db, "SELECT now() > %s AS past", (expires_at,))[0]["past"]:
        assert time.monotonic() < deadline, "the server clock never passed the first expiry"
        time.sleep(0.02)


def test_renewal_keeps_a_long_node_leased(db: str) -> None:
    ttl = RENEW_TTL
    rows: list[dict[str, Any]] = []
    mid, resume = threading.Event(), threading.Event()

    def long_node(state: Any, config: Any) -> None:
        rows.append(thread_row(db, "renew-1"))
        # Inside one node, until the lease's expiry is past on the server's clock, twice
        # (two lifetimes at least): only renewals can keep it.
        for _ in range(2):
            _lease_outlived(db, "renew-1", thread_row(db, "renew-1")["lease_expires_at"])
        rows.append(thread_row(db, "renew-1"))
        mid.set()
        assert resume.wait(60)

    cr.BEFORE["s0"] = long_node
    out: dict[str, Any] = {}
    with DurablePostgresSaver.from_conn_string(db, lease_ttl=ttl) as saver:
        graph = cr.make_builder(2, 0).compile(checkpointer=saver)
        t = threading.Thread(target=lambda: out.update(r=graph.invoke(INPUT, cfg("renew-1"))))
        t.start()
        assert mid.wait(60)
        with pytest.raises(ThreadBusyError):
            graph.invoke(None, cfg("renew-1"))  # still leased after 3 x ttl
        resume.set()
        t.join(60)
    first, second = rows
    assert second["lease_token"] == first["lease_token"]
    assert second["lease_expires_at"] > first["lease_expires_at"]
    assert done_nodes(out["r"]) == ["s0", "s1"]
    assert thread_row(db, "renew-1")["status"] == "done"


# --------------------------------------------------------------------------- fencing


def _stall_renewer(saver: Any) -> threading.Lock:
    """Fault injection: hold the renewer's connection lock so renewals stall, as they
    would with the database unreachable from this process. Returns the held lock."""
    saver._ensure_renewer()
    lock: threading.Lock = saver._renewer._conn_lock
    assert lock.acquire(timeout=30)
    return lock


def _wait_expired(dsn: str, thread_id: str) -> None:
    for _ in range(600):
        if thread_row(dsn, thread_id)["expires_in"] < 0:
            return
        time.sleep(0.05)
    raise AssertionError(f"lease on {thread_id} never expired")


def test_takeover_fences_late_writes_and_stops_the_run(db: str) -> None:
    gate, entered = threading.Event(), threading.Event()

    def block(state: Any, config: Any) -> None:
        entered.set()
        assert gate.wait(60)

    cr.BEFORE["s1"] = block
    out: dict[str, Any] = {}
    with DurablePostgresSaver.from_conn_string(db, lease_ttl=1.0) as saver:
        graph = cr.make_builder(4, 0).compile(checkpointer=saver)

        def run() -> None:
            try:
                graph.invoke(INPUT, cfg("fence-1"))
            except Exception as exc:
                out["error"] = exc

        t = threading.Thread(target=run)
        t.start()
        assert entered.wait(60)
        # The checkpoint s1 runs from is put in the background (durability "async"):
        # wait for it, or `before` may be the one before it (a race, also on main).
        before = graph.get_state(cfg("fence-1"))
        for _ in range(200):
            if before.next == ("s1",):
                break
            time.sleep(0.05)
            before = graph.get_state(cfg("fence-1"))
        stalled = _stall_renewer(saver)
        try:
            _wait_expired(db, "fence-1")
            # Another worker takes the expired lease with the real acquisition statement.
            got = saver.run_op(lambda: saver._op_acquire("fence-1", "thief:1:x", None, None))
            assert got["ok"]
        finally:
            stalled.release()
        gate.set()
        t.join(60)
        after = graph.get_state(cfg("fence-1"))
    assert isinstance(out.get("error"), LeaseLostError)
    assert out["error"].thread_id == "fence-1"
    # s1's writes were rolled back with the failed fence; nothing moved the thread on.
    assert after.config["configurable"]["checkpoint_id"] == before.config["configurable"]["checkpoint_id"]
    assert done_nodes(after.values) == ["s0"] and after.next == ("s1",)
    assert q(
        db,
        "SELECT count(*) AS n FROM checkpoint_writes WHERE thread_id = %s AND checkpoint_id = %s",
        ("fence-1", before.config["configurable"]["checkpoint_id"]),
    )[0]["n"] == 0
    # The zombie guard stopped the run at the step boundary: s2 never started.
    assert [r["node"] for r in log_rows(db, "fence-1")] == ["s0", "s1"]
    row = thread_row(db, "fence-1")
    assert row["lease_owner"] == "thief:1:x" and row["lease_token"] == got["lease_token"]


def test_takeover_waits_for_an_in_flight_fenced_write(db: str) -> None:
    with DurablePostgresSaver.from_conn_string(db) as saver:
        cr.make_builder(1, 0).compile(checkpointer=saver).invoke(INPUT, cfg("inflight-1"))
        got = saver.run_op(lambda: saver._op_acquire("inflight-1", "owner-a", None, None))
    token = got["lease_token"]
    q(db, "UPDATE durable_threads SET lease_expires_at = now() - interval '1 second' WHERE thread_id = %s", ("inflight-1",))
    params = {"thread_id": "inflight-1", "owner": "owner-b", "version": None, "ttl": 30.0, "checkpoint_id": None, "dead_owner": None, "claim_owner": None, "claim_token": None}
    with psycopg.connect(db) as writer, psycopg.connect(db, autocommit=True) as taker:
        # The fence of a write in flight: the row lock is held until the write commits.
        assert writer.execute(_sql.LEASE_FENCE_SQL, ("inflight-1", token, "owner-a")).fetchall()
        taker.execute("SET lock_timeout = '300ms'")
        with pytest.raises(psycopg.errors.LockNotAvailable):
            taker.execute(_sql.LEASE_ACQUIRE_SQL, params)
        writer.commit()
        row = taker.execute(_sql.LEASE_ACQUIRE_SQL, params).fetchone()
    assert row is not None and row[0] == token + 1


def test_same_process_zombie_cannot_write_with_the_new_runs_lease(db: str) -> None:
    """Run A's lease expires (renewer stalled) and run B *of the same process* takes the
    thread over. A's late writes must be fenced with A's token, not B's."""
    gate, entered = threading.Event(), threading.Event()

    def block(state: Any, config: Any) -> None:
        if threading.current_thread().name == "zombie":
            entered.set()
            assert gate.wait(60)

    cr.BEFORE["s1"] = block
    out: dict[str, Any] = {}
    with DurablePostgresSaver.from_conn_string(db, lease_ttl=1.0) as saver:
        graph = cr.make_builder(4, 0).compile(checkpointer=saver)

        def zombie() -> None:
            try:
                graph.invoke(INPUT, cfg("zp-1"))
            except Exception as exc:
                out["zombie"] = exc

        a = threading.Thread(target=zombie, name="zombie")
        a.start()
        assert entered.wait(60)
        stalled = _stall_renewer(saver)
        try:
            _wait_expired(db, "zp-1")
            out["b"] = graph.invoke(None, cfg("zp-1"))  # B: same process, same saver
        finally:
            stalled.release()
        gate.set()
        a.join(60)
        final = graph.get_state(cfg("zp-1"))
    assert isinstance(out.get("zombie"), LeaseLostError)
    assert done_nodes(final.values) == ["s0", "s1", "s2", "s3"] and final.next == ()
    assert final.values == out["b"]
    zombie_token = log_rows(db, "zp-1")[0]["token"]
    assert [r["node"] for r in log_rows(db, "zp-1") if r["token"] == zombie_token] == ["s0", "s1"]


def test_refused_resume_leaves_the_thread_as_it_was(db: str) -> None:
    with DurablePostgresSaver.from_conn_string(db) as saver:
        v1 = saver.bind(graph_version="lease-v1")
        v2 = saver.bind(graph_version="lease-v2")
        builder = cr.make_builder(3, 0)
        builder.compile(checkpointer=v1, interrupt_before=["s1"]).invoke(INPUT, cfg("refuse-1"))
        before = thread_row(db, "refuse-1")
        with pytest.raises(GraphVersionMismatchError):
            builder.compile(checkpointer=v2, interrupt_before=["s1"]).invoke(None, cfg("refuse-1"))
    after = thread_row(db, "refuse-1")
    assert (after["status"], after["graph_version"], after["lease_owner"]) == ("waiting", "lease-v1", None)
    assert after["attempts"] == before["attempts"]


# --------------------------------------------------------------------------- zombie process


def test_sigstopped_worker_is_fenced_after_takeover(db: str, tmp_path: Path) -> None:
    """A worker process is SIGSTOPped inside a node past its lease; another worker takes
    the thread over and finishes it; the paused worker is SIGCONTed: its late writes are
    rejected (LeaseLostError), it runs no further node, and the final state is intact."""
    steps = 4
    with DurablePostgresSaver.from_conn_string(db, lease_ttl=2.0) as saver:
        graph = cr.make_builder(steps, 0.0).compile(checkpointer=saver)
        submit(graph, INPUT, cfg("zombie-1"))
        log = tmp_path / "zombie.log"
        env = {**os.environ, "LGD_DSN": db, "LGD_STEPS": str(steps), "LGD_SLEEP": "2.0"}
        with open(log, "w") as fh:
            proc = subprocess.Popen(
                [sys.executable, CHILD, "worker", "--concurrency", "1", "--lease-ttl", "2",
                 "--poll-interval", "0.2"],
                env=env, stdout=fh, stderr=subprocess.STDOUT,
            )
        try:
            for _ in range(1200):
                if any(r["node"] == "s1" for r in log_rows(db, "zombie-1")):
                    break
                time.sleep(0.05)
            else:
                raise AssertionError(log.read_text())
            os.kill(proc.pid, signal.SIGSTOP)
            _wait_expired(db, "zombie-1")
            taken = RecoveryWorker(graph).recover_one()
            assert taken is not None and taken.thread_id == "zombie-1"
            assert taken.previous_status == "running" and taken.status == "done"
            os.kill(proc.pid, signal.SIGCONT)
            for _ in range(1200):
                if "outcome=lease_lost" in log.read_text():
                    break
                time.sleep(0.05)
            else:
                raise AssertionError(log.read_text())
        finally:
            os.kill(proc.pid, signal.SIGCONT)
            proc.terminate()
            assert proc.wait(60) == 0
        final = graph.get_state(cfg("zombie-1"))
    text = log.read_text()
    assert "LeaseLostError" in text
    rows = log_rows(db, "zombie-1")
    zombie = [r for r in rows if r["pid"] == proc.pid]
    # The zombie started s0 and s1 only; everything after the takeover ran once, here.
    assert [r["node"] for r in zombie] == ["s0", "s1"]
    assert [r["node"] for r in rows if r["pid"] == os.getpid()] == ["s1", "s2", "s3"]
    assert done_nodes(final.values) == ["s0", "s1", "s2", "s3"] and final.next == ()
    owners = [d.split(":")[1] for d in final.values["done"]]
    assert owners == [str(proc.pid)] + [str(os.getpid())] * 3
    row = thread_row(db, "zombie-1")
    assert row["status"] == "done" and row["lease_owner"] is None


@pytest.mark.parametrize(
    ("status", "flushed"),
    [("done", False), ("waiting", True), ("stopped", True), ("error", True)],
)
def test_only_a_finished_runs_release_skips_the_wal_flush(db: str, status: str, flushed: bool) -> None:
    """The release of a finished run commits without waiting for its WAL flush (issue
    14: the flush was most of the run end); every other outcome's release, whose loss
    in a database crash would make a resume re-run a node, waits for it. Read inside
    the release's own transaction (the setting is per transaction)."""
    from langgraph_durable.leases.model import Lease

    tid = f"flush-{status}"
    with DurablePostgresSaver.from_conn_string(db) as saver:
        got = saver.run_op(lambda: saver._op_acquire(tid, "owner-f", None, None))
    lease = Lease(tid, owner="owner-f", token=int(got["lease_token"]), attempts=1, checkpoint_id=None, version=None)
    op = saver._op_release(lease, status, reset=status == "done", undo=False, error=None)
    (release,) = next(op).stmts
    with psycopg.connect(db) as conn:  # one explicit transaction, rolled back
        assert conn.execute(release.sql, release.params).rowcount == 1
        setting = conn.execute("SELECT current_setting('synchronous_commit')").fetchone()
        conn.rollback()
        assert conn.execute("SELECT current_setting('synchronous_commit')").fetchone() == ("on",)
    assert setting == (("on",) if flushed else ("off",))
