"""Asynchronous failover (issue 23, defects 6 and 7): acknowledged work lost, noticed, re-run.

A real primary and an ASYNCHRONOUS standby (tests/_cluster.py), three recovery workers in
child processes (tests/_child_failover_async.py) running 12 submitted threads of a
10-step graph (4 of them make an ``@idempotent`` call per step). Mid-run the standby stops
receiving WAL (its ``primary_conninfo`` emptied: deterministic, no race with a socket
buffer), the workers go on committing on the primary alone (acknowledged, never
replicated), then the primary is SIGKILLed and the standby promoted.

* ``test_async_failover_reruns_lost_steps``: every thread ends ``done`` on the promoted
  standby with an intact history (each checkpoint's parent present, the head's blob
  versions present) and the state of an uncrashed run; acknowledged checkpoints were
  lost, and every lost step ran again; each run in flight stopped with
  ``AcknowledgedWorkLostError`` (its ERROR line, the counter, a ``work_lost`` audit row);
  no ``UnstableKeyError``; and the workers' log says what happened in two lines (failover
  noticed, writing again after N s) among few repeated WARNING lines.
* ``test_async_failover_without_parent_check_leaves_wrong_threads``: the same with the
  put's parent check switched off (the base commit's behaviour): the runs write on top of
  checkpoints the promoted server does not have, and threads end ``done`` on a broken
  history.
* ``test_lost_parent_in_process``: no cluster: the run's last checkpoint removed under it
  (what the failover does), in one process: ``invoke`` raises the typed error, nothing is
  written on top, ``invoke(None)`` runs the lost step again from the real head.

Skipped where the PostgreSQL server binaries are missing (a failure with CI=true).
"""

from __future__ import annotations

import collections
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import _child_failover_async as child  # noqa: E402
import _cluster  # noqa: E402
from conftest import needs, require_or_skip  # noqa: E402

# Ports of this file's clusters (clear of other suites running beside it).
PORTS = (int(os.environ.get("LGD_FAILOVER_PORT_LOW", "56400")), int(os.environ.get("LGD_FAILOVER_PORT_HIGH", "56499")))
# Generous deadlines for conditions (never a measured threshold).
WAIT = float(os.environ.get("LGD_FAILOVER_WAIT", "120"))
N_WORKERS, CONCURRENCY = 3, 4
THREADS = [f"t-{i}" for i in range(8)] + [f"idem-{i}" for i in range(4)]

_reason = _cluster.missing_reason()
cluster = needs(_reason)  # the one skip rule (tests/conftest.py): CI fails instead


# Seconds between the kill and the promotion (a failover manager notices a dead primary
# first); the workers' reconnect attempts meanwhile are what defect 7's log was full of.
PROMOTE_DELAY = float(os.environ.get("LGD_PROMOTE_DELAY", "1.0"))


@pytest.fixture(scope="module")
def failover(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, dict[str, Any]]]:
    """The scenario, run once for the tests that read its figures (by group)."""
    if _reason is not None:
        require_or_skip(_reason)
    pair = _cluster.make_pair(synchronous=False, ports=PORTS)
    try:
        yield _scenario(pair, tmp_path_factory.mktemp("failover"))
    finally:
        pair.destroy()


def _until(cond: Any, what: str, timeout: float = WAIT) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        got = cond()
        if got:
            return got
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.02)


def _rows(dsn: str, sql: str, params: Any = None) -> list[tuple[Any, ...]]:
    with psycopg.connect(dsn, autocommit=True, connect_timeout=3) as conn:
        return conn.execute(sql, params).fetchall()


def _jsonl(path: Path) -> list[dict[str, Any]]:
    return [json.loads(x) for x in path.read_text().splitlines()] if path.exists() else []


