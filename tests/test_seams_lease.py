"""Issue 11, the lease seams: defects 3, 6, 7, 8 and 12, and the bind() renewer of 14.

Each test reproduces what a user does at the seam (an operator's update_state during a
live run, a container sharing the hostname, a resumer whose clock is behind, a lost
COMMIT reply, a forged hand-off) on real PostgreSQL and real processes, and asserts what
they must get. Every one failed on b02aea4.
"""

from __future__ import annotations

import asyncio
import operator
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Annotated, Any, TypedDict

import _child_seams_lease as child
import psycopg
import pytest
from _db import q, thread_row
from conftest import needs
from langchain_core.runnables import RunnableConfig
from langgraph.checkpoint.base import empty_checkpoint
from langgraph.graph import END, START, StateGraph
from langgraph.types import Command, interrupt
from psycopg import sql

from langgraph_durable import (
    AsyncDurablePostgresSaver,
    ClockSkewError,
    DurablePostgresSaver,
    ThreadBusyError,
    _io,
    idempotent,
)
from langgraph_durable.recovery import recover
from langgraph_durable.saver import owner_is_dead, process_identity

CHILD = str(Path(__file__).with_name("_child_seams_lease.py"))
LOAD_WAIT = 60.0  # bound on waiting for a child process under a loaded machine


def cfg(thread_id: str, **extra: Any) -> Any:
    return {"configurable": {"thread_id": thread_id, **extra}}


@pytest.fixture(scope="module")
def db(dsn: str) -> str:
    child.setup_tables(dsn)
    return dsn


def effects(dsn: str, thread_id: str, table: str = "sl_effects") -> dict[str, int]:
    rows = q(
        dsn,
        sql.SQL("SELECT node, count(*) AS n FROM {} WHERE thread_id = %s GROUP BY node").format(
            sql.Identifier(table)
        ),
        (thread_id,),
    )
    return {r["node"]: int(r["n"]) for r in rows}


def wait_until(cond: Callable[[], bool], what: str, limit: float = LOAD_WAIT) -> None:
    """Poll for a condition a child process brings about (bounded; not a timing assert)."""
    deadline = time.monotonic() + limit
    while not cond():
        if time.monotonic() > deadline:
            raise AssertionError(f"gave up waiting for {what}")
        time.sleep(0.05)


def child_env(**extra: str) -> dict[str, str]:
    here = str(Path(__file__).parent)
    root = str(Path(__file__).parent.parent)
    env = {k: v for k, v in os.environ.items() if not k.startswith("LGD_")}
    # The caller's PYTHONPATH first: the children run the same package as the test.
    env["PYTHONPATH"] = os.pathsep.join(p for p in (env.get("PYTHONPATH"), root, here) if p)
    env.update(extra)
    return env


# --------------------------------------------------------------------------- graphs


class S(TypedDict, total=False):
    log: Annotated[list[str], operator.add]
    note: str


def gated_graph(saver: Any, entered: threading.Event, release: threading.Event, runs: list[str]) -> Any:
    """work (blocks until released) -> after."""

    def work(state: S) -> dict[str, Any]:
        runs.append("work")
        if len(runs) == 1:  # a second execution (the defect) must not block the test
            entered.set()
            assert release.wait(LOAD_WAIT), "never released"
        return {"log": ["work"]}

    def after(state: S) -> dict[str, Any]:
        return {"log": ["after"]}

    b = StateGraph(S)
    b.add_node("work", work)
    b.add_node("after", after)
    b.add_edge(START, "work")
    b.add_edge("work", "after")
    b.add_edge("after", END)
    return b.compile(checkpointer=saver)


# --------------------------------------------------------------------------- defect 3


def test_defect3_same_process_update_state_during_live_run_is_refused(db: str) -> None:
    """A web server: one request runs the graph, another edits the thread's state. The
    edit must get ThreadBusyError (as from another process), not be accepted and then
    silently overwritten by the run. The run itself (its puts come from LangGraph's
    executor threads) still passes its own fence; once it ended the edit goes through."""
    tid = "d3-sync"
    entered, release, runs = threading.Event(), threading.Event(), []
    with DurablePostgresSaver.from_conn_string(db, lease_ttl=30) as saver:
        graph = gated_graph(saver, entered, release, runs)
        result: dict[str, Any] = {}
        runner = threading.Thread(
            target=lambda: result.setdefault("out", graph.invoke({"log": []}, cfg(tid)))
        )
        runner.start()
        try:
            assert entered.wait(LOAD_WAIT)
            with pytest.raises(ThreadBusyError) as err:
                graph.update_state(cfg(tid), {"note": "edited by request 2"})
            assert err.value.thread_id == tid and err.value.owner
        finally:
            release.set()
            runner.join(LOAD_WAIT)
        assert result["out"]["log"] == ["work", "after"]
        state = graph.get_state(cfg(tid))
        assert state.values == {"log": ["work", "after"]} and state.next == ()
        assert thread_row(db, tid)["status"] == "done"
        # The thread is free now: the same edit is accepted and kept.
        graph.update_state(cfg(tid), {"note": "edited after the run"})
        assert graph.get_state(cfg(tid)).values["note"] == "edited after the run"
        assert runs == ["work"]


