"""SIGKILL crash tests: real graphs in real processes, killed at random moments, resumed
in fresh processes with ``invoke(None, config)``.

The child (tests/crash_child.py) runs several graph threads at once -- sync and async
APIs, durability "sync", "async" and "exit", a 9-node graph with a 3-way fan-out and a
parent graph around a 4-node subgraph -- so one SIGKILL lands at a different point of
each thread's run. Every node writes a row to ``node_runs`` before doing its work; the
table never deduplicates.

What "a node finished before the kill" means here: its result was *committed* -- it is
in the latest checkpoint of some namespace of the thread, or in that checkpoint's
pending writes. A node that returned but whose write had not reached the database when
the process died has not finished as far as any checkpointer can know, and runs again.
After each kill the test snapshots the committed set from the database (once every
backend of the dead process is gone, since a COMMIT already on the wire still lands
after SIGKILL) and later checks that no node of that set ever ran again.
"""

from __future__ import annotations

import json
import os
import random
import select
import signal
import subprocess
import sys
import tempfile
import time
from collections import defaultdict
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, cast

import psycopg
import pytest
from crash_child import NODE_RUNS_DDL, Recorder, build, initial_input
from langchain_core.runnables import RunnableConfig

from langgraph_durable import DurablePostgresSaver

pytestmark = pytest.mark.chaos

CHILD = Path(__file__).with_name("crash_child.py")

# (kind, api, durability) of the threads every crash child runs side by side.
SPECS: list[tuple[str, str, str]] = [
    ("linear", "sync", "sync"),
    ("linear", "sync", "sync"),
    ("linear", "async", "sync"),
    ("sub", "sync", "sync"),
    ("sub", "async", "sync"),
    ("linear", "sync", "async"),
    ("linear", "sync", "exit"),
]
MIN_KILL_POINTS = 24
MAX_KILLS = 12
KILL_DEPTH_MAX = 50  # node executions of one run before its kill (the first run has 57)


class Child:
    """One crash_child.py process."""

    def __init__(self, dsn: str, run_no: int, specs: list[dict[str, Any]], *extra: str) -> None:
        self.run_no = run_no
        self.stderr = tempfile.TemporaryFile(mode="w+")
        self.proc = subprocess.Popen(
            [sys.executable, str(CHILD), str(run_no), json.dumps(specs), *extra],
            env={**os.environ, "CRASH_DSN": dsn},
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=self.stderr,
            text=True,
        )

    def fail(self, why: str) -> None:
        self.stderr.seek(0)
        pytest.fail(f"crash child {self.run_no}: {why}\n{self.stderr.read()[-4000:]}")

    def wait_ready(self, timeout: float = 120.0) -> None:
        assert self.proc.stdout is not None
        ready, _, _ = select.select([self.proc.stdout], [], [], timeout)
        line = self.proc.stdout.readline() if ready else ""
        if line.strip() != "READY":
            self.proc.kill()
            self.fail(f"did not get ready (got {line!r})")

    def alive(self) -> bool:
        return self.proc.poll() is None

    def go(self) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write("go\n")
        self.proc.stdin.flush()

    def kill(self) -> None:
        if self.alive():
            os.kill(self.proc.pid, signal.SIGKILL)
        self.proc.wait()

    def events(self, timeout: float = 120.0) -> list[dict[str, Any]]:
        try:
            out, _ = self.proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.kill()
            self.fail("timed out")
        return [json.loads(line) for line in out.splitlines() if line.startswith("{")]


def wait_backends_gone(conn: psycopg.Connection[Any], run_no: int) -> None:
    """Wait until the killed child's server backends have exited, so that whatever it
    had sent is committed or rolled back before we look."""
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        row = conn.execute(
            "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
            "AND application_name = %s",
            (f"crash_child_{run_no}",),
        ).fetchone()
        if row is not None and row[0] == 0:
            return
        time.sleep(0.02)
    pytest.fail(f"backends of crash child {run_no} still alive after 30 s")


def wait_first_node(conn: psycopg.Connection[Any], child: Child) -> None:
    """Wait until some thread of ``child`` executes a node (resumed threads first wait
    for the dead run's lease to expire)."""
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and child.alive():
        if conn.execute("SELECT 1 FROM node_runs WHERE run_no = %s LIMIT 1", (child.run_no,)).fetchone():
            return
        time.sleep(0.02)


