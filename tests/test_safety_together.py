"""Issue 24, items 5 and 6: the safety features work together after a real SIGKILL.

5. A process SIGKILLed inside an ``@idempotent`` tool leaves a claim. Its owner is a
   dead process of this machine, so the claim is judged dead as soon as the run's lease
   is (one check, ``owners.owner_is_dead``): the resume raises ``OutcomeUnknownError``
   at once, not once the claim lease ran out. Runs that stop on such a decision only an
   operator can make are not attempts toward poison, so the documented answer (``ledger
   resolve`` / ``forget``, then ``invoke(None)``) runs instead of meeting
   ``PoisonCheckpointError``.
6. Recovery workers use the same check: a dead owner's thread is claimed at once, also
   by ``worker --until-idle``; ``threads status/list/show`` and the console show such a
   lease as ``recoverable: owner pid N on host H is dead; takeover pending``. A frozen
   (SIGSTOPped, alive) owner is never judged dead.

Real PostgreSQL, real child processes, real SIGKILL. The stock saver has no leases and
no ledger: there is nothing of it to compare here. Durations are printed (the issue's
before/after figures), never asserted; what is asserted is the order of events (the
claim lease still runs when the outcome is known, a worker finds the thread at all).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, TypedDict

import _child_safety as child  # type: ignore[import-not-found]
import psycopg
import pytest
from typer.testing import CliRunner

from langgraph_durable import DurablePostgresSaver, Ledger, idempotent
from langgraph_durable.cli import app as cli_app
from langgraph_durable.errors import CallInFlightError, OutcomeUnknownError
from langgraph_durable.recovery import RecoveryWorker

CHILD = str(Path(child.__file__).resolve())
TIMEOUT = float(os.environ.get("LGD_TEST_TIMEOUT", "90"))  # generous: a busy CI machine
runner = CliRunner()


# --------------------------------------------------------------------------- helpers


def _q(dsn: str, sql: str, *args: Any) -> list[dict[str, Any]]:
    with psycopg.connect(dsn, row_factory=psycopg.rows.dict_row) as conn:
        return conn.execute(sql, args).fetchall()


def _wait_for(what: str, cond: Callable[[], bool], proc: subprocess.Popen[bytes] | None = None) -> None:
    deadline = time.monotonic() + TIMEOUT
    while not cond():
        assert proc is None or proc.poll() is None, f"child exited early waiting for {what}"
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)


def _start(
    dsn: str, mode: str, thread_id: str, *args: str, lease_ttl: float = 30.0
) -> subprocess.Popen[bytes]:
    """A child running ``mode`` on ``thread_id``, once it is inside its hanging node."""
    env = {**os.environ, "SAFETY_LEASE_TTL": str(lease_ttl)}
    proc = subprocess.Popen([sys.executable, CHILD, mode, dsn, thread_id, *args], env=env)
    _wait_for(f"{mode} child inside its node", lambda: child.effects(dsn, thread_id) > 0, proc)
    return proc


def _sigkill(proc: subprocess.Popen[bytes]) -> float:
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    return time.monotonic()


@pytest.fixture
def db(dsn: str) -> str:
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(child.TABLE_DDL)
    return dsn


@pytest.fixture(scope="module")
def frozen(dsn: str) -> Iterator[tuple[str, subprocess.Popen[bytes]]]:
    """A thread whose owner is alive but frozen (SIGSTOP) inside its node; its lease
    (600 s) outlives the module. Never judged dead, never claimed, shown running."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(child.TABLE_DDL)
    tid = f"frozen-{uuid.uuid4().hex[:6]}"
    proc = _start(dsn, "slow", tid, lease_ttl=600)
    os.kill(proc.pid, signal.SIGSTOP)
    yield tid, proc
    os.kill(proc.pid, signal.SIGKILL)
    os.kill(proc.pid, signal.SIGCONT)
    proc.wait()