def test_defect3_async_update_state_during_live_run_is_refused(db: str) -> None:
    tid = "d3-async"

    async def scenario() -> None:
        entered, release = asyncio.Event(), asyncio.Event()

        async def work(state: S) -> dict[str, Any]:
            entered.set()
            await asyncio.wait_for(release.wait(), LOAD_WAIT)
            return {"log": ["work"]}

        b = StateGraph(S)
        b.add_node("work", work)
        b.add_edge(START, "work")
        b.add_edge("work", END)
        async with AsyncDurablePostgresSaver.from_conn_string(db, lease_ttl=30) as saver:
            graph = b.compile(checkpointer=saver)
            run = asyncio.create_task(graph.ainvoke({"log": []}, cfg(tid)))
            await asyncio.wait_for(entered.wait(), LOAD_WAIT)
            with pytest.raises(ThreadBusyError):
                await graph.aupdate_state(cfg(tid), {"note": "edited by request 2"})
            release.set()
            out = await run
            assert out["log"] == ["work"]
            state = await graph.aget_state(cfg(tid))
            assert state.values == {"log": ["work"]}
            # The run ended: a write from the thread's caller is an ordinary, accepted
            # write now.
            await graph.aupdate_state(cfg(tid), {"note": "later"})
            assert (await graph.aget_state(cfg(tid))).values["note"] == "later"

    asyncio.run(scenario())


def test_defect3_parallel_and_subgraph_writes_of_the_run_pass_its_fence(db: str) -> None:
    """LangGraph submits some writes from a finished task's done-callback, on an executor
    thread outside the run's context: they must still count as the run's writes."""
    tid = "d3-parallel"

    def leaf(name: str) -> Any:
        return lambda state: {"log": [name]}

    sub = StateGraph(S)
    sub.add_node("inner", leaf("inner"))
    sub.add_edge(START, "inner")
    sub.add_edge("inner", END)
    b = StateGraph(S)
    b.add_node("left", leaf("left"))
    b.add_node("right", leaf("right"))
    b.add_node("child", sub.compile())
    b.add_node("join", leaf("join"))
    for n in ("left", "right", "child"):
        b.add_edge(START, n)
    b.add_edge(["left", "right", "child"], "join")
    b.add_edge("join", END)
    with DurablePostgresSaver.from_conn_string(db) as saver:
        graph = b.compile(checkpointer=saver)
        out = graph.invoke({"log": []}, cfg(tid))
        assert sorted(out["log"]) == ["inner", "join", "left", "right"]
        assert thread_row(db, tid)["status"] == "done"


# --------------------------------------------------------------------------- defect 12


def test_defect12_forged_claim_key_in_config_cannot_take_over_a_live_lease(db: str) -> None:
    """The owner string is public (ThreadBusyError.owner). Passing it under the old
    internal configurable key must not hand the live lease over: ThreadBusyError, and
    the node body runs once."""
    tid = "d12"
    entered, release, runs = threading.Event(), threading.Event(), []
    with DurablePostgresSaver.from_conn_string(db, lease_ttl=30) as saver:
        graph = gated_graph(saver, entered, release, runs)
        runner = threading.Thread(target=graph.invoke, args=({"log": []}, cfg(tid)))
        runner.start()
        try:
            assert entered.wait(LOAD_WAIT)
            with pytest.raises(ThreadBusyError) as busy:
                graph.invoke(None, cfg(tid))
            owner = busy.value.owner
            token = thread_row(db, tid)["lease_token"]
            forged = cfg(tid, __durable_claim=(tid, owner))
            with pytest.raises(ThreadBusyError):
                graph.invoke(None, forged)
            with pytest.raises(ThreadBusyError):
                graph.invoke(None, cfg(tid, __durable_claim=[tid, owner, token]))
            assert thread_row(db, tid)["lease_owner"] == owner
        finally:
            release.set()
            runner.join(LOAD_WAIT)
        assert runs == ["work"]
        assert graph.get_state(cfg(tid)).values["log"] == ["work", "after"]


