"""Poison-checkpoint detection and quarantine (issue 6), on a real PostgreSQL.

Crash loops run in real processes (tests/_child_poison.py forks one process per
attempt; the node SIGKILLs it) next to the stock PostgresSaver, which re-runs the
crashing node on every resume. Policy (max_resume_attempts = N, default 3): every root
run start from a checkpoint counts one attempt, durably, before any node runs; the run
that first reaches a checkpoint is attempt 1 there. A run that ends done or waiting on
an interrupt resets the count; cancellation and a run that never started undo it;
RetryPolicy retries happen inside one run. Start number N+1 from the same checkpoint
raises PoisonCheckpointError before any node runs: the node ran exactly N times.
"""

from __future__ import annotations

import asyncio
import json
import logging
import operator
import os
import signal
import subprocess
import sys
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Annotated, Any, TypedDict

import psycopg
import pytest
from langgraph.checkpoint.postgres import PostgresSaver
from langgraph.errors import EmptyInputError
from langgraph.graph import END, START, StateGraph
from langgraph.types import Command, RetryPolicy, interrupt
from psycopg.rows import dict_row
from typer.testing import CliRunner

from langgraph_durable import (
    AsyncDurablePostgresSaver,
    CheckpointLoadError,
    CheckpointNotFoundError,
    DurableError,
    DurablePostgresSaver,
    NotQuarantinedError,
    PoisonCheckpointError,
    PoisonRecord,
    ThreadBusyError,
    poison,
)
from langgraph_durable.cli import app

CHILD = Path(__file__).with_name("_child_poison.py")


# ---------------------------------------------------------------------- helpers
def q1(dsn: str, sql: str, *args: Any) -> dict[str, Any] | None:
    with psycopg.connect(dsn, row_factory=dict_row) as conn:
        return conn.execute(sql, args).fetchone()


def exec_(dsn: str, sql: str, *args: Any) -> None:
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(sql, args)


def thread_row(dsn: str, thread: str) -> dict[str, Any] | None:
    return q1(dsn, "SELECT * FROM durable_threads WHERE thread_id = %s", thread)


def quarantine_row(dsn: str, thread: str) -> dict[str, Any] | None:
    return q1(dsn, "SELECT * FROM durable_quarantine WHERE thread_id = %s", thread)


def head(dsn: str, thread: str) -> str:
    row = q1(
        dsn,
        "SELECT checkpoint_id FROM checkpoints WHERE thread_id = %s AND checkpoint_ns = '' "
        "ORDER BY checkpoint_id DESC LIMIT 1",
        thread,
    )
    assert row is not None
    return str(row["checkpoint_id"])


def n_checkpoints(dsn: str, thread: str) -> int:
    row = q1(dsn, "SELECT count(*) AS n FROM checkpoints WHERE thread_id = %s", thread)
    assert row is not None
    return int(row["n"])


def executions(dsn: str, thread: str, node: str) -> int:
    row = q1(
        dsn, "SELECT count(*) AS n FROM poison_exec WHERE thread_id = %s AND node = %s", thread, node
    )
    assert row is not None
    return int(row["n"])


@pytest.fixture(scope="module")
def tables(dsn: str) -> str:
    exec_(
        dsn,
        """CREATE TABLE poison_exec (id BIGSERIAL PRIMARY KEY, thread_id TEXT NOT NULL,
               node TEXT NOT NULL, pid INTEGER NOT NULL)""",
    )
    exec_(
        dsn,
        """CREATE TABLE poison_hook (thread_id TEXT, checkpoint_id TEXT, attempts INTEGER,
               last_error TEXT, graph_version TEXT, reason TEXT, pid INTEGER)""",
    )
    exec_(dsn, "CREATE TABLE poison_docs (thread_id TEXT PRIMARY KEY, body TEXT NOT NULL)")
    return dsn


Attempt = Callable[..., dict[str, Any]]


@pytest.fixture(scope="module")
def attempt(tables: str) -> Iterator[Attempt]:
    """Run one attempt in a fresh forked process of the fork server (one import of
    LangGraph for the whole module)."""
    proc = subprocess.Popen(
        [sys.executable, str(CHILD), tables],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )
    assert proc.stdin is not None and proc.stdout is not None

    def run(
        thread: str, *, saver: str = "durable", scenario: str, first: bool = False, max: int = 3
    ) -> dict[str, Any]:
        cmd = {"saver": saver, "scenario": scenario, "thread": thread, "input": first, "max": max}
        assert proc.stdin is not None and proc.stdout is not None
        proc.stdin.write(json.dumps(cmd) + "\n")
        proc.stdin.flush()
        line = proc.stdout.readline()
        assert line, "fork server died"
        return dict(json.loads(line))

    yield run
    proc.stdin.close()
    proc.wait(timeout=30)


