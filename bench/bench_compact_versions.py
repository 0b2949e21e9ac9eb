"""Compact channel versions (issue 26), A/B in one run: the 200-turn chat of
``bench_storage.py`` written three times on the same PostgreSQL, each in its own
database -- the stock ``PostgresSaver``, this package with ``compact_versions=False``
(the stock version form: what the package wrote before) and with the default compact
form -- then bytes per table and ``get_state`` latency, the three taking turns load by
load (a fresh saver each time: cold artifact cache; and one warm saver each), so the
noise of a shared machine hits all alike.

Run: ``python bench/bench_compact_versions.py [--turns 200] [--loads 25] [--content prose]``
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import bench_storage as bs

from langgraph_durable import DurablePostgresSaver


def durable(compact: bool) -> Callable[[str], Any]:
    @contextmanager
    def opener(dsn: str) -> Iterator[DurablePostgresSaver]:
        with DurablePostgresSaver.from_conn_string(dsn, compact_versions=compact) as saver:
            saver.setup()
            yield saver

    return opener


def write_chat(opener: Callable[[str], Any], dsn: str, turns: int) -> None:
    with opener(dsn) as saver:
        graph = bs.chat_graph(False).compile(checkpointer=saver)
        cfg = {"configurable": {"thread_id": "chat"}}
        docs = [bs.text(f"doc-{i}", bs.DOC_SIZE) for i in range(bs.N_DOCS)]
        for i in range(turns):
            update: dict[str, Any] = {"turn": i}
            if i == 0:
                update["documents"] = docs
            graph.invoke(update, cfg, durability="sync")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--dsn", default=os.environ.get("LANGGRAPH_DURABLE_BENCH_DSN", bs.DEFAULT_DSN))
    ap.add_argument("--turns", type=int, default=200)
    ap.add_argument("--loads", type=int, default=25)
    ap.add_argument("--content", choices=("tokens", "prose"), default="tokens")
    args = ap.parse_args(argv)
    bs.CONTENT = args.content
    contenders = {
        "stock": bs.open_stock,
        "pkg, stock versions": durable(False),
        "pkg, compact versions": durable(True),
    }
    dsns: dict[str, str] = {}
    try:
        for name, opener in contenders.items():
            dsns[name] = bs.make_db(args.dsn, "cv")
            write_chat(opener, dsns[name], args.turns)
        tables = {name: bs.storage_bytes(dsn) for name, dsn in dsns.items()}
        cfg = {"configurable": {"thread_id": "chat"}}
        cold: dict[str, list[float]] = {n: [] for n in contenders}
        warm: dict[str, list[float]] = {n: [] for n in contenders}
        stacks = {}
        for name, opener in contenders.items():
            cm = opener(dsns[name])
            saver = cm.__enter__()
            graph = bs.chat_graph(False).compile(checkpointer=saver)
            graph.get_state(cfg)
            stacks[name] = (cm, graph)
        try:
            for i in range(args.loads):
                order = list(contenders) if i % 2 == 0 else list(reversed(contenders))
                for name in order:
                    with contenders[name](dsns[name]) as saver:
                        graph = bs.chat_graph(False).compile(checkpointer=saver)
                        t0 = time.perf_counter()
                        snap = graph.get_state(cfg)
                        cold[name].append(time.perf_counter() - t0)
                        assert len(snap.values["messages"]) == args.turns
                    g = stacks[name][1]
                    t0 = time.perf_counter()
                    g.get_state(cfg)
                    warm[name].append(time.perf_counter() - t0)
        finally:
            for cm, _ in stacks.values():
                cm.__exit__(None, None, None)
    finally:
        for dsn in dsns.values():
            bs.drop_db(args.dsn, dsn)
    names = list(contenders)
    print(f"chat {args.turns} turns, content={args.content}; bytes after VACUUM; get_state medians of {args.loads}")
    print(f"{'':34} | " + " | ".join(f"{n:>22}" for n in names))
    rows = sorted({t for tb in tables.values() for t in tb if t in bs.WRITTEN})
    for t in rows:
        print(f"{t:34} | " + " | ".join(f"{tables[n].get(t, 0) / 1e6:>19.3f} MB" for n in names))
    print(f"{'written tables':34} | " + " | ".join(f"{bs.written_bytes(tables[n]) / 1e6:>19.3f} MB" for n in names))
    print(f"{'get_state, fresh saver (ms)':34} | " + " | ".join(f"{statistics.median(cold[n]) * 1000:>22.1f}" for n in names))
    print(f"{'get_state, warm saver (ms)':34} | " + " | ".join(f"{statistics.median(warm[n]) * 1000:>22.1f}" for n in names))
    return 0


if __name__ == "__main__":
    sys.exit(main())