def _claim_row(dsn: str, thread_id: str) -> dict[str, Any]:
    [row] = _q(
        dsn,
        "SELECT key, status, owner, claim_expires_at > now() AS claim_running FROM durable_ledger "
        "WHERE thread_id = %s AND name = 'charge'",
        thread_id,
    )
    return row


def _thread_row(dsn: str, thread_id: str) -> dict[str, Any]:
    [row] = _q(dsn, "SELECT status, attempts, lease_owner FROM durable_threads WHERE thread_id = %s", thread_id)
    return row


def _killed_claim(dsn: str, name: str, order: str, *, ran_out: bool = False) -> str:
    """The key of an ``@idempotent(key=..., name=name)`` call of ``order`` whose process
    was SIGKILLed inside the function: its claim lease (an hour) still running, or, with
    ``ran_out``, run out (a 1 s claim lease, waited for)."""
    key = f"{name}:{uuid.uuid4().hex[:8]}"
    _sigkill(_start(dsn, "keyed", key, name, order, "1" if ran_out else "3600"))
    sql = "SELECT status, claim_expires_at > now() AS running FROM durable_ledger WHERE key = %s"
    if ran_out:
        _wait_for("the claim lease to run out", lambda: _q(dsn, sql, key)[0]["running"] is False)
    assert _q(dsn, sql, key) == [{"status": "started", "running": not ran_out}]
    return key


def _cli(*args: str) -> Any:
    result = runner.invoke(cli_app, list(args))
    assert result.exit_code == 0, result.output
    return result


# --------------------------------------------------------------------------- item 5


def test_unknown_outcome_is_known_at_once_and_resolve_then_invoke_runs(db: str) -> None:
    """The issue's path: SIGKILL inside the tool, resumes, `ledger resolve`, invoke(None).
    Before: the first resume waited out the claim (30 s by default) and the kill plus
    two resumes quarantined the thread, so invoke(None) after the resolve raised
    PoisonCheckpointError."""
    tid = f"agent-{uuid.uuid4().hex[:6]}"
    # A 120 s lease (and so claim) ttl: "known while the claim still runs" is then a
    # wide margin, not a race with a 30 s clock.
    t_kill = _sigkill(_start(db, "agent", tid, lease_ttl=120))
    config = {"configurable": {"thread_id": tid}}
    with DurablePostgresSaver.from_conn_string(db) as saver:
        app = child.agent_builder(db, hang=False).compile(checkpointer=saver)
        with pytest.raises(OutcomeUnknownError) as info:
            app.invoke(None, config)
        print(f"resume after the kill: OutcomeUnknownError {time.monotonic() - t_kill:.2f} s after SIGKILL")
        claim = _claim_row(db, tid)
        assert info.value.key == claim["key"] and claim["status"] == "started"
        # Judged dead with the lease, not once the dead process's claim ran out.
        assert claim["claim_running"] is True
        entry = Ledger(saver).get(claim["key"])
        assert entry is not None and entry.outcome_unknown and not entry.in_flight
        listed = json.loads(_cli("ledger", "list", "--json", "--dsn", db).stdout)
        assert [r["state"] for r in listed if r["key"] == claim["key"]] == ["unknown_outcome"]
        attempts_after_kill = _thread_row(db, tid)["attempts"]
        for _ in range(saver.max_resume_attempts + 1):  # more resumes than poison allows
            with pytest.raises(OutcomeUnknownError):
                app.invoke(None, config)
        row = _thread_row(db, tid)
        assert row["status"] == "error" and row["attempts"] == attempts_after_kill, row
        # The operator checked the card: it was charged. Resolve from the CLI...
        out = _cli("ledger", "resolve", claim["key"], "--result-json", '"charged o-1 5"', "--json", "--dsn", db)
        assert json.loads(out.stdout)["resolved"] is True
        # ... and the documented next step runs (it met PoisonCheckpointError before).
        result = app.invoke(None, config)
    assert result["messages"][-1].content == "done: charged o-1 5"
    assert child.effects(db, tid, "charge") == 1  # the card was charged once
    assert _thread_row(db, tid)["status"] == "done"


