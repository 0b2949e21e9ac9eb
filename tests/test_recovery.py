"""The recovery worker on real PostgreSQL and real processes: what it claims, poison
bound, async workers, SIGTERM hand-back, SIGKILL chaos across three worker processes,
every backend terminated mid-run, and the stock saver's double resume for contrast."""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import threading
import time
from collections import defaultdict
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import _child_recovery as cr
import psycopg
import pytest
from _db import done_nodes, q, thread_row
from conftest import drop_database, make_database
from langgraph.checkpoint.postgres import PostgresSaver
from typer.testing import CliRunner

from langgraph_durable import (
    AsyncDurablePostgresSaver,
    ConfigurationError,
    DurablePostgresSaver,
    MigrationRegistry,
    PoisonCheckpointError,
)
from langgraph_durable.cli import app
from langgraph_durable.recovery import (
    RecoveryWorker,
    _op_finish,
    astatus_counts,
    asubmit,
    graph_version_of,
    recover,
    status_counts,
    submit,
)

CHILD = str(Path(__file__).with_name("_child_recovery.py"))
INPUT: dict[str, Any] = {"done": []}
NODES = [f"s{i}" for i in range(5)]


def cfg(thread_id: str, version: str | None = None) -> Any:
    c: dict[str, Any] = {"thread_id": thread_id}
    if version:
        c["graph_version"] = version
    return {"configurable": c}