def killed(reply: dict[str, Any]) -> bool:
    return reply["signal"] == signal.SIGKILL and reply["result"] is None


def error_of(reply: dict[str, Any]) -> str | None:
    assert reply["signal"] is None, reply
    result = reply["result"]
    return None if result["ok"] else str(result["error"])


# ---------------------------------------------------------------------- crash loops
@pytest.mark.chaos
def test_sigkill_loop_is_quarantined_then_release_runs_it_again(
    attempt: Attempt, tables: str
) -> None:
    dsn, t = tables, "kill-loop"
    for i in range(3):
        # Each attempt is killed inside `danger`; the next one waits out the dead
        # process's lease (ttl 1.5 s), then counts one more attempt before running.
        assert killed(attempt(t, scenario="kill", first=(i == 0)))
        assert executions(dsn, t, "danger") == i + 1
        row = thread_row(dsn, t)
        assert row is not None and row["attempts"] == i + 1 and row["status"] == "running"
    poisoned = head(dsn, t)
    assert thread_row(dsn, t)["attempts_checkpoint_id"] == poisoned  # type: ignore[index]

    # Start number 4 from the same checkpoint: refused before any node runs.
    reply = attempt(t, scenario="kill")
    assert error_of(reply) == "PoisonCheckpointError"
    fields = reply["result"]["fields"]
    assert fields == {
        "thread_id": t,
        "checkpoint_id": poisoned,
        "attempts": 3,
        "last_error": None,  # every failure was a dead process
        "reason": "max_attempts",
    }
    assert executions(dsn, t, "danger") == 3 and executions(dsn, t, "prep") == 1
    row = thread_row(dsn, t)
    assert row is not None and row["status"] == "quarantined" and row["lease_owner"] is None
    q = quarantine_row(dsn, t)
    assert q is not None and q["checkpoint_id"] == poisoned and q["attempts"] == 3
    assert q["graph_version"] == "poison-v1" and q["reason"] == "max_attempts"

    # A later start (a user, a recovery worker): refused too, the hook does not run again.
    assert error_of(attempt(t, scenario="kill")) == "PoisonCheckpointError"
    assert executions(dsn, t, "danger") == 3
    with psycopg.connect(dsn, row_factory=dict_row) as conn:
        hooks = conn.execute("SELECT * FROM poison_hook WHERE thread_id = %s", (t,)).fetchall()
    assert len(hooks) == 1
    assert hooks[0]["checkpoint_id"] == poisoned and hooks[0]["attempts"] == 3
    assert hooks[0]["graph_version"] == "poison-v1" and hooks[0]["last_error"] is None
    assert hooks[0]["reason"] == "max_attempts"

    # Operator: release. The count starts over and the next run executes the node again.
    with DurablePostgresSaver.from_conn_string(dsn) as saver:
        [listed] = [e for e in poison.list_quarantined(saver) if e.thread_id == t]
        assert listed.checkpoint_id == poisoned and listed.head_checkpoint_id == poisoned
        entry = poison.release(saver, t)
        assert entry.thread_id == t and entry.attempts == 3
        with pytest.raises(NotQuarantinedError):
            poison.release(saver, t)
    row = thread_row(dsn, t)
    assert row is not None and row["status"] == "stopped" and row["attempts"] == 0
    assert quarantine_row(dsn, t) is None
    assert killed(attempt(t, scenario="kill"))
    assert executions(dsn, t, "danger") == 4
    assert thread_row(dsn, t)["attempts"] == 1  # type: ignore[index]


@pytest.mark.chaos
def test_stock_saver_reruns_a_sigkill_loop_forever(attempt: Attempt, tables: str) -> None:
    dsn, t = tables, "kill-loop-stock"
    for i in range(5):
        assert killed(attempt(t, saver="stock", scenario="kill", first=(i == 0)))
        # Nothing counts the deaths: every resume runs the killer node again.
        assert executions(dsn, t, "danger") == i + 1
    assert thread_row(dsn, t) is None