def test_worker_meets_the_unknown_outcome_at_once_and_forget_then_invoke_runs(db: str) -> None:
    """A recovery worker resumes the killed run at once (the dead owner's lease and
    claim alike), reports ``needs_operator`` without counting an attempt, and after
    ``Ledger.forget`` (the effect did not happen) ``invoke(None)`` runs the tool again."""
    tid = f"agent-{uuid.uuid4().hex[:6]}"
    t_kill = _sigkill(_start(db, "agent", tid))
    config = {"configurable": {"thread_id": tid}}
    with DurablePostgresSaver.from_conn_string(db) as saver:
        app = child.agent_builder(db, hang=False).compile(checkpointer=saver)
        result = RecoveryWorker(app).recover_one()
        assert result is not None, "the worker found nothing to claim (the dead owner's lease)"
        print(f"worker resume after the kill: {result.outcome} {time.monotonic() - t_kill:.2f} s after SIGKILL")
        assert result.outcome == "needs_operator" and "OutcomeUnknownError" in (result.error or "")
        attempts = _thread_row(db, tid)["attempts"]
        for _ in range(saver.max_resume_attempts):
            with pytest.raises(OutcomeUnknownError):
                app.invoke(None, config)
        assert _thread_row(db, tid)["attempts"] == attempts
        assert Ledger(saver).forget(_claim_row(db, tid)["key"]) is True
        out = app.invoke(None, config)
    assert out["messages"][-1].content == "done: charged o-1 5"
    assert child.effects(db, tid, "charge") == 2  # forgotten: the operator said it never happened
    assert _thread_row(db, tid)["status"] == "done"


class Two(TypedDict):
    log: list[str]


def test_unknown_outcome_past_the_start_checkpoint_counts_no_attempt(db: str) -> None:
    """The run moves past the checkpoint it started from, then meets an unknown outcome
    (a claim of a SIGKILLed process whose claim lease ran out): no attempt is counted at
    the new head, however often it is resumed; Ledger.resolve (API), then invoke(None)
    finishes it. Before: each resume was a counted attempt, the 4th raised
    PoisonCheckpointError."""
    from langgraph.graph import END, START, StateGraph

    key = _killed_claim(db, "pay", "o-9", ran_out=True)
    ran: list[str] = []

    @idempotent(key=lambda order: key, name="pay", wait_timeout=1.0)
    def pay(order: str) -> str:
        ran.append(order)
        return f"paid {order}"

    builder = StateGraph(Two)
    builder.add_node("first", lambda s: {"log": [*s["log"], "first"]})
    builder.add_node("pay", lambda s: {"log": [*s["log"], pay("o-9")]})
    builder.add_edge(START, "first")
    builder.add_edge("first", "pay")
    builder.add_edge("pay", END)
    tid = f"two-{uuid.uuid4().hex[:6]}"
    config = {"configurable": {"thread_id": tid}}
    with DurablePostgresSaver.from_conn_string(db) as saver:
        app = builder.compile(checkpointer=saver)
        with pytest.raises(OutcomeUnknownError):
            app.invoke({"log": []}, config)
        for _ in range(saver.max_resume_attempts + 1):
            with pytest.raises(OutcomeUnknownError):
                app.invoke(None, config)
        row = _thread_row(db, tid)
        assert row["status"] == "error" and row["attempts"] == 0, row
        Ledger(saver).resolve(key, "paid o-9")
        out = app.invoke(None, config)
    assert out["log"] == ["first", "paid o-9"] and ran == []


