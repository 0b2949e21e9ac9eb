"""Issue 23, defects 1 and 2: deferred checkpoints at their seams. Real PostgreSQL,
real LangGraph runs, a real child process SIGKILLed; no mocks.

1. A task whose own policy is "always" that finishes from a deferred checkpoint is
   never run again after a crash: its writes make the deferred checkpoint durable
   (fenced), then they are stored. Shapes: parallel branches, ``Send``, a subgraph
   task; the control is the same graph with no policy (LangGraph stores the finished
   task's writes as pending writes: it runs once).
2. A failed flush at run end (an unencodable last value, a lease lost meanwhile)
   raises the typed error the un-deferred put raises, from invoke/ainvoke/stream/
   astream, and the thread row never says ``done`` while its stored head has work left.
"""

from __future__ import annotations

import json
import operator
import os
import queue
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable
from typing import Annotated, Any, TypedDict

import psycopg
import pytest
from langgraph.graph import END, START, StateGraph

from langgraph_durable import (
    AsyncDurablePostgresSaver,
    DurablePostgresSaver,
    LeaseLostError,
    UnencodableValueError,
)

HERE = os.path.dirname(os.path.abspath(__file__))
CHILD = os.path.join(HERE, "_child_defer_seams.py")
# Bounds on waits for a condition (2 shared cores, cold imports): never an assertion.
START_WAIT = 120.0
STORED_WAIT = 20.0
SHAPES = ("branches", "send", "subgraph")


def _cfg(thread_id: str) -> dict[str, Any]:
    return {"configurable": {"thread_id": thread_id}}


def _one(dsn: str, sql: str, *args: Any) -> Any:
    with psycopg.connect(dsn, autocommit=True) as conn:
        row = conn.execute(sql, args).fetchone()
    return None if row is None else row[0]


# ---------------------------------------------------------------------- defect 1
class _Child:
    """The child process with its stdout read by a thread (a wait is bounded)."""

    def __init__(self, dsn: str, thread: str, shape: str, policy: str, mode: str, durability: str) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, CHILD, dsn, thread, shape, policy, mode, durability],
            stdout=subprocess.PIPE, text=True, env={**os.environ, "PYTHONPATH": os.getcwd()},
        )
        self.lines: queue.Queue[str] = queue.Queue()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.lines.put(line.strip())
        self.lines.put("<EOF>")

    def expect(self, wanted: str) -> None:
        line = self.lines.get(timeout=START_WAIT)
        assert line == wanted, (wanted, line, self.proc.poll())

    def last_line(self) -> str:
        assert self.proc.wait(START_WAIT) == 0
        out = []
        while (line := self.lines.get(timeout=START_WAIT)) != "<EOF>":
            out.append(line)
        return out[-1]

    def kill(self) -> None:
        os.kill(self.proc.pid, signal.SIGKILL)
        self.proc.wait(START_WAIT)

    def __enter__(self) -> _Child:
        return self

    def __exit__(self, *exc: object) -> None:
        if self.proc.poll() is None:  # a failed wait: never leave the child behind
            self.kill()


def _charge_writes_stored(dsn: str, thread: str) -> bool:
    """The root-namespace write of the task that charged (channel 'charged') is stored,
    and so is the checkpoint it was written on: what lets LangGraph skip that finished
    task on resume. (Under durability="async" LangGraph may store the write before its
    checkpoint's put commits: a kill in between re-runs the task with no policy too.)"""
    return bool(_one(
        dsn, "SELECT count(*) FROM checkpoint_writes w JOIN checkpoints c USING "
        "(thread_id, checkpoint_ns, checkpoint_id) WHERE w.thread_id = %s AND w.checkpoint_ns = '' "
        "AND w.channel = 'charged'", thread,
    ))


def _wait_for(condition: Callable[[], bool], seconds: float) -> bool:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(0.05)
    return condition()


# (shape, policy, durability): "none" is the control (no policy: runs once on any
# code); every "defer" case ran charge twice on the base commit except "subgraph"
# (the subgraph's own first write flushed the head there already: a guard). A
# subgraph compiled with checkpointer=False runs under "async" only: LangGraph 1.2
# itself fails such a subgraph under "sync" (no '_put_checkpoint_fut').
# The controls of the other shapes run with the long profile (LGD_HYPOTHESIS_PROFILE=long
# pytest tests/test_defer_seams.py; they passed on the base commit too), to
# keep this file's CI time modest; the branches control is the issue's own scenario.
LONG = os.environ.get("LGD_HYPOTHESIS_PROFILE") == "long"
CASES = [
    ("branches", "none", "sync"),
    *[(shape, "defer", "sync") for shape in SHAPES],
    # Not generated at all outside the long profile: a skip must not count as a pass.
    *([(shape, "none", "sync") for shape in SHAPES[1:]] if LONG else []),
    *[("stateless_subgraph", policy, "async") for policy in ("none", "defer")],
    ("branches", "defer", "async"),
    # ReworkBudget: charge is deferrable but finishes past the budget.
    ("branches", "budget", "sync"),
]