@pytest.mark.chaos
def test_exception_loop_is_quarantined_with_the_error(attempt: Attempt, tables: str) -> None:
    dsn, t = tables, "raise-loop"
    # max_resume_attempts is per saver: 2 here.
    assert error_of(attempt(t, scenario="raise", first=True, max=2)) == "RuntimeError"
    row = thread_row(dsn, t)
    assert row is not None and row["status"] == "error" and row["attempts"] == 1
    assert error_of(attempt(t, scenario="raise", max=2)) == "RuntimeError"
    assert thread_row(dsn, t)["attempts"] == 2  # type: ignore[index]
    reply = attempt(t, scenario="raise", max=2)
    assert error_of(reply) == "PoisonCheckpointError"
    fields = reply["result"]["fields"]
    assert fields["attempts"] == 2 and fields["checkpoint_id"] == head(dsn, t)
    assert fields["last_error"] == "RuntimeError: bad document in raise-loop (execution 2)"
    assert executions(dsn, t, "danger") == 2
    assert error_of(attempt(t, scenario="raise", max=2)) == "PoisonCheckpointError"
    assert executions(dsn, t, "danger") == 2
    hook = q1(dsn, "SELECT * FROM poison_hook WHERE thread_id = %s", t)
    assert hook is not None and hook["last_error"] == fields["last_error"]

    stock = "raise-loop-stock"
    for i in range(4):
        assert error_of(attempt(stock, saver="stock", scenario="raise", first=(i == 0))) == "RuntimeError"
        assert executions(dsn, stock, "danger") == i + 1


@pytest.mark.chaos
def test_failing_once_then_succeeding_is_not_quarantined(attempt: Attempt, tables: str) -> None:
    dsn, t = tables, "kill-once"
    assert killed(attempt(t, scenario="kill_once", first=True))
    assert thread_row(dsn, t)["attempts"] == 1  # type: ignore[index]
    reply = attempt(t, scenario="kill_once")
    assert error_of(reply) is None
    assert reply["result"]["steps"] == ["prep", "danger", "finish"]
    row = thread_row(dsn, t)
    assert row is not None and row["status"] == "done" and row["attempts"] == 0
    assert row["last_error"] is None and quarantine_row(dsn, t) is None
    assert [executions(dsn, t, n) for n in ("prep", "danger", "finish")] == [1, 2, 1]


# ---------------------------------------------------------------------- what does not count
class Calls(Counter[str]):
    pass


class S(TypedDict, total=False):
    x: int
    doc: str
    items: list[int]
    big: str
    answer: str
    steps: Annotated[list[str], operator.add]


def _chain(*nodes: tuple[str, Callable[..., Any]], retry: RetryPolicy | None = None) -> Any:
    builder = StateGraph(S)
    prev = START
    for name, fn in nodes:
        builder.add_node(name, fn, retry_policy=retry)
        builder.add_edge(prev, name)
        prev = name
    builder.add_edge(prev, END)
    return builder


def test_retry_policy_retries_are_one_attempt(dsn: str) -> None:
    calls = Calls()

    def flaky(state: S) -> S:
        calls["flaky"] += 1
        if calls["flaky"] < 3:
            raise ValueError("transient")
        return {"x": 1}

    def broken(state: S) -> S:
        calls["broken"] += 1
        raise ValueError("permanent")

    retry = RetryPolicy(max_attempts=4, initial_interval=0.001, jitter=False, retry_on=ValueError)
    with DurablePostgresSaver.from_conn_string(dsn, max_resume_attempts=2) as saver:
        ok = _chain(("flaky", flaky), retry=retry).compile(checkpointer=saver)
        ok.invoke({"x": 0}, {"configurable": {"thread_id": "retry-ok"}})
        assert calls["flaky"] == 3
        row = thread_row(dsn, "retry-ok")
        assert row is not None and row["status"] == "done" and row["attempts"] == 0

        bad = _chain(("broken", broken), retry=retry).compile(checkpointer=saver)
        cfg = {"configurable": {"thread_id": "retry-bad"}}
        for run in (1, 2):
            with pytest.raises(ValueError):
                bad.invoke({"x": 0} if run == 1 else None, cfg)
            # Four executions inside the run, one attempt at the checkpoint.
            assert calls["broken"] == 4 * run
            assert thread_row(dsn, "retry-bad")["attempts"] == run  # type: ignore[index]
        with pytest.raises(PoisonCheckpointError) as err:
            bad.invoke(None, cfg)
        assert err.value.attempts == 2 and err.value.last_error == "ValueError: permanent"
        assert calls["broken"] == 8