def wait_for(pred: Any, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if pred():
            return
        time.sleep(0.1)
    raise AssertionError(f"timed out waiting for {what}")


def started(dsn: str, thread_id: str, node: str) -> bool:
    return bool(q(dsn, "SELECT 1 FROM rec_log WHERE thread_id = %s AND node = %s", (thread_id, node)))


def expired(dsn: str, thread_id: str) -> bool:
    return bool(thread_row(dsn, thread_id)["expires_in"] < 0)


def child_env(dsn: str, **extra: str) -> dict[str, str]:
    return {**os.environ, "LGD_DSN": dsn, "LGD_STEPS": "5", "LGD_TTL": "2", **extra}


@pytest.fixture(scope="module")
def db(dsn: str) -> str:
    cr.setup_tables(dsn)
    cr.use_dsn(dsn)
    return dsn


@pytest.fixture(scope="module")
def claim_db(admin_dsn: str) -> Iterator[str]:
    url = make_database(admin_dsn, "recovery_claims")
    with DurablePostgresSaver.from_conn_string(url) as saver:
        saver.setup()
    cr.setup_tables(url)
    yield url
    drop_database(admin_dsn, url)


@pytest.fixture(autouse=True)
def _clear_hooks() -> Iterator[None]:
    yield
    cr.BEFORE.clear()


@pytest.fixture(scope="module")
def crashed(db: str, claim_db: str) -> dict[str, str]:
    """Threads whose process was SIGKILLed inside s1: a stock one and a durable one in
    ``db``, a durable one in ``claim_db``. One child per database, started together."""
    procs = [
        (db, ["stock:st-1", "durable:dur-1"]),
        (claim_db, ["durable:c-crash"]),
    ]
    running = [
        (url, threads, subprocess.Popen(
            [sys.executable, CHILD, "run", *threads], env=child_env(url, LGD_SLEEP="0.5")
        ))
        for url, threads in procs
    ]
    for url, threads, proc in running:
        wait_for(
            lambda url=url, threads=threads: all(started(url, t.split(":")[1], "s1") for t in threads),
            90, f"{threads} to reach s1",
        )
        proc.kill()
        proc.wait()
    return {"stock": "st-1", "durable": "dur-1", "claim": "c-crash"}


# --------------------------------------------------------------------------- stock contrast


def test_two_processes_resuming_a_crashed_thread(db: str, crashed: dict[str, str]) -> None:
    """Stock PostgresSaver: both processes run the crashed thread (every remaining effect
    twice). Durable saver: one runs it, the other gets ThreadBusyError."""
    wait_for(lambda: expired(db, crashed["durable"]), 30, "the crashed lease to expire")
    procs = [
        (kind, subprocess.Popen(
            [sys.executable, CHILD, "resume", kind, crashed[kind]],
            # 1 s per node: the second stock child reads the same checkpoint before the
            # first one's next step commits, even on a loaded machine.
            env=child_env(db, LGD_SLEEP="1.0"), stdin=subprocess.PIPE, stdout=subprocess.PIPE,
            text=True,
        ))
        for kind in ("stock", "durable")
        for _ in range(2)
    ]
    # All four imported and connected, then all started together (see the child).
    for _, proc in procs:
        assert proc.stdout is not None
        while (line := proc.stdout.readline()) and line.strip() != "ready":
            pass
        assert line, "a child exited before it was ready"
    for _, proc in procs:
        assert proc.stdin is not None
        proc.stdin.write("go\n")
        proc.stdin.flush()
    results: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for kind, proc in procs:
        out, _ = proc.communicate(timeout=120)
        results[kind].append(json.loads(out.strip().splitlines()[-1]))

    def effects(thread_id: str) -> dict[str, int]:
        rows = q(db, "SELECT node, count(*) AS n FROM rec_effects WHERE thread_id = %s GROUP BY node", (thread_id,))
        return {r["node"]: r["n"] for r in rows}

    assert [r["ok"] for r in results["stock"]] == [True, True]
    stock = effects("st-1")
    assert all(stock[n] == 2 for n in NODES[1:]), stock  # s0 ran before the crash: once
    assert stock["s0"] == 1
    assert sorted(r.get("error", "ok") for r in results["durable"]) == ["ThreadBusyError", "ok"]
    assert effects("dur-1") == dict.fromkeys(NODES, 1)


# --------------------------------------------------------------------------- claims


def test_claims_only_recoverable_threads(claim_db: str, crashed: dict[str, str]) -> None:
    gate = threading.Event()

    def hook(state: Any, config: Any) -> None:
        tid = config["configurable"]["thread_id"]
        if tid in ("c-err", "c-quar"):
            raise RuntimeError("node failed")
        if tid == "c-live":
            assert gate.wait(60)

    cr.BEFORE["s1"] = hook
    with (
        DurablePostgresSaver.from_conn_string(claim_db, lease_ttl=5) as saver,
        DurablePostgresSaver.from_conn_string(claim_db, max_resume_attempts=1) as strict,
    ):
        builder = cr.make_builder(5, 0)
        graph = builder.compile(checkpointer=saver)
        fp = graph_version_of(graph)
        assert fp is not None
        submit(graph, INPUT, cfg("c-queued"))
        graph.invoke(INPUT, cfg("c-done"))
        builder.compile(checkpointer=saver, interrupt_before=["s2"]).invoke(INPUT, cfg("c-wait", fp))
        for _ in graph.stream(INPUT, cfg("c-stopped"), stream_mode="values"):
            break
        for _ in graph.stream(INPUT, cfg("c-old", "old-v"), stream_mode="values"):
            break
        with pytest.raises(RuntimeError):
            graph.invoke(INPUT, cfg("c-err"))
        failing = builder.compile(checkpointer=strict)
        with pytest.raises(RuntimeError):
            failing.invoke(INPUT, cfg("c-quar"))
        with pytest.raises(PoisonCheckpointError):
            failing.invoke(None, cfg("c-quar"))
        live = threading.Thread(target=graph.invoke, args=(INPUT, cfg("c-live")))
        live.start()
        wait_for(lambda: started(cr.DSN, "c-live", "s1"), 30, "c-live in s1")
        wait_for(lambda: expired(claim_db, "c-crash"), 30, "c-crash lease expiry")
        untouched = {t: thread_row(claim_db, t) for t in ("c-wait", "c-done", "c-quar", "c-live")}

        assert status_counts(saver) == {
            "running": 1, "recoverable": 4, "waiting": 1, "quarantined": 1,
            "done": 1, "error": 1, "orphaned": 0,
        }
        worker = RecoveryWorker(graph, error_backoff=0.0)
        with psycopg.connect(claim_db) as locker:
            # A row another claimer has locked is skipped, not waited for (SKIP LOCKED).
            locker.execute("SELECT 1 FROM durable_threads WHERE thread_id = 'c-queued' FOR UPDATE")
            claims = []
            while (claim := saver.run_op(worker._claim_op())) is not None:
                claims.append(claim)
            locker.rollback()
        by_id = {c.thread_id: c for c in claims}
        assert set(by_id) == {"c-crash", "c-stopped", "c-err"}
        assert by_id["c-crash"].previous_status == "running"
        assert by_id["c-stopped"].previous_status == "stopped"
        assert by_id["c-err"].previous_status == "error" and by_id["c-err"].attempt == 2
        assert all(c.graph_version == fp for c in claims)
        for c in claims:
            assert thread_row(claim_db, c.thread_id)["lease_owner"] == c.owner
            saver.run_op(lambda c=c: _op_finish(c))  # hand the claims back unused
        # Unlocked, c-queued is claimable too; the handed-back claims are again.
        again = []
        while (claim := saver.run_op(worker._claim_op())) is not None:
            again.append(claim)
        assert {c.thread_id for c in again} == {"c-crash", "c-stopped", "c-err", "c-queued"}
        for c in again:
            saver.run_op(lambda c=c: _op_finish(c))

        # A worker with a migration from old-v resumes c-old too (and migrates it).
        cr.BEFORE.clear()
        registry = MigrationRegistry()
        registry.register("old-v", fp, lambda values: values)
        migrating = builder.compile(checkpointer=saver.bind(migrations=registry))
        stats = recover(migrating, error_backoff=0.0, concurrency=2)
        assert stats.claimed == 5 and stats.outcomes == {"finished": 5}
        for tid in ("c-crash", "c-stopped", "c-err", "c-queued", "c-old"):
            state = graph.get_state(cfg(tid))
            assert done_nodes(state.values) == NODES and state.next == (), tid
        assert graph.get_state(cfg("c-old")).metadata.get("graph_version") == fp
        gate.set()
        live.join(60)
        for tid, row in untouched.items():
            now = thread_row(claim_db, tid)
            if tid != "c-live":
                assert (now["status"], now["lease_token"]) == (row["status"], row["lease_token"]), tid
        assert thread_row(claim_db, "c-live")["lease_token"] == untouched["c-live"]["lease_token"]


def test_failing_thread_is_retried_until_quarantined(db: str) -> None:
    def boom(state: Any, config: Any) -> None:
        raise RuntimeError("always fails")

    cr.BEFORE["s1"] = boom
    with DurablePostgresSaver.from_conn_string(db, max_resume_attempts=2) as saver:
        graph = cr.make_builder(3, 0).compile(checkpointer=saver.bind(graph_version="poison-v"))
        submit(graph, INPUT, cfg("p-err"))
        results: list[Any] = []
        stats = recover(graph, error_backoff=0.0, on_recovery=results.append)
    assert [r.outcome for r in results] == ["failed", "failed", "refused"]
    assert [r.attempt for r in results] == [1, 2, 3]
    assert results[-1].status == "quarantined" and "PoisonCheckpointError" in results[-1].error
    assert stats.claimed == 3
    assert thread_row(db, "p-err")["status"] == "quarantined"
    with DurablePostgresSaver.from_conn_string(db) as saver:
        graph = cr.make_builder(3, 0).compile(checkpointer=saver.bind(graph_version="poison-v"))
        before = len(list(saver.list(cfg("p-err"))))
        with pytest.raises(PoisonCheckpointError) as info:
            submit(graph, INPUT, cfg("p-err"))  # refused before anything is written
        assert info.value.thread_id == "p-err" and info.value.attempts == 2
        assert len(list(saver.list(cfg("p-err")))) == before


async def test_async_worker_resumes_submitted_threads(db: str) -> None:
    async with AsyncDurablePostgresSaver.from_conn_string(db) as saver:
        graph = cr.make_builder(3, 0).compile(checkpointer=saver.bind(graph_version="async-v"))
        for i in range(6):
            await asubmit(graph, INPUT, cfg(f"a-{i}"))
        worker = RecoveryWorker(graph, concurrency=3)
        stats = await worker.arun(until_idle=True, install_signal_handlers=False)
        assert stats.claimed == 6 and stats.outcomes == {"finished": 6}
        for i in range(6):
            state = await graph.aget_state(cfg(f"a-{i}"))
            assert done_nodes(state.values) == ["s0", "s1", "s2"]
        counts = await astatus_counts(saver)
        assert counts["recoverable"] == 0 and counts["done"] >= 6


# --------------------------------------------------------------------------- processes


@pytest.mark.parametrize("mode", ["threads", "async"])
def test_sigterm_hands_back_at_a_step_boundary(db: str, tmp_path: Path, mode: str) -> None:
    tid = f"term-{mode}"
    log = tmp_path / "worker.log"
    with DurablePostgresSaver.from_conn_string(db) as saver:
        graph = cr.make_builder(5, 0).compile(checkpointer=saver)
        submit(graph, INPUT, cfg(tid))
        with open(log, "w") as fh:
            proc = subprocess.Popen(
                [sys.executable, CHILD, "worker", "--concurrency", "1", "--poll-interval", "0.2",
                 *(["--async"] if mode == "async" else [])],
                env=child_env(db, LGD_SLEEP="0.8"), stdout=fh, stderr=subprocess.STDOUT,
            )
        try:
            wait_for(lambda: started(db, tid, "s1"), 90, "s1 to start")
            proc.send_signal(signal.SIGTERM)
            assert proc.wait(60) == 0, log.read_text()
        finally:
            if proc.poll() is None:
                proc.kill()
        text = log.read_text()
        assert "outcome=handed_back" in text and "status=stopped" in text
        row = thread_row(db, tid)
        assert row["status"] == "stopped" and row["lease_owner"] is None
        # The step in flight finished and was checkpointed; the next never started.
        logged = q(db, "SELECT node, t_end FROM rec_log WHERE thread_id = %s ORDER BY id", (tid,))
        assert [r["node"] for r in logged] == ["s0", "s1"] and all(r["t_end"] for r in logged)
        assert done_nodes(graph.get_state(cfg(tid)).values) == ["s0", "s1"]
        taken = RecoveryWorker(graph).recover_one()
        assert taken is not None and taken.thread_id == tid
        assert taken.previous_status == "stopped" and taken.status == "done"
        assert done_nodes(graph.get_state(cfg(tid)).values) == NODES
    nodes = [r["node"] for r in q(db, "SELECT node FROM rec_log WHERE thread_id = %s ORDER BY id", (tid,))]
    assert nodes == NODES  # nothing ran twice


@pytest.mark.chaos
def test_three_workers_recover_30_threads_under_sigkill(db: str, tmp_path: Path) -> None:
    seed = int(os.environ.get("LGD_CHAOS_SEED", str(random.randrange(1 << 30))))
    print("chaos seed", seed)
    rng = random.Random(seed)
    threads = [f"chaos-{i:02d}" for i in range(30)]
    with DurablePostgresSaver.from_conn_string(db) as saver:
        graph = cr.make_builder(5, 0).compile(checkpointer=saver)
        for t in threads:
            submit(graph, INPUT, cfg(t))
    env = child_env(db, LGD_SLEEP="0.25")
    args = ["worker", "--concurrency", "2", "--lease-ttl", "2", "--poll-interval", "0.2",
            "--max-resume-attempts", "20", "--error-backoff", "0.2"]
    procs: list[subprocess.Popen[bytes]] = []
    logs: list[Path] = []

    def spawn() -> None:
        path = tmp_path / f"worker-{len(logs)}.log"
        logs.append(path)
        with open(path, "w") as fh:
            procs.append(subprocess.Popen([sys.executable, CHILD, *args], env=env, stdout=fh, stderr=subprocess.STDOUT))

    def unfinished() -> int:
        return int(q(db, "SELECT count(*) AS n FROM durable_threads WHERE thread_id = ANY(%s) AND status <> 'done'", (threads,))[0]["n"])

    for _ in range(3):
        spawn()
    killed: dict[int, datetime] = {}
    try:
        while len(killed) < 6 and unfinished() > 0:
            time.sleep(rng.uniform(1.0, 2.0))
            live = [p for p in procs if p.poll() is None]
            holding = [
                p for p in live
                if q(db, "SELECT 1 FROM durable_threads WHERE lease_owner LIKE %s AND lease_expires_at > now()", (f"%:{p.pid}:%",))
            ]
            if not holding:
                # Only workers still starting (imports take seconds on a loaded machine):
                # killing one of them tests nothing, and six such kills in a row ended
                # the loop before any thread moved between workers.
                continue
            victim = rng.choice(holding)
            victim.kill()
            victim.wait()
            killed[victim.pid] = q(db, "SELECT clock_timestamp() AS t")[0]["t"]
            spawn()
        wait_for(lambda: unfinished() == 0, 180, "every chaos thread to finish")
    finally:
        for p in procs:
            if p.poll() is None:
                p.terminate()
        for p in procs:
            try:
                p.wait(60)
            except subprocess.TimeoutExpired:
                p.kill()
    assert len(killed) >= 3, "the chaos loop must have killed workers mid-run"
    # Survivors exit 0 on SIGTERM; one respawned so late that it was still importing
    # (no handler installed yet, nothing claimed) dies of the signal itself.
    for p, path in zip(procs, logs, strict=True):
        if p.pid not in killed:
            ready = "started: concurrency" in path.read_text()
            assert p.returncode == 0 or (not ready and p.returncode == -signal.SIGTERM), (
                p.returncode, path.read_text()[-2000:],
            )

    with DurablePostgresSaver.from_conn_string(db) as saver:
        graph = cr.make_builder(5, 0).compile(checkpointer=saver)
        for t in threads:
            state = graph.get_state(cfg(t))
            assert done_nodes(state.values) == NODES and state.next == (), t
    # 0 duplicated effects: every (thread, node) effect happened exactly once.
    effects = q(db, "SELECT thread_id, node, count(*) AS n FROM rec_effects WHERE thread_id = ANY(%s) GROUP BY 1, 2", (threads,))
    assert len(effects) == 30 * 5 and all(r["n"] == 1 for r in effects)
    # No thread was ever executed by two owners at once: per thread, execution
    # intervals of different (pid, token) never overlap. An execution cut short by
    # SIGKILL ends at the kill; one that never ended otherwise counts as still running.
    forever = datetime.now(UTC) + timedelta(days=1)
    by_thread: dict[str, list[tuple[datetime, datetime, tuple[int, int]]]] = defaultdict(list)
    for r in q(db, "SELECT * FROM rec_log WHERE thread_id = ANY(%s)", (threads,)):
        end = r["t_end"] or killed.get(r["pid"]) or forever
        by_thread[r["thread_id"]].append((r["t_start"], end, (r["pid"], r["token"])))
    overlaps = []
    for tid, execs in by_thread.items():
        execs.sort()
        for i, (_s1, e1, o1) in enumerate(execs):
            for s2, _e2, o2 in execs[i + 1:]:
                if o2 != o1 and s2 < e1:
                    overlaps.append((tid, o1, o2))
    assert overlaps == []
    recovered = [t for t, ex in by_thread.items() if len({o[0] for _s, _e, o in ex}) > 1]
    assert recovered, "some thread must have been resumed by another worker"
    reexecuted = sum(1 for ex in by_thread.values() for _ in ex) - 30 * 5
    print(f"kills={len(killed)} threads moved between workers={len(recovered)} "
          f"node re-executions after a kill={reexecuted}")
    text = "".join(p.read_text() for p in logs)
    assert "recovering thread=chaos-" in text and " attempt=" in text and " checkpoint=" in text
    assert not q(db, "SELECT 1 FROM durable_threads WHERE thread_id = ANY(%s) AND status = 'quarantined'", (threads,))


def test_runs_survive_every_backend_being_terminated(db: str) -> None:
    """pg_terminate_backend on every connection to the test database (workers' pool,
    renewer, nodes' own) several times mid-run: every run finishes, no checkpoint lost."""
    threads = [f"pgkill-{i}" for i in range(10)]
    with DurablePostgresSaver.from_conn_string(db, lease_ttl=3, max_resume_attempts=20) as saver:
        graph = cr.make_builder(5, 0.1).compile(checkpointer=saver.bind(graph_version="pgkill-v"))
        for t in threads:
            submit(graph, INPUT, cfg(t))
        results: list[Any] = []
        worker = RecoveryWorker(
            graph, concurrency=3, poll_interval=0.1, error_backoff=0.1, on_recovery=results.append
        )
        runner = threading.Thread(target=worker.run, kwargs={"install_signal_handlers": False})
        runner.start()
        # The stock saver, side by side: one connection, never re-opened.
        stock_out: dict[str, Any] = {}

        def stock_run() -> None:
            with PostgresSaver.from_conn_string(db) as stock:
                g = cr.make_builder(5, 0.3).compile(checkpointer=stock)
                try:
                    g.invoke(INPUT, cfg("pgkill-stock"))
                except Exception as exc:
                    stock_out["error"] = exc

        stock_thread = threading.Thread(target=stock_run)
        stock_thread.start()
        terminated = 0
        try:
            with psycopg.connect(db, autocommit=True) as admin:
                for _ in range(6):
                    wait_for(
                        lambda: bool(q(db, "SELECT 1 FROM durable_threads WHERE thread_id = ANY(%s) AND status = 'running' AND lease_expires_at > now()", (threads,))),
                        30, "a run in progress",
                    )
                    time.sleep(0.3)
                    rows = admin.execute(
                        "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                        "WHERE datname = current_database() AND pid <> pg_backend_pid()"
                    ).fetchall()
                    terminated += sum(1 for r in rows if r[0])
            wait_for(
                lambda: not q(db, "SELECT 1 FROM durable_threads WHERE thread_id = ANY(%s) AND status <> 'done'", (threads,)),
                120, "every run to finish",
            )
        finally:
            worker.stop()
            runner.join(60)
            stock_thread.join(60)
        assert terminated > 0
        # Stock: the run raised with its dead connection; the nodes it went on running
        # in memory never reached the database, and nothing will ever resume the thread.
        assert isinstance(stock_out.get("error"), psycopg.OperationalError), stock_out
        with PostgresSaver.from_conn_string(db) as stock:
            left = cr.make_builder(5, 0).compile(checkpointer=stock).get_state(cfg("pgkill-stock"))
        # (``next`` may be empty here even so: when the last task's writes were saved but
        # the next checkpoint never was, LangGraph reports no next node. Count the work.)
        assert len(left.values.get("done", [])) < 5, left
        for t in threads:
            state = graph.get_state(cfg(t))
            assert done_nodes(state.values) == NODES and state.next == (), t
            chain = []
            snap = state
            while snap is not None:
                chain.append(snap.metadata["step"])
                parent = snap.parent_config
                snap = graph.get_state(parent) if parent else None
            # Every superstep's checkpoint is there, linked parent to child.
            assert sorted(chain) == list(range(-1, 6)), (t, chain)
    orphans = q(
        db,
        "SELECT count(*) AS n FROM checkpoints c WHERE c.thread_id = ANY(%s) AND c.parent_checkpoint_id IS NOT NULL "
        "AND NOT EXISTS (SELECT 1 FROM checkpoints p WHERE p.thread_id = c.thread_id "
        "AND p.checkpoint_ns = c.checkpoint_ns AND p.checkpoint_id = c.parent_checkpoint_id)",
        (threads,),
    )
    assert orphans[0]["n"] == 0
    effects = q(db, "SELECT node, count(*) AS n FROM rec_effects WHERE thread_id = ANY(%s) GROUP BY thread_id, node", (threads,))
    assert len(effects) == 50 and all(r["n"] == 1 for r in effects)
    print("backends terminated:", terminated, "recoveries:", len(results),
          "outcomes:", worker.stats.outcomes)


# --------------------------------------------------------------------------- CLI


def test_worker_cli_rejects_a_bad_graph_spec() -> None:
    runner = CliRunner()
    result = runner.invoke(app, ["worker", "--graph", "no_such_module_xyz:graph", "--dsn", "postgresql://x"])
    assert result.exit_code == 2
    assert "cannot import" in result.output
    result = runner.invoke(app, ["worker", "--graph", "missing-colon", "--dsn", "postgresql://x"])
    assert result.exit_code == 2 and "module:attr" in result.output


def test_bad_worker_input_raises_typed_errors(db: str) -> None:
    from langgraph.checkpoint.memory import InMemorySaver

    with DurablePostgresSaver.from_conn_string(db) as saver:
        graph = cr.make_builder(2, 0).compile(checkpointer=saver)
        with pytest.raises(ConfigurationError) as info:
            RecoveryWorker(cr.make_builder(2, 0).compile(checkpointer=InMemorySaver()))
        assert info.value.checkpointer == "InMemorySaver"
        with pytest.raises(ConfigurationError):
            RecoveryWorker(graph, concurrency=0)
        with pytest.raises(ConfigurationError):
            RecoveryWorker(graph, shutdown="later")  # type: ignore[arg-type]
        with pytest.raises(ConfigurationError):
            RecoveryWorker([graph, cr.make_builder(2, 0).compile(checkpointer=saver)])  # same version
        with pytest.raises(ConfigurationError):
            submit(graph, INPUT, {"configurable": {}})