def test_retry_tool_reruns_a_dead_owners_claim_at_once(db: str) -> None:
    """on_unknown='retry': a claim whose owner is a dead process of this machine is
    taken over at once, not after its claim lease (an hour here); a live-looking claim
    of an owner this machine cannot judge is still waited for."""
    key = _killed_claim(db, "refund", "o-1")
    # The same call claimed by an owner on another machine: nothing here can judge it.
    other = f"refund:{uuid.uuid4().hex[:8]}"
    _q(db, "INSERT INTO durable_ledger (key, name, fingerprint, status, owner, attempts, claim_expires_at, "
           "created_at) SELECT %s, name, fingerprint, 'started', 'another-host:1:1.k1:ns1.b:ab', 1, "
           "now() + interval '1 hour', now() FROM durable_ledger WHERE key = %s RETURNING key", other, key)
    runs: list[str] = []
    with DurablePostgresSaver.from_conn_string(db) as saver:

        @idempotent(ledger=saver, key=lambda order: key, name="refund", on_unknown="retry", wait_timeout=1.0)
        def refund(order: str) -> str:
            runs.append(order)
            return f"refunded {order}"

        assert refund("o-1") == "refunded o-1" and runs == ["o-1"]
        entry = Ledger(saver).get(key)
        assert entry is not None and entry.status == "completed" and entry.attempts == 2

        @idempotent(ledger=saver, key=lambda order: other, name="refund", on_unknown="retry", wait_timeout=0.5)
        def refund_other(order: str) -> str:
            runs.append(order)
            return f"refunded {order}"

        with pytest.raises(CallInFlightError):
            refund_other("o-1")
        with pytest.raises(CallInFlightError):  # the operator too refuses a call in flight
            Ledger(saver).forget(other)
        assert runs == ["o-1"]


# --------------------------------------------------------------------------- item 6


def _views(db: str, dead: str) -> dict[str, Any]:
    """What every view says about the dead owner's thread ``dead``."""
    status = json.loads(_cli("threads", "status", "--json", "--dsn", db).stdout)
    text = _cli("threads", "status", "--dsn", db).output
    listed = {r["thread_id"]: r for r in json.loads(_cli("threads", "list", "--json", "--dsn", db).stdout)}
    shown = json.loads(_cli("threads", "show", dead, "--json", "--dsn", db).stdout)
    list_text = _cli("threads", "list", "--dsn", db).output
    return {"status": status, "text": text, "listed": listed, "shown": shown, "list_text": list_text}


def test_views_show_a_dead_owners_lease_as_recoverable(db: str, frozen: tuple[str, Any]) -> None:
    frozen_tid, _ = frozen
    tid = f"slow-{uuid.uuid4().hex[:6]}"
    proc = _start(db, "slow", tid)
    pid = proc.pid
    _sigkill(proc)
    note = f"owner pid {pid} on host {os.uname().nodename} is dead; takeover pending"
    v = _views(db, tid)
    # The counts agree with the list, thread by thread (other tests' threads included).
    by_state = [r["state"] for r in v["listed"].values()]
    for state in ("running", "recoverable"):
        assert v["status"][state] == by_state.count(state), (state, v["status"], v["listed"])
    assert f"recoverable: {note}  thread {tid}" in v["text"], v["text"]
    assert v["listed"][tid]["state"] == "recoverable" and v["listed"][tid]["note"] == note
    assert v["listed"][frozen_tid]["state"] == "running" and v["listed"][frozen_tid]["note"] is None
    assert f"recoverable: {note}  thread {tid}" in v["list_text"], v["list_text"]
    assert v["shown"]["state"] == "recoverable" and v["shown"]["lease"]["note"] == note
    running = json.loads(_cli("threads", "list", "--status", "running", "--json", "--dsn", db).stdout)
    assert frozen_tid in [r["thread_id"] for r in running] and tid not in [r["thread_id"] for r in running]

    from starlette.testclient import TestClient

    from langgraph_durable.console import create_app

    with DurablePostgresSaver.from_conn_string(db) as saver, TestClient(create_app(saver, sample_interval=0)) as web:
        overview = web.get("/").text
        running = by_state.count("running")
        assert f'id="count-running"><span class="n">{running}<' in overview, overview
        assert note in overview
        assert note in web.get("/threads").text
        assert note in web.get("/threads?prefix=slow-&newer_than_h=1").text  # the filtered query
        page = web.get(f"/thread?id={tid}").text
        assert note in page and 'st-recoverable' in page