@pytest.mark.parametrize(("shape", "policy", "durability"), CASES)
def test_a_finished_always_task_is_not_run_again_after_sigkill(
    dsn: str, shape: str, policy: str, durability: str
) -> None:
    """``START -> prep (defer) -> {charge, slow}``: SIGKILL while ``slow`` sleeps after
    ``charge`` returned; ``invoke(None)`` in a new process must not charge again."""
    thread = f"d1-{shape}-{policy}-{durability}-{uuid.uuid4()}"
    with _Child(dsn, thread, shape, policy, "hang", durability) as child:
        child.expect("READY")
        child.expect("CHARGED")
        # Killed once charge's writes are stored (at once with the fix and without a
        # policy); on the old code they never are, and the bounded wait ends in the kill.
        stored = _wait_for(lambda: _charge_writes_stored(dsn, thread), STORED_WAIT)
        child.kill()
    with _Child(dsn, thread, shape, policy, "go", durability) as resumed:
        resumed.expect("READY")
        final = json.loads(resumed.last_line())
    charges = _one(dsn, "SELECT count(*) FROM defer_charges WHERE thread_id = %s", thread)
    print(f"[{shape}/{policy}/{durability}] writes stored before the kill: {stored}; charge ran {charges}x")
    assert charges == 1, f"charge ran {charges} times"
    assert final["charged"] == ["charge"] and "slow" in final["log"]
    assert _one(dsn, "SELECT status FROM durable_threads WHERE thread_id = %s", thread) == "done"


# ---------------------------------------------------------------------- defect 2
class Two(TypedDict, total=False):
    log: Annotated[list[str], operator.add]
    docs: Annotated[list[Any], operator.add]


THIEF = "other-host:1:0:thief"


def _two_deferred(dsn: str, fault: str, policy: str) -> StateGraph:
    """``START -> a -> b -> END``, both deferred with ``policy="defer"``; ``b`` makes
    the run's last value unencodable (an int beyond 64 bits) or, as another worker
    taking the thread over would, moves the lease token on."""
    from langgraph.config import get_config

    def b(state: Two) -> dict[str, Any]:
        if fault == "unencodable":
            return {"log": ["b"], "docs": [2**70]}
        thread_id = get_config()["configurable"]["thread_id"]
        with psycopg.connect(dsn, autocommit=True) as conn:
            conn.execute(
                "UPDATE durable_threads SET lease_owner = %s, lease_token = lease_token + 1, "
                "lease_expires_at = now() + interval '5 minutes' WHERE thread_id = %s",
                (THIEF, thread_id),
            )
        return {"log": ["b"]}

    metadata = {"checkpoint": "defer"} if policy == "defer" else None
    builder = StateGraph(Two)
    builder.add_node("a", lambda s: {"log": ["a"]}, metadata=metadata)
    builder.add_node("b", b, metadata=metadata)
    builder.add_edge(START, "a")
    builder.add_edge("a", "b")
    builder.add_edge("b", END)
    return builder


async def _run(api: str, dsn: str, graph_of: Callable[[Any], Any], thread: str) -> None:
    config = _cfg(thread)
    if api in ("invoke", "stream"):
        with DurablePostgresSaver.from_conn_string(dsn) as saver:
            graph = graph_of(saver)
            if api == "invoke":
                graph.invoke({"log": []}, config, durability="sync")
            else:
                list(graph.stream({"log": []}, config, durability="sync"))
        return
    async with AsyncDurablePostgresSaver.from_conn_string(dsn) as asaver:
        agraph = graph_of(asaver)
        if api == "ainvoke":
            await agraph.ainvoke({"log": []}, config, durability="sync")
        else:
            [chunk async for chunk in agraph.astream({"log": []}, config, durability="sync")]


