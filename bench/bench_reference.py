"""At the reference's scale (issue 15, item 5): 500 concurrent workflows of 10+ I/O-bound
steps over 4 worker processes, 2% of the runs' processes SIGKILLed mid-run, on one
PostgreSQL (a database of its own), the package and the stock saver side by side.

* ``durable``: the workflows are submitted (queued), then N ``RecoveryWorker`` processes
  (async, ``concurrency = workflows / N`` each, so all of them are in flight at once)
  claim and run them. Every node waits ``--node-ms`` (an LLM or HTTP call), then performs
  its effect: an INSERT into ``ref_effects`` through ``@idempotent(transactional=True)``.
  A killed worker is restarted; its threads are resumed by whichever worker claims them
  once their leases expire (``--lease-ttl``).
* ``stock``: ``langgraph.checkpoint.postgres.aio.AsyncPostgresSaver``, the same graph and
  the same kills, in N processes each running its share with ``ainvoke`` (a plain loop,
  all at once), LangGraph's default ``durability="async"`` (checkpoints written in the
  background, so under load they lag the nodes: a kill loses several steps);
  ``stock-sync``: the same with ``durability="sync"`` (a step's checkpoint is written
  before the next step starts). Stock has no recovery: the restarted process re-runs its unfinished
  threads from their last checkpoint (the best a plain loop can do), and the effect is a
  plain INSERT, so a node cut between its effect and its checkpoint repeats the effect.

Kills: ``ceil(kill_rate * workflows)`` SIGKILLs, spread evenly over the run's progress
(by effects done), each of one worker process (round-robin) while it has runs in flight.
Reported: throughput (workflows/s, checkpoints/s), p50/p99 put latency as the runs saw it
(await of ``aput``: pool wait and event loop included, under full concurrency) and one put
at a time after the run (the reference: "PostgreSQL INSERT latency at p99 is under 5 ms"),
the time from a kill to each interrupted thread's next effect, duplicated effects
((thread, step) done twice), completed workflows.

Run: ``python bench/bench_reference.py [--dsn postgresql://...] [--workflows 500]
[--workers 4] [--steps 10] [--node-ms 5] [--kill-rate 0.02] [--lease-ttl 5]``;
``--quick`` (50 workflows, 2 workers, CI: well under a minute) and ``--no-stock``.
Prints a table; ``--out`` writes JSON (default bench/reference_results.json, not in --quick).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import math
import os
import random
import signal
import statistics
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path
from typing import Any, TypedDict

import psycopg
from langchain_core.runnables import RunnableConfig
from langgraph.graph import END, START, StateGraph
from psycopg import conninfo as ci

HERE = Path(__file__).resolve().parent
DEFAULT_DSN = "postgresql://postgres@127.0.0.1:5432/postgres"
EFFECTS_SQL = """CREATE TABLE IF NOT EXISTS ref_effects (
    id BIGSERIAL PRIMARY KEY, saver TEXT NOT NULL, thread_id TEXT NOT NULL, step INT NOT NULL,
    pid INT NOT NULL, at DOUBLE PRECISION NOT NULL DEFAULT extract(epoch FROM clock_timestamp()))"""
INSERT_EFFECT = "INSERT INTO ref_effects (saver, thread_id, step, pid) VALUES (%s, %s, %s, %s)"


class State(TypedDict):
    step: int


def build(steps: int, node_ms: float, saver_kind: str, stock_pool: Any = None, label: str = "stock") -> StateGraph:
    """A sequential graph of ``steps`` I/O-bound nodes, each with one external effect."""
    from langgraph_durable import idempotent

    @idempotent(transactional=True, name="ref_effect")
    async def durable_effect(conn: Any, thread_id: str, step: int) -> int:
        await conn.execute(INSERT_EFFECT, ("durable", thread_id, step, os.getpid()))
        return step

    b = StateGraph(State)
    prev = START
    for i in range(steps):
        async def node(state: State, config: RunnableConfig, i: int = i) -> dict[str, Any]:
            await asyncio.sleep(node_ms / 1000)
            thread_id = str(config["configurable"]["thread_id"])
            if saver_kind == "durable":
                await durable_effect(thread_id, i)
            else:
                async with stock_pool.connection() as conn:
                    await conn.execute(INSERT_EFFECT, (label, thread_id, i, os.getpid()))
            return {"step": state["step"] + 1}

        b.add_node(f"n{i}", node)
        b.add_edge(prev, f"n{i}")
        prev = f"n{i}"
    b.add_edge(prev, END)
    return b


# ----------------------------------------------------------------------------- children


class _Latencies:
    """put latencies of this process, appended to a file every second (a SIGKILLed
    process loses at most its last second of samples)."""

    def __init__(self, path: str) -> None:
        self.path = path
        self.samples: list[float] = []
        self.lock = threading.Lock()

    def wrap(self, saver: Any) -> None:
        original = saver.aput

        async def aput(*args: Any, **kwargs: Any) -> Any:
            t0 = time.perf_counter()
            try:
                return await original(*args, **kwargs)
            finally:
                self.samples.append(time.perf_counter() - t0)

        saver.aput = aput

    def flush(self) -> None:
        with self.lock:
            batch, self.samples = self.samples, []
            if batch:
                with open(self.path, "a") as fh:
                    fh.write("".join(f"{s:.6f}\n" for s in batch))

    async def flusher(self) -> None:
        while True:
            await asyncio.sleep(1.0)
            self.flush()


async def durable_child(args: argparse.Namespace) -> None:
    from langgraph_durable import AsyncDurablePostgresSaver
    from langgraph_durable.recovery import RecoveryWorker

    lat = _Latencies(args.latency_file)
    async with AsyncDurablePostgresSaver.from_conn_string(
        # Kills are infrastructure failures, not poison: with 125 runs per process and a
        # saturated pool, one thread can be cut several times at the same checkpoint
        # (a run at 500 x 10 quarantined 2 threads with the default of 3).
        args.dsn, pool_size=args.pool_size, lease_ttl=args.lease_ttl, max_resume_attempts=20
    ) as saver:
        graph = build(args.steps, args.node_ms, "durable").compile(checkpointer=saver)
        lat.wrap(saver)
        # poll_interval: how often an IDLE slot asks for work; 500 slots polling every
        # 0.1 s would be 5000 claims/s against the database once runs finish.
        worker = RecoveryWorker(graph, concurrency=args.concurrency, poll_interval=1.0, shutdown="finish")
        print("ready", flush=True)
        if not args.nowait:
            await asyncio.get_running_loop().run_in_executor(None, sys.stdin.readline)
        flusher = asyncio.ensure_future(lat.flusher())
        try:
            await worker.arun()
        finally:
            flusher.cancel()
            lat.flush()


async def stock_child(args: argparse.Namespace) -> None:
    from langgraph.checkpoint.postgres.aio import AsyncPostgresSaver
    from psycopg.rows import dict_row
    from psycopg_pool import AsyncConnectionPool

    lat = _Latencies(args.latency_file)
    ids = [f"{args.prefix}{i}" for i in range(args.first, args.last)]
    async with AsyncConnectionPool(
        args.dsn, min_size=2, max_size=args.pool_size, open=False,
        kwargs={"autocommit": True, "prepare_threshold": 0, "row_factory": dict_row},
    ) as pool:
        saver = AsyncPostgresSaver(pool)
        label = "stock-sync" if args.durability == "sync" else "stock"
        graph = build(args.steps, args.node_ms, "stock", pool, label).compile(checkpointer=saver)
        durability: Any = args.durability
        lat.wrap(saver)
        print("ready", flush=True)
        if not args.nowait:
            await asyncio.get_running_loop().run_in_executor(None, sys.stdin.readline)
        flusher = asyncio.ensure_future(lat.flusher())

        async def one(thread_id: str) -> None:
            config: RunnableConfig = {"configurable": {"thread_id": thread_id}}
            state = await graph.aget_state(config)
            if not state.created_at:
                await graph.ainvoke({"step": 0}, config, durability=durability)
            elif state.values.get("step", 0) < args.steps:
                # Cut short by a kill: resume from the last checkpoint. (Not state.next: a
                # kill between a task's writes and the step's checkpoint leaves next empty.)
                await graph.ainvoke(None, config, durability=durability)

        try:
            await asyncio.gather(*(one(t) for t in ids))
        finally:
            flusher.cancel()
            lat.flush()


# ----------------------------------------------------------------------------- supervisor


class Fleet:
    """The worker processes of one configuration; kills and restarts them."""

    def __init__(self, kind: str, dsn: str, args: argparse.Namespace, tmp: Path, prefix: str) -> None:
        self.kind, self.dsn, self.args, self.tmp, self.prefix = kind, dsn, args, tmp, prefix
        self.procs: list[subprocess.Popen[str]] = []
        self.spans: list[tuple[int, int]] = []
        per = math.ceil(args.workflows / args.workers)
        for w in range(args.workers):
            self.spans.append((w * per, min(args.workflows, (w + 1) * per)))
            self.procs.append(self._start(w, wait=True))

    def _start(self, w: int, *, wait: bool) -> subprocess.Popen[str]:
        a = self.args
        first, last = self.spans[w]
        child = "durable" if self.kind == "durable" else "stock"
        durability = "sync" if self.kind == "stock-sync" else "async"
        cmd = [sys.executable, __file__, "--child", child, "--durability", durability, "--dsn", self.dsn, "--steps", str(a.steps),
               "--node-ms", str(a.node_ms), "--lease-ttl", str(a.lease_ttl),
               "--concurrency", str(math.ceil(a.workflows / a.workers)), "--pool-size", str(a.pool_size),
               "--latency-file", str(self.tmp / f"{self.kind}-lat-{w}.txt"),
               "--prefix", self.prefix, "--first", str(first), "--last", str(last)]
        if not wait:
            cmd.append("--nowait")
        proc = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
                                stderr=open(self.tmp / f"{self.kind}-{w}.log", "a"))
        if wait:  # a restart is not waited for: the kills go on meanwhile
            assert proc.stdout is not None
            line = proc.stdout.readline().strip()
            assert line == "ready", f"{self.kind} worker {w} did not start: {line!r}"
        return proc

    def go(self) -> None:
        for p in self.procs:
            assert p.stdin is not None
            p.stdin.write("go\n")
            p.stdin.flush()

    def kill(self, w: int) -> int:
        pid = self.procs[w].pid
        os.kill(pid, signal.SIGKILL)
        self.procs[w].wait()
        self.procs[w] = self._start(w, wait=False)
        return pid

    def stop(self) -> None:
        for p in self.procs:
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
        for p in self.procs:
            try:
                p.wait(timeout=60)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()


def _one(conn: psycopg.Connection[Any], sql: str, params: Any = None) -> Any:
    row = conn.execute(sql, params).fetchone()
    return row[0] if row else None


def run_config(kind: str, dsn: str, args: argparse.Namespace, tmp: Path) -> dict[str, Any]:
    prefix = f"{kind}-{uuid.uuid4().hex[:6]}-"
    n, steps = args.workflows, args.steps
    fleet = Fleet(kind, dsn, args, tmp, prefix)
    conn = psycopg.connect(dsn, autocommit=True)
    try:
        if kind == "durable":
            from langgraph_durable import DurablePostgresSaver
            from langgraph_durable.recovery import submit

            with DurablePostgresSaver.from_conn_string(dsn) as saver:
                graph = build(steps, args.node_ms, "durable").compile(checkpointer=saver)
                for i in range(n):
                    submit(graph, {"step": 0}, {"configurable": {"thread_id": f"{prefix}{i}"}})
        kills_planned = max(1, math.ceil(args.kill_rate * n)) if args.kill_rate > 0 else 0
        thresholds = [n * steps * (k + 1) / (kills_planned + 1) for k in range(kills_planned)]
        kills: list[dict[str, Any]] = []
        rng = random.Random(args.seed)
        t0 = time.time()
        fleet.go()
        victim = rng.randrange(args.workers)
        deadline = t0 + args.timeout
        done = 0
        while time.time() < deadline:
            effects = int(_one(conn, "SELECT count(DISTINCT (thread_id, step)) FROM ref_effects "
                                     "WHERE saver = %s AND thread_id LIKE %s", (kind, prefix + "%")))
            if kind == "durable":
                # quarantined threads end the run too (reported as not completed)
                done = int(_one(conn, "SELECT count(*) FROM durable_threads WHERE thread_id LIKE %s "
                                      "AND status IN ('done', 'quarantined')", (prefix + "%",)))
            else:
                done = sum(1 for p in fleet.procs if p.poll() == 0)  # a child exits when its share is done
                failed = [p.returncode for p in fleet.procs if p.poll() not in (None, 0)]
                assert not failed, f"a stock worker failed: {failed} (see its log in {tmp})"
            if (kind == "durable" and done >= n) or (kind != "durable" and done == args.workers):
                break
            if thresholds and effects >= thresholds[0]:
                thresholds.pop(0)
                proc = fleet.procs[victim]
                if kind == "durable":
                    pattern = f"%:{proc.pid}:%"
                    held = [r[0] for r in conn.execute(
                        "SELECT thread_id FROM durable_threads WHERE lease_owner LIKE %s AND status = 'running'",
                        (pattern,))]
                else:
                    first, last = fleet.spans[victim]
                    mine = [f"{prefix}{i}" for i in range(first, last)]
                    finished = {r[0] for r in conn.execute(
                        "SELECT thread_id FROM ref_effects WHERE saver = %s AND thread_id = ANY(%s) "
                        "AND step = %s", (kind, mine, steps - 1))}
                    held = [t for t in mine if t not in finished]
                at = time.time()
                if proc.poll() is None and held:
                    pid = fleet.kill(victim)
                    kills.append({"at": at, "pid": pid, "threads": held})
                else:
                    thresholds.insert(0, effects + 1)  # nothing in flight there now: soon again
                victim = (victim + 1) % args.workers
            time.sleep(0.1)
        elapsed = time.time() - t0
        fleet.stop()
        completed = int(_one(conn, "SELECT count(*) FROM (SELECT thread_id FROM ref_effects WHERE saver = %s "
                                   "AND thread_id LIKE %s GROUP BY thread_id HAVING count(DISTINCT step) = %s) x",
                             (kind, prefix + "%", steps)))
        duplicated = int(_one(conn, "SELECT coalesce(sum(c - 1), 0) FROM (SELECT count(*) AS c FROM ref_effects "
                                    "WHERE saver = %s AND thread_id LIKE %s GROUP BY thread_id, step) x",
                              (kind, prefix + "%")))
        checkpoints = int(_one(conn, "SELECT count(*) FROM checkpoints WHERE thread_id LIKE %s", (prefix + "%",)))
        resume: list[float] = []
        for k in kills:
            for t in k["threads"]:
                nxt = _one(conn, "SELECT min(at) FROM ref_effects WHERE saver = %s AND thread_id = %s AND at > %s",
                           (kind, t, k["at"]))
                if nxt is not None:
                    resume.append(float(nxt) - k["at"])
    finally:
        conn.close()
    lat: list[float] = []
    for f in tmp.glob(f"{kind}-lat-*.txt"):
        lat.extend(float(x) for x in f.read_text().split())
    return {
        "config": kind, "workflows": n, "steps": steps, "processes": args.workers,
        "seconds": round(elapsed, 2), "completed": completed, "duplicated_effects": duplicated,
        "checkpoints": checkpoints,
        "workflows_per_s": round(completed / elapsed, 2), "checkpoints_per_s": round(checkpoints / elapsed, 1),
        "put_p50_ms": _pct(lat, 50), "put_p99_ms": _pct(lat, 99), "put_samples": len(lat),
        "kills": len(kills), "threads_interrupted": sum(len(k["threads"]) for k in kills),
        "resume_p50_s": round(statistics.median(resume), 2) if resume else None,
        "resume_max_s": round(max(resume), 2) if resume else None,
    }


def _pct(values: list[float], p: int) -> float | None:
    if len(values) < 2:
        return None
    return round(statistics.quantiles(values, n=100, method="inclusive")[p - 1] * 1000, 2)


def quiet_puts(dsn: str, samples: int) -> dict[str, Any]:
    """One put at a time (no concurrency), durable and stock, taking turns."""
    from langgraph.checkpoint.base import empty_checkpoint
    from langgraph.checkpoint.postgres import PostgresSaver

    from langgraph_durable import DurablePostgresSaver

    out: dict[str, Any] = {}
    with DurablePostgresSaver.from_conn_string(dsn) as durable, PostgresSaver.from_conn_string(dsn) as stock:
        savers = {"durable": durable, "stock": stock}
        configs: dict[str, Any] = {k: {"configurable": {"thread_id": f"quiet-{k}-{uuid.uuid4().hex[:6]}",
                                                         "checkpoint_ns": ""}} for k in savers}
        times: dict[str, list[float]] = {k: [] for k in savers}
        for i in range(samples + 20):
            for k, saver in savers.items():
                cp = empty_checkpoint()
                cp["channel_values"] = {"step": i}
                t0 = time.perf_counter()
                configs[k] = saver.put(configs[k], cp, {"source": "loop", "step": i}, {"step": i + 1})
                if i >= 20:
                    times[k].append(time.perf_counter() - t0)
        for k, v in times.items():
            out[k] = {"p50_ms": _pct(v, 50), "p99_ms": _pct(v, 99)}
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--dsn", default=os.environ.get("LANGGRAPH_DURABLE_BENCH_DSN", DEFAULT_DSN))
    ap.add_argument("--workflows", type=int, default=500)
    ap.add_argument("--workers", type=int, default=4)
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--node-ms", type=float, default=5.0)
    ap.add_argument("--kill-rate", type=float, default=0.02)
    ap.add_argument("--lease-ttl", type=float, default=5.0)
    ap.add_argument("--pool-size", type=int, default=12)
    ap.add_argument("--timeout", type=float, default=1800.0)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--quiet-samples", type=int, default=300)
    ap.add_argument("--quick", action="store_true", help="50 workflows, 2 workers (CI)")
    ap.add_argument("--no-stock", action="store_true")
    ap.add_argument("--out", default=None)
    ap.add_argument("--child", choices=["durable", "stock"], help=argparse.SUPPRESS)
    for hidden in ("--latency-file", "--prefix"):
        ap.add_argument(hidden, default="", help=argparse.SUPPRESS)
    ap.add_argument("--first", type=int, default=0, help=argparse.SUPPRESS)
    ap.add_argument("--last", type=int, default=0, help=argparse.SUPPRESS)
    ap.add_argument("--concurrency", type=int, default=1, help=argparse.SUPPRESS)
    ap.add_argument("--nowait", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--durability", default="async", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        asyncio.run(durable_child(args) if args.child == "durable" else stock_child(args))
        return
    if args.quick:
        args.workflows, args.workers, args.lease_ttl, args.quiet_samples = 50, 2, 2.0, 50
        args.timeout = min(args.timeout, 240.0)
    out = args.out or (None if args.quick else str(HERE / "reference_results.json"))

    import tempfile

    name = "lgd_bench_ref_" + uuid.uuid4().hex[:8]
    with psycopg.connect(args.dsn, autocommit=True) as admin:
        admin.execute(psycopg.sql.SQL("CREATE DATABASE {}").format(psycopg.sql.Identifier(name)))
    params = ci.conninfo_to_dict(args.dsn)
    params["dbname"] = name
    dsn = ci.make_conninfo(**params)
    rows: list[dict[str, Any]] = []
    load: list[float] = []
    try:
        from langgraph.checkpoint.postgres import PostgresSaver

        from langgraph_durable import DurablePostgresSaver

        with DurablePostgresSaver.from_conn_string(dsn) as saver:
            saver.setup()
        with PostgresSaver.from_conn_string(dsn) as stock:
            stock.setup()
        with psycopg.connect(dsn, autocommit=True) as conn:
            conn.execute(EFFECTS_SQL)
        with tempfile.TemporaryDirectory(prefix="lgd-bench-ref-") as tmp:
            for kind in ["durable"] + ([] if args.no_stock else ["stock", "stock-sync"]):
                print(f"running {kind}: {args.workflows} workflows x {args.steps} steps over "
                      f"{args.workers} processes ...", file=sys.stderr, flush=True)
                rows.append(run_config(kind, dsn, args, Path(tmp)))
                load.append(os.getloadavg()[0])
                print(f"  {rows[-1]}", file=sys.stderr, flush=True)
        quiet = quiet_puts(dsn, args.quiet_samples)
    finally:
        with psycopg.connect(args.dsn, autocommit=True) as admin:
            admin.execute(psycopg.sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(
                psycopg.sql.Identifier(name)))

    print(f"\n{args.workflows} workflows x {args.steps} steps ({args.node_ms:g} ms I/O wait per node, one "
          f"effect each), {args.workers} processes, {rows[0]['kills']} SIGKILLs "
          f"({args.kill_rate:.0%} of the workflows), lease ttl {args.lease_ttl:g} s, cores: {os.cpu_count()}, "
          f"load average after each run: {', '.join(f'{x:.1f}' for x in load)}\n")
    print("| saver | completed | wall s | workflows/s | checkpoints/s | put p50 / p99 ms (in run) "
          "| put p50 / p99 ms (one at a time) | kills (threads cut) | kill -> resumed p50 / max s "
          "| duplicated effects |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for r in rows:
        q = quiet["durable" if r["config"] == "durable" else "stock"]
        resumed = "-" if r["resume_p50_s"] is None else f"{r['resume_p50_s']:.2f} / {r['resume_max_s']:.2f}"
        print(f"| {r['config']} | {r['completed']}/{r['workflows']} | {r['seconds']:.1f} | "
              f"{r['workflows_per_s']:.1f} | {r['checkpoints_per_s']:.0f} | {r['put_p50_ms']} / {r['put_p99_ms']} | "
              f"{q['p50_ms']} / {q['p99_ms']} | {r['kills']} ({r['threads_interrupted']}) | {resumed} | "
              f"**{r['duplicated_effects']}** |")
    result = {"args": {k: v for k, v in vars(args).items() if k not in ("dsn",)}, "cpu_count": os.cpu_count(),
              "load_average_after": load, "rows": rows, "put_one_at_a_time": quiet}
    print("\nJSON " + json.dumps(result))
    if out:
        Path(out).write_text(json.dumps(result, indent=2) + "\n")
        print(f"saved {out}")


if __name__ == "__main__":
    with contextlib.suppress(KeyboardInterrupt):
        main()