def test_worker_cli_until_idle_claims_a_dead_owners_thread_at_once(db: str, frozen: tuple[str, Any]) -> None:
    """Before: `worker --until-idle` exited having claimed nothing (the dead owner's
    lease had 30 s to run) while invoke would have taken it over at once."""
    frozen_tid, _ = frozen
    tid = f"slow-{uuid.uuid4().hex[:6]}"
    t_kill = _sigkill(_start(db, "slow", tid))
    env = {**os.environ, "SAFETY_DSN": db}
    code = "import sys; from langgraph_durable.cli import main; sys.argv[0] = 'langgraph-durable'; main()"
    worker = subprocess.run(
        [sys.executable, "-c", code, "worker", "--graph", f"{CHILD}:worker_graph", "--until-idle",
         "--poll-interval", "0.2", "--dsn", db],
        env=env, capture_output=True, text=True, timeout=TIMEOUT,
    )
    print(f"worker --until-idle: exit {worker.returncode} {time.monotonic() - t_kill:.2f} s after SIGKILL "
          "(the worker's start-up included)")
    assert worker.returncode == 0, worker.stderr
    row = _thread_row(db, tid)
    assert row["status"] == "done", (row, worker.stderr[-3000:])
    assert child.effects(db, tid, "slow") == 2  # the killed run's node, then the worker's
    assert "claiming it now" in worker.stderr
    # The frozen owner is alive: its thread was neither claimed nor touched.
    assert _thread_row(db, frozen_tid)["status"] == "running"
    assert child.effects(db, frozen_tid) == 1


def test_a_killed_but_unreaped_owner_is_dead(db: str) -> None:
    """A SIGKILLed process whose parent has not reaped it yet (a zombie) keeps its /proc
    entry, start ticks included: it looked alive, so its lease and claims waited out
    their ttl although it holds nothing any more."""
    from langgraph_durable.leases.owners import owner_is_dead

    tid = f"zombie-{uuid.uuid4().hex[:6]}"
    proc = _start(db, "slow", tid)
    owner = _thread_row(db, tid)["lease_owner"]
    assert not owner_is_dead(owner)  # alive
    os.kill(proc.pid, signal.SIGKILL)
    _wait_for("the killed child to be a zombie", lambda: _proc_state(proc.pid) == "Z")
    try:
        assert owner_is_dead(owner)
        with DurablePostgresSaver.from_conn_string(db) as saver:
            app = child.slow_builder(db, hang=False).compile(checkpointer=saver)
            assert app.invoke(None, {"configurable": {"thread_id": tid}}) == {"n": 2}
    finally:
        proc.wait()


def _proc_state(pid: int) -> str:
    with open(f"/proc/{pid}/stat", "rb") as f:
        data = f.read()
    return data[data.rindex(b")") + 2 :].split()[0].decode()



# ------------------------------------------------- item 6: writes outside a run too