def committed_nodes(saver: DurablePostgresSaver, thread_id: str) -> set[str]:
    """Nodes whose result is committed: in the latest checkpoint of any namespace of
    the thread, or in that checkpoint's pending writes."""
    done: set[str] = set()
    with saver.connection() as conn:
        namespaces = [
            r["checkpoint_ns"]
            for r in conn.execute(
                "SELECT DISTINCT checkpoint_ns FROM checkpoints WHERE thread_id = %s", (thread_id,)
            ).fetchall()
        ]
    for ns in namespaces:
        tup = saver.get_tuple({"configurable": {"thread_id": thread_id, "checkpoint_ns": ns}})
        assert tup is not None
        for key in ("log", "sub_log"):
            done.update(tup.checkpoint["channel_values"].get(key) or [])
        for _task, channel, value in tup.pending_writes or []:
            if channel in ("log", "sub_log"):
                done.update(value)
    return done


def wait_node_runs(conn: psycopg.Connection[Any], child: Child, n: int) -> None:
    """Wait until ``child`` has started ``n`` more node executions (or ended)."""
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and child.alive():
        row = conn.execute("SELECT count(*) FROM node_runs WHERE run_no = %s", (child.run_no,)).fetchone()
        if row is not None and row[0] > n:
            return
        time.sleep(0.005)


def node_rows(conn: psycopg.Connection[Any], thread_id: str) -> dict[str, list[int]]:
    runs: dict[str, list[int]] = defaultdict(list)
    for node, run_no in conn.execute(
        "SELECT node, run_no FROM node_runs WHERE thread_id = %s ORDER BY id", (thread_id,)
    ).fetchall():
        runs[node].append(run_no)
    return runs


def describe(saver: DurablePostgresSaver, conn: psycopg.Connection[Any], t: Thread) -> str:
    """Everything known about a thread, for failure messages."""
    lines = [f"thread {t.thread_id}: final={t.final} kills={t.kills}"]
    for tup in sorted(
        saver.list({"configurable": {"thread_id": t.thread_id}}), key=lambda c: c.checkpoint["id"]
    ):
        cfg = tup.config["configurable"]
        lines.append(
            f"  {cfg['checkpoint_ns'] or '-'} {cfg['checkpoint_id']} md={tup.metadata} "
            f"values={tup.checkpoint['channel_values']} "
            f"writes={[(w[1], w[2]) for w in tup.pending_writes or []]}"
        )
    lines.append(f"  node_runs={dict(node_rows(conn, t.thread_id))}")
    row = conn.execute("SELECT * FROM durable_threads WHERE thread_id = %s", (t.thread_id,)).fetchone()
    lines.append(f"  durable_threads={row}")
    return "\n".join(lines)


@dataclass
class Thread:
    thread_id: str
    kind: str
    api: str
    durability: str
    final: dict[str, Any] | None = None
    # (run_no of the killed process, nodes committed when it died)
    kills: list[tuple[int, frozenset[str]]] = field(default_factory=list)

    def spec(self, delay: float) -> dict[str, Any]:
        return {
            "thread_id": self.thread_id,
            "kind": self.kind,
            "api": self.api,
            "durability": self.durability,
            "delay": delay,
        }


@pytest.fixture(scope="module")
def crash_db(dsn: str) -> Iterator[str]:
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(NODE_RUNS_DDL)
    yield dsn


@pytest.fixture(scope="module")
def reference(crash_db: str) -> dict[str, dict[str, Any]]:
    """Final state of an uninterrupted run of each graph kind (same code, same saver)."""
    out: dict[str, dict[str, Any]] = {}
    recorder = Recorder(crash_db)
    with (
        DurablePostgresSaver.from_conn_string(crash_db) as saver,
        psycopg.connect(crash_db) as conn,
    ):
        for kind in ("linear", "sub"):
            graph = build(kind, recorder).compile(checkpointer=saver)
            cfg: RunnableConfig = {"configurable": {"thread_id": f"ref-{kind}", "run_no": 0}}
            out[kind] = dict(graph.invoke(initial_input(kind), cfg, durability="sync"))
            rows = node_rows(conn, f"ref-{kind}")
            assert all(r == [0] for r in rows.values()), rows
            assert len(rows) == (9 if kind == "linear" else 6)
    assert out["linear"]["log"][:2] == ["fetch", "parse"] and len(out["linear"]["log"]) == 9
    assert out["sub"]["sub_log"] == ["s1", "s2", "s3", "s4"]
    return out


