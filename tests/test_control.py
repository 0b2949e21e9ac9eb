"""Operator decisions and the worker registry (issue 25, ops/control.py) on real
PostgreSQL and real processes: a worker's row (idle visible, SIGKILL -> dead, clean exit
-> stopped), resume with the workers that serve the version, an interrupt answered by a
worker exactly once under SIGKILL, cancel of a run in another process (sync and async),
fork, delete with archive, refusals, the audit rows of each."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import _child_control as cc
import pytest
from _db import q, thread_row
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from langgraph.types import Command

from langgraph_durable import AsyncDurablePostgresSaver, DurablePostgresSaver
from langgraph_durable.errors import (
    CheckpointNotFoundError,
    ControlRefusedError,
    RunCancelledError,
    ThreadBusyError,
)
from langgraph_durable.ops import control
from langgraph_durable.recovery import RecoveryWorker

CHILD = str(Path(__file__).with_name("_child_control.py"))


def cfg(thread_id: str) -> Any:
    return {"configurable": {"thread_id": thread_id}}


def wait_for(pred: Any, timeout: float, what: str) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        got = pred()
        if got:
            return got
        time.sleep(0.1)
    raise AssertionError(f"timed out waiting for {what}")


def child_env(dsn: str, **extra: str) -> dict[str, str]:
    return {**os.environ, "LGD_DSN": dsn, **extra}


def audit(dsn: str, thread_id: str, action: str) -> list[dict[str, Any]]:
    return q(dsn, "SELECT * FROM durable_audit WHERE thread_id = %s AND action = %s ORDER BY at", (thread_id, action))


def effects(dsn: str, thread_id: str, kind: str | None = None) -> list[dict[str, Any]]:
    if kind is None:
        return q(dsn, "SELECT * FROM ctl_effects WHERE thread_id = %s ORDER BY id", (thread_id,))
    return q(dsn, "SELECT * FROM ctl_effects WHERE thread_id = %s AND kind = %s ORDER BY id", (thread_id, kind))


@pytest.fixture(scope="module")
def db(dsn: str) -> str:
    q(dsn, cc.SCHEMA_SQL)
    cc.DSN = dsn
    return dsn


@pytest.fixture
def ask_graph(db: str) -> Iterator[Any]:
    with DurablePostgresSaver.from_conn_string(db, lease_ttl=5) as saver:
        yield cc.ask_builder.compile(checkpointer=saver)


def waiting_thread(graph: Any, thread_id: str) -> None:
    out = graph.invoke({"log": []}, cfg(thread_id))
    assert "__interrupt__" in out
    assert thread_row(cc.DSN, thread_id)["status"] == "waiting"


# --------------------------------------------------------------------------- answer


def test_queued_answer_is_run_by_a_worker_and_cleared(db: str, ask_graph: Any) -> None:
    saver = ask_graph.checkpointer
    waiting_thread(ask_graph, "ans-1")
    head = thread_row(db, "ans-1")
    queued = control.queue_answer(saver, "ans-1", {"approved": True, "note": "ok"})
    assert queued.thread_id == "ans-1" and queued.served_by == ()  # no worker registered
    row = thread_row(db, "ans-1")
    assert row["status"] == "queued" and row["answer_blob"] is not None
    # Stored through the serde (type tag + bytes), not plain JSON.
    assert row["answer_type"] == saver.serde.dumps_typed({"approved": True})[0]
    assert b'"approved"' not in bytes(row["answer_blob"])
    assert head["status"] == "waiting"
    result = RecoveryWorker(ask_graph, register=False).recover_one()
    assert result is not None and result.outcome == "finished" and result.status == "done"
    values = ask_graph.get_state(cfg("ans-1")).values
    assert values["log"] == ["prep", 'answer:{"approved": true, "note": "ok"}', "after"]
    row = thread_row(db, "ans-1")
    assert row["answer_blob"] is None and row["answer_checkpoint_id"] is None
    [rec] = audit(db, "ans-1", "answer")
    assert rec["detail"]["value_type"] == "dict" and rec["detail"]["run_by"] == "worker"
    assert "approved" not in json.dumps(rec["detail"])  # never the value itself


def test_answer_refusals(db: str, ask_graph: Any) -> None:
    saver = ask_graph.checkpointer
    with pytest.raises(ControlRefusedError) as info:
        control.queue_answer(saver, "no-such-thread", 1)
    assert info.value.fields["reason"] == "no such thread"
    waiting_thread(ask_graph, "ans-ref")
    ask_graph.invoke(Command(resume="yes"), cfg("ans-ref"))
    assert thread_row(db, "ans-ref")["status"] == "done"
    with pytest.raises(ControlRefusedError) as info:
        control.queue_answer(saver, "ans-ref", "again")
    assert info.value.fields["status"] == "done"
    assert not audit(db, "ans-ref", "answer")


def test_answer_now_runs_here(db: str, ask_graph: Any) -> None:
    waiting_thread(ask_graph, "ans-now")
    out = control.answer_now(ask_graph, "ans-now", [1, "two", None])
    assert out["log"][-2:] == ['answer:[1, "two", null]', "after"]
    assert thread_row(db, "ans-now")["status"] == "done"
    [rec] = audit(db, "ans-now", "answer")
    assert rec["detail"]["run_by"] == "console"
    with pytest.raises(ControlRefusedError):
        control.answer_now(ask_graph, "ans-now", 1)
    waiting_thread(ask_graph, "ans-null")
    with pytest.raises(ControlRefusedError) as info:
        control.queue_answer(ask_graph.checkpointer, "ans-null", None)  # LangGraph: no resume
    assert "null" in info.value.fields["reason"]
    assert thread_row(db, "ans-null")["status"] == "waiting"


JSON = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**53), 2**53) | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=20),
    lambda children: st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=8), children, max_size=4),
    max_leaves=12,
)


@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(value=JSON.filter(lambda v: v is not None))
def test_answer_values_round_trip(db: str, ask_graph: Any, value: Any) -> None:
    """Whatever JSON an operator answers with reaches interrupt() as the same value."""
    import uuid

    tid = f"ans-h-{uuid.uuid4().hex[:8]}"
    waiting_thread(ask_graph, tid)
    control.queue_answer(ask_graph.checkpointer, tid, value)
    result = RecoveryWorker(ask_graph, register=False).recover_one()
    assert result is not None and result.status == "done", result
    [got] = effects(db, tid, "ask")
    assert json.loads(got["detail"]) == json.loads(json.dumps(value, sort_keys=True))


# --------------------------------------------------------------------------- answer x SIGKILL


def _worker_proc(db: str, log: Path, graph: str = "ask", **env: str) -> subprocess.Popen[bytes]:
    fh = log.open("ab")
    return subprocess.Popen(
        [sys.executable, CHILD, "worker", "--poll-interval", "0.2", "--lease-ttl", "3", "-c", "2"],
        env=child_env(db, LGD_GRAPH=graph, **env), stdout=fh, stderr=subprocess.STDOUT,
    )


def _stop(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


@pytest.mark.parametrize("kill_in", ["ask", "after"])
def test_answer_consumed_exactly_once_when_the_worker_is_sigkilled(
    db: str, ask_graph: Any, tmp_path: Path, kill_in: str
) -> None:
    """A worker SIGKILLed after it ran the answer (inside the answered node, before its
    checkpoint: the resume write is stored, the head is still the waiting checkpoint; or
    in the next node: the head moved on) neither loses nor repeats it: the next worker
    runs Command(resume=...) again in the first case, None in the second."""
    tid = f"ans-kill-{kill_in}"
    waiting_thread(ask_graph, tid)
    control.queue_answer(ask_graph.checkpointer, tid, {"ship": kill_in})
    answered = thread_row(db, tid)["answer_checkpoint_id"]
    sleeps = {"LGD_ASK_SLEEP": "60"} if kill_in == "ask" else {"LGD_AFTER_SLEEP": "60"}
    first = _worker_proc(db, tmp_path / "w1.log", **sleeps)
    try:
        wait_for(lambda: effects(db, tid, kill_in), 60, f"the worker in {kill_in}")
        head_now = q(db, "SELECT max(checkpoint_id) AS h FROM checkpoints WHERE thread_id = %s AND checkpoint_ns = ''", (tid,))[0]["h"]
        # Killed inside the answered node: the head is still the answered checkpoint.
        assert (head_now == answered) == (kill_in == "ask")
        first.send_signal(signal.SIGKILL)
        first.wait(10)
    finally:
        if first.poll() is None:
            first.kill()
    assert thread_row(db, tid)["answer_blob"] is not None  # not consumed yet: kept
    second = _worker_proc(db, tmp_path / "w2.log")
    try:
        wait_for(lambda: thread_row(db, tid)["status"] == "done", 60, "the second worker to finish it")
    finally:
        _stop(second)
    log = ask_graph.get_state(cfg(tid)).values["log"]
    answer = 'answer:' + json.dumps({"ship": kill_in})
    assert log == ["prep", answer, "after"], log
    asks = effects(db, tid, "ask")
    assert all(json.loads(a["detail"]) == {"ship": kill_in} for a in asks)
    # Ran once per worker that got that far: twice when killed inside it, else once.
    assert len(asks) == (2 if kill_in == "ask" else 1)
    row = thread_row(db, tid)
    assert row["answer_blob"] is None and row["answer_checkpoint_id"] is None
    assert len(audit(db, tid, "answer")) == 1


# --------------------------------------------------------------------------- cancel


def test_cancel_a_run_in_another_process_then_resume(db: str, tmp_path: Path) -> None:
    tid = "cancel-proc"
    proc = subprocess.Popen(
        [sys.executable, CHILD, "run", tid], env=child_env(db, LGD_STEPS="8", LGD_SLEEP="0.5"),
        stdout=subprocess.PIPE, stderr=(tmp_path / "run.log").open("wb"),
    )
    try:
        wait_for(lambda: len(effects(db, tid, "step")) >= 2, 60, "two steps")
        with DurablePostgresSaver.from_conn_string(db) as saver:
            control.request_cancel(saver, tid)
            out, _ = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 3, out
    fields = json.loads(out.decode().strip().splitlines()[-1])["cancelled"]
    assert fields["thread_id"] == tid
    row = thread_row(db, tid)
    assert row["status"] == "stopped" and row["lease_owner"] is None and row["cancelled_at"] is not None
    steps = [e["detail"] for e in effects(db, tid, "step")]
    assert len(steps) < 8, steps
    [rec] = audit(db, tid, "cancel")
    assert rec["detail"]["lease_token"] == fields["token"]
    with DurablePostgresSaver.from_conn_string(db) as saver:
        graph = cc.make_steps(8).compile(checkpointer=saver)  # the child's graph (LGD_STEPS=8)
        stored = graph.get_state(cfg(tid)).values["log"]
        assert stored == steps[: len(stored)]  # a checkpoint at a step boundary
        # A worker leaves a cancelled thread alone ...
        assert RecoveryWorker(graph, register=False).recover_one() is None
        # ... until an operator resumes it.
        queued = control.queue_resume(saver, tid)
        assert queued.thread_id == tid
        assert thread_row(db, tid)["cancelled_at"] is None
        result = RecoveryWorker(graph, register=False).recover_one()
        assert result is not None and result.status == "done"
        assert graph.get_state(cfg(tid)).values["log"] == [f"s{i}" for i in range(8)]
    assert audit(db, tid, "resume")


def test_cancel_refused_without_a_live_lease_and_never_leaks(db: str) -> None:
    with DurablePostgresSaver.from_conn_string(db) as saver:
        graph = cc.make_steps(2).compile(checkpointer=saver)
        with pytest.raises(ControlRefusedError) as info:
            control.request_cancel(saver, "cancel-none")
        assert info.value.fields["action"] == "cancel"
        graph.invoke({"log": []}, cfg("cancel-leak"))
        with pytest.raises(ControlRefusedError):
            control.request_cancel(saver, "cancel-leak")  # done: no lease
        # A request seen at a run's last put stops it there (stopped, resumable) ...
        gate = threading.Event()
        hold = threading.Event()

        def slow(state: Any) -> dict[str, Any]:
            hold.set()
            gate.wait(10)
            return {"log": ["slow"]}

        from langgraph.graph import END, START, StateGraph

        b = StateGraph(cc.State)
        b.add_node("slow", slow)
        b.add_edge(START, "slow")
        b.add_edge("slow", END)
        g = b.compile(checkpointer=saver)
        errors: list[BaseException] = []

        def run() -> None:
            try:
                g.invoke({"log": []}, cfg("cancel-leak2"), durability="sync")
            except BaseException as exc:
                errors.append(exc)

        t = threading.Thread(target=run, daemon=True)
        t.start()
        hold.wait(10)
        control.request_cancel(saver, "cancel-leak2")
        gate.set()
        t.join(10)
        assert [type(e) for e in errors] == [RunCancelledError]
        row = thread_row(db, "cancel-leak2")
        assert row["status"] == "stopped" and row["cancel_token"] is None  # the release cleared it
        assert g.invoke(None, cfg("cancel-leak2"))["log"] == ["slow"]  # nothing left: done
        assert thread_row(db, "cancel-leak2")["status"] == "done"
        # ... and a request left for a run that ended before any boundary saw it (here: the
        # request of the run that just ended, by its token) never reaches the next run.
        q(db, "UPDATE durable_threads SET cancel_token = lease_token WHERE thread_id = 'cancel-leak2'")
        out = g.invoke({"log": []}, cfg("cancel-leak2"))
        assert out["log"][-1] == "slow" and thread_row(db, "cancel-leak2")["status"] == "done"


async def test_cancel_async_run(db: str) -> None:
    async with AsyncDurablePostgresSaver.from_conn_string(db) as saver:
        graph = cc.make_steps(30).compile(checkpointer=saver)
        task = asyncio.create_task(graph.ainvoke({"log": []}, cfg("cancel-async")))
        await asyncio.to_thread(wait_for, lambda: len(effects(db, "cancel-async", "step")) >= 2, 60, "steps")
        await control.arequest_cancel(saver, "cancel-async")
        with pytest.raises(RunCancelledError):
            await asyncio.wait_for(task, 60)
        row = thread_row(db, "cancel-async")
        assert row["status"] == "stopped" and row["cancelled_at"] is not None
        out = await graph.ainvoke(None, cfg("cancel-async"))  # resumable with invoke(None)
        assert out["log"] == [f"s{i}" for i in range(30)]
        assert thread_row(db, "cancel-async")["cancelled_at"] is None


# --------------------------------------------------------------------------- resume


def test_queue_resume_refusals(db: str, ask_graph: Any) -> None:
    saver = ask_graph.checkpointer
    with pytest.raises(ControlRefusedError):
        control.queue_resume(saver, "resume-none")
    waiting_thread(ask_graph, "resume-wait")
    with pytest.raises(ControlRefusedError) as info:
        control.queue_resume(saver, "resume-wait")
    assert "interrupt" in info.value.fields["reason"]
    control.answer_now(ask_graph, "resume-wait", 1)
    with pytest.raises(ControlRefusedError) as info:
        control.queue_resume(saver, "resume-wait")
    assert info.value.fields["status"] == "done"
    q(db, "UPDATE durable_threads SET status = 'quarantined' WHERE thread_id = 'resume-wait'")
    with pytest.raises(ControlRefusedError) as info:
        control.queue_resume(saver, "resume-wait")
    assert "quarantined" in info.value.fields["reason"]
    assert not audit(db, "resume-wait", "resume")


def test_decisions_refused_on_a_live_lease(db: str) -> None:
    with DurablePostgresSaver.from_conn_string(db) as saver:
        hold, gate = threading.Event(), threading.Event()

        def slow(state: Any) -> dict[str, Any]:
            hold.set()
            gate.wait(20)
            return {"log": ["slow"]}

        from langgraph.graph import END, START, StateGraph

        b = StateGraph(cc.State)
        b.add_node("a", lambda s: {"log": ["a"]})
        b.add_node("slow", slow)
        b.add_edge(START, "a")
        b.add_edge("a", "slow")
        b.add_edge("slow", END)
        g = b.compile(checkpointer=saver)
        t = threading.Thread(target=lambda: g.invoke({"log": []}, cfg("live")), daemon=True)
        t.start()
        try:
            hold.wait(10)
            head = wait_for(
                lambda: q(db, "SELECT max(checkpoint_id) AS h FROM checkpoints WHERE thread_id = 'live'")[0]["h"],
                10, "a checkpoint",
            )
            with pytest.raises(ThreadBusyError):
                control.queue_resume(saver, "live")
            with pytest.raises(ThreadBusyError):
                control.fork(saver, "live", head)
            with pytest.raises(ThreadBusyError):
                control.delete_thread(saver, "live")
        finally:
            gate.set()
            t.join(10)
        for action in ("resume", "fork", "delete"):
            assert not audit(db, "live", action)


# --------------------------------------------------------------------------- fork


def test_fork_from_a_checkpoint_into_a_new_thread(db: str) -> None:
    with DurablePostgresSaver.from_conn_string(db) as saver:
        graph = cc.make_steps(4).compile(checkpointer=saver)
        graph.invoke({"log": []}, cfg("fork-src"))
        history = list(graph.get_state_history(cfg("fork-src")))
        at = next(h for h in history if h.values.get("log") == ["s0", "s1"])
        cid = at.config["configurable"]["checkpoint_id"]
        before = q(db, "SELECT count(*) AS n FROM checkpoints WHERE thread_id = 'fork-src'")[0]["n"]
        new = control.fork(saver, "fork-src", cid, "fork-new")
        assert new == "fork-new"
        state = graph.get_state(cfg("fork-new"))
        assert state.values["log"] == ["s0", "s1"] and state.next == ("s2",)
        assert state.metadata["source"] == "fork"
        assert state.metadata["forked_from"] == {"thread_id": "fork-src", "checkpoint_id": cid}
        row = thread_row(db, "fork-new")
        assert row["status"] == "stopped" and row["cancelled_at"] is not None  # held
        assert RecoveryWorker(graph, register=False).recover_one() is None
        out = graph.invoke(None, cfg("fork-new"))
        assert out["log"] == ["s0", "s1", "s2", "s3"]
        # The source is untouched.
        after = q(db, "SELECT count(*) AS n FROM checkpoints WHERE thread_id = 'fork-src'")[0]["n"]
        assert after == before
        assert graph.get_state(cfg("fork-src")).values["log"] == ["s0", "s1", "s2", "s3"]
        [rec] = audit(db, "fork-src", "fork")
        assert rec["before_id"] == cid and rec["detail"]["new_thread_id"] == "fork-new"
        # Refusals: the target exists, an unknown checkpoint; a generated id otherwise.
        with pytest.raises(ControlRefusedError):
            control.fork(saver, "fork-src", cid, "fork-new")
        with pytest.raises(CheckpointNotFoundError):
            control.fork(saver, "fork-src", "1f000000-0000-6000-8000-000000000000")
        generated = control.fork(saver, "fork-src", cid)
        assert generated.startswith("fork-src-fork-") and graph.get_state(cfg(generated)).values["log"] == ["s0", "s1"]


def test_fork_of_a_waiting_thread_waits_on_the_same_interrupt(db: str, ask_graph: Any) -> None:
    waiting_thread(ask_graph, "fork-wait")
    head = ask_graph.get_state(cfg("fork-wait"))
    new = control.fork(ask_graph.checkpointer, "fork-wait", head.config["configurable"]["checkpoint_id"])
    state = ask_graph.get_state(cfg(new))
    assert [i.value for i in state.interrupts] == [{"question": "ship it?", "order": 7}]
    out = ask_graph.invoke(Command(resume="forked"), cfg(new))
    assert out["log"] == ["prep", 'answer:"forked"', "after"]
    assert thread_row(db, "fork-wait")["status"] == "waiting"  # the source still waits


# --------------------------------------------------------------------------- delete


def test_delete_with_archive_then_restore(db: str, tmp_path: Path) -> None:
    from langgraph_durable import archive

    with DurablePostgresSaver.from_conn_string(db) as saver:
        graph = cc.make_steps(3).compile(checkpointer=saver)
        graph.invoke({"log": []}, cfg("del-arch"))
        location = control.delete_thread(saver, "del-arch", archive_url=str(tmp_path / "arch"))
        assert location is not None and Path(location).exists()
        assert not q(db, "SELECT 1 FROM checkpoints WHERE thread_id = 'del-arch'")
        assert not q(db, "SELECT 1 FROM durable_threads WHERE thread_id = 'del-arch'")
        [rec] = audit(db, "del-arch", "delete")
        assert rec["detail"]["archived"]
        archive.restore(saver, location)
        assert graph.get_state(cfg("del-arch")).values["log"] == ["s0", "s1", "s2"]
        # Without an archive, and the configured URL.
        graph.invoke({"log": []}, cfg("del-plain"))
        assert control.delete_thread(saver, "del-plain") is None
        assert not q(db, "SELECT 1 FROM checkpoints WHERE thread_id = 'del-plain'")
        graph.invoke({"log": []}, cfg("del-env"))
        os.environ[control.ARCHIVE_URL_ENV] = str(tmp_path / "env")
        try:
            assert control.delete_thread(saver, "del-env") is not None
        finally:
            del os.environ[control.ARCHIVE_URL_ENV]
        assert list((tmp_path / "env").iterdir())
        with pytest.raises(ControlRefusedError):
            control.delete_thread(saver, "del-plain")  # gone


async def test_async_twins(db: str, tmp_path: Path) -> None:
    async with AsyncDurablePostgresSaver.from_conn_string(db) as saver:
        graph = cc.ask_builder.compile(checkpointer=saver)
        await graph.ainvoke({"log": []}, cfg("async-ans"))
        queued = await control.aqueue_answer(saver, "async-ans", "async")
        assert queued.thread_id == "async-ans"
        result = await RecoveryWorker(graph, register=False).arecover_one()
        assert result is not None and result.status == "done"
        head = (await graph.aget_state(cfg("async-ans"))).config["configurable"]["checkpoint_id"]
        new = await control.afork(saver, "async-ans", head, "async-fork")
        assert (await graph.aget_state(cfg(new))).values["log"][-1] == "after"
        with pytest.raises(ControlRefusedError):
            await control.aqueue_resume(saver, "async-ans")
        assert await control.adelete_thread(saver, "async-fork", archive_url=str(tmp_path)) is not None
        assert await control.alist_workers(saver, include_dead=True) is not None


# --------------------------------------------------------------------------- workers


def _workers(db: str, **kw: Any) -> list[control.WorkerInfo]:
    with DurablePostgresSaver.from_conn_string(db) as saver:
        return control.list_workers(saver, **kw)


def test_worker_registry_with_real_worker_processes(db: str, ask_graph: Any, tmp_path: Path) -> None:
    """An idle worker is listed alive with its host, pid, versions and concurrency; a
    SIGKILLed one shows dead at once (same host, pid gone), a SIGTERMed one stopped;
    queue_resume names the live workers serving the thread's version."""
    from langgraph_durable.recovery import graph_version_of

    version = graph_version_of(ask_graph)
    q(db, "DELETE FROM durable_workers")
    idle = _worker_proc(db, tmp_path / "idle.log")
    other = _worker_proc(db, tmp_path / "other.log", graph="steps")
    try:
        found = wait_for(lambda: {w.pid: w for w in _workers(db)} if len(_workers(db)) == 2 else None, 60, "two workers")
        w = found[idle.pid]
        assert w.alive and w.host == os.uname().nodename and w.concurrency == 2 and w.claimed == 0
        assert version in w.versions and w.stopped_at is None
        # The heartbeat moves and the last poll is recorded while idle.
        first = w.heartbeat_at
        wait_for(lambda: {x.pid: x for x in _workers(db)}[idle.pid].heartbeat_at > first, 30, "a heartbeat")
        assert {x.pid: x for x in _workers(db)}[idle.pid].last_poll_at is not None
        with DurablePostgresSaver.from_conn_string(db) as saver:
            assert [x.pid for x in control.workers_serving(saver, version)] == [idle.pid]
            # queue_resume says who will pick it up (a stopped thread of the ask graph).
            ask_graph.invoke({"log": []}, cfg("reg-resume"))
            control.answer_now(ask_graph, "reg-resume", "x")
        # SIGKILL: dead at once (same host, pid gone), listed only with include_dead.
        other.send_signal(signal.SIGKILL)
        other.wait(10)
        wait_for(lambda: [x.pid for x in _workers(db)] == [idle.pid], 30, "the killed worker to drop out")
        dead = {x.pid: x for x in _workers(db, include_dead=True)}[other.pid]
        assert not dead.alive and dead.stopped_at is None
        # SIGTERM: a clean exit marks the row stopped.
        _stop(idle)
        rows = {x.pid: x for x in _workers(db, include_dead=True)}
        assert rows[idle.pid].stopped_at is not None and not rows[idle.pid].alive
        assert _workers(db) == []
        # The CLI lists them (JSON), alive and dead.
        from typer.testing import CliRunner

        from langgraph_durable.cli import app

        res = CliRunner().invoke(app, ["workers", "--dsn", db, "--json", "--all"])
        assert res.exit_code == 0, res.output
        listed = {r["pid"]: r for r in json.loads(res.output)}
        assert listed[idle.pid]["alive"] is False and listed[idle.pid]["stopped_at"]
        res = CliRunner().invoke(app, ["workers", "--dsn", db])
        assert res.exit_code == 0 and "no live workers" in res.output
    finally:
        for p in (idle, other):
            if p.poll() is None:
                p.kill()
                p.wait()


