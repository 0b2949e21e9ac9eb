"""Hot-path benchmark (issue 14, problems 1 and 2): writes against the floor, the run
lifecycle's round trips, per-invoke overhead and throughput under concurrency.

Side by side in ONE run on the SAME PostgreSQL database:

* ``floor``   -- a raw psycopg pipeline running the stock ``UPSERT_CHECKPOINTS_SQL``
  (``UPSERT_CHECKPOINT_WRITES_SQL`` for writes) with the stock saver's parameters;
* ``stock``   -- ``langgraph.checkpoint.postgres.PostgresSaver`` (``AsyncPostgresSaver``);
* ``durable`` -- ``DurablePostgresSaver`` with a lease held (every write fenced);
* ``outside``  -- ``DurablePostgresSaver`` with no lease held (a write outside a run:
  every write carries the foreign-lease check), writes only;
* ``leases off`` -- ``DurablePostgresSaver(leases=False)``.

Sections:

* ``put`` / ``put_writes``: median ms per call, the contenders taking turns in rounds
  (so load from elsewhere on a shared machine hits them alike), ratio to the floor;
* ``invoke``: a 10-step loop graph on a new thread per invoke, ``durability="sync"`` and
  ``"async"`` (LangGraph's default), the savers taking turns: median ms per invoke,
  and the wire per invoke counted by libpq's protocol trace on the saver's connection
  (round trips = ReadyForQuery messages, statements = Execute + simple Query);
* ``concurrent``: async savers on a pool of 10 connections, N runs at once: runs/s.

Run: ``python bench/bench_hotpath.py [--dsn postgresql://...] [--quick]``. Prints the
load average before and after: on a loaded machine repeat and compare medians.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any, TypedDict

import psycopg
from langgraph.checkpoint.base import empty_checkpoint
from langgraph.checkpoint.postgres import PostgresSaver
from langgraph.checkpoint.postgres.aio import AsyncPostgresSaver
from langgraph.checkpoint.postgres.base import UPSERT_CHECKPOINT_WRITES_SQL, UPSERT_CHECKPOINTS_SQL
from langgraph.graph import END, START, StateGraph
from psycopg import conninfo as ci
from psycopg.rows import dict_row
from psycopg.types.json import Jsonb
from psycopg_pool import AsyncConnectionPool

from langgraph_durable import AsyncDurablePostgresSaver, DurablePostgresSaver
from langgraph_durable import saver as saver_mod

DEFAULT_DSN = "postgresql://postgres@127.0.0.1:5432/postgres"
STEPS = 10


# --------------------------------------------------------------------------- wire count
@contextmanager
def wire(conn: psycopg.Connection[Any]) -> Iterator[dict[str, int]]:
    """Count what ``conn`` sends and waits for, from libpq's protocol trace."""
    out = {"round_trips": 0, "statements": 0}
    with tempfile.TemporaryFile("w+") as f:
        conn.pgconn.trace(f.fileno())
        conn.pgconn.set_trace_flags(psycopg.pq.Trace.SUPPRESS_TIMESTAMPS | psycopg.pq.Trace.REGRESS_MODE)
        try:
            yield out
        finally:
            conn.pgconn.untrace()
            f.seek(0)
            for line in f:
                parts = line.split("\t")
                if len(parts) < 3:
                    continue
                kind = parts[2].split()[0] if parts[2].split() else ""
                if parts[0] == "B" and kind == "ReadyForQuery":
                    out["round_trips"] += 1
                elif parts[0] == "F" and kind in ("Execute", "Query"):
                    out["statements"] += 1


def connect(dsn: str) -> psycopg.Connection[Any]:
    return psycopg.connect(dsn, autocommit=True, prepare_threshold=0, row_factory=dict_row)


def backend_cpu(conn: psycopg.Connection[Any]) -> float | None:
    """CPU seconds the connection's server process has run (``/proc/<pid>/schedstat``,
    ns resolution), or None when the server is not on this machine. On a shared machine
    the wall clock carries everyone's load and fsync queue; CPU per call is what a
    write itself costs, client and server."""
    try:
        with open(f"/proc/{conn.info.backend_pid}/schedstat") as f:
            return int(f.read().split()[0]) / 1e9
    except (OSError, ValueError, IndexError):
        return None


# --------------------------------------------------------------------------- graph
class State(TypedDict):
    n: int
    note: str


def build(steps: int = STEPS) -> StateGraph:
    g = StateGraph(State)
    for i in range(steps):
        def node(s: State, i: int = i) -> dict[str, Any]:
            return {"n": s["n"] + 1, "note": f"step {i}"}
        g.add_node(f"s{i}", node)
        g.add_edge(START if i == 0 else f"s{i - 1}", f"s{i}")
    g.add_edge(f"s{steps - 1}", END)
    return g


