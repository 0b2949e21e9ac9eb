"""Child process of tests/test_granularity.py (not a test module).

``python _child_granularity.py DSN THREAD BUDGET [DURABILITY]``: runs (or resumes, when the thread
has a checkpoint) the reconciliation workload of _gran_workload.py with
``checkpoint_policy=ReworkBudget(BUDGET)``; prints READY before the run and the final
state as JSON after it. The parent SIGKILLs it at a random moment.
"""

from __future__ import annotations

import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from _gran_workload import build

from langgraph_durable import DurablePostgresSaver, ReworkBudget


def main() -> None:
    dsn, thread_id, budget = sys.argv[1], sys.argv[2], float(sys.argv[3])
    durability = sys.argv[4] if len(sys.argv) > 4 else "sync"
    with DurablePostgresSaver.from_conn_string(dsn, checkpoint_policy=ReworkBudget(seconds=budget)) as saver:
        graph = build(dsn, cheap=0.03).compile(checkpointer=saver)
        config = {"configurable": {"thread_id": thread_id}}
        started = graph.get_state(config).values
        print("READY", flush=True)
        out = graph.invoke(None if started else {"log": [], "total": 0}, config, durability=durability)
        print(json.dumps(out), flush=True)


if __name__ == "__main__":
    main()
