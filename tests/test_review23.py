"""Adversarial review of issue 23's fixes (review23): each test is a scenario a user can
hit, reproduced on real PostgreSQL; its docstring says what the user loses.

A test marked ``xfail(strict=True)`` is a finding left unfixed on this branch (its
reason says the fix); the others fail on the merge of issue 23 (0d398b0) and pass here.
"""

from __future__ import annotations

import logging
import operator
from typing import Annotated, Any, TypedDict

import psycopg
import pytest
from langgraph.checkpoint.postgres import PostgresSaver
from langgraph.graph import END, START, StateGraph

from langgraph_durable import DurablePostgresSaver


class _S(TypedDict):
    steps: Annotated[list[int], operator.add]


def _two_steps() -> StateGraph:
    g = StateGraph(_S)
    g.add_node("a", lambda s: {"steps": [1]})
    g.add_node("b", lambda s: {"steps": [2]})
    g.add_edge(START, "a")
    g.add_edge("a", "b")
    g.add_edge("b", END)
    return g


def _rows(dsn: str, q: str, args: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    with psycopg.connect(dsn, autocommit=True) as conn:
        return conn.execute(q, args).fetchall()


@pytest.mark.parametrize("how", ["deleted", "other_thread"])
def test_config_with_unknown_checkpoint_id_is_not_work_lost(
    dsn: str, how: str, caplog: pytest.LogCaptureFixture
) -> None:
    """A caller keeps the config a run returned (it carries ``checkpoint_id``) and uses it
    again after ``delete_thread``, or for another thread (a checkpoint id that is not in
    the thread). LangGraph finds no checkpoint and starts the thread fresh: the stock
    saver's run succeeds. The parent check of issue 23 took the caller's id for the run's
    own acknowledged parent: ``invoke`` raised ``AcknowledgedWorkLostError`` ("a failover
    to a standby that had not received it?"), logged ACKNOWLEDGED WORK LOST, counted it,
    handed the thread back 'stopped', and every retry with that config failed the same
    way. The user loses the run (it can never start with that config) and the operator
    gets a false data-loss alarm."""
    src, dst = f"unk-{how}-src", f"unk-{how}-{'src' if how == 'deleted' else 'dst'}"
    with DurablePostgresSaver.from_conn_string(dsn) as saver:
        graph = _two_steps().compile(checkpointer=saver)
        graph.invoke({"steps": []}, {"configurable": {"thread_id": src}})
        head = graph.get_state({"configurable": {"thread_id": src}}).config["configurable"]["checkpoint_id"]
        if how == "deleted":
            saver.delete_thread(src)
        cfg: Any = {"configurable": {"thread_id": dst, "checkpoint_id": head}}
        with caplog.at_level(logging.ERROR, logger="langgraph_durable"):
            out = graph.invoke({"steps": []}, cfg)
        assert out["steps"] == [1, 2]
        assert "ACKNOWLEDGED WORK LOST" not in caplog.text
    assert _rows(dsn, "SELECT status FROM durable_threads WHERE thread_id = %s", (dst,)) == [("done",)]
    # The stock saver does the same: a fresh start.
    with PostgresSaver.from_conn_string(dsn) as stock:
        cfg = {"configurable": {"thread_id": f"{dst}-stock", "checkpoint_id": head}}
        assert _two_steps().compile(checkpointer=stock).invoke({"steps": []}, cfg)["steps"] == [1, 2]
