"""Reads, the package vs the stock saver, taking turns in one process (issue 14: "nothing
else regresses"). bench_storage.py's 200-turn chat (1.5 KB messages next to 50 documents
of 20 KB) is written once per saver, each in a database of its own; then, round by round
with the contenders alternating who goes first:

* ``get_state cold``: the latest state from a saver just opened (a new pool, an empty
  artifact cache), what bench_storage.py calls "load latest, fresh saver";
* ``get_tuple`` / ``get_state`` warm: the same saver again;
* ``list 10``: ``list(config, limit=10)``, materialised (10 checkpoints with their values);
* ``history 10``: ``get_state_history(config, limit=10)``.

Medians of ``--rounds`` rounds, wall ms, and durable/stock.

    PYTHONPATH=$PWD python bench/bench_reads.py [--dsn postgresql://...] [--turns 200] [--rounds 15]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from langchain_core.runnables import RunnableConfig

sys.path.insert(0, str(Path(__file__).resolve().parent))

import bench_storage as bs  # the chat workload and its contenders

METRICS = ("get_state cold", "get_tuple", "get_state warm", "list 10", "history 10")


def _timed(fn: Callable[[], Any]) -> float:
    t0 = time.perf_counter()
    fn()
    return (time.perf_counter() - t0) * 1000


def one_round(c: bs.Contender, dsn: str, turns: int) -> dict[str, float]:
    cfg: RunnableConfig = {"configurable": {"thread_id": "chat"}}
    out: dict[str, float] = {}
    with c.opener(dsn) as saver:
        graph = bs.chat_graph(c.delta).compile(checkpointer=saver)
        t0 = time.perf_counter()
        snap = graph.get_state(cfg)
        out["get_state cold"] = (time.perf_counter() - t0) * 1000
        assert len(snap.values["messages"]) == turns
        out["get_tuple"] = _timed(lambda: saver.get_tuple(cfg))
        out["get_state warm"] = _timed(lambda: graph.get_state(cfg))
        out["list 10"] = _timed(lambda: list(saver.list(cfg, limit=10)))
        out["history 10"] = _timed(lambda: list(graph.get_state_history(cfg, limit=10)))
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dsn", default=os.environ.get("LANGGRAPH_DURABLE_BENCH_DSN", bs.DEFAULT_DSN))
    ap.add_argument("--turns", type=int, default=200)
    ap.add_argument("--rounds", type=int, default=15)
    o = ap.parse_args()
    cs = [c for c in bs.contenders() if c.name in ("stock", "durable")]
    dsns = {c.name: bs.make_db(o.dsn, f"reads_{c.name}") for c in cs}
    try:
        for c in cs:
            bs.run_chat(c, dsns[c.name], o.turns, o.turns, 1)
        res: dict[str, dict[str, list[float]]] = {c.name: {m: [] for m in METRICS} for c in cs}
        for r in range(o.rounds + 1):
            for c in cs[r % 2:] + cs[: r % 2]:
                got = one_round(c, dsns[c.name], o.turns)
                if r:  # the first round warms the server's caches for both
                    for m in METRICS:
                        res[c.name][m].append(got[m])
    finally:
        for dsn in dsns.values():
            bs.drop_db(o.dsn, dsn)
    print(f"# {o.turns}-turn chat, median of {o.rounds} rounds (quartiles), wall ms; ratio of medians,"
          " and the median of the per-round ratios (the two ran back to back)")
    print(f"{'read':<16} {'stock':>22} {'durable':>22} {'ratio':>7} {'per round':>9}")

    def q(xs: list[float]) -> str:
        a, b, c = statistics.quantiles(xs, n=4)
        return f"{b:7.2f} ({a:.2f}-{c:.2f})"

    for m in METRICS:
        s, d = res["stock"][m], res["durable"][m]
        per_round = statistics.median(y / x for x, y in zip(s, d, strict=True))
        print(f"{m:<16} {q(s):>22} {q(d):>22} {statistics.median(d) / statistics.median(s):>6.2f}x"
              f" {per_round:>8.2f}x")


if __name__ == "__main__":
    main()
