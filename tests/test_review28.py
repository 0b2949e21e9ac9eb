"""Review 28: the two changes of 2026-12-02, attacked on real PostgreSQL.

1. "put: a run's cancel learned from the put's rowcount": a run's put is filtered out
   when an operator cancelled the run, stored by a second statement, and the run stops
   at its next step boundary (core.base.get_next_version).
2. "update_state beside a dead owner's lease" / "operator decisions ... end a provably
   dead owner's lease" (core.write._write, ops.control._op_thread, EXPIRE_DEAD_LEASE_SQL).

The cancel is requested from inside a node (``control.request_cancel`` on another
saver, committed before the node returns), so "the step in which it arrived" is exact.
Dead owners are forged: an owner id of this process's form whose pid is a reaped child
(``true``), so ``owner_is_dead`` judges it as it judges a SIGKILLed run.
"""

from __future__ import annotations

import operator
import subprocess
import threading
import time
import uuid
from collections.abc import Iterator
from typing import Annotated, Any, TypedDict

import pytest
from _db import q, thread_row
from langchain_core.runnables import RunnableConfig
from langgraph.graph import END, START, StateGraph

from langgraph_durable import DurablePostgresSaver
from langgraph_durable.errors import RunCancelledError, ThreadBusyError
from langgraph_durable.leases.owners import owner_is_dead, process_identity
from langgraph_durable.ops import control


class S(TypedDict):
    log: Annotated[list[str], operator.add]
    big: str


class C(TypedDict):
    n: int


def cfg(thread_id: str) -> Any:
    return {"configurable": {"thread_id": thread_id}}


@pytest.fixture(scope="module")
def db(dsn: str) -> str:
    with DurablePostgresSaver.from_conn_string(dsn) as saver:
        saver.setup()
    return dsn


@pytest.fixture
def operator_saver(db: str) -> Iterator[DurablePostgresSaver]:
    """The operator's own saver (its own pool), as a console or the CLI would have."""
    with DurablePostgresSaver.from_conn_string(db) as saver:
        yield saver


