"""How many driver calls a run start and a run end make (issue 14), counted, not timed.

The run start's checkpoint rows come back with the lease (one pipeline); decoding them
needs a statement only when they reference artifacts. The run end is the release: one
op, and no deferral flush flow when nothing was deferred. Driven without a database
(the ops' own logic; tests/test_hotpath_wire.py counts the wire of a real invoke).
"""

from __future__ import annotations

from contextlib import ExitStack
from typing import Any

from langchain_core.runnables import RunnableConfig
from langgraph.checkpoint.base import empty_checkpoint

from langgraph_durable._io.scripted import ScriptedDriver
from langgraph_durable.config import SaverOptions
from langgraph_durable.leases.model import Lease
from langgraph_durable.lifecycle import _RunContext
from langgraph_durable.saver import _DurableBase
from langgraph_durable.sql import threads as threads_sql

THREAD = "t-runstart"


class _Counting(_DurableBase):
    """The saver's logic, its ops run by the scripted driver, its driver calls counted."""

    def __init__(self, **options: Any) -> None:
        super().__init__(options=SaverOptions.from_keywords(**options))
        self.driver = ScriptedDriver()
        self.ops = 0
        self.flows = 0

    def _run_op(self, factory: Any, *, transaction: bool = True) -> Any:
        self.ops += 1
        return self.driver.run_op(factory, transaction=transaction)

    def _run_flow(self, flow: Any) -> Any:
        self.flows += 1
        return self.driver.run_flow(flow)


class _Loop:
    def __init__(self) -> None:
        self.stack = ExitStack()
        self.status = "done"
        self.checkpoint_config = {"configurable": {"checkpoint_id": "c0"}}
        self.checkpoint_pending_writes: list[Any] = []


def _lease() -> Lease:
    return Lease(THREAD, owner="me:1:x", token=3, attempts=1, checkpoint_id="c0", version=None)


def _row(checkpoint_id: str = "1ef0") -> dict[str, Any]:
    checkpoint = {**empty_checkpoint(), "id": checkpoint_id}
    return {
        "thread_id": THREAD,
        "checkpoint_ns": "",
        "checkpoint_id": checkpoint_id,
        "parent_checkpoint_id": None,
        "checkpoint": checkpoint,
        "metadata": {"step": 1, "source": "loop"},
        "channel_values": None,
        "pending_writes": None,
    }


def _enter(saver: _Counting, loaded: list[Any]) -> tuple[list[Any], Any]:
    """Drive step 2 of a run start by hand: what it yields, and what it returns."""
    config: RunnableConfig = {"configurable": {"thread_id": THREAD, "checkpoint_ns": ""}}
    flow = saver._flow_enter_run(config, _RunContext(_Loop(), None), _lease(), None, "refuse", loaded)
    yielded = []
    try:
        item = next(flow)
        while True:
            yielded.append(item)
            item = flow.send(saver.driver.run_op(item.factory, transaction=item.transaction))
    except StopIteration as stop:
        return yielded, stop.value


def test_a_new_thread_run_start_decodes_without_an_op() -> None:
    yielded, saved = _enter(_Counting(), [])
    assert yielded == [] and saved is None


def test_a_checkpoint_without_artifacts_decodes_without_an_op() -> None:
    yielded, saved = _enter(_Counting(), [_row()])
    assert yielded == []
    assert saved.config["configurable"]["checkpoint_id"] == "1ef0"
    assert saved.metadata["step"] == 1


def test_run_end_is_one_op_and_no_flow_when_nothing_was_deferred() -> None:
    saver = _Counting()  # checkpoint_policy None: deferral on, this graph defers nothing
    assert saver._granularity is not None and not saver._granularity.runs
    loop = _Loop()
    lease = _lease()
    restored: list[bool] = []
    saver._push_exit(_RunContext(loop, None), lease, lambda: restored.append(True))
    loop.stack.close()
    assert (saver.ops, saver.flows) == (1, 0)
    assert lease.released and restored == [True]
    sent = [p for sql, p in saver.driver.statements if sql == threads_sql.LEASE_RELEASE_SQL]
    assert len(sent) == 1 and sent[0]["status"] == "done" and sent[0]["token"] == 3


def test_a_release_removes_only_its_own_runtime_bindings() -> None:
    from langgraph_durable.leases.model import _LeaseRegistry

    registry = _LeaseRegistry()
    a, b = _lease(), Lease("t-other", owner="me:1:y", token=1, attempts=1, checkpoint_id=None, version=None)
    ra1, ra2, rb, rebound = object(), object(), object(), object()
    for lease in (a, b):
        registry.add(lease)
    registry.bind_runtime(ra1, a)
    registry.bind_runtime(ra2, a)
    registry.bind_runtime(rb, b)
    registry.bind_runtime(rebound, a)
    registry.bind_runtime(rebound, b)  # the same Runtime bound again, to b: b's now
    registry.remove(a)
    assert registry.for_runtime(ra1, a.thread_id) is None and registry.for_runtime(ra2, a.thread_id) is None
    assert registry.for_runtime(rb, b.thread_id) is b and registry.for_runtime(rebound, b.thread_id) is b
    assert registry.get(a.thread_id) is None and registry.get(b.thread_id) is b
    registry.remove(b)
    assert registry.by_runtime == {} and registry.by_lease == {}
