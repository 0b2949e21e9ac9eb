"""Regression (issue 16): a put waits for the flushes of deferred checkpoints taken before it.

The race, as LangGraph's time-travel suites hit it with the policy on: ``durability="async"``
hands the root's checkpoint puts to a background thread, and the next step starts before
they reach the saver. With C1 deferred and the put of C2 (its child) still on its way, a
subgraph in step 3 writes: a subgraph's write flushes the root's deferred head, C1, in the
subgraph's thread. If the put of C2 then commits before that flush, the flush of C1 (an
older id) is refused by the order check: ``ClockSkewError``, the run fails.

The saver below is the real one with two hooks that force exactly that interleaving:
the root's put of C2 is held until the flush of C1 has started, and the flush of C1 is held
until C2's put has been handed to the saver and has committed, or 2 s have passed. Without
the wait (granularity._Run.flushing / _wait_flushes), C2 commits first every time and the run
fails; with it, C2's put waits for the flush and the history is whole.
"""

from __future__ import annotations

import threading
import uuid
from typing import Any, TypedDict

import psycopg
from langgraph.graph import END, START, StateGraph
from psycopg_pool import ConnectionPool

from langgraph_durable import DurablePostgresSaver


class Log(TypedDict):
    log: list[str]  # no reducer: the subgraph's final state replaces the parent's


def _append(name: str) -> Any:
    return lambda s: {"log": [*s["log"], name]}


class _Interleaving(DurablePostgresSaver):
    """Holds the subgraph's writes until the put of step 1 (C1) has reached the saver, the
    root's put of step 2 (C2) until the flush of C1 starts, and that flush until the put
    of C2 commits (or 2 s)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.c1: str | None = None
        self.c1_arrived = threading.Event()
        self.flush_started = threading.Event()
        self.c2_entered = threading.Event()
        self.c2_committed = threading.Event()
        self.flush_saw_c2_committed: bool | None = None

    def put(self, config: Any, checkpoint: Any, metadata: Any, new_versions: Any) -> Any:
        root = not config["configurable"].get("checkpoint_ns")
        step = (metadata or {}).get("step")
        if root and step == 1:
            self.c1 = checkpoint["id"]  # deferred when it arrives: flushed later
            try:
                return super().put(config, checkpoint, metadata, new_versions)
            finally:
                self.c1_arrived.set()
        if not (root and step == 2):
            return super().put(config, checkpoint, metadata, new_versions)
        # The background put of C2: not before the subgraph's flush of C1 has started.
        assert self.flush_started.wait(10), "the subgraph never flushed C1"
        self.c2_entered.set()
        try:
            return super().put(config, checkpoint, metadata, new_versions)
        finally:
            self.c2_committed.set()

    def put_writes(self, config: Any, writes: Any, task_id: str, task_path: str = "") -> None:
        if config["configurable"].get("checkpoint_ns"):
            # The subgraph's writes flush what is deferred: C1, once its (background) put
            # has reached the saver; under load it may still be on its way.
            assert self.c1_arrived.wait(10), "the put of C1 never arrived"
        super().put_writes(config, writes, task_id, task_path)

    def _op_put(self, config: Any, checkpoint: Any, metadata: Any, new_versions: Any) -> Any:
        if checkpoint["id"] == self.c1 and not self.flush_started.is_set():
            # The flush of C1 (deferred: this is its only write). Let C2's put in first.
            self.flush_started.set()
            assert self.c2_entered.wait(10), "the put of C2 never arrived"
            self.flush_saw_c2_committed = self.c2_committed.wait(2.0)
        return super()._op_put(config, checkpoint, metadata, new_versions)


def _graph() -> StateGraph:
    inner = StateGraph(Log)
    inner.add_node("s1", _append("s1"))
    inner.add_edge(START, "s1")
    inner.add_edge("s1", END)
    builder = StateGraph(Log)
    builder.add_node("a", _append("a"))
    builder.add_node("b", _append("b"))
    builder.add_node("sub", inner.compile())
    builder.add_edge(START, "a")
    builder.add_edge("a", "b")
    builder.add_edge("b", "sub")
    builder.add_edge("sub", END)
    return builder


def test_a_put_waits_for_the_flush_of_its_deferred_parent(dsn: str) -> None:
    thread = f"order-{uuid.uuid4()}"
    cfg = {"configurable": {"thread_id": thread}}
    with ConnectionPool(dsn, max_size=6, kwargs={"autocommit": True}) as pool:
        saver = _Interleaving(pool, checkpoint_policy="defer")
        try:
            graph = _graph().compile(checkpointer=saver)
            out = graph.invoke({"log": []}, cfg, durability="async")
            state = graph.get_state(cfg)
        finally:
            saver.close()
    # The interleaving happened as forced: C1's flush was held while C2's put was in the
    # saver, and C2 did not commit meanwhile (it waited for the flush).
    assert saver.flush_started.is_set() and saver.c2_entered.is_set()
    assert saver.flush_saw_c2_committed is False
    assert out == {"log": ["a", "b", "s1"]} and state.values == out and state.next == ()
    with psycopg.connect(dsn) as conn:
        rows = conn.execute(
            "SELECT checkpoint_id, parent_checkpoint_id FROM checkpoints WHERE thread_id = %s "
            "AND checkpoint_ns = '' ORDER BY checkpoint_id",
            (thread,),
        ).fetchall()
    ids = [r[0] for r in rows]
    assert saver.c1 in ids  # the flushed C1 is stored, before its child
    assert all(parent is None or parent in ids for _, parent in rows)