def steps(n: int, at: int, ran: list[int], cancel: Any, big: int = 0, pause: float = 0.0) -> StateGraph:
    """s0..s{n-1}; s{at} requests the cancel of its own run; ``big``: the size of a
    string channel every step rewrites (a blob per put); ``pause``: seconds per step."""
    b = StateGraph(S)
    prev = START
    for i in range(n):
        def fn(state: S, config: RunnableConfig, i: int = i) -> dict[str, Any]:
            ran.append(i)
            if pause:
                time.sleep(pause)
            if i == at:
                cancel(config["configurable"]["thread_id"])
            out: dict[str, Any] = {"log": [f"s{i}"]}
            if big:
                out["big"] = f"{i:03d}" * (big // 3)
            return out
        b.add_node(f"s{i}", fn)
        b.add_edge(prev, f"s{i}")
        prev = f"s{i}"
    b.add_edge(prev, END)
    return b


# --------------------------------------------------------------------------- cancel


def test_cancel_under_exit_durability_never_corrupts_the_thread(
    db: str, operator_saver: Any, caplog: pytest.LogCaptureFixture
) -> None:
    """Found while fixing review 28: under durability="exit" a cancel raised at a step
    boundary (get_next_version, inside LangGraph's apply_writes, after the step's tasks
    were marked as having seen their triggers and before their writes were applied) was
    followed by LangGraph storing that in-memory checkpoint on the way out: the thread
    resumed as finished with 9 of 60 steps, the rest lost without a word. Now such a run
    says so (one WARNING) and runs to its end; nothing is lost."""
    ran: list[int] = []
    tid = f"r28-exit-{uuid.uuid4().hex[:6]}"
    with DurablePostgresSaver.from_conn_string(db, lease_ttl=1.5) as saver:
        g = steps(60, 3, ran, lambda t: control.request_cancel(operator_saver, t), big=3_000, pause=0.05)
        app = g.compile(checkpointer=saver)
        with caplog.at_level("WARNING", logger="langgraph_durable"):
            out = app.invoke({"log": [], "big": ""}, cfg(tid), durability="exit")
        assert out["log"] == [f"s{i}" for i in range(60)] and ran == list(range(60))
        assert app.get_state(cfg(tid)).values["log"] == out["log"]
        assert thread_row(db, tid)["status"] == "done"
        assert sum("durability='exit'" in r.getMessage() for r in caplog.records) == 1, caplog.text


@pytest.mark.parametrize("durability", ["async"])
def test_cancel_without_a_put_per_step_stops_at_the_next_renewal(db: str, operator_saver: Any, durability: str) -> None:
    """Found by review 28: under "async" LangGraph chains a run's puts in the background
    (the put carrying the flag can run many steps behind the loop: requested in s3 of 60
    fast steps with a 300 kB state, runs went on to s12..s50, some to the end). The
    bound docs/control.md now gives: the
    first of a put issued after the request and the lease renewal (every lease_ttl/3)
    brings the flag; the next step boundary stops the run. Here lease_ttl 1.5 s
    (renewals every 0.5 s), 60 steps of 50 ms (3 s): the run stops well before its end,
    'stopped', and resumes to it."""
    ran: list[int] = []
    tid = f"r28-lag-{durability}-{uuid.uuid4().hex[:6]}"
    with DurablePostgresSaver.from_conn_string(db, lease_ttl=1.5) as saver:
        g = steps(60, 3, ran, lambda t: control.request_cancel(operator_saver, t), big=300_000, pause=0.05)
        app = g.compile(checkpointer=saver)
        with pytest.raises(RunCancelledError):
            app.invoke({"log": [], "big": ""}, cfg(tid), durability=durability)  # type: ignore[arg-type]
        row = thread_row(db, tid)
        assert row["status"] == "stopped" and row["cancelled_at"] is not None, row
        # A renewal is at most 0.5 s (10 steps) away; a loaded machine gets slack.
        assert len(ran) < 40, f"{len(ran)} steps ran after a cancel requested in s3"
        out = app.invoke(None, cfg(tid), durability=durability)  # type: ignore[arg-type]
        assert out["log"] == [f"s{i}" for i in range(60)]


def test_cancel_under_sync_durability_stops_at_the_step_it_arrived_in(db: str, operator_saver: Any) -> None:
    """Holds: 30 steps (the put statements prepared long before), the cancel requested in
    s20: the put of s20's checkpoint is filtered (rowcount 0), stored by the second
    statement, and the run stops there, 'stopped' with cancelled_at; it resumes to the end."""
    ran: list[int] = []
    tid = f"r28-sync-{uuid.uuid4().hex[:6]}"
    with DurablePostgresSaver.from_conn_string(db) as saver:
        app = steps(30, 20, ran, lambda t: control.request_cancel(operator_saver, t)).compile(checkpointer=saver)
        with pytest.raises(RunCancelledError):
            app.invoke({"log": [], "big": ""}, cfg(tid), durability="sync")
        assert ran == list(range(21))
        assert app.get_state(cfg(tid)).values["log"] == [f"s{i}" for i in range(21)]
        row = thread_row(db, tid)
        assert row["status"] == "stopped" and row["cancelled_at"] is not None and row["lease_owner"] is None
        assert app.invoke(None, cfg(tid))["log"] == [f"s{i}" for i in range(30)]


def test_cancel_learned_by_a_subgraph_put_stops_the_run(db: str, operator_saver: Any) -> None:
    """Holds: requested in a subgraph's step (its puts have checkpoint_ns != ''): the run
    stops at the subgraph's next boundary, 'stopped', and resumes."""
    ran: list[int] = []
    sub = steps(10, 3, ran, lambda t: control.request_cancel(operator_saver, t)).compile()
    b = StateGraph(S)
    b.add_node("a", lambda s: {"log": ["a"]})
    b.add_node("sub", sub)
    b.add_edge(START, "a")
    b.add_edge("a", "sub")
    b.add_edge("sub", END)
    tid = f"r28-sub-{uuid.uuid4().hex[:6]}"
    with DurablePostgresSaver.from_conn_string(db) as saver:
        app = b.compile(checkpointer=saver)
        with pytest.raises(RunCancelledError):
            app.invoke({"log": [], "big": ""}, cfg(tid), durability="sync")
        assert ran in ([0, 1, 2, 3], [0, 1, 2, 3, 4]), ran
        assert thread_row(db, tid)["status"] == "stopped"
        ran.clear()
        app.invoke(None, cfg(tid))
        assert thread_row(db, tid)["status"] == "done"


# --------------------------------------------------------------------------- dead owners


def _owner(pid: int, namespace: str | None = None) -> str:
    host, _, incarnation, mine = process_identity().split(":")
    return f"{host}:{pid}:{incarnation.split('.')[0]}.k1:{namespace or mine}:{uuid.uuid4().hex[:12]}"


def _reaped_pid() -> int:
    p = subprocess.Popen(["true"])
    p.wait()
    return p.pid


def _counter(saver: Any, interrupt_before: list[str] | None = None) -> Any:
    b = StateGraph(C)
    b.add_node("a", lambda s: {"n": s["n"] + 1})
    b.add_node("b", lambda s: {"n": s["n"] + 1})
    b.add_edge(START, "a")
    b.add_edge("a", "b")
    b.add_edge("b", END)
    return b.compile(checkpointer=saver, interrupt_before=interrupt_before)


def _forge_lease(db: str, tid: str, owner: str) -> None:
    q(db, "UPDATE durable_threads SET lease_owner = %s, lease_token = lease_token + 1, "
          "lease_expires_at = now() + interval '30 seconds', status = 'running' WHERE thread_id = %s",
      (owner, tid))


LEASE_SQL = "SELECT lease_owner, lease_token, lease_expires_at FROM durable_threads WHERE thread_id = %s"


def test_a_dead_pid_of_another_pid_namespace_is_never_expired(db: str) -> None:
    """Holds: the owner's pid is gone here, but its id names another pid namespace (a
    container sharing our hostname): not provably dead, so update_state and a decision
    are refused as busy and its lease is left as it was."""
    tid = f"r28-ns-{uuid.uuid4().hex[:6]}"
    with DurablePostgresSaver.from_conn_string(db) as saver:
        app = _counter(saver, interrupt_before=["b"])
        app.invoke({"n": 0}, cfg(tid))
        boot = process_identity().split(":")[3].partition(".")[2]
        owner = _owner(_reaped_pid(), f"ns4000000001.{boot}")
        assert not owner_is_dead(owner)
        _forge_lease(db, tid, owner)
        before = q(db, LEASE_SQL, (tid,))
        with pytest.raises(ThreadBusyError):
            _counter(saver).update_state(cfg(tid), {"n": 40})
        with pytest.raises(ThreadBusyError):
            control.queue_resume(saver, tid)
        assert q(db, LEASE_SQL, (tid,)) == before


def test_update_state_racing_a_run_start_over_a_dead_lease_is_never_lost(db: str) -> None:
    """Holds: update_state (which ends the dead owner's lease, then writes) and
    invoke(None) (which takes the lease over) at once, 12 times: the update is either
    refused as busy (the run took the lease first) or in the final state, never
    accepted and then overwritten by the run."""
    seen: set[tuple[str, int]] = set()
    with DurablePostgresSaver.from_conn_string(db) as saver:
        first, app = _counter(saver, interrupt_before=["b"]), _counter(saver)
        for i in range(12):
            tid = f"r28-race-{i}-{uuid.uuid4().hex[:6]}"
            first.invoke({"n": 0}, cfg(tid))
            _forge_lease(db, tid, _owner(_reaped_pid()))
            gate = threading.Barrier(2)
            out: dict[str, Any] = {}

            def update(tid: str = tid, gate: threading.Barrier = gate, out: dict[str, Any] = out) -> None:
                gate.wait()
                try:
                    app.update_state(cfg(tid), {"n": 100})
                    out["update"] = "accepted"
                except ThreadBusyError:
                    out["update"] = "busy"

            def run(tid: str = tid, gate: threading.Barrier = gate, i: int = i) -> None:
                gate.wait()
                threading.Event().wait((i % 4) * 0.004)
                app.invoke(None, cfg(tid))

            threads = [threading.Thread(target=update), threading.Thread(target=run)]
            for t in threads:
                t.start()
            for t in threads:
                t.join(30)
            final = app.get_state(cfg(tid)).values["n"]
            seen.add((out["update"], final))
            assert (out["update"], final) in {("busy", 2), ("accepted", 101), ("accepted", 100)}, (out, final)
    print("outcomes:", sorted(seen))