def test_sigkill_at_random_moments_then_resume(crash_db: str, reference: dict[str, dict[str, Any]]) -> None:
    seed = int(os.environ.get("LGD_SEED") or os.environ.get("CRASH_SEED") or random.SystemRandom().randrange(2**32))
    print(f"\nkill points from seed {seed} (replay: LGD_SEED={seed})")
    rng = random.Random(seed)
    # Kill after this many node executions of the run (events, not moments: the same
    # depths on a loaded machine as on a quiet one). Both ends of the range come first
    # (the depth-spread check below needs a shallow and a deep kill, and the kills stop
    # once MIN_KILL_POINTS are in, after about 6 runs): deep in the first run, while
    # every thread is fresh; then shallow; the rest at random.
    rest = [rng.randint(0, KILL_DEPTH_MAX) for _ in range(MAX_KILLS - 4)]
    depths = [KILL_DEPTH_MAX, 0, KILL_DEPTH_MAX - 6, 1, *rest]
    threads: list[Thread] = []
    serial = 0

    def new_thread(kind: str, api: str, durability: str) -> Thread:
        nonlocal serial
        serial += 1
        t = Thread(f"crash-{serial}-{kind}-{api}-{durability}", kind, api, durability)
        threads.append(t)
        return t

    active = [new_thread(*s) for s in SPECS]
    kill_points: list[tuple[str, str, int, frozenset[str], frozenset[str]]] = []
    run_no = 0
    lease_lost = 0
    t0 = time.monotonic()
    with (
        DurablePostgresSaver.from_conn_string(crash_db) as saver,
        psycopg.connect(crash_db, autocommit=True) as conn,
    ):
        while active:
            run_no += 1
            killing = len(kill_points) < MIN_KILL_POINTS and run_no <= MAX_KILLS
            specs = [t.spec(0.05 * i) for i, t in enumerate(active)]
            child = Child(crash_db, run_no, specs)
            child.wait_ready()
            if killing:
                wait_first_node(conn, child)
                wait_node_runs(conn, child, depths[(run_no - 1) % len(depths)])
                child.kill()
                events = child.events()
                wait_backends_gone(conn, run_no)
            else:
                events = child.events()
                assert child.proc.returncode == 0
            finished = {e["thread_id"]: e for e in events if e["event"] == "done"}
            # On a starved machine a run can miss its 2 s lease renewal: fencing then
            # stops it with LeaseLostError (by design) and it is resumed like a killed
            # run. Anything else is a failure.
            fenced = {e["thread_id"] for e in events if e["event"] == "error" and e["error"].startswith("LeaseLostError")}
            for e in events:
                assert e["event"] == "done" or e["thread_id"] in fenced, e
            lease_lost += len(fenced)
            still: list[Thread] = []
            for t in active:
                if t.thread_id in finished:
                    t.final = finished[t.thread_id]["state"]
                    if killing:  # keep the process full of runs to kill
                        still.append(new_thread(t.kind, t.api, t.durability))
                    continue
                assert killing or t.thread_id in fenced, f"{t.thread_id} did not finish in an uninterrupted run"
                # Every run that stopped unfinished: what was committed must never rerun.
                done = frozenset(committed_nodes(saver, t.thread_id))
                t.kills.append((run_no, done))
                ran_now = frozenset(n for n, runs in node_rows(conn, t.thread_id).items() if run_no in runs)
                if ran_now and killing and t.thread_id not in fenced:
                    kill_points.append((t.kind, t.durability, run_no, done, ran_now - done))
                still.append(t)
            active = still
            if run_no > MAX_KILLS + 3:
                pytest.fail(f"threads still unfinished after {run_no} processes: {active}")
        elapsed = time.monotonic() - t0

        # 1. Every thread finished with exactly the uninterrupted run's state.
        for t in threads:
            assert t.final == reference[t.kind], describe(saver, conn, t)

        for t in threads:
            rows = node_rows(conn, t.thread_id)
            # 2. No node whose result was committed when a process died ran again later.
            for killed_run, done in t.kills:
                for node in done:
                    later = [r for r in rows.get(node, []) if r > killed_run]
                    assert not later, (
                        f"{t.thread_id}: {node} was committed when run {killed_run} was "
                        f"killed but ran again in run(s) {later}"
                    )
            # 3. Never twice in one process, and every node ran.
            expected = reference[t.kind].get("log", []) + reference[t.kind].get("sub_log", [])
            assert set(rows) == set(expected), (t.thread_id, rows)
            for node, runs in rows.items():
                assert len(runs) == len(set(runs)), (t.thread_id, node, runs)
            # 4. Against the checkpoint history: a node never ran in a process later than
            #    the one that wrote the first checkpoint containing its result.
            first_in: dict[str, int] = {}
            for tup in sorted(
                saver.list({"configurable": {"thread_id": t.thread_id}}),
                key=lambda c: c.checkpoint["id"],
            ):
                for key in ("log", "sub_log"):
                    for node in tup.checkpoint["channel_values"].get(key) or []:
                        first_in.setdefault(node, int(cast(dict[str, Any], tup.metadata)["run_no"]))
            assert set(first_in) == set(expected), t.thread_id
            for node, runs in rows.items():
                assert max(runs) <= first_in[node], (t.thread_id, node, runs, first_in[node])

        reruns = sum(len(r) - 1 for t in threads for r in node_rows(conn, t.thread_id).values())

        # 5. Every lease was released and every thread is marked done.
        states: dict[str, str] = dict(
            conn.execute(
                "SELECT thread_id, status || ':' || coalesce(lease_owner, '-') FROM durable_threads "
                "WHERE thread_id = ANY(%s)",
                ([t.thread_id for t in threads],),
            ).fetchall()
        )
        assert states == {t.thread_id: "done:-" for t in threads}

    # 6. Enough kill points, spread over the run.
    positions = {(kind, dur, len(done), tuple(sorted(flight))) for kind, dur, _, done, flight in kill_points}
    print(
        f"\ncrash test: {run_no} processes, {run_no - 1} SIGKILLs, {len(kill_points)} mid-run kill "
        f"points at {len(positions)} distinct positions, {len(threads)} threads, "
        f"{reruns} node re-runs (all uncommitted), {lease_lost} runs fenced out, {elapsed:.1f} s; linear "
        f"kill depths {sorted({len(d) for k, _, _, d, _ in kill_points if k == 'linear'})}"
    )
    assert len(kill_points) >= MIN_KILL_POINTS
    assert len(positions) >= 10
    # Kills landed at every depth of the linear graph, from before the first committed
    # node to after the fan-out.
    depths = {len(done) for kind, _, _, done, _ in kill_points if kind == "linear"}
    assert min(depths) <= 2 and max(depths) >= 6, depths