@pytest.mark.parametrize("mode", ["sync", "async"])
def test_update_state_on_a_dead_owners_thread_is_accepted_at_once(db: str, mode: str) -> None:
    """Found by test_model_chaos in CI (2026-12-02): update_state right after the run
    holding the thread was SIGKILLed raised ThreadBusyError naming the dead owner, for
    up to lease_ttl (here 30 s), although a run start (invoke) would have taken the
    lease over at once. The write now ends the dead owner's lease and is accepted; the
    thread is then what an expired lease leaves: recoverable, resumed from the update."""
    import asyncio

    tid = f"upd-dead-{mode}-{uuid.uuid4().hex[:6]}"
    proc = _start(db, "slow", tid)
    owner = _thread_row(db, tid)["lease_owner"]
    _sigkill(proc)
    config = {"configurable": {"thread_id": tid}}
    if mode == "sync":
        with DurablePostgresSaver.from_conn_string(db) as saver:
            app = child.slow_builder(db, hang=False).compile(checkpointer=saver)
            app.update_state(config, {"n": 40})
            assert app.get_state(config).values == {"n": 40}
            assert app.invoke(None, config) == {"n": 41}
    else:
        from langgraph_durable import AsyncDurablePostgresSaver

        async def go() -> None:
            async with AsyncDurablePostgresSaver.from_conn_string(db) as saver:
                app = child.slow_builder(db, hang=False).compile(checkpointer=saver)
                await app.aupdate_state(config, {"n": 40})
                assert (await app.aget_state(config)).values == {"n": 40}
                assert await app.ainvoke(None, config) == {"n": 41}

        asyncio.run(go())
    [row] = _q(db, "SELECT status, lease_owner IS NULL AS released FROM durable_threads WHERE thread_id = %s", tid)
    assert row == {"status": "done", "released": True}, (row, owner)


def test_update_state_beside_a_live_frozen_owner_is_still_refused(db: str, frozen: tuple[str, Any]) -> None:
    """The other side: a live (SIGSTOPped) owner is never judged dead, so a write
    outside its run is refused, and its lease is left as it was."""
    from langgraph_durable.errors import ThreadBusyError

    tid, _ = frozen
    before = _q(db, "SELECT lease_owner, lease_token, lease_expires_at FROM durable_threads WHERE thread_id = %s", tid)
    with DurablePostgresSaver.from_conn_string(db) as saver:
        app = child.slow_builder(db, hang=False).compile(checkpointer=saver)
        with pytest.raises(ThreadBusyError) as caught:
            app.update_state({"configurable": {"thread_id": tid}}, {"n": 40})
    assert caught.value.owner == before[0]["lease_owner"]
    after = _q(db, "SELECT lease_owner, lease_token, lease_expires_at FROM durable_threads WHERE thread_id = %s", tid)
    assert after == before


def test_operator_decisions_on_a_dead_owners_thread_are_accepted_at_once(db: str, frozen: tuple[str, Any]) -> None:
    """The views call a dead owner's thread recoverable; the decisions agree: resume
    queues it at once (the dead lease ended in the decision's transaction), where it
    was refused as busy for the rest of lease_ttl; a live (frozen) owner's is still
    refused and its lease left as it was."""
    from langgraph_durable.errors import ThreadBusyError
    from langgraph_durable.ops import control

    tid = f"dec-dead-{uuid.uuid4().hex[:6]}"
    _sigkill(_start(db, "slow", tid))
    frozen_tid, _ = frozen
    lease_sql = "SELECT lease_owner, lease_token, lease_expires_at FROM durable_threads WHERE thread_id = %s"
    before = _q(db, lease_sql, frozen_tid)
    with DurablePostgresSaver.from_conn_string(db) as saver:
        queued = control.queue_resume(saver, tid)
        assert queued.thread_id == tid
        [row] = _q(db, "SELECT status, lease_expires_at <= now() AS ended FROM durable_threads WHERE thread_id = %s", tid)
        assert row == {"status": "queued", "ended": True}, row
        [audit] = _q(db, "SELECT action FROM durable_audit WHERE thread_id = %s", tid)
        assert audit["action"] == "resume"
        with pytest.raises(ThreadBusyError):
            control.queue_resume(saver, frozen_tid)
        assert _q(db, lease_sql, frozen_tid) == before
        result = RecoveryWorker(child.slow_builder(db, hang=False).compile(checkpointer=saver), register=False).recover_one()
        assert result is not None and result.thread_id == tid and result.status == "done", result