def test_defect12_handoff_needs_the_context_and_the_claims_token(db: str) -> None:
    """The real hand-off (a recovery worker's claim) travels in a ContextVar and must
    name the claim's current fencing token: a stale or guessed one finds the thread busy."""
    from langgraph_durable.saver import claim_handoff

    tid = "d12-handoff"
    entered, release, runs = threading.Event(), threading.Event(), []
    release.set()
    with DurablePostgresSaver.from_conn_string(db) as saver:
        graph = gated_graph(saver, entered, release, runs)
        graph.update_state(cfg(tid), {"log": []}, as_node="__input__")
        q(db, "INSERT INTO durable_threads (thread_id, status, lease_owner, lease_token, lease_expires_at) "
              "VALUES (%s, 'queued', 'worker-x:abc', 7, now() + interval '30 seconds') "
              "ON CONFLICT (thread_id) DO UPDATE SET lease_owner = 'worker-x:abc', lease_token = 7, "
              "lease_expires_at = now() + interval '30 seconds'", (tid,))
        with claim_handoff(tid, "worker-x:abc", 6), pytest.raises(ThreadBusyError):
            graph.invoke(None, cfg(tid))
        with claim_handoff("another-thread", "worker-x:abc", 7), pytest.raises(ThreadBusyError):
            graph.invoke(None, cfg(tid))
        assert runs == []
        with claim_handoff(tid, "worker-x:abc", 7):
            out = graph.invoke(None, cfg(tid))
        assert out["log"] == ["work", "after"] and runs == ["work"]
        row = thread_row(db, tid)
        assert (row["status"], row["lease_owner"], row["lease_token"]) == ("done", None, 8)


# --------------------------------------------------------------------------- defect 6


def _dead_pid() -> int:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


def _here() -> tuple[str, str, str, str]:
    """(hostname, boot time, pid-namespace inode, boot id) of this process, read directly
    (not from process_identity, whose format is what changed)."""
    import socket

    import psutil

    with open("/proc/sys/kernel/random/boot_id") as f:
        boot_id = f.read().strip().replace("-", "")
    ino = str(os.stat("/proc/self/ns/pid").st_ino)
    return socket.gethostname(), str(int(psutil.boot_time())), ino, boot_id


def test_defect6_owner_of_another_pid_namespace_is_never_provably_dead() -> None:
    host, boot, inode, boot_id = _here()
    namespace = f"ns{inode}.{boot_id}"
    dead = _dead_pid()
    # Positive control: same host, same pid namespace, pid gone -> provably dead.
    assert owner_is_dead(f"{host}:{dead}:{boot}.1:{namespace}:abcdef123456")
    # Another pid namespace on the same hostname (a container with --network host):
    # its pid is not ours to look up.
    assert not owner_is_dead(f"{host}:{dead}:{boot}.1:ns{int(inode) + 1}.{boot_id}:abcdef123456")
    # Another kernel boot (another machine with the same hostname).
    assert not owner_is_dead(f"{host}:{dead}:{boot}.1:ns{inode}.{'f' * 32}:abcdef123456")
    # An owner id without a namespace (older version of this package): uncertain.
    assert not owner_is_dead(f"{host}:{dead}:{boot}.1:abcdef123456")
    # Unknown namespace parts prove nothing.
    assert not owner_is_dead(f"{host}:{dead}:{boot}.1:ns0.{boot_id}:abcdef123456")
    assert not owner_is_dead(f"{host}:{dead}:{boot}.1:ns{inode}.0:abcdef123456")
    # This process's own owner ids carry its namespace.
    assert process_identity().split(":")[3] == namespace


def test_defect6_lease_from_another_namespace_is_not_taken_over(db: str) -> None:
    """A live lease whose owner names another pid namespace of this hostname (and a pid
    that does not exist here) waits for expiry: ThreadBusyError, no node runs."""
    tid = "d6-crafted"
    host, boot, inode, boot_id = _here()
    owner = f"{host}:{_dead_pid()}:{boot}.1:ns{int(inode) + 7}.{boot_id}:c0ffee000000"
    q(
        db,
        "INSERT INTO durable_threads (thread_id, status, lease_owner, lease_token, lease_expires_at) "
        "VALUES (%s, 'running', %s, 5, now() + interval '30 seconds')",
        (tid, owner),
    )
    entered, release, runs = threading.Event(), threading.Event(), []
    release.set()
    with DurablePostgresSaver.from_conn_string(db) as saver:
        graph = gated_graph(saver, entered, release, runs)
        with pytest.raises(ThreadBusyError) as err:
            graph.invoke({"log": []}, cfg(tid))
        assert err.value.owner == owner
    assert runs == []
    row = thread_row(db, tid)
    assert (row["lease_owner"], row["lease_token"]) == (owner, 5)


