"""What one primary sustains (issue 26, "beyond one primary"): checkpoints per second per
server core at saturation, this saver beside stock, in ONE run on the SAME database.

Many concurrent async runs (a 10-step graph, a new thread each: 11 checkpoints and 10
put_writes per run) from ``--procs`` client processes, each with its own pool of
``--pool`` connections and ``--concurrency`` runs in flight, for ``--seconds``. The
contenders take turns (``--rounds``), so load from elsewhere hits them alike.

Server CPU is read from ``/proc/<pid>/schedstat`` (time on a CPU) of the postgres backends
serving the bench's own connections (their pids from ``pg_stat_activity``), before and
after each round: the cost of the work itself, not of whatever else the shared machine
runs. The cluster's background processes (WAL writer, checkpointer, background writer)
are shown apart: they serve every database of the cluster. Reported per contender:

* ``ckpt/s``: checkpoints written per second of wall (what the whole machine managed;
  on a small machine the clients compete with the server for the same cores);
* ``server cpu/ckpt``: backend CPU per checkpoint (ms), all the run's statements
  included (put_writes, lease, release, reads);
* ``ckpt/s/core``: 1 / that: checkpoints one fully busy server core sustains, the
  saturation figure (the server is CPU-bound there: the commits' WAL flushes are
  grouped across sessions); ``server cores`` says how busy the backends were;
* ``WAL KB/ckpt``: WAL written per checkpoint (the LSN's advance: cluster-wide, so
  other databases' writes meanwhile count too), what a standby and the disk take.

``--mode puts``: the saver's writes of such a run without LangGraph (a real lease held by
the durable saver), so the clients' CPU per checkpoint is several times lower and the server
gets busier on the same machine.

Run: ``python bench/bench_saturation.py [--dsn ...] [--seconds 15] [--rounds 2] [--mode puts]``.
Needs the server's /proc (PostgreSQL on this machine). Prints the load average.
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import multiprocessing as mp
import os
import statistics
import time
import uuid
from typing import Any, TypedDict

import psycopg
from langgraph.checkpoint.base import empty_checkpoint
from langgraph.checkpoint.postgres import PostgresSaver
from langgraph.checkpoint.postgres.aio import AsyncPostgresSaver
from langgraph.graph import END, START, StateGraph
from psycopg import conninfo as ci
from psycopg.rows import dict_row
from psycopg_pool import AsyncConnectionPool

from langgraph_durable import AsyncDurablePostgresSaver, DurablePostgresSaver
from langgraph_durable import saver as saver_mod

DEFAULT_DSN = "postgresql://postgres@127.0.0.1:5432/postgres"
STEPS = 10


class State(TypedDict):
    n: int
    note: str


def build(steps: int = STEPS) -> Any:
    g = StateGraph(State)
    for i in range(steps):
        def node(s: State, i: int = i) -> dict[str, Any]:
            return {"n": s["n"] + 1, "note": f"step {i} " + "x" * 64}
        g.add_node(f"s{i}", node)
        g.add_edge(START if i == 0 else f"s{i - 1}", f"s{i}")
    g.add_edge(f"s{steps - 1}", END)
    return g


def cpu_ticks(pids: list[int]) -> dict[int, int]:
    """CPU time of each live pid in ns: /proc/<pid>/schedstat's first field (the
    scheduler's own count of time on a CPU; /proc/<pid>/stat's 10 ms ticks are too
    coarse for backends that run in bursts of microseconds)."""
    out = {}
    for pid in pids:
        try:
            with open(f"/proc/{pid}/schedstat") as f:
                out[pid] = int(f.read().split()[0])
        except (FileNotFoundError, ProcessLookupError):
            pass
    return out


def cpu_delta(before: dict[int, int], after: dict[int, int]) -> float:
    """CPU seconds spent between the two readings by the processes alive at both."""
    return sum(after[p] - before[p] for p in before if p in after) / 1e9


# --------------------------------------------------------------------------- one client
async def _run_graph(graph: Any, thread_id: str) -> None:
    await graph.ainvoke({"n": 0, "note": ""}, {"configurable": {"thread_id": thread_id}})


async def _run_puts(saver: Any, kind: str, thread_id: str) -> None:
    """The saver's own writes without LangGraph around them (``--mode puts``): what a
    10-step run writes (12 checkpoints, 10 put_writes), with a real lease held for the
    durable saver (as a run start takes it; every write fenced), released at the end.
    The client's CPU per checkpoint drops several-fold, so the server gets busier."""
    lease = None
    if kind == "durable":
        owner = saver_mod._owner_id()
        res = await saver.arun_op(lambda: saver._op_acquire(thread_id, owner, None, None))
        lease = saver_mod.Lease(thread_id=thread_id, owner=owner, token=int(res["lease_token"]),
                                attempts=1, checkpoint_id=None, version=None)
        saver_mod._RUN_LEASE.set(lease)  # this task's context only
    parent: str | None = None
    for i in range(STEPS + 2):
        cp = empty_checkpoint()
        cp["channel_values"] = {"n": i, "note": f"step {i} " + "x" * 64}
        cp["channel_versions"] = {"n": f"{i + 1:032}.0", "note": f"{i + 1:032}.0"}
        cfg: Any = {"configurable": {"thread_id": thread_id, "checkpoint_ns": "",
                                     **({"checkpoint_id": parent} if parent else {})}}
        out = await saver.aput(cfg, cp, {"source": "loop", "step": i, "parents": {}}, dict(cp["channel_versions"]))
        parent = out["configurable"]["checkpoint_id"]
        if i <= STEPS - 1:
            await saver.aput_writes(out, [("n", i + 1), ("note", f"w {i}")], str(uuid.uuid4()), "")
    if lease is not None:
        saver_mod._RUN_LEASE.set(None)