def test_interrupt_waits_do_not_count(dsn: str) -> None:
    calls = Calls()

    def ask(state: S) -> S:
        calls["ask"] += 1
        return {"answer": str(interrupt("approve?"))}

    with DurablePostgresSaver.from_conn_string(dsn, max_resume_attempts=1) as saver:
        graph = _chain(("ask", ask)).compile(checkpointer=saver)
        cfg = {"configurable": {"thread_id": "interrupt-wait"}}
        for i in range(4):  # more starts than max_resume_attempts, all ending in a wait
            out = graph.invoke({"x": 0} if i == 0 else None, cfg)
            assert "__interrupt__" in out
            row = thread_row(dsn, "interrupt-wait")
            assert row is not None and row["status"] == "waiting" and row["attempts"] == 0
        assert graph.invoke(Command(resume="yes"), cfg)["answer"] == "yes"
        assert calls["ask"] == 5
        assert thread_row(dsn, "interrupt-wait")["status"] == "done"  # type: ignore[index]


async def test_cancellation_does_not_count(dsn: str) -> None:
    started = asyncio.Event()
    calls = Calls()

    async def prep(state: S) -> S:
        return {"x": 1}

    async def slow(state: S) -> S:
        calls["slow"] += 1
        started.set()
        await asyncio.Event().wait()  # until cancelled
        return {}

    async with AsyncDurablePostgresSaver.from_conn_string(dsn, max_resume_attempts=1) as saver:
        graph = _chain(("prep", prep), ("slow", slow)).compile(checkpointer=saver)
        cfg = {"configurable": {"thread_id": "cancelled"}}
        for i in range(3):
            started.clear()
            task = asyncio.create_task(graph.ainvoke({"x": 0} if i == 0 else None, cfg))
            await started.wait()
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
            row = thread_row(dsn, "cancelled")
            assert row is not None and row["status"] == "stopped" and row["attempts"] == 0
        assert calls["slow"] == 3


def test_closed_stream_and_keyboard_interrupt_do_not_count(dsn: str) -> None:
    calls = Calls()

    def a(state: S) -> S:
        calls["a"] += 1
        return {"x": 1}

    def stop(state: S) -> S:
        calls["stop"] += 1
        raise KeyboardInterrupt

    with DurablePostgresSaver.from_conn_string(dsn, max_resume_attempts=1) as saver:
        graph = _chain(("a", a)).compile(checkpointer=saver)
        cfg = {"configurable": {"thread_id": "closed-stream"}}
        for i in range(3):
            events = graph.stream({"x": 0} if i == 0 else None, cfg, stream_mode="tasks")
            assert next(events)["name"] == "a"  # the task is about to run
            events.close()
            assert thread_row(dsn, "closed-stream")["attempts"] == 0  # type: ignore[index]
        graph.invoke(None, cfg)
        assert thread_row(dsn, "closed-stream")["status"] == "done"  # type: ignore[index]

        ki = _chain(("stop", stop)).compile(checkpointer=saver)
        cfg = {"configurable": {"thread_id": "ctrl-c"}}
        for i in range(3):
            with pytest.raises(KeyboardInterrupt):
                ki.invoke({"x": 0} if i == 0 else None, cfg)
            row = thread_row(dsn, "ctrl-c")
            assert row is not None and row["status"] == "stopped" and row["attempts"] == 0
        assert calls["stop"] == 3


def test_a_run_that_fails_to_start_neither_counts_nor_keeps_the_lease(dsn: str) -> None:
    # EmptyInputError is raised inside PregelLoop.__enter__ after the saver took the
    # lease: no __exit__ runs. The thread must not stay busy, nor count an attempt.
    with DurablePostgresSaver.from_conn_string(dsn, max_resume_attempts=1) as saver:
        graph = _chain(("a", lambda s: {"x": 1})).compile(checkpointer=saver)
        cfg = {"configurable": {"thread_id": "bad-start"}}
        for _ in range(3):
            with pytest.raises(EmptyInputError):
                graph.invoke(None, cfg)
            row = thread_row(dsn, "bad-start")
            assert row is not None and row["lease_owner"] is None and row["attempts"] == 0
        assert graph.invoke({"x": 0}, cfg)["x"] == 1


async def test_a_run_that_fails_to_start_async(dsn: str) -> None:
    async with AsyncDurablePostgresSaver.from_conn_string(dsn, max_resume_attempts=1) as saver:
        graph = _chain(("a", lambda s: {"x": 1})).compile(checkpointer=saver)
        cfg = {"configurable": {"thread_id": "bad-start-async"}}
        for _ in range(2):
            with pytest.raises(EmptyInputError):
                await graph.ainvoke(None, cfg)
            row = thread_row(dsn, "bad-start-async")
            assert row is not None and row["lease_owner"] is None and row["attempts"] == 0
        assert (await graph.ainvoke({"x": 0}, cfg))["x"] == 1