# --------------------------------------------------------------------------- writes
class Writer:
    """One contender's put / put_writes on its own thread, checkpoints chained."""

    def __init__(self, name: str, conn: psycopg.Connection[Any], saver: Any | None) -> None:
        self.name, self.conn, self.saver = name, conn, saver
        self.thread = f"hp-{name}-{uuid.uuid4().hex[:8]}"
        self.parent: str | None = None
        self.lease: Any = None
        self.i = 0
        # The floor's serializer, made once (building a PostgresSaver per call put
        # ~10 us of setup into every floor put_writes: the floor looked slower than stock).
        self.serde = PostgresSaver(conn).serde if saver is None else None

    def _checkpoint(self) -> tuple[dict[str, Any], dict[str, Any], dict[str, Any]]:
        self.i += 1
        cp = empty_checkpoint()
        cp["channel_values"] = {"n": self.i, "note": f"step {self.i}"}
        cp["channel_versions"] = {"n": f"{self.i:032}.0", "note": f"{self.i:032}.0"}
        md = {"source": "loop", "step": self.i, "parents": {}}
        return cp, md, dict(cp["channel_versions"])

    def config(self) -> dict[str, Any]:
        c: dict[str, Any] = {"thread_id": self.thread, "checkpoint_ns": ""}
        if self.parent:
            c["checkpoint_id"] = self.parent
        return {"configurable": c}

    def put(self) -> tuple[float, float]:
        cp, md, versions = self._checkpoint()
        cfg = self.config()
        c0, t0 = time.thread_time(), time.perf_counter()
        if self.saver is None:
            # The floor: the stock statement with the stock saver's parameters.
            with self.conn.pipeline(), self.conn.cursor(binary=True) as cur:
                cur.execute(
                    UPSERT_CHECKPOINTS_SQL,
                    (self.thread, "", cp["id"], self.parent, Jsonb(cp), Jsonb(md)),
                )
        else:
            self.saver.put(cfg, cp, md, versions)
        dt, dc = time.perf_counter() - t0, time.thread_time() - c0
        self.parent = cp["id"]
        return dt, dc

    def put_writes(self) -> tuple[float, float]:
        cfg = self.config()
        task = str(uuid.uuid4())
        writes = [("n", self.i), ("note", f"w {self.i}")]
        c0, t0 = time.thread_time(), time.perf_counter()
        if self.saver is None:
            serde = self.serde
            rows = []
            for idx, (ch, v) in enumerate(writes):
                typ, data = serde.dumps_typed(v)
                rows.append((self.thread, "", self.parent, task, "", idx, ch, typ, data))
            with self.conn.pipeline(), self.conn.cursor(binary=True) as cur:
                cur.executemany(UPSERT_CHECKPOINT_WRITES_SQL, rows)
        else:
            self.saver.put_writes(cfg, writes, task, "")
        return time.perf_counter() - t0, time.thread_time() - c0


def take_lease(w: Writer, version: str | None = "bench-v1") -> None:
    """Hold a real lease for ``w``'s thread in this context (what a run start does). A
    run's lease carries its graph version (the configured one or the graph's
    fingerprint, lifecycle._current_version), so its puts stamp it and need no
    inheritance from the parent; ``version=None`` measures the unversioned lease."""
    s = w.saver
    owner = saver_mod._owner_id()
    res = s.run_op(lambda: s._op_acquire(w.thread, owner, version, None))
    assert res["ok"], res
    w.lease = saver_mod.Lease(
        thread_id=w.thread, owner=owner, token=int(res["lease_token"]), attempts=1,
        checkpoint_id=None, version=version,
    )
    saver_mod._RUN_LEASE.set(w.lease)