def _cut_standby(pair: _cluster.Pair) -> None:
    """The standby replays everything so far, then receives nothing more (its
    ``primary_conninfo`` emptied and reloaded ends its WAL receiver)."""
    lsn = _rows(pair.primary.dsn, "SELECT pg_current_wal_lsn()::text")[0][0]
    _until(lambda: _rows(pair.standby.dsn, "SELECT pg_last_wal_replay_lsn() >= %s::pg_lsn", (lsn,))[0][0],
           "the standby to catch up")
    with psycopg.connect(pair.standby.dsn, autocommit=True) as conn:
        conn.execute("ALTER SYSTEM SET primary_conninfo = ''")
        conn.execute("SELECT pg_reload_conf()")
    _until(lambda: not _rows(pair.primary.dsn, "SELECT count(*) FROM pg_stat_replication")[0][0],
           "the standby to disconnect")


def _setup(dsn: str) -> None:
    from langgraph_durable import DurablePostgresSaver

    with DurablePostgresSaver.from_conn_string(dsn) as saver:
        saver.setup()


def _submit(dsn: str, threads: list[str], version: str) -> None:
    from langgraph_durable import DurablePostgresSaver, submit

    with DurablePostgresSaver.from_conn_string(dsn, graph_version=version) as saver:
        graph = child.build_graph().compile(checkpointer=saver)
        for t in threads:
            submit(graph, {"steps": []}, {"configurable": {"thread_id": t}})