def test_replay_from_an_earlier_checkpoint_runs(dsn: str) -> None:
    # LangGraph re-reads the latest checkpoint inside __enter__ of a replay
    # (checkpoint_superseded): that read must not be taken for a second run start.
    with DurablePostgresSaver.from_conn_string(dsn) as saver:
        graph = _chain(("a", lambda s: {"x": s["x"] + 1})).compile(checkpointer=saver)
        cfg = {"configurable": {"thread_id": "replay"}}
        graph.invoke({"x": 1}, cfg)
        graph.invoke({"x": 10}, cfg)
        first_run = [
            s for s in graph.get_state_history(cfg) if s.next == ("a",) and s.values["x"] == 1
        ]
        assert graph.invoke(None, first_run[0].config)["x"] == 2


# ---------------------------------------------------------------------- hooks
def test_sync_hook_failure_is_logged_and_poison_still_raised(
    dsn: str, caplog: pytest.LogCaptureFixture
) -> None:
    def hook(record: PoisonRecord) -> None:
        raise RuntimeError("pager down")

    def boom(state: S) -> S:
        raise RuntimeError("boom")

    with DurablePostgresSaver.from_conn_string(dsn, max_resume_attempts=1, on_poison=hook) as saver:
        graph = _chain(("boom", boom)).compile(checkpointer=saver)
        cfg = {"configurable": {"thread_id": "hook-fails"}}
        with pytest.raises(RuntimeError, match="boom"):
            graph.invoke({"x": 0}, cfg)
        with caplog.at_level(logging.ERROR, logger="langgraph_durable"):
            with pytest.raises(PoisonCheckpointError):
                graph.invoke(None, cfg)
    messages = [r.getMessage() for r in caplog.records]
    assert any("quarantined at checkpoint" in m and "hook-fails" in m for m in messages)
    assert any("on_poison hook failed for thread hook-fails" in m for m in messages)


async def test_async_hook_runs_once_and_async_operator_api(
    dsn: str, caplog: pytest.LogCaptureFixture
) -> None:
    records: list[PoisonRecord] = []

    async def hook(record: PoisonRecord) -> None:
        await asyncio.sleep(0)
        records.append(record)

    async def failing_hook(record: PoisonRecord) -> None:
        raise RuntimeError("pager down")

    calls = Calls()

    async def boom(state: S) -> S:
        calls["boom"] += 1
        raise RuntimeError("boom")

    async with AsyncDurablePostgresSaver.from_conn_string(
        dsn, max_resume_attempts=1, on_poison=hook, graph_version="g-async"
    ) as saver:
        graph = _chain(("boom", boom)).compile(checkpointer=saver)
        cfg = {"configurable": {"thread_id": "async-hook"}}
        with pytest.raises(RuntimeError):
            await graph.ainvoke({"x": 0}, cfg)
        for _ in range(2):
            with pytest.raises(PoisonCheckpointError) as err:
                await graph.ainvoke(None, cfg)
        assert calls["boom"] == 1
        assert records == [
            PoisonRecord(
                "async-hook", head(dsn, "async-hook"), 1, "RuntimeError: boom", "g-async"
            )
        ]
        assert err.value.checkpoint_id == records[0].checkpoint_id

        report = await poison.ashow(saver, "async-hook")
        assert report.status == "quarantined" and report.quarantine is not None
        assert [e.thread_id for e in await poison.alist_quarantined(saver)].count("async-hook") == 1
        await poison.arelease(saver, "async-hook")
        with pytest.raises(RuntimeError):
            await graph.ainvoke(None, cfg)
        assert calls["boom"] == 2
        parent = report.history[1].checkpoint_id
        result = await poison.arewind(saver, "async-hook", parent)
        assert result.rewound_to == parent and result.released is False

        failing = saver.bind(graph_version="g-async")
        failing.on_poison = failing_hook
        graph2 = _chain(("boom", boom)).compile(checkpointer=failing)
        cfg2 = {"configurable": {"thread_id": "async-hook-fails"}}
        with pytest.raises(RuntimeError):
            await graph2.ainvoke({"x": 0}, cfg2)
        with caplog.at_level(logging.ERROR, logger="langgraph_durable"):
            with pytest.raises(PoisonCheckpointError):
                await graph2.ainvoke(None, cfg2)
    assert any("on_poison hook failed" in r.getMessage() for r in caplog.records)


