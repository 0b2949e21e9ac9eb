"""Child of test_versioning: runs the v1 graph on a thread until the parent SIGKILLs it.

argv: DSN THREAD_ID. The node named by LGD_HANG_IN blocks after recording itself; the
saver's short lease (1.5 s) lets the parent take the thread over soon after the kill.
"""

from __future__ import annotations

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import _child_versioning_graphs as g

from langgraph_durable import DurablePostgresSaver


def main() -> None:
    dsn, thread_id = sys.argv[1], sys.argv[2]
    os.environ[g.DSN_ENV] = dsn
    with DurablePostgresSaver.from_conn_string(dsn, graph_version="v1", lease_ttl=1.5) as saver:
        graph = g.build_v1().compile(checkpointer=saver)
        # durability="sync": fetch's checkpoint is committed before review starts.
        graph.invoke(
            {"log": [], "topic": "urgent"},
            {"configurable": {"thread_id": thread_id}},
            durability="sync",
        )
    print("finished without being killed", file=sys.stderr)
    sys.exit(3)


if __name__ == "__main__":
    main()
