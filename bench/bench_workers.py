"""Recovery-worker throughput (issue #7): checkpoints per second on 32 threads of a
20-step graph, side by side in ONE run on the SAME PostgreSQL (a database of its own):

* ``stock loop``       -- ``langgraph.checkpoint.postgres.PostgresSaver``, a plain loop
  invoking the 32 threads one after another in one process;
* ``durable loop``     -- ``DurablePostgresSaver``, the same loop (leases on);
* ``durable, no lease``-- the same loop with ``leases=False``: the difference to the row
  above is the lease overhead (acquire + release per run, fence per write);
* ``durable workers xN`` -- the 32 threads submitted (queued), then N worker processes
  (``RecoveryWorker``, concurrency 1 each) claim and run them until none is left.

Workers import and connect before the clock starts (they wait for "go" on stdin).
Nodes do no I/O by default, so the table measures checkpointing itself (CPU- and
commit-bound: on a 2-core machine more processes cannot add throughput). ``--node-ms``
makes every node wait that long, like an LLM or HTTP call; then workers scale.

Run: ``python bench/bench_workers.py [--dsn postgresql://...] [--threads 32] [--steps 20]
[--node-ms 0] [--repeat 3]``; prints a table and writes ``bench/workers_results.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Any, TypedDict

import psycopg
from langgraph.checkpoint.postgres import PostgresSaver
from langgraph.graph import END, START, StateGraph
from psycopg import conninfo as ci

from langgraph_durable import DurablePostgresSaver
from langgraph_durable.recovery import RecoveryWorker, submit

HERE = Path(__file__).resolve().parent
DEFAULT_DSN = "postgresql://postgres@127.0.0.1:5432/postgres"
VERSION = "bench-workers-v1"


class State(TypedDict):
    step: int
    note: str


NODE_MS = 0.0  # simulated I/O wait per node (an LLM or HTTP call), set by --node-ms


def build(steps: int) -> StateGraph:
    """A sequential graph; each node changes the state (and waits NODE_MS, if set)."""
    b = StateGraph(State)
    prev = START
    for i in range(steps):
        def node(state: State, i: int = i) -> dict[str, Any]:
            if NODE_MS:
                time.sleep(NODE_MS / 1000)
            return {"step": state["step"] + 1, "note": f"node {i} done"}

        b.add_node(f"n{i}", node)
        b.add_edge(prev, f"n{i}")
        prev = f"n{i}"
    b.add_edge(prev, END)
    return b


def count_checkpoints(dsn: str, prefix: str) -> int:
    with psycopg.connect(dsn) as conn:
        row = conn.execute(
            "SELECT count(*) FROM checkpoints WHERE thread_id LIKE %s", (prefix + "%",)
        ).fetchone()
    return int(row[0]) if row else 0


def loop(dsn: str, saver_kind: str, threads: int, steps: int, prefix: str) -> float:
    graph_input: State = {"step": 0, "note": ""}
    if saver_kind == "stock":
        with PostgresSaver.from_conn_string(dsn) as stock:
            graph = build(steps).compile(checkpointer=stock)
            t0 = time.perf_counter()
            for i in range(threads):
                graph.invoke(graph_input, {"configurable": {"thread_id": f"{prefix}{i}"}})
            return time.perf_counter() - t0
    leases = saver_kind == "durable"
    with DurablePostgresSaver.from_conn_string(dsn, leases=leases, graph_version=VERSION) as saver:
        graph = build(steps).compile(checkpointer=saver)
        t0 = time.perf_counter()
        for i in range(threads):
            graph.invoke(graph_input, {"configurable": {"thread_id": f"{prefix}{i}"}})
        return time.perf_counter() - t0


def per_invoke(dsn: str, steps: int, samples: int) -> dict[str, float]:
    """Median ms per step of one invoke, the three savers taking turns invoke by invoke,
    so that load from elsewhere on the machine hits them alike (the throughput rounds
    above are minutes apart and much noisier on a shared machine)."""
    graph_input: State = {"step": 0, "note": ""}
    timings: dict[str, list[float]] = {"stock": [], "durable": [], "leases off": []}
    with (
        PostgresSaver.from_conn_string(dsn) as stock,
        DurablePostgresSaver.from_conn_string(dsn, graph_version=VERSION) as on,
        DurablePostgresSaver.from_conn_string(dsn, graph_version=VERSION, leases=False) as off,
    ):
        graphs = {
            "stock": build(steps).compile(checkpointer=stock),
            "durable": build(steps).compile(checkpointer=on),
            "leases off": build(steps).compile(checkpointer=off),
        }
        for i in range(samples):
            for name, graph in graphs.items():
                t0 = time.perf_counter()
                graph.invoke(graph_input, {"configurable": {"thread_id": f"pi-{name}-{i}"}})
                timings[name].append((time.perf_counter() - t0) * 1000 / steps)
    return {name: statistics.median(v) for name, v in timings.items()}


def workers(dsn: str, n: int, threads: int, steps: int, prefix: str) -> float:
    procs = [
        subprocess.Popen(
            [sys.executable, __file__, "--worker", "--dsn", dsn, "--steps", str(steps),
             "--node-ms", str(NODE_MS)],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
        )
        for _ in range(n)
    ]
    for p in procs:
        assert p.stdout is not None and p.stdout.readline().strip() == "ready"
    with DurablePostgresSaver.from_conn_string(dsn, graph_version=VERSION) as saver:
        graph = build(steps).compile(checkpointer=saver)
        for i in range(threads):
            submit(graph, {"step": 0, "note": ""}, {"configurable": {"thread_id": f"{prefix}{i}"}})
    t0 = time.perf_counter()
    for p in procs:
        assert p.stdin is not None
        p.stdin.write("go\n")
        p.stdin.flush()
    claimed = 0
    for p in procs:
        out, _ = p.communicate(timeout=600)
        claimed += int(out.strip().splitlines()[-1])
    elapsed = time.perf_counter() - t0
    assert claimed == threads, (claimed, threads)
    return elapsed


def worker_main(dsn: str, steps: int) -> None:
    with DurablePostgresSaver.from_conn_string(dsn, graph_version=VERSION, pool_size=4) as saver:
        graph = build(steps).compile(checkpointer=saver)
        worker = RecoveryWorker(graph, concurrency=1, poll_interval=0.05)
        # Warm up like the loops do (first-call costs in a fresh process), off the clock.
        graph.invoke({"step": 0, "note": ""}, {"configurable": {"thread_id": f"warm-w-{os.getpid()}"}})
        print("ready", flush=True)
        sys.stdin.readline()
        stats = worker.run(until_idle=True, install_signal_handlers=False)
        print(stats.claimed, flush=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--dsn", default=os.environ.get("LANGGRAPH_DURABLE_BENCH_DSN", DEFAULT_DSN))
    ap.add_argument("--threads", type=int, default=32)
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--workers", default="1,2,4")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--samples", type=int, default=32)
    ap.add_argument("--node-ms", type=float, default=0.0,
                    help="simulated I/O wait per node in ms (0: pure checkpointing overhead)")
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--out", default=str(HERE / "workers_results.json"))
    args = ap.parse_args()
    global NODE_MS
    NODE_MS = args.node_ms
    if args.worker:
        worker_main(args.dsn, args.steps)
        return

    name = "lgd_bench_workers_" + uuid.uuid4().hex[:8]
    with psycopg.connect(args.dsn, autocommit=True) as admin:
        admin.execute(psycopg.sql.SQL("CREATE DATABASE {}").format(psycopg.sql.Identifier(name)))
    params = ci.conninfo_to_dict(args.dsn)
    params["dbname"] = name
    dsn = ci.make_conninfo(**params)
    try:
        with DurablePostgresSaver.from_conn_string(dsn) as saver:
            saver.setup()
        configs: list[tuple[str, int, Any]] = [
            ("stock loop", 1, lambda p: loop(dsn, "stock", args.threads, args.steps, p)),
            ("durable loop", 1, lambda p: loop(dsn, "durable", args.threads, args.steps, p)),
            ("durable loop, leases off", 1, lambda p: loop(dsn, "nolease", args.threads, args.steps, p)),
        ] + [
            (f"durable workers x{n}", n, lambda p, n=n: workers(dsn, n, args.threads, args.steps, p))
            for n in [int(x) for x in args.workers.split(",") if x]
        ]
        # Warm-up (connections, plans, page cache), not reported.
        loop(dsn, "stock", 2, args.steps, "warm-s-")
        loop(dsn, "durable", 2, args.steps, "warm-d-")
        # Rounds interleave the configurations, so load from elsewhere on the machine
        # hits all of them alike; the median of the rounds is reported.
        times: dict[str, list[float]] = {label: [] for label, _, _ in configs}
        counts: dict[str, int] = {}
        for r in range(args.repeat):
            for i, (label, _procs, fn) in enumerate(configs):
                prefix = f"c{i}r{r}-"
                seconds = fn(prefix)
                times[label].append(seconds)
                counts[label] = count_checkpoints(dsn, prefix)
                print(f"  round {r + 1}: {label}: {seconds:.2f} s, {counts[label]} checkpoints",
                      file=sys.stderr, flush=True)
        rows: list[dict[str, Any]] = []
        for label, procs, _fn in configs:
            seconds = statistics.median(times[label])
            rows.append({
                "config": label, "processes": procs, "seconds": round(seconds, 3),
                "rounds": [round(t, 3) for t in times[label]],
                "checkpoints": counts[label],
                "checkpoints_per_s": round(counts[label] / seconds, 1),
                "ms_per_step": round(1000 * seconds / (args.threads * args.steps), 3),
            })
        NODE_MS = 0.0  # the per-step overhead is measured without simulated I/O
        per_step = per_invoke(dsn, args.steps, args.samples)
    finally:
        with psycopg.connect(args.dsn, autocommit=True) as admin:
            admin.execute(
                psycopg.sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(psycopg.sql.Identifier(name))
            )

    print(f"\n{args.threads} threads x {args.steps}-step graph, one PostgreSQL, cores: "
          f"{os.cpu_count()}, node I/O wait {args.node_ms:g} ms, median of {args.repeat} rounds\n")
    print("| configuration | processes | wall s | checkpoints | checkpoints/s | ms/step |")
    print("|---|---:|---:|---:|---:|---:|")
    for r in rows:
        print(f"| {r['config']} | {r['processes']} | {r['seconds']:.2f} | {r['checkpoints']} | "
              f"{r['checkpoints_per_s']:.0f} | {r['ms_per_step']:.2f} |")
    print(f"\nper step, one invoke at a time, savers taking turns ({args.samples} invokes each):")
    print("| saver | ms/step (median) |")
    print("|---|---:|")
    for name, ms in per_step.items():
        print(f"| {name} | {ms:.2f} |")
    lease_ms = per_step["durable"] - per_step["leases off"]
    vs_stock_ms = per_step["durable"] - per_step["stock"]
    print(f"\nlease overhead per step (durable - leases off): {lease_ms:+.3f} ms")
    print(f"durable vs stock per step: {vs_stock_ms:+.3f} ms")
    Path(args.out).write_text(json.dumps({
        "threads": args.threads, "steps": args.steps, "cpu_count": os.cpu_count(),
        "repeat": args.repeat, "node_ms": args.node_ms,
        "rows": rows, "per_step_ms": {k: round(v, 3) for k, v in per_step.items()},
        "lease_overhead_ms_per_step": round(lease_ms, 3),
        "durable_minus_stock_ms_per_step": round(vs_stock_ms, 3),
    }, indent=2) + "\n")
    print(f"saved {args.out}")


if __name__ == "__main__":
    main()