@needs(None if os.geteuid() == 0 and shutil.which("unshare") is not None else "unshare: needs root and unshare(1)")
def test_defect6_run_in_another_pid_namespace_keeps_its_lease(db: str) -> None:
    """A real run under ``unshare --pid --fork --mount-proc`` (same hostname, its own pid
    namespace: the run is pid 1 there, and our pid 1 is another, older process): while
    it runs its node, a run here must find the thread busy, not take it over as a
    "dead process whose pid was reused" and run the node a second time."""
    tid = "d6-unshare"
    proc = subprocess.Popen(
        ["unshare", "--pid", "--fork", "--kill-child", "--mount-proc",
         sys.executable, CHILD, db, tid],
        env=child_env(LGD_BLOCK_AT="n2"),
        start_new_session=True,
    )
    try:
        wait_until(lambda: effects(db, tid, "sl_started").get("n2") == 1 or proc.poll() is not None,
                   "the namespaced child to reach n2")
        assert proc.poll() is None, "the namespaced child exited early"
        holder = thread_row(db, tid)["lease_owner"]
        theirs = holder.split(":")
        assert theirs[0] == _here()[0] and theirs[1] == "1"  # our hostname, pid 1 there
        with DurablePostgresSaver.from_conn_string(db) as saver:
            graph = child.make_builder(db).compile(checkpointer=saver)
            with pytest.raises(ThreadBusyError) as err:
                graph.invoke(None, cfg(tid))
            assert err.value.owner == holder
        assert effects(db, tid) == {"n1": 1}
        assert thread_row(db, tid)["lease_owner"] == holder
    finally:
        proc.kill()
        proc.wait(LOAD_WAIT)


# --------------------------------------------------------------------------- defect 7


def _uuid6(ticks: int, clock_seq: int = 0) -> str:
    """A uuid6 string at ``ticks`` (100 ns since 1582-10-15), like LangGraph's ids."""
    n = ((ticks >> 12) & 0xFFFFFFFFFFFF) << 80
    n |= (0x6000 | (ticks & 0x0FFF)) << 64
    n |= (0x8000 | (clock_seq & 0x3FFF)) << 48
    n |= uuid.uuid4().int & 0xFFFFFFFFFFFF
    return str(uuid.UUID(int=n))


def _now_ticks() -> int:
    return time.time_ns() // 100 + 0x01B21DD213814000


def test_defect7_resume_by_a_machine_whose_clock_is_behind_repeats_no_step(db: str) -> None:
    """Machine A (clock 60 s ahead) crashes (SIGKILL) in n3; machine B (this process,
    60 s behind it) resumes and finishes. A later invoke(None) must find the thread
    finished, not resume from A's old head and charge n3..n5 a second time."""
    tid = "d7-resume"
    proc = subprocess.run(
        [sys.executable, CHILD, db, tid],
        env=child_env(LGD_CLOCK_OFFSET="60", LGD_CRASH_AT="n3"),
        timeout=LOAD_WAIT * 2,
        check=False,
    )
    assert proc.returncode == -signal.SIGKILL
    assert effects(db, tid) == {"n1": 1, "n2": 1}
    head_a = q(db, "SELECT max(checkpoint_id) AS id FROM checkpoints WHERE thread_id = %s", (tid,))[0]["id"]
    with DurablePostgresSaver.from_conn_string(db) as saver:
        graph = child.make_builder(db).compile(checkpointer=saver)
        out = graph.invoke(None, cfg(tid), durability="sync")
        assert out["log"] == ["n1", "n2", "n3", "n4", "n5"]
        again = graph.invoke(None, cfg(tid), durability="sync")
        assert again["log"] == ["n1", "n2", "n3", "n4", "n5"]
        state = graph.get_state(cfg(tid))
        assert state.next == () and state.values["log"] == ["n1", "n2", "n3", "n4", "n5"]
        head = state.config["configurable"]["checkpoint_id"]
        assert head > head_a  # B's checkpoints sort after A's despite B's clock
    assert effects(db, tid) == {n: 1 for n in child.NODES}
    assert thread_row(db, tid)["status"] == "done"