def test_queue_resume_names_the_live_workers_serving_the_version(db: str, tmp_path: Path) -> None:
    with DurablePostgresSaver.from_conn_string(db) as saver:
        graph = cc.make_steps(8).compile(checkpointer=saver)
        from langgraph_durable.recovery import graph_version_of

        version = graph_version_of(graph)
        q(db, "INSERT INTO durable_threads (thread_id, status, graph_version) VALUES ('reg-q', 'stopped', %s)", (version,))
        graph.update_state(cfg("reg-q"), {"log": []}, as_node="__input__")
        q(db, "UPDATE durable_threads SET status = 'stopped', lease_owner = NULL WHERE thread_id = 'reg-q'")
        queued = control.queue_resume(saver, "reg-q")
        assert queued.graph_version == version and queued.served_by == ()  # nobody serves it
        worker = _worker_proc(db, tmp_path / "w.log", graph="steps", LGD_STEPS="8")
        try:
            wait_for(lambda: thread_row(db, "reg-q")["status"] == "done", 60, "the worker to run it")
            q(db, "UPDATE durable_threads SET status = 'stopped' WHERE thread_id = 'reg-q'")
            queued = control.queue_resume(saver, "reg-q")
            assert [w.pid for w in queued.served_by] == [worker.pid]
        finally:
            _stop(worker)