# ---------------------------------------------------------------------- corrupted bytes
CORRUPTIONS = {
    # a msgpack blob of a channel value (0xc1 is never valid msgpack)
    "blob": "UPDATE checkpoint_blobs SET blob = '\\xc1'::bytea WHERE thread_id = %s AND channel = 'items'",
    # a pending write (the interrupt the thread waits on)
    "write": "UPDATE checkpoint_writes SET blob = '\\xc1'::bytea WHERE thread_id = %s AND channel = '__interrupt__'",
    # an offloaded artifact (content-addressed: its hash no longer matches)
    "artifact": """UPDATE durable_artifacts SET data = '\\xdeadbeef'::bytea WHERE digest IN
                   (SELECT digest FROM durable_artifact_refs WHERE thread_id = %s)""",
    # the checkpoint JSON itself
    "json": """UPDATE checkpoints SET checkpoint = checkpoint - 'versions_seen'
               WHERE thread_id = %s AND checkpoint_id = (SELECT max(checkpoint_id)
               FROM checkpoints WHERE thread_id = %s)""",
}


def _corruptible(calls: Calls) -> Any:
    def load(state: S) -> S:
        calls["load"] += 1
        tid = state["doc"]
        # unique big content per thread and execution: artifacts are content-addressed
        return {"items": [1, 2, calls["load"]], "big": f"{tid}:{calls['load']}:" + "x" * 4000}

    def ask(state: S) -> S:
        calls["ask"] += 1
        return {"answer": str(interrupt("approve?"))}

    return _chain(("load", load), ("ask", ask))


@pytest.mark.parametrize("what", sorted(CORRUPTIONS))
def test_corrupted_checkpoint_fails_closed(dsn: str, what: str) -> None:
    calls = Calls()
    t = f"corrupt-{what}"
    cfg = {"configurable": {"thread_id": t}}
    builder = _corruptible(calls)
    with DurablePostgresSaver.from_conn_string(dsn) as saver:
        builder.compile(checkpointer=saver).invoke({"doc": t}, cfg)
    bad_head = head(dsn, t)
    exec_(dsn, CORRUPTIONS[what], *([t, t] if what == "json" else [t]))

    records: list[PoisonRecord] = []
    # A fresh saver: nothing cached from before the corruption.
    with DurablePostgresSaver.from_conn_string(dsn, on_poison=records.append) as saver:
        graph = builder.compile(checkpointer=saver)
        with pytest.raises(PoisonCheckpointError) as err:
            graph.invoke(Command(resume="yes"), cfg)
        assert err.value.reason == "load_error" and err.value.checkpoint_id == bad_head
        assert err.value.last_error is not None
        assert calls == Counter({"load": 1, "ask": 1})  # nothing ran on half a state
        q = quarantine_row(dsn, t)
        assert q is not None and q["reason"] == "load_error" and q["checkpoint_id"] == bad_head
        assert len(records) == 1 and records[0].reason == "load_error"

        # Reads never quarantine, and say what is broken, with a typed error.
        with pytest.raises(CheckpointLoadError) as load_err:
            graph.get_state(cfg)
        assert load_err.value.thread_id == t and load_err.value.checkpoint_id == bad_head
        with pytest.raises(PoisonCheckpointError):
            graph.invoke(Command(resume="yes"), cfg)
        assert len(records) == 1 and calls["ask"] == 1

        report = poison.show(saver, t)  # SQL only: works on the broken thread
        assert report.quarantine is not None and report.history[0].checkpoint_id == bad_head
        if what == "write":
            # Only a pending write is broken: a fork of the same checkpoint leaves the
            # writes behind, so rewinding onto it is enough.
            result = poison.rewind(saver, t, bad_head)
        else:
            # Rewinding onto the broken checkpoint is refused, nothing written ...
            with pytest.raises(CheckpointLoadError):
                poison.rewind(saver, t, bad_head)
            assert quarantine_row(dsn, t) is not None and head(dsn, t) == bad_head
            # ... onto the one before `load` (the broken value is `load`'s output) works.
            [before_load] = [c for c in report.history if c.step == 0]
            result = poison.rewind(saver, t, before_load.checkpoint_id)
        assert result.released and result.rewound_from == bad_head
        assert "__interrupt__" in graph.invoke(None, cfg)
        assert graph.invoke(Command(resume="yes"), cfg)["answer"] == "yes"
        assert calls == Counter({"load": 1 if what == "write" else 2, "ask": 3})

    if what != "artifact":  # the stock saver cannot read artifacts at all
        stock_t = f"stock-corrupt-{what}"
        stock_cfg = {"configurable": {"thread_id": stock_t}}
        with PostgresSaver.from_conn_string(dsn) as stock:
            stock_graph = builder.compile(checkpointer=stock)
            stock_graph.invoke({"doc": stock_t}, stock_cfg)
            exec_(dsn, CORRUPTIONS[what], *([stock_t, stock_t] if what == "json" else [stock_t]))
            for _ in range(2):  # no record, no quarantine: an untyped error every time
                with pytest.raises(Exception) as stock_err:
                    stock_graph.invoke(Command(resume="yes"), stock_cfg)
                assert not isinstance(stock_err.value, DurableError)


