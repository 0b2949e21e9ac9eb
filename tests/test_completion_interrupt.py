"""A finished thread that was once interrupted is finished (found by the edges' state
machine, tests/test_edges_machine.py): LangGraph keeps ``versions_seen["__interrupt__"]``
with the version of *every* channel, and reading it as a node's triggers made every state
key a trigger, so ``retain`` judged such a thread "unfinished" and kept it forever."""

from __future__ import annotations

import operator
import tempfile
from typing import Annotated, Any, TypedDict

from langgraph.checkpoint.postgres import PostgresSaver
from langgraph.graph import START, StateGraph
from langgraph.types import Command, interrupt

from langgraph_durable import DurablePostgresSaver
from langgraph_durable._completion import has_next_tasks, inferred_status
from langgraph_durable.ops.retention import retain


class S(TypedDict, total=False):
    log: Annotated[list[str], operator.add]


def _graph(saver: Any) -> Any:
    g = StateGraph(S)
    g.add_node("ask", lambda s: {"log": [f"asked:{interrupt('ok?')}"]})
    g.add_node("final", lambda s: {"log": ["final"]})
    g.add_edge(START, "ask")
    g.add_edge("ask", "final")
    return g.compile(checkpointer=saver)


def _finish(graph: Any, tid: str) -> None:
    config = {"configurable": {"thread_id": tid}}
    graph.invoke({"log": []}, config)
    graph.invoke(Command(resume="yes"), config)
    assert graph.get_state(config).next == () and graph.get_state(config).values["log"] == ["asked:yes", "final"]


def test_head_of_a_finished_once_interrupted_thread_has_no_next_task() -> None:
    v = "00000000000000000000000000000006.0.1"
    head = {
        "channel_versions": {"log": v, "branch:to:final": v},
        "versions_seen": {"final": {"branch:to:final": v}, "__interrupt__": {"log": v, "branch:to:final": v}},
        "updated_channels": ["log"],
        "inline_channels": [],
        "blob_channels": ["log"],
        "write_channels": [],
    }
    assert not has_next_tasks(head) and inferred_status(head) == "done"
    # A trigger a node has not seen is still work left, with or without that entry.
    waiting = {**head, "updated_channels": ["branch:to:final"], "inline_channels": ["branch:to:final"]}
    assert has_next_tasks(waiting)


def test_retain_deletes_a_finished_thread_that_was_interrupted(dsn: str) -> None:
    with DurablePostgresSaver.from_conn_string(dsn) as saver:
        _finish(_graph(saver), "was-asked")
        report = retain(saver, older_than_days=0, archive=tempfile.mkdtemp())
        assert "was-asked" in report.deleted_thread_ids, report
        assert report.skipped.get("unfinished", 0) == 0


def test_retain_deletes_a_finished_stock_thread_that_was_interrupted(dsn: str) -> None:
    with PostgresSaver.from_conn_string(dsn) as stock:  # no status row: the head decides
        _finish(_graph(stock), "stock-asked")
    with DurablePostgresSaver.from_conn_string(dsn) as saver:
        report = retain(saver, older_than_days=0)
        assert "stock-asked" in report.deleted_thread_ids, report