def test_defect7_stock_saver_with_a_clock_behind_repeats_the_steps(db: str) -> None:
    """The failure defect 7's test prevents, shown on the stock saver: the same crash of
    machine A (60 s ahead) in n3 and resume by this process; B's checkpoints sort before
    A's, so the next invoke(None) resumes from one of A's old checkpoints and charges
    steps after n2 again."""
    from langgraph.checkpoint.postgres import PostgresSaver

    tid = "d7-resume-stock-" + uuid.uuid4().hex[:6]
    proc = subprocess.run(
        [sys.executable, CHILD, db, tid],
        env=child_env(LGD_CLOCK_OFFSET="60", LGD_CRASH_AT="n3", LGD_STOCK="1"),
        timeout=LOAD_WAIT * 2,
        check=False,
    )
    assert proc.returncode == -signal.SIGKILL
    assert effects(db, tid) == {"n1": 1, "n2": 1}
    with PostgresSaver.from_conn_string(db) as saver:
        graph = child.make_builder(db).compile(checkpointer=saver)
        out = graph.invoke(None, cfg(tid), durability="sync")
        assert out["log"] == ["n1", "n2", "n3", "n4", "n5"]
        graph.invoke(None, cfg(tid), durability="sync")
    charged = effects(db, tid)
    repeated = {n: c for n, c in charged.items() if c > 1}
    print("stock saver, clock behind: effects", charged)
    assert set(charged) == set(child.NODES) and repeated and not {"n1", "n2"} & set(repeated), charged


def test_defect7_put_that_would_sort_before_the_head_is_refused(db: str) -> None:
    """The backstop in the put itself: a checkpoint id behind the thread's head (and not a
    re-put of a stored one) is refused with ClockSkewError naming the skew; nothing is
    written; this process's id clock then continues after the head."""
    tid = "d7-put"
    config = {"configurable": {"thread_id": tid, "checkpoint_ns": ""}}
    head_id = _uuid6(_now_ticks() + 60 * 10**7)
    with DurablePostgresSaver.from_conn_string(db) as saver:
        head = empty_checkpoint()
        head["id"] = head_id
        saver.put(config, head, {"source": "update", "step": 0}, {})
        saver.put(config, head, {"source": "update", "step": 0}, {})  # re-put: allowed
        behind = empty_checkpoint()
        behind["id"] = _uuid6(_now_ticks())
        with pytest.raises(ClockSkewError) as err:
            saver.put({"configurable": {**config["configurable"], "checkpoint_id": head_id}},
                      behind, {"source": "update", "step": 1}, {})
        e = err.value
        assert (e.thread_id, e.checkpoint_ns, e.checkpoint_id, e.head_checkpoint_id) == (
            tid, "", behind["id"], head_id)
        assert e.skew_seconds is not None and 59 < e.skew_seconds < 61
        rows = q(db, "SELECT checkpoint_id FROM checkpoints WHERE thread_id = %s", (tid,))
        assert [r["checkpoint_id"] for r in rows] == [head_id]
        fresh = empty_checkpoint()  # LangGraph's uuid6: continues after the head now
        assert fresh["id"] > head_id
        saver.put({"configurable": {**config["configurable"], "checkpoint_id": head_id}},
                  fresh, {"source": "update", "step": 1}, {})
        latest = saver.get_tuple(cfg(tid))
        assert latest is not None and latest.checkpoint["id"] == fresh["id"]


# --------------------------------------------------------------------------- defect 8


@contextmanager
def lost_commit_replies() -> Iterator[dict[str, int]]:
    """Every op's first execution commits, then its connection drops before the reply
    reaches us: the driver retries the whole op on a fresh connection."""
    seen = {"injected": 0}

    def hook(conn: Any, attempt: int) -> None:
        if attempt == 0:
            seen["injected"] += 1
            conn.pgconn.finish()
            raise psycopg.OperationalError("injected: connection lost before the COMMIT reply")

    previous = _io.set_after_commit_hook(hook)
    try:
        yield seen
    finally:
        _io.set_after_commit_hook(previous)


def _ledger(dsn: str, thread_id: str) -> list[dict[str, Any]]:
    return q(dsn, "SELECT name, status, attempts FROM durable_ledger WHERE thread_id = %s ORDER BY name",
             (thread_id,))