# ---------------------------------------------------------------------- rewind / release
def test_rewind_continues_from_the_chosen_checkpoint(tables: str) -> None:
    dsn, calls, t = tables, Calls(), "rewind"

    def fetch(state: S) -> S:
        calls["fetch"] += 1
        row = q1(dsn, "SELECT body FROM poison_docs WHERE thread_id = %s", t)
        assert row is not None
        return {"doc": row["body"], "steps": ["fetch"]}

    def analyze(state: S) -> S:
        calls["analyze"] += 1
        if state["doc"] == "poison":
            raise ValueError(f"cannot parse {state['doc']!r}")
        return {"answer": state["doc"].upper(), "steps": ["analyze"]}

    exec_(dsn, "INSERT INTO poison_docs VALUES (%s, 'poison')", t)
    cfg = {"configurable": {"thread_id": t}}
    with DurablePostgresSaver.from_conn_string(dsn, max_resume_attempts=2) as saver:
        graph = _chain(("fetch", fetch), ("analyze", analyze)).compile(checkpointer=saver)
        for i in range(2):
            with pytest.raises(ValueError):
                graph.invoke({"steps": []} if i == 0 else None, cfg)
        with pytest.raises(PoisonCheckpointError):
            graph.invoke(None, cfg)
        poisoned = head(dsn, t)
        before = n_checkpoints(dsn, t)

        report = poison.show(saver, t)
        assert report.status == "quarantined" and report.quarantine is not None
        assert report.quarantine.checkpoint_id == poisoned == report.history[0].checkpoint_id
        assert report.history[0].errors == 1  # the failing task's __error__ write
        target = report.history[1]  # the checkpoint whose next task is `fetch`
        assert target.checkpoint_id == report.history[0].parent_checkpoint_id
        assert graph.get_state({"configurable": {**cfg["configurable"], "checkpoint_id": target.checkpoint_id}}).next == ("fetch",)

        # Errors first: unknown checkpoint, a thread a run holds.
        with pytest.raises(CheckpointNotFoundError):
            poison.rewind(saver, t, "no-such-checkpoint")
        with pytest.raises(CheckpointNotFoundError):
            poison.show(saver, "no-such-thread")
        exec_(
            dsn,
            "UPDATE durable_threads SET lease_owner = 'someone', "
            "lease_expires_at = now() + interval '1 minute' WHERE thread_id = %s",
            t,
        )
        with pytest.raises(ThreadBusyError):
            poison.rewind(saver, t, target.checkpoint_id)
        exec_(
            dsn,
            "UPDATE durable_threads SET lease_owner = NULL, lease_expires_at = NULL "
            "WHERE thread_id = %s",
            t,
        )
        assert quarantine_row(dsn, t) is not None and n_checkpoints(dsn, t) == before

        # The upstream data is fixed; rewind to before the fetch and continue.
        exec_(dsn, "UPDATE poison_docs SET body = 'good' WHERE thread_id = %s", t)
        result = poison.rewind(saver, t, target.checkpoint_id)
        assert result.released and result.rewound_from == poisoned
        assert result.checkpoint_id == head(dsn, t) and result.checkpoint_id > poisoned
        assert n_checkpoints(dsn, t) == before + 1  # history kept: a fork, nothing deleted
        state = graph.get_state(cfg)
        assert state.next == ("fetch",) and state.metadata is not None
        assert state.metadata["source"] == "fork"
        assert state.metadata["rewound_to"] == target.checkpoint_id
        row = thread_row(dsn, t)
        assert row is not None and row["status"] == "stopped" and row["attempts"] == 0

        out = graph.invoke(None, cfg)
        assert out["answer"] == "GOOD" and out["steps"] == ["fetch", "analyze"]
        assert calls == Counter({"fetch": 2, "analyze": 3})
        assert thread_row(dsn, t)["status"] == "done"  # type: ignore[index]
        assert any(s.config["configurable"]["checkpoint_id"] == poisoned for s in graph.get_state_history(cfg))