async def _client(dsn: str, kind: str, mode: str, pool_size: int, concurrency: int, seconds: float,
                  ready: Any, go: Any, out: Any, finish: Any) -> None:
    async with AsyncConnectionPool(
        dsn, min_size=pool_size, max_size=pool_size, open=False,
        kwargs={"autocommit": True, "prepare_threshold": 0, "row_factory": dict_row},
    ) as pool:
        await pool.wait()
        saver: Any = AsyncPostgresSaver(pool) if kind == "stock" else AsyncDurablePostgresSaver(pool)
        graph = build().compile(checkpointer=saver)
        tag = uuid.uuid4().hex[:8]
        run = functools.partial(_run_puts, saver, kind) if mode == "puts" else functools.partial(_run_graph, graph)
        # Warm every connection (prepared statement caches, catalog caches).
        await asyncio.gather(*(run(f"w-{tag}-{i}") for i in range(pool_size)))
        ready.set()
        go.wait()
        done = 0
        stop = time.perf_counter() + seconds

        async def loop(j: int) -> None:
            nonlocal done
            k = 0
            while time.perf_counter() < stop:
                await run(f"s-{tag}-{j}-{k}")
                k += 1
                done += 1

        t0 = time.perf_counter()
        await asyncio.gather(*(loop(j) for j in range(concurrency)))
        out.put((done, time.perf_counter() - t0, os.times().user + os.times().system))
        finish.wait(120)  # the backends stay up until their CPU has been read


def _client_main(*args: Any) -> None:
    asyncio.run(_client(*args))


def _backends(admin_conn: psycopg.Connection[Any], dbname: str) -> list[int]:
    rows = admin_conn.execute(
        "SELECT pid FROM pg_stat_activity WHERE datname = %s AND pid <> pg_backend_pid() "
        "AND backend_type = 'client backend'", (dbname,)
    ).fetchall()
    return [r["pid"] for r in rows]


def _background(admin_conn: psycopg.Connection[Any]) -> list[int]:
    rows = admin_conn.execute(
        "SELECT pid FROM pg_stat_activity WHERE backend_type IN ('walwriter', 'checkpointer', 'background writer')"
    ).fetchall()
    return [r["pid"] for r in rows]


def one_round(dsn: str, kind: str, mode: str, procs: int, pool: int, concurrency: int,
              seconds: float) -> dict[str, float]:
    dbname = ci.conninfo_to_dict(dsn)["dbname"]
    with psycopg.connect(dsn, autocommit=True, row_factory=dict_row) as admin:
        deadline = time.monotonic() + 60
        while _backends(admin, str(dbname)) and time.monotonic() < deadline:
            time.sleep(0.2)  # the previous round's backends are still closing
    ctx = mp.get_context("spawn")
    readies = [ctx.Event() for _ in range(procs)]
    go, out, finish = ctx.Event(), ctx.Queue(), ctx.Event()
    workers = [ctx.Process(target=_client_main,
                           args=(dsn, kind, mode, pool, concurrency, seconds, readies[i], go, out, finish))
               for i in range(procs)]
    for w in workers:
        w.start()
    for r in readies:
        r.wait(120)
    with psycopg.connect(dsn, autocommit=True, row_factory=dict_row) as admin:
        pids, bg = _backends(admin, str(dbname)), _background(admin)
        if len(pids) != procs * pool:  # a previous round's backends still closing, or ours not all up
            raise RuntimeError(f"expected {procs * pool} backends of {dbname}, found {len(pids)}")
        n0 = admin.execute("SELECT count(*) AS n FROM checkpoints").fetchone()["n"]  # type: ignore[index]
        cpu0, bg0 = cpu_ticks(pids), cpu_ticks(bg)
        lsn0 = admin.execute("SELECT pg_current_wal_lsn() AS l").fetchone()["l"]  # type: ignore[index]
        load0 = os.getloadavg()[0]
        t0 = time.perf_counter()
        go.set()
        results = [out.get(timeout=seconds + 120) for _ in workers]
        wall = time.perf_counter() - t0
        cpu1, bg1 = cpu_ticks(pids), cpu_ticks(bg)
        wal = admin.execute("SELECT pg_current_wal_lsn() - %s::pg_lsn AS b", (lsn0,)).fetchone()["b"]  # type: ignore[index]
        n1 = admin.execute("SELECT count(*) AS n FROM checkpoints").fetchone()["n"]  # type: ignore[index]
        finish.set()
    for w in workers:
        w.join(30)
    ckpts = n1 - n0
    server = cpu_delta(cpu0, cpu1)
    return {
        "runs": sum(r[0] for r in results), "ckpts": ckpts, "wall": wall,
        "ckpt_s": ckpts / wall, "server_cpu": server, "bg_cpu": cpu_delta(bg0, bg1),
        "server_cores": server / wall, "wal_kb_per_ckpt": float(wal) / 1024 / max(ckpts, 1),
        "cpu_per_ckpt_ms": 1000 * server / max(ckpts, 1), "per_core": ckpts / server if server else 0.0,
        "client_cpu": sum(r[2] for r in results), "backends": len(pids), "load": load0,
    }