def _checkout_graph(saver: Any, dsn: str) -> Any:
    @idempotent(wait_timeout=3)
    def charge_card(thread_id: str) -> str:
        child.record(dsn, "sl_effects", thread_id, "charge_card")
        return "charged"

    @idempotent(wait_timeout=3)
    def ship_parcel(thread_id: str) -> str:
        child.record(dsn, "sl_effects", thread_id, "ship_parcel")
        return "shipped"

    def charge(state: S, config: RunnableConfig) -> dict[str, Any]:
        tid = config["configurable"]["thread_id"]
        child.record(dsn, "sl_started", tid, "charge")
        return {"log": [charge_card(tid)]}

    def approve(state: S) -> dict[str, Any]:
        return {"log": [f"approved:{interrupt('ship it?')}"]}

    def ship(state: S, config: RunnableConfig) -> dict[str, Any]:
        tid = config["configurable"]["thread_id"]
        child.record(dsn, "sl_started", tid, "ship")
        return {"log": [ship_parcel(tid)]}

    b = StateGraph(S)
    for name, fn in (("charge", charge), ("approve", approve), ("ship", ship)):
        b.add_node(name, fn)
    b.add_edge(START, "charge")
    b.add_edge("charge", "approve")
    b.add_edge("approve", "ship")
    b.add_edge("ship", END)
    return b.compile(checkpointer=saver)


def test_defect8_lost_commit_reply_is_harmless_for_every_op(db: str) -> None:
    """The reply to every op's COMMIT is lost once (setup, run starts, puts, writes,
    @idempotent claims and completions, releases, update_state, a recovery worker's
    claim and hand-off, copy, prune, delete). Each retry must recognise its own
    committed work: no OutcomeUnknownError / CallInFlightError, no attempt counted
    twice (max_resume_attempts=1 would quarantine), no effect or node run twice."""
    tid, flaky_tid = "d8-checkout", "d8-flaky"
    fails = {"left": 1}

    def flaky(state: S, config: RunnableConfig) -> dict[str, Any]:
        if fails["left"]:
            fails["left"] -= 1
            raise RuntimeError("transient")
        child.record(db, "sl_effects", config["configurable"]["thread_id"], "flaky")
        return {"log": ["flaky"]}

    with DurablePostgresSaver.from_conn_string(db, max_resume_attempts=1, lease_ttl=30) as saver:
        with lost_commit_replies() as seen:
            saver.setup()
            graph = _checkout_graph(saver, db)
            first = graph.invoke({"log": []}, cfg(tid))
            assert first["log"] == ["charged"] and first["__interrupt__"]
            row = thread_row(db, tid)
            assert (row["status"], row["attempts"]) == ("waiting", 0)
            assert graph.get_state(cfg(tid)).next == ("approve",)
            assert len(list(graph.get_state_history(cfg(tid)))) >= 3
            graph.update_state(cfg(tid), {"note": "gift wrap"})
            done = graph.invoke(Command(resume="yes"), cfg(tid))
            assert done["log"] == ["charged", "approved:yes", "shipped"]
            assert done["note"] == "gift wrap"

            # A failed run, then a recovery worker's claim and its hand-off to the run
            # (max_resume_attempts=2: the retry is the thread's second attempt).
            with DurablePostgresSaver.from_conn_string(db, max_resume_attempts=2) as other:
                b = StateGraph(S)
                b.add_node("flaky", flaky)
                b.add_edge(START, "flaky")
                b.add_edge("flaky", END)
                flaky_graph = b.compile(checkpointer=other)
                with pytest.raises(RuntimeError):
                    flaky_graph.invoke({"log": []}, cfg(flaky_tid))
                row = thread_row(db, flaky_tid)
                assert (row["status"], row["attempts"]) == ("error", 1)
                stats = recover(flaky_graph, error_backoff=0, poll_interval=0.1)
                assert stats.outcomes == {"finished": 1}

            saver.copy_thread(tid, tid + "-copy")
            assert graph.get_state(cfg(tid + "-copy")).values["log"] == done["log"]
            saver.prune([tid + "-copy"])
            saver.delete_thread(tid + "-copy")
            assert graph.get_state(cfg(tid + "-copy")).values == {}
        assert seen["injected"] >= 25
    row = thread_row(db, tid)
    assert (row["status"], row["attempts"]) == ("done", 0)
    assert q(db, "SELECT * FROM durable_quarantine") == []
    assert effects(db, tid) == {"charge_card": 1, "ship_parcel": 1}
    assert effects(db, tid, "sl_started") == {"charge": 1, "ship": 1}
    assert [(r["name"].rsplit(".", 1)[-1], r["status"], r["attempts"]) for r in _ledger(db, tid)] == [
        ("charge_card", "completed", 1), ("ship_parcel", "completed", 1)]
    assert thread_row(db, flaky_tid)["status"] == "done"
    assert effects(db, flaky_tid) == {"flaky": 1}