@pytest.mark.parametrize("api", ["invoke", "stream", "ainvoke", "astream"])
@pytest.mark.parametrize("fault", ["unencodable", "lease_lost"])
@pytest.mark.parametrize("policy", ["none", "defer"])
async def test_a_failed_exit_flush_raises_what_the_put_would_have(
    dsn: str, policy: str, fault: str, api: str
) -> None:
    """Two deferred nodes in a row, the last one's checkpoint flushed at run end: its
    failure is raised as the un-deferred put's ("none", the control) is, and the
    thread row does not say 'done'."""
    thread = f"d2-{policy}-{fault}-{api}-{uuid.uuid4()}"
    builder = _two_deferred(dsn, fault, policy)
    expected = UnencodableValueError if fault == "unencodable" else LeaseLostError
    with pytest.raises(expected) as raised:
        await _run(api, dsn, lambda saver: builder.compile(checkpointer=saver), thread)
    assert raised.value.thread_id == thread
    status, owner, error = (
        _one(dsn, f"SELECT {col} FROM durable_threads WHERE thread_id = %s", thread)
        for col in ("status", "lease_owner", "last_error")
    )
    with DurablePostgresSaver.from_conn_string(dsn) as other:
        stored = builder.compile(checkpointer=other).get_state(_cfg(thread))
    print(f"[{policy}/{fault}/{api}] raised {type(raised.value).__name__}; row {status!r}; "
          f"stored head tasks={[t.name for t in stored.tasks]} values={stored.values}")
    assert status != "done"
    # The stored head has work left (the input checkpoint's is its stored __start__
    # write, so ``next`` is empty there while ``tasks`` is not).
    assert stored.tasks and stored.values.get("log") != ["a", "b"]
    if fault == "unencodable":
        assert raised.value.checkpoint_id is not None and "2**70" in str(raised.value)
        # This run's lease is released as failed, with the error recorded.
        assert (status, owner) == ("error", None) and error.startswith("UnencodableValueError")
    else:
        # The thief's lease is untouched by this run's (fenced) release.
        assert owner == THIEF


@pytest.mark.parametrize("order", ["charge_first", "interrupt_first"])
def test_an_always_task_beside_an_interrupt_runs_once(dsn: str, order: str) -> None:
    """An interrupt from a deferred checkpoint (a guard: it held on the base commit
    too, the interrupt's own flush storing the held writes). Whichever of the two
    tasks of the step reaches the saver first, the resume does not charge again."""
    from langgraph.types import Command, interrupt

    charged: list[str] = []
    done, asked = threading.Event(), threading.Event()

    def charge(state: Two) -> dict[str, Any]:
        if order == "interrupt_first":
            asked.wait(START_WAIT)
        charged.append("charge")
        done.set()
        return {"docs": ["charged"]}

    def ask(state: Two) -> dict[str, Any]:
        if order == "charge_first":
            done.wait(START_WAIT)
        asked.set()
        return {"log": [f"ask:{interrupt('ok?')}"]}

    builder = StateGraph(Two)
    builder.add_node("prep", lambda s: {"log": ["prep"]}, metadata={"checkpoint": "defer"})
    builder.add_node("charge", charge)
    builder.add_node("ask", ask)
    builder.add_edge(START, "prep")
    builder.add_edge("prep", "charge")
    builder.add_edge("prep", "ask")
    builder.add_edge("charge", END)
    builder.add_edge("ask", END)
    thread = f"d1-interrupt-{order}-{uuid.uuid4()}"
    with DurablePostgresSaver.from_conn_string(dsn) as saver:
        first = builder.compile(checkpointer=saver).invoke({"log": []}, _cfg(thread), durability="sync")
    assert "__interrupt__" in first and charged == ["charge"]
    with DurablePostgresSaver.from_conn_string(dsn) as other:
        out = builder.compile(checkpointer=other).invoke(Command(resume="yes"), _cfg(thread))
    assert charged == ["charge"], charged
    assert out == {"log": ["prep", "ask:yes"], "docs": ["charged"]}


@pytest.mark.parametrize("policy", ["none", "defer"])
def test_a_put_that_always_fails_ends_in_quarantine(dsn: str, policy: str) -> None:
    """The failure is counted at the last stored head, never at one whose put failed:
    the count once moved to the loop's in-memory head (never stored), was reset on
    every run, and such a thread retried forever without a policy too."""
    from langgraph_durable import PoisonCheckpointError

    builder = _two_deferred(dsn, "unencodable", policy)
    thread = f"d2-poison-{policy}-{uuid.uuid4()}"
    outcomes: list[str] = []
    with DurablePostgresSaver.from_conn_string(dsn, max_resume_attempts=2) as saver:
        graph = builder.compile(checkpointer=saver)
        for attempt in range(4):
            try:
                graph.invoke({"log": []} if attempt == 0 else None, _cfg(thread), durability="sync")
                outcomes.append("ok")
            except (UnencodableValueError, PoisonCheckpointError) as error:
                outcomes.append(type(error).__name__)
    print(f"[{policy}] {outcomes}")
    assert outcomes == ["UnencodableValueError"] * 3 + ["PoisonCheckpointError"]
    assert _one(dsn, "SELECT status FROM durable_threads WHERE thread_id = %s", thread) == "quarantined"