def test_two_resumers_after_crash_durable_runs_once_stock_runs_twice(crash_db: str, reference: dict[str, dict[str, Any]]) -> None:
    """After a crash, two workers resume the same thread at the same moment (a
    supervisor restarted the job while a cron also picked it up). The stock saver lets
    both run the remaining nodes; the durable saver's lease lets exactly one."""
    durable = Thread("race-durable", "linear", "sync", "sync")
    stock = Thread("race-stock", "linear", "stock", "sync")
    specs = [durable.spec(0.0), stock.spec(0.0)]
    with psycopg.connect(crash_db, autocommit=True) as conn:
        first = Child(crash_db, 101, specs)
        first.wait_ready()
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            n = conn.execute(
                "SELECT count(DISTINCT thread_id) FROM node_runs WHERE node = 'parse' AND run_no = 101"
            ).fetchone()
            if n is not None and n[0] == 2:
                break
            time.sleep(0.01)
        first.kill()
        wait_backends_gone(conn, 101)
        # The dead run's lease expires lease_ttl (2 s here) after its last renewal.
        while conn.execute(
            "SELECT 1 FROM durable_threads WHERE thread_id = %s AND lease_expires_at > now()",
            (durable.thread_id,),
        ).fetchone():
            time.sleep(0.05)

        racers = [Child(crash_db, n, specs, "--barrier", "--on-busy", "raise") for n in (102, 103)]
        for r in racers:
            r.wait_ready()
        for r in racers:
            r.go()
        events = [e for r in racers for e in r.events()]

        by_thread: dict[str, list[str]] = defaultdict(list)
        for e in events:
            by_thread[e["thread_id"]].append(e["event"])
            if e["event"] == "done":
                assert e["state"] == reference["linear"], e
        assert sorted(by_thread[durable.thread_id]) == ["busy", "done"], events
        assert by_thread[stock.thread_id] == ["done", "done"], events

        def duplicated(thread_id: str) -> list[str]:
            rows = node_rows(conn, thread_id)
            return sorted(n for n, runs in rows.items() if {102, 103} <= set(runs))

        # The stock saver: both workers ran the rest of the graph (side effects twice).
        twice = duplicated(stock.thread_id)
        print(f"\ntwo resumers: stock saver ran {twice} twice; durable saver: one ran, one refused")
        assert twice, node_rows(conn, stock.thread_id)
        # The durable saver: one worker ran it, the other was refused up front.
        assert duplicated(durable.thread_id) == []
        rows = node_rows(conn, durable.thread_id)
        assert {"merge", "draft", "review", "publish"} <= set(rows)
