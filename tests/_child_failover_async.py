"""Child process of tests/test_failover_async.py (not a test module): a recovery worker.

``python _child_failover_async.py SPEC_JSON`` runs a ``RecoveryWorker`` (``concurrency``
slots) over the ``N_STEPS``-step graph below, through a ``DurablePostgresSaver`` on the
spec's multi-host DSN, until SIGTERM. The threads are submitted by the parent.

* Every node execution appends ``{"thread", "step", "pid"}`` to ``exec_log`` (a file:
  what ran, even when its checkpoint is later lost).
* Every acknowledged ``put()`` appends ``{"t", "thread", "checkpoint_id", "step"}`` to
  ``ack_log``.
* Threads whose id starts with ``idem-`` make one ``@idempotent`` call per step (its
  ledger row: what ``_await_checkpoint`` waits on).
* ``parent_check: false`` switches the fence's parent check off (what the base commit
  did), to show the wrong threads it prevents.
* Logging goes to stderr (the parent counts its WARNING and ERROR lines). At exit one
  JSON line on stdout: ``{"event": "exit", "work_lost": {where: n}}`` (the
  ``langgraph_durable_acknowledged_work_lost_total`` counter of this process).
"""

from __future__ import annotations

import json
import logging
import operator
import os
import sys
import threading
import time
from typing import Annotated, Any, TypedDict

from langchain_core.runnables import RunnableConfig
from langgraph.graph import END, START, StateGraph

from langgraph_durable import DurablePostgresSaver, RecoveryWorker, idempotent

N_STEPS = 10


class State(TypedDict):
    # A list: never inline in the checkpoint JSON, so every step writes a blob version
    # (what a head on a lost history misses).
    steps: Annotated[list[int], operator.add]


@idempotent
def mark(thread_id: str, step: int) -> int:
    return step


def build_graph(exec_log: str | None = None, node_sleep: float = 0.0) -> StateGraph:
    lock = threading.Lock()

    def make(i: int) -> Any:
        def node(state: State, config: RunnableConfig) -> dict[str, Any]:
            thread_id = config["configurable"]["thread_id"]
            if exec_log is not None:
                with lock, open(exec_log, "a") as f:
                    f.write(json.dumps({"thread": thread_id, "step": i, "pid": os.getpid()}) + "\n")
            if thread_id.startswith("idem-"):
                mark(thread_id, i)
            time.sleep(node_sleep)
            return {"steps": [i]}

        return node

    builder = StateGraph(State)
    for i in range(N_STEPS):
        builder.add_node(f"s{i}", make(i))
    builder.add_edge(START, "s0")
    for i in range(N_STEPS - 1):
        builder.add_edge(f"s{i}", f"s{i + 1}")
    builder.add_edge(f"s{N_STEPS - 1}", END)
    return builder


def _ack_saver(ack_path: str) -> type[DurablePostgresSaver]:
    ack = open(ack_path, "a", buffering=1)
    lock = threading.Lock()

    class AckSaver(DurablePostgresSaver):
        def put(self, config: Any, checkpoint: Any, metadata: Any, new_versions: Any) -> Any:
            out = super().put(config, checkpoint, metadata, new_versions)
            with lock:
                ack.write(json.dumps({
                    "t": time.time(),
                    "thread": out["configurable"]["thread_id"],
                    "checkpoint_id": out["configurable"]["checkpoint_id"],
                    "step": (metadata or {}).get("step"),
                }) + "\n")
            return out

    return AckSaver


def _work_lost_counts() -> dict[str, float]:
    try:
        from prometheus_client import REGISTRY
    except ImportError:
        return {}
    out: dict[str, float] = {}
    for family in REGISTRY.collect():
        for s in family.samples:
            if s.name == "langgraph_durable_acknowledged_work_lost_total":
                out[s.labels.get("where", "")] = s.value
    return out


def main() -> None:
    spec = json.loads(sys.argv[1])
    logging.basicConfig(
        level=logging.WARNING, stream=sys.stderr, format="%(levelname)s %(asctime)s %(name)s: %(message)s"
    )
    if not spec.get("parent_check", True):
        from langgraph_durable.leases import fence

        if hasattr(fence, "PARENT_CHECK"):  # (the base commit has no check to switch off)
            fence.PARENT_CHECK[0] = False
    saver_cls = _ack_saver(spec["ack_log"])
    with saver_cls.from_conn_string(
        spec["dsn"], lease_ttl=spec.get("lease_ttl", 10.0), on_busy="wait", busy_timeout=30.0,
        graph_version=spec.get("graph_version"),
    ) as saver:
        graph = build_graph(spec["exec_log"], spec.get("node_sleep", 0.1)).compile(checkpointer=saver)
        worker = RecoveryWorker(
            graph, concurrency=spec.get("concurrency", 4), poll_interval=0.05,
            error_backoff=0.0, max_error_backoff=0.0, name=spec.get("name"),
        )
        sys.stdout.write("READY\n")
        sys.stdout.flush()
        worker.run()
    sys.stdout.write(json.dumps({"event": "exit", "work_lost": _work_lost_counts()}) + "\n")
    sys.stdout.flush()


if __name__ == "__main__":
    main()