def bench_writes(dsn: str, rounds: int, per_round: int) -> dict[str, dict[str, float]]:
    conns = {n: connect(dsn) for n in ("floor", "stock", "durable", "outside", "leases off")}
    savers: dict[str, Any] = {
        "floor": None,
        "stock": PostgresSaver(conns["stock"]),
        "durable": DurablePostgresSaver(conns["durable"]),
        "outside": DurablePostgresSaver(conns["outside"]),
        "leases off": DurablePostgresSaver(conns["leases off"], leases=False),
    }
    writers = {n: Writer(n, conns[n], savers[n]) for n in conns}
    take_lease(writers["durable"])
    results: dict[str, dict[str, list[float]]] = {
        n: {"put": [], "put_writes": [], "put_cpu": [], "pw_cpu": []} for n in conns
    }
    counts: dict[str, dict[str, float]] = {}
    for w in writers.values():  # warm up (prepared statements, caches), then count once
        for _ in range(20):
            w.put()
            w.put_writes()
        with wire(w.conn) as c1:
            w.put()
        with wire(w.conn) as c2:
            w.put_writes()
        counts[w.name] = {
            "put_rt": c1["round_trips"], "put_stmts": c1["statements"],
            "pw_rt": c2["round_trips"], "pw_stmts": c2["statements"],
        }
    order = list(writers.items())
    server0 = {n: backend_cpu(c) for n, c in conns.items()}
    for r in range(rounds * per_round):
        # Call by call, the contenders taking turns (rotating who goes first), so load
        # from elsewhere on a shared machine hits them alike.
        for name, w in order[r % len(order):] + order[: r % len(order)]:
            for key, (wall, cpu) in (("put", w.put()), ("pw", w.put_writes())):
                results[name]["put_writes" if key == "pw" else "put"].append(wall)
                results[name][f"{key}_cpu"].append(cpu)
    calls = 2 * rounds * per_round  # put + put_writes, per contender
    server = {}
    for n, c in conns.items():
        s1, s0 = backend_cpu(c), server0[n]
        server[n] = (s1 - s0) / calls * 1000 if s1 is not None and s0 is not None else float("nan")
    for c in conns.values():
        c.close()
    return {
        n: {
            "server": server[n],
            "put": statistics.median(r["put"]) * 1000,
            "put_writes": statistics.median(r["put_writes"]) * 1000,
            "put_cpu": statistics.median(r["put_cpu"]) * 1000,
            "pw_cpu": statistics.median(r["pw_cpu"]) * 1000,
            **counts[n],
        }
        for n, r in results.items()
    }


# --------------------------------------------------------------------------- invoke
def bench_invoke(dsn: str, samples: int, durability: str = "async") -> dict[str, dict[str, float]]:
    conns = {n: connect(dsn) for n in ("stock", "durable", "leases off")}
    savers: dict[str, Any] = {
        "stock": PostgresSaver(conns["stock"]),
        "durable": DurablePostgresSaver(conns["durable"]),
        "leases off": DurablePostgresSaver(conns["leases off"], leases=False),
    }
    graphs = {n: build().compile(checkpointer=s) for n, s in savers.items()}
    times: dict[str, list[float]] = {n: [] for n in graphs}
    cpus: dict[str, list[float]] = {n: [] for n in graphs}
    wires: dict[str, dict[str, int]] = {}
    tag = uuid.uuid4().hex[:6]
    for name, g in graphs.items():  # warm up, then count one invoke
        for i in range(5):
            g.invoke({"n": 0, "note": ""}, {"configurable": {"thread_id": f"w-{tag}-{name}-{i}"}},
                     durability=durability)
        with wire(conns[name]) as c:
            g.invoke({"n": 0, "note": ""}, {"configurable": {"thread_id": f"c-{tag}-{name}"}},
                     durability=durability)
        wires[name] = c
    order = list(graphs.items())
    server0 = {n: backend_cpu(c) for n, c in conns.items()}
    for i in range(samples):
        # Taking turns, rotating who goes first (load from elsewhere hits all alike).
        for name, g in order[i % len(order):] + order[: i % len(order)]:
            cfg = {"configurable": {"thread_id": f"i-{tag}-{name}-{i}"}}
            c0, t0 = time.process_time(), time.perf_counter()
            g.invoke({"n": 0, "note": ""}, cfg, durability=durability)
            times[name].append((time.perf_counter() - t0) * 1000)
            cpus[name].append((time.process_time() - c0) * 1000)
    server = {}
    for n, c in conns.items():
        s1, s0 = backend_cpu(c), server0[n]
        server[n] = (s1 - s0) / samples * 1000 if s1 is not None and s0 is not None else float("nan")
    for c in conns.values():
        c.close()
    return {
        n: {"ms": statistics.median(t), "cpu": statistics.median(cpus[n]), "server": server[n],
            "round_trips": wires[n]["round_trips"],
            "statements": wires[n]["statements"]}
        for n, t in times.items()
    }


# --------------------------------------------------------------------------- concurrency
async def _throughput(dsn: str, kind: str, concurrency: int, runs: int) -> float:
    async with AsyncConnectionPool(
        dsn, min_size=10, max_size=10, open=False,
        kwargs={"autocommit": True, "prepare_threshold": 0, "row_factory": dict_row},
    ) as pool:
        saver: Any = AsyncPostgresSaver(pool) if kind == "stock" else AsyncDurablePostgresSaver(pool)
        graph = build().compile(checkpointer=saver)
        tag = uuid.uuid4().hex[:6]
        sem = asyncio.Semaphore(concurrency)

        async def one(i: int) -> None:
            async with sem:
                await graph.ainvoke({"n": 0, "note": ""}, {"configurable": {"thread_id": f"t-{tag}-{i}"}})

        await asyncio.gather(*(one(i) for i in range(min(concurrency, 20))))  # warm up
        t0 = time.perf_counter()
        await asyncio.gather(*(one(i) for i in range(100, 100 + runs)))
        return runs / (time.perf_counter() - t0)


