"""Run-start micro-benchmark (issue 14): the lease acquisition and the run's first load,
as two round trips (``_op_acquire``, then ``_op_get_tuple``: main before the fold) and
folded into one pipeline (``_op_acquire(..., load=...)``, then the decode), taking
turns on one connection. Median wall and client-CPU ms per run start.

Run: ``python bench/bench_runstart.py [--dsn postgresql://.../db]`` on a scratch database
(it runs ``setup()`` there and leaves one thread behind).
"""

from __future__ import annotations

import argparse
import statistics
import time
import uuid
from functools import partial
from typing import Any, TypedDict

import psycopg
from langgraph.graph import END, START, StateGraph
from psycopg.rows import dict_row

from langgraph_durable import DurablePostgresSaver


class S(TypedDict):
    n: int


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dsn", default="postgresql://postgres@127.0.0.1:5432/postgres")
    ap.add_argument("--rounds", type=int, default=30)
    ap.add_argument("--per-round", type=int, default=50)
    args = ap.parse_args()
    with psycopg.connect(args.dsn, autocommit=True, prepare_threshold=0, row_factory=dict_row) as conn:
        saver = DurablePostgresSaver(conn)
        saver.setup()
        b = StateGraph(S)
        b.add_node("a", lambda s: {"n": s["n"] + 1})
        b.add_edge(START, "a")
        b.add_edge("a", END)
        b.compile(checkpointer=saver).invoke({"n": 0}, {"configurable": {"thread_id": "warm"}})
        tid = f"runstart-{uuid.uuid4().hex}"
        cfg: Any = {"configurable": {"thread_id": tid, "checkpoint_ns": ""}}
        b.compile(checkpointer=saver).invoke({"n": 0}, cfg)
        owner = "bench:1:x"  # the same owner each time: the acquisition's idempotent path

        def separate() -> None:
            saver._run_op(lambda: saver._op_acquire(tid, owner, None, None))
            saver._run_op(lambda: saver._op_get_tuple(cfg), transaction=False)

        def folded() -> None:
            stmt = saver._get_tuple_stmt(cfg)
            res = saver._run_op(partial(saver._op_acquire, tid, owner, None, None, None, stmt))
            saver._run_op(partial(saver._op_tuple_of, res["loaded"]), transaction=False)

        out: dict[str, tuple[list[float], list[float]]] = {"separate": ([], []), "folded": ([], [])}
        for _ in range(args.rounds):
            for name, fn in (("separate", separate), ("folded", folded)):
                w0, c0 = time.perf_counter(), time.process_time()
                for _ in range(args.per_round):
                    fn()
                out[name][0].append((time.perf_counter() - w0) / args.per_round * 1000)
                out[name][1].append((time.process_time() - c0) / args.per_round * 1000)
        for name, (wall, cpu) in out.items():
            print(f"{name:9} wall {statistics.median(wall):.3f} ms  cpu {statistics.median(cpu):.3f} ms per run start")


if __name__ == "__main__":
    main()
