"""Found by the model-based chaos test's long run (issue 11): ``delete_thread`` during a
live run whose ``@idempotent`` call waits for its task's checkpoint to be stored
(durability "async": LangGraph stores it in the background). The delete fences the run,
so that checkpoint is never stored; the call used to wait its whole ``wait_timeout``
and then raise ``UnstableKeyError``. It must stop at once with ``LeaseLostError``."""

from __future__ import annotations

import threading
import time
from typing import Any, TypedDict

from langgraph.graph import END, START, StateGraph

from langgraph_durable import DurablePostgresSaver, LeaseLostError, idempotent


class S(TypedDict, total=False):
    log: list[str]


def test_delete_thread_stops_a_call_waiting_for_its_checkpoint(dsn: str) -> None:
    entered, ran = threading.Event(), []

    @idempotent(wait_timeout=60)
    def effect(tag: str) -> str:
        ran.append(tag)
        return tag

    def first(s: S) -> dict[str, Any]:
        return {"log": ["first"]}

    def second(s: S) -> dict[str, Any]:
        entered.set()
        return {"log": [*s["log"], effect("charge")]}

    g: Any = StateGraph(S)
    g.add_node("first", first)
    g.add_node("second", second)
    g.add_edge(START, "first")
    g.add_edge("first", "second")
    g.add_edge("second", END)

    with DurablePostgresSaver.from_conn_string(dsn) as saver:
        real_put = saver.put

        def slow_put(config: Any, checkpoint: Any, metadata: Any, new_versions: Any) -> Any:
            if metadata.get("step") == 1:  # the checkpoint "second" runs from
                assert entered.wait(30)
                with DurablePostgresSaver.from_conn_string(dsn) as operator:
                    operator.delete_thread("live-call")
                time.sleep(0.5)
            return real_put(config, checkpoint, metadata, new_versions)

        saver.put = slow_put  # type: ignore[method-assign]
        graph = g.compile(checkpointer=saver)
        errors: list[BaseException] = []
        try:
            graph.invoke({"log": []}, {"configurable": {"thread_id": "live-call"}}, durability="async")
        except BaseException as exc:
            errors.append(exc)
    assert ran == []  # the effect never ran: its checkpoint was never stored
    assert errors and isinstance(errors[0], LeaseLostError), errors