def _broken(dsn: str, thread: str) -> list[str]:
    """What is wrong with ``thread``'s stored history (empty: nothing): a checkpoint
    whose parent is missing, a blob version the head references and lacks, a final
    state other than an uncrashed run's."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        cps = {r[0]: (r[1], r[2]) for r in conn.execute(
            "SELECT checkpoint_id, parent_checkpoint_id, checkpoint FROM checkpoints "
            "WHERE thread_id = %s AND checkpoint_ns = ''", (thread,)).fetchall()}
        blobs = {(r[0], r[1]) for r in conn.execute(
            "SELECT channel, version FROM checkpoint_blobs WHERE thread_id = %s AND checkpoint_ns = ''",
            (thread,)).fetchall()}
        status = conn.execute("SELECT status FROM durable_threads WHERE thread_id = %s", (thread,)).fetchone()
    if not cps:
        return ["no checkpoint"]
    problems = [f"parent {p} of {c} missing" for c, (p, _) in cps.items() if p is not None and p not in cps]
    head = cps[max(cps)][1]
    for channel, version in head["channel_versions"].items():
        if channel not in head["channel_values"] and (channel, str(version)) not in blobs and channel == "steps":
            problems.append(f"head's blob {channel}@{version} missing")
    from langgraph_durable import DurablePostgresSaver

    with DurablePostgresSaver.from_conn_string(dsn) as saver:
        tup = saver.get_tuple({"configurable": {"thread_id": thread}})
    steps = tup.checkpoint["channel_values"].get("steps") if tup else None
    if steps != list(range(child.N_STEPS)):
        problems.append(f"final state {steps}")
    if status is None or status[0] != "done":
        problems.append(f"status {status}")
    return problems


# The two groups of one run: the package as it is, and its parent check switched off (the
# base commit's behaviour). Each group's threads carry its own graph version, so a worker
# only ever claims its own group's threads (RecoveryWorker routes threads by version).
GROUPS = {
    "checked": {"threads": THREADS, "workers": N_WORKERS, "parent_check": True},
    "unchecked": {"threads": [f"u-{i}" for i in range(4)], "workers": 1, "parent_check": False},
}


def _scenario(pair: _cluster.Pair, tmp: Path) -> dict[str, dict[str, Any]]:
    t0 = time.monotonic()
    dsn = pair.multi_dsn()
    every = [t for g in GROUPS.values() for t in g["threads"]]
    procs: list[tuple[str, subprocess.Popen[str]]] = []
    _setup(dsn)
    for name, group in GROUPS.items():
        for w in range(group["workers"]):
            spec = {"dsn": dsn, "ack_log": str(tmp / f"acks-{name}.jsonl"),
                    "exec_log": str(tmp / f"exec-{name}.jsonl"), "node_sleep": 0.12,
                    "concurrency": CONCURRENCY, "name": f"{name}-{w}", "graph_version": name,
                    "parent_check": group["parent_check"]}
            procs.append((name, subprocess.Popen(
                [sys.executable, os.path.join(HERE, "_child_failover_async.py"), json.dumps(spec)],
                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
            )))
    acks = lambda: [a for name in GROUPS for a in _jsonl(tmp / f"acks-{name}.jsonl")]  # noqa: E731
    timing: dict[str, float] = {}
    decisions: list[dict[str, Any]] = []
    try:
        # Submitted once every worker is up, so that the groups run side by side.
        for _, p in procs:
            assert p.stdout is not None
            line = p.stdout.readline()
            while line and line.strip() != "READY":
                line = p.stdout.readline()
            assert line, p.stderr.read() if p.stderr else ""
        for name, group in GROUPS.items():
            _submit(dsn, group["threads"], name)
        # Mid-run: every thread has stored a few steps.
        def progressed() -> bool:
            rows = _rows(pair.primary.dsn, "SELECT thread_id, count(*) FROM checkpoints GROUP BY 1")
            return len(rows) == len(every) and all(n >= 3 for _, n in rows)

        _until(progressed, "every thread to run a few steps")
        _cut_standby(pair)
        cut_at = time.time()
        # About a step per thread of each group acknowledged by the primary alone.
        def acked_after_cut() -> bool:
            after = collections.Counter(a["thread"][0] for a in acks() if a["t"] > cut_at)
            return after["u"] >= len(GROUPS["unchecked"]["threads"]) and \
                after["t"] + after["i"] >= len(GROUPS["checked"]["threads"])

        _until(acked_after_cut, "acknowledged checkpoints after the cut")
        pair.kill_primary()
        time.sleep(PROMOTE_DELAY)
        pair.promote()
        timing["kill"] = time.monotonic() - t0
        def settled() -> bool:
            _operate(pair.standby.dsn, decisions)
            return _rows(pair.standby.dsn, "SELECT count(*) FROM durable_threads WHERE status = 'done'")[0][0] \
                == len(every)

        try:
            _until(settled, "every thread done on the promoted standby")
        except AssertionError as exc:  # say where each thread is: a stall is not a slow machine
            rows = _rows(pair.standby.dsn, "SELECT thread_id, status, lease_owner, attempts, last_error "
                         "FROM durable_threads WHERE status IS DISTINCT FROM 'done' ORDER BY 1")
            raise AssertionError(f"{exc}; not done: {rows}") from None
        timing["done"] = time.monotonic() - t0
    finally:
        for _, p in procs:
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
        outs: list[tuple[str, str, str]] = []
        for name, p in procs:
            try:
                out, err = p.communicate(timeout=20)
            except subprocess.TimeoutExpired:
                p.kill()
                out, err = p.communicate()
            outs.append((name, out, err))
    result = {name: _figures(pair.standby.dsn, tmp, name, GROUPS[name]["threads"],
                             [(o, e) for n, o, e in outs if n == name]) for name in GROUPS}
    result["checked"]["decisions"] = decisions
    if os.environ.get("LGD_FAILOVER_LOG"):
        Path(os.environ["LGD_FAILOVER_LOG"]).write_text("".join(e for _, _, e in outs))
    print(f"ASYNC FAILOVER timing: kill at {timing.get('kill', 0):.1f}s, all done at "
          f"{timing.get('done', 0):.1f}s, end {time.monotonic() - t0:.1f}s")
    return result


def _operate(dsn: str, decisions: list[dict[str, Any]]) -> None:
    """The operator's part, as docs/idempotency.md gives it: a thread stopped on an
    ``@idempotent`` call whose outcome is unknown is judged, resolved, and run again.

    Not a workaround of a defect: the claim of a call can reach the standby before the
    cut and its recorded result after it (lost with the primary). The promoted server
    then holds a 'started' claim and no result; the call did run once, which the server
    cannot know, so the package refuses to guess (OutcomeUnknownError, no attempt
    counted, the workers skip the thread) instead of running ``mark`` a second time.
    The operator knows: ``mark`` returns its step (in the entry's argument preview)."""
    from langgraph_durable import DurablePostgresSaver, Ledger

    stopped = _rows(dsn, "SELECT thread_id FROM durable_threads WHERE status = 'error' "
                         "AND last_error LIKE '%%OutcomeUnknownError%%'")
    for (thread,) in stopped:
        with DurablePostgresSaver.from_conn_string(dsn, graph_version="checked", on_busy="wait") as saver:
            ledger = Ledger(saver)
            for entry in ledger.entries(thread_id=thread, status="started"):
                step = json.loads(entry.args_preview or "{}")["step"]
                ledger.resolve(entry.key, step)
                decisions.append({"thread": thread, "key": entry.key, "step": step})
            graph = child.build_graph().compile(checkpointer=saver)
            graph.invoke(None, {"configurable": {"thread_id": thread}})


def _figures(new: str, tmp: Path, name: str, threads: list[str], outs: list[tuple[str, str]]) -> dict[str, Any]:
    """One group's figures, read from the promoted standby, the logs and the workers."""
    f: dict[str, Any] = {}
    acks = _jsonl(tmp / f"acks-{name}.jsonl")
    present = {r[0] for r in _rows(new, "SELECT checkpoint_id FROM checkpoints WHERE thread_id = ANY(%s)", (threads,))}
    f["lost"] = [a for a in acks if a["checkpoint_id"] not in present]
    runs = collections.Counter((e["thread"], e["step"]) for e in _jsonl(tmp / f"exec-{name}.jsonl"))
    # Checkpoint step k is written after node s{k-1} (step 0: the input applied). A
    # lost step either ran again or needs not: its task's writes (stored against the
    # previous checkpoint, before the cut) survived, and the resume applied them.
    kept = {(r[0], r[1].rsplit(", s", 1)[-1]) for r in _rows(
        new, "SELECT DISTINCT thread_id, task_path FROM checkpoint_writes WHERE task_path LIKE '%%, s%%'")}
    f["rerun"] = [(a["thread"], a["step"]) for a in f["lost"]
                  if a["step"] >= 1 and runs[(a["thread"], a["step"] - 1)] >= 2]
    f["lost_not_rerun"] = [
        (a["thread"], a["step"]) for a in f["lost"]
        if a["step"] >= 1 and runs[(a["thread"], a["step"] - 1)] < 2 and (a["thread"], str(a["step"] - 1)) not in kept
    ]
    f["wrong"] = {t: p for t in threads if (p := _broken(new, t))}
    f["audit"] = _rows(new, "SELECT thread_id, before_id, after_id FROM durable_audit "
                            "WHERE action = 'work_lost' AND thread_id = ANY(%s)", (threads,))
    f["kept"] = sum(int(r[0] or 0) for r in _rows(
        new, "SELECT (detail->>'ledger_records_kept')::int FROM durable_audit "
             "WHERE action = 'work_lost' AND thread_id = ANY(%s)", (threads,)))
    f["stderrs"] = [err for _, err in outs]
    f["stderr"] = "".join(f["stderrs"])
    f["work_lost"] = collections.Counter()
    for out, _ in outs:
        for line in out.splitlines():
            if line.startswith("{"):
                f["work_lost"].update(json.loads(line).get("work_lost", {}))
    levels = collections.Counter(line.split(" ", 1)[0] for line in f["stderr"].splitlines() if line[:1].isupper())
    print(
        f"\nASYNC FAILOVER {name}: threads={len(threads)} acked={len(acks)} lost acked={len(f['lost'])} "
        f"re-ran={len(f['rerun'])} wrong={len(f['wrong'])} work_lost={dict(f['work_lost'])} "
        f"audit rows={len(f['audit'])} log lines={dict(levels)} ledger records kept at hand-back={f['kept']} "
        f"own claims completed from memory={f['stderr'].count('written again and replayed')}"
    )
    return f


@cluster
@pytest.mark.chaos
def test_async_failover_reruns_lost_steps(failover: dict[str, dict[str, Any]]) -> None:
    f = failover["checked"]
    stderr = f["stderr"]
    assert f["lost"], "no acknowledged checkpoint was lost: the scenario did not happen"
    assert f["wrong"] == {}, f["wrong"]
    assert f["rerun"] and f["lost_not_rerun"] == [], (f["rerun"], f["lost_not_rerun"])
    # Noticed and said: the typed error, its one ERROR line per run, the counter, the audit row.
    assert "AcknowledgedWorkLostError" in stderr, stderr[-3000:]
    assert "ACKNOWLEDGED WORK LOST on thread" in stderr
    assert sum(f["work_lost"].values()) >= 1, f["work_lost"]
    assert f["audit"], "no work_lost audit row"
    # The @idempotent threads did not stall on a checkpoint that will never come.
    assert "UnstableKeyError" not in stderr, stderr[-3000:]
    # An operator decision only where the server lost a call's recorded result: an
    # @idempotent thread's started claim, never a plain thread (_operate).
    assert all(d["thread"].startswith("idem-") for d in f["decisions"]), f["decisions"]
    print(f"ASYNC FAILOVER operator decisions (recorded results lost with the primary): {f['decisions']}")


# The repeated connection-error lines (defect 7), by the start of their message.
REPEATED = ("error connecting in", "discarding broken connection", "discarding closed connection",
            "error ignored terminating", "connection lost (", "lease renewal failed")


@cluster
@pytest.mark.chaos
def test_async_failover_log_says_what_happened(failover: dict[str, dict[str, Any]]) -> None:
    """Each worker: one line when it lost the server, one when it wrote again (with the
    time between), and each repeated connection error at most once per interval."""
    from langgraph_durable import _pool

    interval = getattr(_pool, "OUTAGE_LOG_INTERVAL", 10.0)
    for n, err in enumerate(failover["checked"]["stderrs"] + failover["unchecked"]["stderrs"]):
        lines = [line for line in err.splitlines() if line.startswith(("WARNING", "ERROR"))]
        lost = [i for i, line in enumerate(lines) if "DATABASE SERVER LOST" in line]
        back = [i for i, line in enumerate(lines) if "DATABASE WRITABLE AGAIN after" in line]
        print(f"worker {n}: {len(lines)} WARNING/ERROR lines; summary: "
              + " | ".join(lines[i].split(": ", 1)[-1][:110] for i in lost + back))
        assert len(lost) == 1 and len(back) == 1 and lost[0] < back[0], lines
        seconds = float(lines[back[0]].split("after ", 1)[1].split(" s", 1)[0])
        assert seconds > 0
        allowed = 1 + int(seconds // interval) + 1
        for prefix in REPEATED:
            shown = sum(1 for line in lines if f": {prefix}" in line)
            assert shown <= allowed, (prefix, shown, allowed)


@cluster
@pytest.mark.chaos
def test_async_failover_without_parent_check_leaves_wrong_threads(failover: dict[str, dict[str, Any]]) -> None:
    f = failover["unchecked"]
    assert f["lost"], "no acknowledged checkpoint was lost: the scenario did not happen"
    # The base behaviour: the runs' next puts land on a parent the server lacks.
    assert f["wrong"], "expected threads on a broken history without the parent check"
    assert any("parent" in p for ps in f["wrong"].values() for p in ps), f["wrong"]


# --- the same loss in one process (no cluster): the run's last checkpoint removed under it


def _abc(node: Any) -> Any:
    """a -> b -> c, each node ``node(name)``."""
    from langgraph.graph import END, START, StateGraph

    builder = StateGraph(child.State)
    for name in "abc":
        builder.add_node(name, node(name))
    builder.add_edge(START, "a")
    builder.add_edge("a", "b")
    builder.add_edge("b", "c")
    builder.add_edge("c", END)
    return builder


def _lose_parent_graph(dsn: str, runs: collections.Counter[str], *, idem: bool | None) -> Any:
    """a -> b -> c. The first time b runs it deletes the checkpoint it runs from (a's,
    acknowledged: durability "sync"), what a failover to a lagging standby does; with
    ``idem`` it then makes an ``@idempotent`` call (which awaits that checkpoint); None:
    b deletes nothing."""
    from langchain_core.runnables import RunnableConfig

    from langgraph_durable import idempotent

    @idempotent(wait_timeout=2.0)
    def effect(thread_id: str) -> str:
        return "ok"

    def node(name: str) -> Any:
        def fn(state: child.State, config: RunnableConfig) -> dict[str, Any]:
            runs[name] += 1
            if name == "b" and runs["b"] == 1 and idem is not None:
                with psycopg.connect(dsn, autocommit=True) as conn:
                    conn.execute(
                        "DELETE FROM checkpoints WHERE thread_id = %(t)s AND checkpoint_id = "
                        "(SELECT max(checkpoint_id) FROM checkpoints WHERE thread_id = %(t)s)",
                        {"t": config["configurable"]["thread_id"]})
                if idem:
                    effect(config["configurable"]["thread_id"])
            return {"steps": [ord(name) - ord("a")]}

        return fn

    return _abc(node)


def test_lost_final_checkpoint_in_process(dsn: str) -> None:
    """The run's last checkpoint lost after its put returned, before the run ended (a
    failover between the two): the thread is not marked done on the older head; invoke
    raises the typed error and invoke(None) completes it."""
    from langgraph_durable import DurablePostgresSaver
    from langgraph_durable.errors import AcknowledgedWorkLostError

    thread = "lost-final"
    lost: list[str] = []

    class Losing(DurablePostgresSaver):
        def put(self, config: Any, checkpoint: Any, metadata: Any, new_versions: Any) -> Any:
            out = super().put(config, checkpoint, metadata, new_versions)
            if (metadata or {}).get("step") == 3 and not lost:
                lost.append(checkpoint["id"])
                _rows_exec(dsn, "DELETE FROM checkpoints WHERE thread_id = %s AND checkpoint_id = %s",
                           (thread, checkpoint["id"]))
            return out

    config: Any = {"configurable": {"thread_id": thread}}
    runs: collections.Counter[str] = collections.Counter()
    with Losing.from_conn_string(dsn) as saver:
        graph = _lose_parent_graph(dsn, runs, idem=None).compile(checkpointer=saver)
        with pytest.raises(AcknowledgedWorkLostError) as info:
            graph.invoke({"steps": []}, config, durability="sync")
        assert info.value.missing_checkpoint_id == lost[0]
        assert _rows(dsn, "SELECT status FROM durable_threads WHERE thread_id = %s", (thread,)) == [("stopped",)]
        out = graph.invoke(None, config, durability="sync")
    assert out["steps"] == [0, 1, 2] and runs == {"a": 1, "b": 1, "c": 1}
    assert _rows(dsn, "SELECT status FROM durable_threads WHERE thread_id = %s", (thread,)) == [("done",)]


def _rows_exec(dsn: str, sql: str, params: Any) -> None:
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(sql, params)


@pytest.mark.parametrize("idem", [False, True], ids=["put", "idempotent-await"])
def test_lost_parent_in_process(dsn: str, idem: bool) -> None:
    from langgraph_durable import DurablePostgresSaver
    from langgraph_durable.errors import AcknowledgedWorkLostError

    thread = f"lost-{idem}"
    config: Any = {"configurable": {"thread_id": thread}}
    runs: collections.Counter[str] = collections.Counter()
    with DurablePostgresSaver.from_conn_string(dsn) as saver:
        graph = _lose_parent_graph(dsn, runs, idem=idem).compile(checkpointer=saver)
        started = time.monotonic()
        with pytest.raises(AcknowledgedWorkLostError) as info:
            graph.invoke({"steps": []}, config, durability="sync")
        waited = time.monotonic() - started
        err = info.value
        assert err.thread_id == thread and err.missing_checkpoint_id
        # Nothing written on top of the missing checkpoint; handed back 'stopped' at the
        # real head, not counted as a failed attempt; one audit row.
        rows = _rows(dsn, "SELECT checkpoint_id, parent_checkpoint_id FROM checkpoints WHERE thread_id = %s", (thread,))
        ids = {r[0] for r in rows}
        assert all(p is None or p in ids for _, p in rows), rows
        assert err.missing_checkpoint_id not in ids and err.head_checkpoint_id == max(ids)
        assert _rows(dsn, "SELECT status, attempts FROM durable_threads WHERE thread_id = %s", (thread,)) == [("stopped", 0)]
        audit = _rows(dsn, "SELECT before_id, after_id FROM durable_audit WHERE action = 'work_lost' AND thread_id = %s", (thread,))
        assert audit == [(err.missing_checkpoint_id, err.head_checkpoint_id)]
        # invoke(None) resumes from the real head: a's result is applied from its task's
        # stored writes (the head's pending writes, kept), b runs again, then c.
        out = graph.invoke(None, config, durability="sync")
    assert out["steps"] == [0, 1, 2]
    assert runs == {"a": 1, "b": 2, "c": 1}
    print(f"\nLOST PARENT ({'await' if idem else 'put'}): raised {type(err).__name__} after {waited:.2f}s; runs {dict(runs)}")


def test_lost_parent_async_saver(dsn: str) -> None:
    """The async saver: the same put check, ainvoke raises, ainvoke(None) resumes."""
    import asyncio

    from langgraph_durable import AsyncDurablePostgresSaver
    from langgraph_durable.errors import AcknowledgedWorkLostError

    thread = "lost-async"
    config: Any = {"configurable": {"thread_id": thread}}
    runs: collections.Counter[str] = collections.Counter()

    async def main() -> dict[str, Any]:
        async with AsyncDurablePostgresSaver.from_conn_string(dsn) as saver:
            graph = _lose_parent_graph(dsn, runs, idem=False).compile(checkpointer=saver)
            with pytest.raises(AcknowledgedWorkLostError):
                await graph.ainvoke({"steps": []}, config, durability="sync")
            assert _rows(dsn, "SELECT status FROM durable_threads WHERE thread_id = %s", (thread,)) == [("stopped",)]
            return await graph.ainvoke(None, config, durability="sync")

    out = asyncio.run(main())
    assert out["steps"] == [0, 1, 2] and runs == {"a": 1, "b": 2, "c": 1}


@pytest.mark.parametrize("kept", [True, False], ids=["recorded-here", "recorded-elsewhere"])
def test_lost_record_in_process(dsn: str, kept: bool) -> None:
    """An @idempotent call's record lost with the run's checkpoint while its claim
    survived (the claim reached the standby, the record did not: what
    test_async_failover_reruns_lost_steps met in about one run in three).

    recorded-here: the process that recorded it writes the record again in the run's
    release (idempotency memory, langgraph_durable/_acked.py), so the resumed run replays
    the call: no OutcomeUnknownError, the effect once. recorded-elsewhere: that memory is
    gone (another process resumes, or the recorder died): the claim is an unknown
    outcome, as before; never a second effect."""
    from langchain_core.runnables import RunnableConfig

    from langgraph_durable import DurablePostgresSaver, idempotent
    from langgraph_durable._acked import ACKED
    from langgraph_durable.errors import AcknowledgedWorkLostError, OutcomeUnknownError

    thread = f"lost-record-{kept}"
    effects: list[str] = []

    @idempotent(wait_timeout=2.0)
    def charge(thread_id: str) -> str:
        effects.append(thread_id)
        return f"charged {thread_id}"

    def node(name: str) -> Any:
        def fn(state: child.State, config: RunnableConfig) -> dict[str, Any]:
            if name == "b":
                assert charge(config["configurable"]["thread_id"]) == f"charged {thread}"
            return {"steps": [ord(name) - ord("a")]}

        return fn

    builder = _abc(node)

    class Losing(DurablePostgresSaver):
        def put(self, config: Any, checkpoint: Any, metadata: Any, new_versions: Any) -> Any:
            out = super().put(config, checkpoint, metadata, new_versions)
            if (metadata or {}).get("step") == 2 and effects and not lost:
                # b's checkpoint and the call's record gone, its claim kept (live
                # claim lease when recorded here: even so it is written again).
                lost.append(checkpoint["id"])
                _rows_exec(dsn, "DELETE FROM checkpoints WHERE thread_id = %s AND checkpoint_id = %s",
                           (thread, checkpoint["id"]))
                # b's task writes, stored after its claim, are gone too: b runs again.
                _rows_exec(dsn, "DELETE FROM checkpoint_writes WHERE thread_id = %s AND checkpoint_id = %s",
                           (thread, config["configurable"]["checkpoint_id"]))
                _rows_exec(dsn, "UPDATE durable_ledger SET status = 'started', result = NULL, result_type = NULL, "
                                "completed_at = NULL, claim_expires_at = now() + "
                                + ("interval '1 hour'" if kept else "interval '-1 second'")
                                + " WHERE thread_id = %s", (thread,))
                if not kept:
                    ACKED.clear()
            return out

    lost: list[str] = []
    config: Any = {"configurable": {"thread_id": thread}}
    with Losing.from_conn_string(dsn) as saver:
        graph = builder.compile(checkpointer=saver)
        with pytest.raises(AcknowledgedWorkLostError):
            graph.invoke({"steps": []}, config, durability="sync")
        [(status,)] = _rows(dsn, "SELECT status FROM durable_ledger WHERE thread_id = %s", (thread,))
        [(detail,)] = _rows(dsn, "SELECT detail FROM durable_audit WHERE action = 'work_lost' AND thread_id = %s",
                            (thread,))
        assert detail["ledger_records_kept"] == (1 if kept else 0), detail
        if kept:
            assert status == "completed"
            out = graph.invoke(None, config, durability="sync")
            assert out["steps"] == [0, 1, 2]
        else:
            assert status == "started"
            with pytest.raises(OutcomeUnknownError):
                graph.invoke(None, config, durability="sync")
    assert effects == [thread], effects  # never a second effect


def test_own_claim_without_its_record_is_completed_from_memory(dsn: str) -> None:
    """The claim path of the same memory: a call whose own earlier claim is found
    'started' (its record lost) replays the result this process recorded, and only over
    that claim: a row an operator forgot, or one claimed anew by another owner, is not
    restored (the call runs, or is judged, as before)."""
    from langgraph_durable import DurablePostgresSaver, Ledger, idempotent

    runs: list[int] = []
    with DurablePostgresSaver.from_conn_string(dsn) as saver:
        saver.setup()

        @idempotent(ledger=saver, key=lambda n: f"memo-{n}", wait_timeout=1.0)
        def call(n: int) -> int:
            runs.append(n)
            return n * 10

        assert call(1) == 10 and call(2) == 20 and runs == [1, 2]
        lose = ("UPDATE durable_ledger SET status = 'started', result = NULL, result_type = NULL, "
                "completed_at = NULL, claim_expires_at = now() - interval '1 second' WHERE key = %s")
        _rows_exec(dsn, lose, ("memo-1",))
        assert call(1) == 10 and runs == [1, 2]  # replayed from memory, written again
        assert _rows(dsn, "SELECT status FROM durable_ledger WHERE key = 'memo-1'") == [("completed",)]
        # An operator's forget: the row is gone, the call runs again (their decision).
        assert Ledger(saver).forget("memo-2")
        assert call(2) == 20 and runs == [1, 2, 2]