def test_old_worker_rows_are_pruned(db: str) -> None:
    from langgraph_durable.recovery import WORKER_ROWS_KEPT, _op_register

    q(db, "DELETE FROM durable_workers")
    q(
        db,
        "INSERT INTO durable_workers (worker_id, name, host, pid, identity, ttl_s, concurrency, heartbeat_at, stopped_at) "
        "SELECT 'old' || g, 'w', 'h', g, 'h:1:0:0', 5, 1, now() - make_interval(secs => g), "
        "CASE WHEN g %% 2 = 0 THEN now() END FROM generate_series(1, %s) g",
        (WORKER_ROWS_KEPT + 50,),
    )
    q(db, "INSERT INTO durable_workers (worker_id, name, host, pid, identity, ttl_s, concurrency, heartbeat_at) "
          "VALUES ('ancient', 'w', 'h', 1, 'h:1:0:0', 5, 1, now() - interval '2 days')")
    with DurablePostgresSaver.from_conn_string(db) as saver:
        saver.run_op(lambda: _op_register({
            "worker_id": "new", "name": "n", "host": "h", "pid": 1, "identity": "h:1:0:0", "ttl": 5.0,
            "versions": [], "graph_names": [], "concurrency": 1,
        }))
    n = q(db, "SELECT count(*) AS n FROM durable_workers")[0]["n"]
    # The kept history, the two rows still live (heartbeat 1 s and 3 s ago, ttl 5 s, not
    # stopped: never pruned) and the new row.
    assert n == WORKER_ROWS_KEPT + 2 + 1
    assert not q(db, "SELECT 1 FROM durable_workers WHERE worker_id = 'ancient'")