def bench_concurrent(dsn: str, levels: list[int], repeats: int) -> dict[int, dict[str, float]]:
    out: dict[int, dict[str, float]] = {}
    for c in levels:
        runs = max(100, 2 * c)
        got: dict[str, list[float]] = {"stock": [], "durable": []}
        for _ in range(repeats):
            for kind in got:
                got[kind].append(asyncio.run(_throughput(dsn, kind, c, runs)))
        out[c] = {k: statistics.median(v) for k, v in got.items()}
    return out


# --------------------------------------------------------------------------- main
def make_db(admin: str) -> str:
    name = f"bench_hotpath_{os.getpid()}"
    with psycopg.connect(admin, autocommit=True) as c:
        c.execute(f'DROP DATABASE IF EXISTS "{name}"')
        c.execute(f'CREATE DATABASE "{name}"')
    params = ci.conninfo_to_dict(admin)
    params["dbname"] = name
    return ci.make_conninfo(**params)


def drop_db(admin: str, dsn: str) -> None:
    name = ci.conninfo_to_dict(dsn)["dbname"]
    with psycopg.connect(admin, autocommit=True) as c:
        c.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def _load() -> str:
    try:
        return " ".join(f"{x:.1f}" for x in os.getloadavg()) + f" ({os.cpu_count()} cpus)"
    except OSError:
        return "n/a"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dsn", default=os.environ.get("BENCH_DSN", DEFAULT_DSN))
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--skip-concurrent", action="store_true")
    ap.add_argument("--skip-invoke", action="store_true")
    ap.add_argument("--skip-writes", action="store_true")
    args = ap.parse_args(argv)
    dsn = make_db(args.dsn)
    try:
        with connect(dsn) as c:
            PostgresSaver(c).setup()
        with DurablePostgresSaver.from_conn_string(dsn) as s:
            s.setup()
        print(f"load average before: {_load()}")
        rounds, per = (4, 50) if args.quick else (10, 100)
        w = {} if args.skip_writes else bench_writes(dsn, rounds, per)
        print(f"\nwrites: median ms per call, {rounds * per} calls each, contenders taking turns call by call;"
              " cpu = client CPU ms per call; server = the backend's CPU ms per call, put and put_writes"
              " averaged")
        print(f"{'':12} {'put':>8} {'x floor':>8} {'cpu':>6} {'rt':>3} {'stmts':>5}"
              f"   {'put_writes':>10} {'x floor':>8} {'cpu':>6} {'rt':>3} {'stmts':>5}")
        f = w.get("floor", {})
        for n, r in w.items():
            print(
                f"{n:12} {r['put']:8.3f} {r['put'] / f['put']:8.2f} {r['put_cpu']:6.3f}"
                f" {r['put_rt']:3.0f} {r['put_stmts']:5.0f}"
                f"   {r['put_writes']:10.3f} {r['put_writes'] / f['put_writes']:8.2f} {r['pw_cpu']:6.3f}"
                f" {r['pw_rt']:3.0f} {r['pw_stmts']:5.0f}   server {r['server']:6.3f}"
                f" (x floor {r['server'] / f['server']:4.2f})"
                f"  client+server x floor {(r['put_cpu'] + r['pw_cpu'] + 2 * r['server']) / (f['put_cpu'] + f['pw_cpu'] + 2 * f['server']):4.2f}"
            )
        for durability in () if args.skip_invoke else ("sync", "async"):
            inv = bench_invoke(dsn, 30 if args.quick else 100, durability)
            print(f"\ninvoke, durability={durability!r}: {STEPS}-step loop graph, new thread each"
                  " (median wall ms and process CPU ms; wire per invoke)")
            for n, r in inv.items():
                print(
                    f"{n:12} {r['ms']:8.2f} ms  {r['ms'] - inv['stock']['ms']:+6.2f} ms vs stock"
                    f"  cpu {r['cpu']:6.2f} ms ({r['cpu'] - inv['stock']['cpu']:+5.2f})"
                    f"  {r['round_trips']:3} round trips  {r['statements']:3} statements"
                    f"  server cpu {r['server']:5.2f} ms ({r['server'] - inv['stock']['server']:+5.2f})"
                )
        if not args.skip_concurrent:
            conc = bench_concurrent(dsn, [10, 200], 1 if args.quick else 3)
            print("\nconcurrent runs (async, pool of 10): runs/s")
            for c, r in conc.items():
                print(f"{c:>4} at once: stock {r['stock']:7.1f}  durable {r['durable']:7.1f}"
                      f"  ratio {r['durable'] / r['stock']:.2f}")
        print(f"\nload average after: {_load()}")
    finally:
        drop_db(args.dsn, dsn)
    return 0


if __name__ == "__main__":
    sys.exit(main())