def test_defect8_lost_commit_reply_async(db: str) -> None:
    tid = "d8-async"

    async def scenario() -> None:
        @idempotent(wait_timeout=3)
        async def charge_card(thread_id: str) -> str:
            child.record(db, "sl_effects", thread_id, "charge_card")
            return "charged"

        async def charge(state: S, config: RunnableConfig) -> dict[str, Any]:
            return {"log": [await charge_card(config["configurable"]["thread_id"])]}

        async def approve(state: S) -> dict[str, Any]:
            return {"log": [f"approved:{interrupt('ok?')}"]}

        b = StateGraph(S)
        b.add_node("charge", charge)
        b.add_node("approve", approve)
        b.add_edge(START, "charge")
        b.add_edge("charge", "approve")
        b.add_edge("approve", END)
        async with AsyncDurablePostgresSaver.from_conn_string(db, max_resume_attempts=1) as saver:
            graph = b.compile(checkpointer=saver)
            with lost_commit_replies() as seen:
                await graph.ainvoke({"log": []}, cfg(tid))
                out = await graph.ainvoke(Command(resume="yes"), cfg(tid))
            assert out["log"] == ["charged", "approved:yes"]
            assert seen["injected"] >= 8

    asyncio.run(scenario())
    row = thread_row(db, tid)
    assert (row["status"], row["attempts"]) == ("done", 0)
    assert effects(db, tid) == {"charge_card": 1}


# --------------------------------------------------------------------------- item 14


def test_item14_bind_clone_renewer_stops_with_the_saver(db: str) -> None:
    """A run through a bind() clone starts the lease renewer; closing the saver stops it
    (it used to be the clone's own and lingered for up to 60 s after close)."""
    with DurablePostgresSaver.from_conn_string(db) as saver:
        clone = saver.bind(graph_version="clone-v1")
        entered, release, runs = threading.Event(), threading.Event(), []
        release.set()
        gated_graph(clone, entered, release, runs).invoke({"log": []}, cfg("i14"))
        renewer = clone._renewer
        assert renewer is not None and renewer.is_alive()
        assert saver._renewer is renewer  # one renewer for the saver and its clones
    renewer.join(LOAD_WAIT)
    assert not renewer.is_alive()
    assert clone._renewer is None and saver._renewer is None