async def test_async_worker_registers_and_stops(db: str) -> None:
    async with AsyncDurablePostgresSaver.from_conn_string(db) as saver:
        graph = cc.make_steps(2).compile(checkpointer=saver)
        worker = RecoveryWorker(graph, heartbeat_interval=0.2, poll_interval=0.1)
        task = asyncio.create_task(worker.arun(install_signal_handlers=False))
        try:
            row = await asyncio.to_thread(
                wait_for, lambda: q(db, "SELECT * FROM durable_workers WHERE worker_id = %s", (worker.worker_id,)),
                30, "the async worker's row",
            )
            assert row[0]["stopped_at"] is None and row[0]["pid"] == os.getpid()
            [info] = [w for w in await control.alist_workers(saver) if w.worker_id == worker.worker_id]
            assert info.alive
        finally:
            worker.stop()
            await asyncio.wait_for(task, 30)
        [row] = q(db, "SELECT * FROM durable_workers WHERE worker_id = %s", (worker.worker_id,))
        assert row["stopped_at"] is not None


def test_a_worker_run_cancelled_is_held_until_resumed(db: str) -> None:
    with DurablePostgresSaver.from_conn_string(db) as saver:
        graph = cc.make_steps(30).compile(checkpointer=saver)
        from langgraph_durable.recovery import submit

        submit(graph, {"log": []}, cfg("cancel-worker"))
        results: list[Any] = []
        worker = RecoveryWorker(graph, poll_interval=0.1, on_recovery=results.append, heartbeat_interval=0.5)
        t = threading.Thread(target=lambda: worker.run(install_signal_handlers=False), daemon=True)
        t.start()
        try:
            wait_for(lambda: len(effects(db, "cancel-worker", "step")) >= 2, 60, "steps")
            # The registry counts the run in flight.
            wait_for(lambda: any(w.claimed == 1 for w in control.list_workers(saver) if w.worker_id == worker.worker_id),
                     30, "claimed = 1")
            control.request_cancel(saver, "cancel-worker")
            wait_for(lambda: results, 60, "the run to stop")
            assert results[0].outcome == "cancelled" and results[0].status == "stopped"
            time.sleep(0.5)  # several polls: the held thread is not claimed again
            assert len(results) == 1 and thread_row(db, "cancel-worker")["status"] == "stopped"
            control.queue_resume(saver, "cancel-worker")
            wait_for(lambda: len(results) == 2, 60, "the resumed run")
            assert results[1].status == "done"
        finally:
            worker.stop()
            t.join(30)
        assert graph.get_state(cfg("cancel-worker")).values["log"] == [f"s{i}" for i in range(30)]