# ---------------------------------------------------------------------- CLI
def test_cli_list_show_release_rewind(dsn: str) -> None:
    def boom(state: S) -> S:
        raise RuntimeError("boom")

    with DurablePostgresSaver.from_conn_string(dsn, max_resume_attempts=1) as saver:
        graph = _chain(("prep", lambda s: {"x": 1}), ("boom", boom)).compile(checkpointer=saver)
        for t in ("cli-a", "cli-b"):
            cfg = {"configurable": {"thread_id": t}}
            with pytest.raises(RuntimeError):
                graph.invoke({"x": 0}, cfg)
            with pytest.raises(PoisonCheckpointError):
                graph.invoke(None, cfg)

    runner = CliRunner()

    def cli(*args: str) -> Any:
        result = runner.invoke(app, ["quarantine", *args, "--dsn", dsn])
        return result

    res = cli("list", "--json")
    assert res.exit_code == 0, res.output
    listed = {e["thread_id"]: e for e in json.loads(res.stdout)}
    assert {"cli-a", "cli-b"} <= set(listed)
    assert listed["cli-a"]["attempts"] == 1 and listed["cli-a"]["last_error"] == "RuntimeError: boom"
    assert listed["cli-a"]["checkpoint_id"] == head(dsn, "cli-a")
    human = cli("list")
    assert human.exit_code == 0 and "cli-a" in human.stdout and "quarantined" in human.stdout

    res = cli("show", "cli-a", "--json", "--history", "3")
    assert res.exit_code == 0, res.output
    shown = json.loads(res.stdout)
    assert shown["status"] == "quarantined" and shown["quarantine"]["reason"] == "max_attempts"
    assert len(shown["history"]) == 3 and shown["history"][0]["checkpoint_id"] == head(dsn, "cli-a")
    assert "fix the cause" in cli("show", "cli-a").stdout

    target = shown["history"][1]["checkpoint_id"]
    res = cli("rewind", "cli-a", "--to", target, "--json")
    assert res.exit_code == 0, res.output
    rewound = json.loads(res.stdout)
    assert rewound["released"] is True and rewound["rewound_to"] == target
    assert rewound["checkpoint_id"] == head(dsn, "cli-a")

    res = cli("release", "cli-b", "--json")
    assert res.exit_code == 0, res.output
    assert json.loads(res.stdout)["thread_id"] == "cli-b"
    assert thread_row(dsn, "cli-b")["status"] == "stopped"  # type: ignore[index]

    res = cli("release", "cli-b", "--json")
    assert res.exit_code == 1
    assert json.loads(res.stdout)["error"] == "NotQuarantinedError"
    res = cli("rewind", "cli-a", "--to", "nope")
    assert res.exit_code == 1 and "not found" in res.stderr
    listed_after = json.loads(cli("list", "--json").stdout)
    assert not {"cli-a", "cli-b"} & {e["thread_id"] for e in listed_after}


# ---------------------------------------------------------------------- recovery, retention
def test_recovery_and_retention_leave_quarantined_threads_alone(dsn: str) -> None:
    # Last in the module: retention below deletes every completed thread of this database.
    from langgraph_durable.ops.retention import retain
    from langgraph_durable.recovery import recover

    calls, failing = Calls(), {"on": True}

    def boom(state: S) -> S:
        calls["boom"] += 1
        if failing["on"]:
            raise RuntimeError("boom")
        return {"x": 2}

    t = "rr-quarantined"
    cfg = {"configurable": {"thread_id": t}}
    with DurablePostgresSaver.from_conn_string(dsn, max_resume_attempts=1) as saver:
        graph = _chain(("boom", boom)).compile(checkpointer=saver.bind(graph_version="rr-v"))
        with pytest.raises(RuntimeError):
            graph.invoke({"x": 0}, cfg)
        with pytest.raises(PoisonCheckpointError):
            graph.invoke(None, cfg)
        checkpoints = n_checkpoints(dsn, t)

        # A recovery worker for this graph never resumes it ...
        recover(graph, error_backoff=0.0)
        assert calls["boom"] == 1
        assert thread_row(dsn, t)["status"] == "quarantined"  # type: ignore[index]
        # ... retention never deletes it, even with the age limit at zero.
        report = retain(saver, older_than_days=0, keep_last=1)
        assert report.skipped.get("quarantined", 0) >= 1 and t not in report.deleted_thread_ids
        assert n_checkpoints(dsn, t) == checkpoints and quarantine_row(dsn, t) is not None

        # Released (after a fix), the thread is unfinished work again: the worker runs it.
        failing["on"] = False
        poison.release(saver, t)
        recover(graph, error_backoff=0.0)
        assert calls["boom"] == 2
        assert thread_row(dsn, t)["status"] == "done"  # type: ignore[index]
        assert graph.get_state(cfg).values["x"] == 2