def make_db(admin: str) -> str:
    name = f"bench_saturation_{os.getpid()}"
    with psycopg.connect(admin, autocommit=True) as c:
        c.execute(f'DROP DATABASE IF EXISTS "{name}"')
        c.execute(f'CREATE DATABASE "{name}"')
    return ci.make_conninfo(admin, dbname=name)


def drop_db(admin: str, dsn: str) -> None:
    name = ci.conninfo_to_dict(dsn)["dbname"]
    with psycopg.connect(admin, autocommit=True) as c:
        c.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dsn", default=os.environ.get("BENCH_DSN", DEFAULT_DSN))
    ap.add_argument("--seconds", type=float, default=15.0)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--procs", type=int, default=2, help="client processes")
    ap.add_argument("--pool", type=int, default=8, help="connections per client process")
    ap.add_argument("--concurrency", type=int, default=32, help="runs in flight per client process")
    ap.add_argument("--mode", choices=("graph", "puts"), default="graph",
                    help="graph: LangGraph runs; puts: the saver's writes of such a run, no LangGraph")
    args = ap.parse_args(argv)
    dsn = make_db(args.dsn)
    print(f"# load before: {' '.join(f'{x:.2f}' for x in os.getloadavg())} ({os.cpu_count()} cpus); "
          f"{args.procs} client processes x {args.concurrency} runs on {args.pool} connections, "
          f"{args.seconds:.0f} s a round, {args.rounds} rounds; {STEPS}-step graph, new thread per run, "
          f"mode {args.mode}",
          flush=True)
    try:
        with psycopg.connect(dsn, autocommit=True) as c:
            PostgresSaver(c).setup()
            settings = {k: c.execute(f"SHOW {k}").fetchone()[0]  # type: ignore[index]
                        for k in ("fsync", "synchronous_commit", "shared_buffers", "server_version")}
        with DurablePostgresSaver.from_conn_string(dsn) as s:
            s.setup()
        print(f"# server: {settings}", flush=True)
        got: dict[str, list[dict[str, float]]] = {"stock": [], "durable": []}
        for r in range(args.rounds):
            for kind in got:
                res = one_round(dsn, kind, args.mode, args.procs, args.pool, args.concurrency, args.seconds)
                got[kind].append(res)
                print(f"# round {r + 1} {kind:<8} runs={res['runs']:.0f} ckpts={res['ckpts']:.0f} "
                      f"wall={res['wall']:.1f}s server_cpu={res['server_cpu']:.2f}s ({res['server_cores']:.2f} cores) "
                      f"bg_cpu={res['bg_cpu']:.2f}s "
                      f"client_cpu={res['client_cpu']:.1f}s backends={res['backends']:.0f} load={res['load']:.1f}",
                      flush=True)
        print(f"\n{'saver':<10}{'ckpt/s':>10}{'server cores':>14}{'server cpu/ckpt (ms)':>24}"
              f"{'ckpt/s/core':>14}{'WAL KB/ckpt':>14}{'bg cpu (s)':>12}")
        med: dict[str, dict[str, float]] = {}
        for kind, rows in got.items():
            med[kind] = {k: statistics.median(r[k] for r in rows) for k in rows[0]}
            m = med[kind]
            print(f"{kind:<10}{m['ckpt_s']:>10.0f}{m['server_cores']:>14.2f}{m['cpu_per_ckpt_ms']:>24.3f}"
                  f"{m['per_core']:>14.0f}{m['wal_kb_per_ckpt']:>14.2f}{m['bg_cpu']:>12.2f}")
        ratio = med["durable"]["cpu_per_ckpt_ms"] / med["stock"]["cpu_per_ckpt_ms"]
        print(f"durable / stock server CPU per checkpoint: {ratio:.2f}x")
        print(f"# load after: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    finally:
        drop_db(args.dsn, dsn)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