@pytest.mark.parametrize("durability", ["sync", "async"])
def test_cancel_stops_at_the_next_step_boundary(db: str, durability: str) -> None:
    """Requested while s2 runs: under durability="sync" s3 never starts (the put of s2's
    checkpoint says so and LangGraph waits for it); under "async" one more step runs
    (s2's put runs beside it), then the boundary after it stops the run. The stored head is a step
    boundary and resumes to the end."""
    from langgraph.graph import END, START, StateGraph

    in_s2, release = threading.Event(), threading.Event()
    ran: list[str] = []

    def node(name: str) -> Any:
        def fn(state: Any) -> dict[str, Any]:
            ran.append(name)
            if name == "s2" and not release.is_set():
                in_s2.set()
                release.wait(10)
            elif durability == "async":
                time.sleep(0.3)  # a step longer than a put (the put runs beside it)
            return {"log": [name]}
        return fn

    b = StateGraph(cc.State)
    prev = START
    for i in range(6):
        b.add_node(f"s{i}", node(f"s{i}"))
        b.add_edge(prev, f"s{i}")
        prev = f"s{i}"
    b.add_edge(prev, END)
    tid = f"cancel-boundary-{durability}"
    with DurablePostgresSaver.from_conn_string(db) as saver:
        g = b.compile(checkpointer=saver)
        errors: list[BaseException] = []

        def run() -> None:
            try:
                g.invoke({"log": []}, cfg(tid), durability=durability)  # type: ignore[arg-type]
            except BaseException as exc:
                errors.append(exc)

        t = threading.Thread(target=run, daemon=True)
        t.start()
        assert in_s2.wait(10)
        control.request_cancel(saver, tid)
        release.set()
        t.join(20)
        assert [type(e) for e in errors] == [RunCancelledError]
        if durability == "sync":
            assert ran == ["s0", "s1", "s2"]
        else:
            # Usually s3 (the put carrying the cancel runs beside it); right after s2 when a
            # lease renewal brought the cancel during s2's wait (a loaded machine); s4 too
            # when the put is still in flight after s3; never all.
            assert ran in (["s0", "s1", "s2"], ["s0", "s1", "s2", "s3"], ["s0", "s1", "s2", "s3", "s4"])
        stored = g.get_state(cfg(tid)).values["log"]
        assert stored == ran[: len(stored)]
        if durability == "sync":
            # The put that learned of the cancel stored its checkpoint all the same (its
            # second, unfiltered statement, sql.checkpoints.CANCELLED_PUT_SQL): s2's.
            assert stored == ran, (stored, ran)
        release.set()
        assert g.invoke(None, cfg(tid))["log"] == [f"s{i}" for i in range(6)]