def test_defect8_operator_ops_survive_a_lost_commit_reply(db: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """The operator's ops under the same fault: each retry finds its own committed work
    (op_memo) instead of failing, or worse, doing it a second time: quarantine release
    and rewind, ledger resolve / forget, migration undo (a second undo would also undo
    the previous migration of the same checkpoint), delete_for_runs (its threads'
    references must still be recomputed)."""
    import _child_versioning_graphs as G

    from langgraph_durable import Ledger
    from langgraph_durable.ops.migrations import migrate_threads, undo_migration
    from langgraph_durable.ops.poison import release, rewind
    from langgraph_durable.ops.retention import gc, recompute_refs
    from langgraph_durable.recovery import submit

    monkeypatch.setenv(G.DSN_ENV, db)
    G.ensure_side_table(db)

    def boom(state: S) -> dict[str, Any]:
        raise RuntimeError("poison")

    b = StateGraph(S)
    b.add_node("boom", boom)
    b.add_edge(START, "boom")
    b.add_edge("boom", END)

    def quarantine(graph: Any, tid: str, first: Any) -> None:
        with pytest.raises(RuntimeError):
            graph.invoke(first, cfg(tid))
        with pytest.raises(Exception, match="quarantined"):
            graph.invoke(None, cfg(tid))
        assert thread_row(db, tid)["status"] == "quarantined"

    qtid, ltid, mtid, rtid = "d8-op-q", "d8-op-ledger", "d8-op-mig", "d8-op-runs"
    with DurablePostgresSaver.from_conn_string(db, max_resume_attempts=1) as saver:
        poison_graph = b.compile(checkpointer=saver)
        quarantine(poison_graph, qtid, {"log": []})
        with lost_commit_replies():
            entry = release(saver, qtid)
        assert entry.thread_id == qtid and thread_row(db, qtid)["status"] == "stopped"

        quarantine(poison_graph, qtid, None)
        history = q(db, "SELECT checkpoint_id FROM checkpoints WHERE thread_id = %s ORDER BY 1", (qtid,))
        with lost_commit_replies():
            result = rewind(saver, qtid, history[0]["checkpoint_id"])
        assert result.released and result.rewound_from == history[-1]["checkpoint_id"]
        after = q(db, "SELECT checkpoint_id FROM checkpoints WHERE thread_id = %s ORDER BY 1", (qtid,))
        assert len(after) == len(history) + 1 and after[-1]["checkpoint_id"] == result.checkpoint_id

        for key in ("d8-k1", "d8-k2"):
            q(db, "INSERT INTO durable_ledger (key, thread_id, fingerprint, status, owner, claim_expires_at) "
                  "VALUES (%s, %s, 'fp', 'started', 'gone', now() - interval '1 minute')", (key, ltid))
        ledger = Ledger(saver)
        with lost_commit_replies():
            ledger.resolve("d8-k1", "it happened")
            assert ledger.forget("d8-k2") is True
        got = ledger.get("d8-k1")
        assert got is not None and got.status == "completed" and ledger.result("d8-k1") == "it happened"
        assert ledger.get("d8-k2") is None

        G.build_v1().compile(checkpointer=saver.bind(graph_version="v1")).invoke(
            {"log": [], "topic": "urgent"}, cfg(mtid))
        with lost_commit_replies():
            for src, dst, graph in (("v1", "v2", G.graph_v2), ("v2", "v3", G.graph_v3)):
                report = migrate_threads(saver, src, dst, graph=graph, registry=G.registry,
                                         thread_ids=[mtid])
                assert report.migrated == [mtid]
            assert [r["to_version"] for r in q(
                db, "SELECT to_version FROM durable_migration_log WHERE thread_id = %s ORDER BY id",
                (mtid,))] == ["v2", "v3"]  # one backup per migration, none twice
            undone = undo_migration(saver, mtid)
        assert (undone["restored_version"], undone["undone_version"]) == ("v2", "v3")
        head = saver.get_tuple(cfg(mtid))
        assert head is not None and head.metadata["graph_version"] == "v2"

        def big(state: S) -> dict[str, Any]:
            return {"note": state["note"] + ":" + "x" * 5000}  # an artifact per run

        bb = StateGraph(S)
        bb.add_node("big", big)
        bb.add_edge(START, "big")
        bb.add_edge("big", END)
        big_graph = bb.compile(checkpointer=saver)
        runs = [str(uuid.uuid4()), str(uuid.uuid4())]
        for run_id in runs:
            big_graph.invoke({"log": [], "note": run_id}, cfg(rtid, run_id=run_id))
        with lost_commit_replies():
            saver.delete_for_runs([runs[1]])
        assert big_graph.get_state(cfg(rtid)).values["note"].startswith(runs[0])
        assert recompute_refs(saver, [rtid]) == 0  # delete_for_runs recomputed them already
        with lost_commit_replies():
            collected = gc(saver, grace=0)
        assert collected.artifacts >= 1  # run 2's artifact, unreferenced now
        assert big_graph.get_state(cfg(rtid)).values["note"].startswith(runs[0])

        stid = "d8-op-submit"
        with lost_commit_replies():
            submit(big_graph, {"log": [], "note": "queued"}, cfg(stid))
            assert thread_row(db, stid)["status"] == "queued"
            stats = recover(big_graph, poll_interval=0.1)
        assert stats.outcomes == {"finished": 1}
        assert big_graph.get_state(cfg(stid)).values["note"].startswith("queued:")


def test_defect8_retried_acquisition_of_a_refused_resume_hands_the_thread_back(db: str) -> None:
    """A waiting thread, resumed by a graph of another version (refused before any node
    runs) while every COMMIT reply is lost: the thread goes back to 'waiting' with no
    attempt counted, as without the fault; the retried acquisition must not take the
    'running' status it wrote itself for the thread's previous state."""
    from langgraph_durable import GraphVersionMismatchError

    tid = "d8-refused"

    def ask(state: S) -> dict[str, Any]:
        return {"log": [f"answer:{interrupt('?')}"]}

    b = StateGraph(S)
    b.add_node("ask", ask)
    b.add_edge(START, "ask")
    b.add_edge("ask", END)
    with DurablePostgresSaver.from_conn_string(db) as saver:
        b.compile(checkpointer=saver.bind(graph_version="v1")).invoke({"log": []}, cfg(tid))
        assert thread_row(db, tid)["status"] == "waiting"
        other = b.compile(checkpointer=saver.bind(graph_version="v2"))
        with lost_commit_replies(), pytest.raises(GraphVersionMismatchError):
            other.invoke(Command(resume="x"), cfg(tid))
    row = thread_row(db, tid)
    assert (row["status"], row["attempts"], row["lease_owner"]) == ("waiting", 0, None)