def test_new_errors_pickle_with_their_fields() -> None:
    import pickle

    for err in (
        RunCancelledError("t", 7, "c"),
        ControlRefusedError("t", "answer", "it does not wait on an interrupt", "done", "c"),
    ):
        back = pickle.loads(pickle.dumps(err))
        assert type(back) is type(err) and str(back) == str(err) and back.fields == err.fields
        assert back.fields["thread_id"] == "t" and back.fields["checkpoint_id"] == "c"


def test_cli_decisions(db: str, ask_graph: Any, tmp_path: Path) -> None:
    from typer.testing import CliRunner

    from langgraph_durable.cli import app

    run = CliRunner().invoke
    waiting_thread(ask_graph, "cli-ans")
    res = run(app, ["threads", "answer", "cli-ans", '{"ok": 1}', "--dsn", db, "--json"])
    assert res.exit_code == 0, res.output
    assert json.loads(res.output)["thread_id"] == "cli-ans" and thread_row(db, "cli-ans")["status"] == "queued"
    [rec] = audit(db, "cli-ans", "answer")
    assert rec["detail"]["run_by"] == "worker"  # (via is "cli" from the real entry point, main())
    res = run(app, ["threads", "answer", "cli-ans", "{not json", "--dsn", db])
    assert res.exit_code == 1
    result = RecoveryWorker(ask_graph, register=False).recover_one()
    assert result is not None and result.status == "done"
    res = run(app, ["threads", "resume", "cli-ans", "--dsn", db])
    assert res.exit_code == 1 and "finished" in res.output
    res = run(app, ["threads", "cancel", "cli-ans", "--dsn", db, "--json"])
    assert res.exit_code == 1 and json.loads(res.output)["error"] == "ControlRefusedError"
    head = ask_graph.get_state(cfg("cli-ans")).config["configurable"]["checkpoint_id"]
    res = run(app, ["threads", "fork", "cli-ans", head, "--new-thread", "cli-fork", "--dsn", db, "--json"])
    assert res.exit_code == 0 and json.loads(res.output)["new_thread_id"] == "cli-fork"
    res = run(app, ["threads", "resume", "cli-fork", "--dsn", db])
    assert res.exit_code == 0 and "no live worker serves" in res.output
    res = run(app, ["threads", "delete", "cli-fork", "--dsn", db])
    assert res.exit_code == 1  # needs --yes
    res = run(app, ["threads", "delete", "cli-fork", "--dsn", db, "--yes", "--archive", str(tmp_path), "--json"])
    assert res.exit_code == 0 and json.loads(res.output)["archive"]
    assert not q(db, "SELECT 1 FROM checkpoints WHERE thread_id = 'cli-fork'")


def test_cancel_of_a_claim_follows_it_into_the_run(db: str) -> None:
    """A cancel requested in the instant between a worker's claim and its run start (the
    live lease is the claim's) is carried over by the run start (LEASE_ACQUIRE_SQL)."""
    from langgraph_durable.recovery import submit

    with DurablePostgresSaver.from_conn_string(db) as saver:
        graph = cc.make_steps(30).compile(checkpointer=saver)
        submit(graph, {"log": []}, cfg("cancel-claim"))
        worker = RecoveryWorker(graph, register=False)
        claim = saver.run_op(worker._claim_op())
        assert claim is not None and claim.thread_id == "cancel-claim"
        control.request_cancel(saver, "cancel-claim")
        result = worker._sync.flows(worker).run_flow(worker._resume_flow(claim, worker._sync))
        assert result.outcome == "cancelled" and result.status == "stopped"
        assert len(effects(db, "cancel-claim", "step")) < 30
