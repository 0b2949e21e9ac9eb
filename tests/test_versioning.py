"""Graph-version stamping, the check at run start, migrations, and the versions CLI.

Real PostgreSQL throughout. "Nothing ran" is proven with the side table the test
graphs' nodes write to (tests/_child_versioning_graphs.py); "nothing was written" by
comparing the raw rows of the thread before and after.
"""

from __future__ import annotations

import json
import logging
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import _child_versioning_graphs as G
import psycopg
import pytest
from langgraph.types import Command
from psycopg.rows import dict_row

from langgraph_durable import (
    AsyncDurablePostgresSaver,
    ConfigurationError,
    DurablePostgresSaver,
    GraphVersionMismatchError,
    MigrationError,
    MigrationRegistry,
    OrphanedWorkError,
    amigrate_threads,
    aundo_migration,
    graph_fingerprint,
    migrate_threads,
    undo_migration,
)
from langgraph_durable.ops.migrations import list_threads, migration_log
from langgraph_durable.versioning import apply_migrations

HERE = Path(__file__).parent
GRAPHS_FILE = str(HERE / "_child_versioning_graphs.py")


@pytest.fixture(scope="module", autouse=True)
def side_table(dsn: str) -> Iterator[None]:
    G.ensure_side_table(dsn)
    old = os.environ.get(G.DSN_ENV)
    os.environ[G.DSN_ENV] = dsn
    yield
    if old is None:
        os.environ.pop(G.DSN_ENV, None)
    else:
        os.environ[G.DSN_ENV] = old


def cfg(thread_id: str, **configurable: Any) -> Any:
    return {"configurable": {"thread_id": thread_id, **configurable}}


def raw_rows(dsn: str, thread_id: str) -> dict[str, list[Any]]:
    """Every stored row of the thread, bytes included."""
    with psycopg.connect(dsn) as conn:
        return {
            "checkpoints": conn.execute(
                "SELECT checkpoint_ns, checkpoint_id, parent_checkpoint_id, checkpoint, metadata "
                "FROM checkpoints WHERE thread_id = %s ORDER BY 1, 2",
                (thread_id,),
            ).fetchall(),
            "blobs": conn.execute(
                "SELECT checkpoint_ns, channel, version, type, blob FROM checkpoint_blobs "
                "WHERE thread_id = %s ORDER BY 1, 2, 3",
                (thread_id,),
            ).fetchall(),
            "writes": conn.execute(
                "SELECT checkpoint_ns, checkpoint_id, task_id, task_path, idx, channel, type, blob "
                "FROM checkpoint_writes WHERE thread_id = %s ORDER BY 1, 2, 3, 5",
                (thread_id,),
            ).fetchall(),
        }


def thread_row(dsn: str, thread_id: str) -> dict[str, Any]:
    with psycopg.connect(dsn, row_factory=dict_row) as conn:
        row = conn.execute(
            "SELECT status, graph_version, lease_owner FROM durable_threads WHERE thread_id = %s",
            (thread_id,),
        ).fetchone()
    assert row is not None
    return row


def log_count(dsn: str, thread_id: str) -> int:
    with psycopg.connect(dsn) as conn:
        row = conn.execute(
            "SELECT count(*) FROM durable_migration_log WHERE thread_id = %s", (thread_id,)
        ).fetchone()
    assert row is not None
    return int(row[0])


def pause_v1_in_review(saver: Any, thread_id: str, topic: str = "urgent") -> Any:
    graph = G.build_v1().compile(checkpointer=saver.bind(graph_version="v1"))
    out = graph.invoke({"log": [], "topic": topic}, cfg(thread_id))
    assert "__interrupt__" in out
    return graph


# --- stamping -------------------------------------------------------------------------


def test_every_checkpoint_is_stamped_and_filterable(dsn: str) -> None:
    with DurablePostgresSaver.from_conn_string(dsn) as saver:
        graph = G.build_v1().compile(checkpointer=saver.bind(graph_version="v1"))
        graph.invoke({"log": [], "topic": "t"}, cfg("stamp-bound"))
        graph.invoke(Command(resume="ok"), cfg("stamp-bound"))
        tuples = list(saver.list(cfg("stamp-bound")))
        assert len(tuples) >= 5
        assert {t.metadata["graph_version"] for t in tuples} == {"v1"}
        filtered = list(saver.list(cfg("stamp-bound"), filter={"graph_version": "v1"}))
        assert len(filtered) == len(tuples)

        # configurable.graph_version wins over the saver's.
        graph.invoke({"log": [], "topic": "t"}, cfg("stamp-conf", graph_version="v1-hotfix"))
        assert {t.metadata["graph_version"] for t in saver.list(cfg("stamp-conf"))} == {"v1-hotfix"}

        # Nothing given: the running graph's fingerprint, subgraph checkpoints included.
        auto = G.build_with_subgraph(False).compile(checkpointer=saver)
        auto.invoke({"log": []}, cfg("stamp-auto"))
        tuples = list(saver.list(cfg("stamp-auto")))
        namespaces = {t.config["configurable"]["checkpoint_ns"] for t in tuples}
        assert "" in namespaces and any(ns.startswith("write:") for ns in namespaces)
        assert {t.metadata["graph_version"] for t in tuples} == {graph_fingerprint(auto)}


def test_update_state_outside_a_run_inherits_the_version(dsn: str) -> None:
    with DurablePostgresSaver.from_conn_string(dsn) as saver:
        pause_v1_in_review(saver, "inherit-1")
        # An unbound graph on the unbound saver: no version known outside a run.
        plain = G.build_v1().compile(checkpointer=saver)
        plain.update_state(cfg("inherit-1"), {"topic": "edited"})
        latest = saver.get_tuple(cfg("inherit-1"))
        assert latest is not None
        assert latest.metadata["source"] == "update"
        assert latest.metadata["graph_version"] == "v1"


def test_bind_serves_several_graphs_from_one_pool(dsn: str) -> None:
    with DurablePostgresSaver.from_conn_string(dsn) as saver:
        research = saver.bind(graph=G.build_v1())
        other = saver.bind(graph_version="parallel-1")
        assert research.conn is saver.conn and other.conn is saver.conn
        assert research._leases is saver._leases and other._leases is saver._leases
        G.build_v1().compile(checkpointer=research).invoke({"log": []}, cfg("bind-a"))
        G.build_parallel("left").compile(checkpointer=other).invoke({"log": []}, cfg("bind-b"))
        a = saver.get_tuple(cfg("bind-a"))
        b = saver.get_tuple(cfg("bind-b"))
        assert a is not None and b is not None
        assert a.metadata["graph_version"] == graph_fingerprint(G.build_v1())
        assert b.metadata["graph_version"] == "parallel-1"


# --- the check at run start and migrations ------------------------------------------


def test_interrupted_thread_is_refused_then_migrated(dsn: str) -> None:
    """Automatic fingerprints: v2 renames review->approve, removes audit, renames a key."""
    tid = "intr-1"
    with DurablePostgresSaver.from_conn_string(dsn) as saver:
        g1 = G.build_v1().compile(checkpointer=saver)
        g1.invoke({"log": [], "topic": "urgent"}, cfg(tid))
        ran = G.executed(dsn, tid)
        assert ran == ["v1:fetch", "v1:review"]
        before = raw_rows(dsn, tid)
        g2 = G.build_v2().compile(checkpointer=saver)
        fp1, fp2 = graph_fingerprint(g1), graph_fingerprint(g2)
        with pytest.raises(GraphVersionMismatchError) as err:
            g2.invoke(Command(resume="yes"), cfg(tid))
        assert (err.value.thread_id, err.value.stored, err.value.current) == (tid, fp1, fp2)
        assert G.executed(dsn, tid) == ran  # before any node ran
        assert raw_rows(dsn, tid) == before
        assert thread_row(dsn, tid)["status"] == "waiting"  # still a paused thread

        # Reading a mismatched thread never raises.
        state = g2.get_state(cfg(tid))
        assert state.values["log"] == ["fetch"] and state.metadata["graph_version"] == fp1
        history = list(g2.get_state_history(cfg(tid)))
        assert len(history) == 3 and all(h.metadata["graph_version"] == fp1 for h in history)

        saver.migrations.register(
            fp1, fp2, G.v1_to_v2,
            rename_nodes={"review": "approve", "audit": "summarize"},
            rename_channels={"topic": "subject"},
        )
        out = g2.invoke(Command(resume="yes"), cfg(tid))
        assert out["log"] == ["fetch", "approve", "summarize"]
        assert (out["answer"], out["subject"], out["priority"]) == ("yes", "urgent", 1)
        assert "topic" not in out
        assert G.executed(dsn, tid) == [*ran, "v2:approve", "v2:summarize"]
        tuples = list(saver.list(cfg(tid)))
        migrated = [t for t in tuples if t.metadata.get("migrated_from") == fp1]
        assert len(migrated) == 1 and migrated[0].metadata["graph_version"] == fp2
        assert tuples[0].metadata["graph_version"] == fp2
        assert log_count(dsn, tid) == 1


def test_sigkilled_thread_is_refused_then_migrated(dsn: str) -> None:
    """v1 dies (SIGKILL) inside review; v2 refuses, then resumes on approve."""
    tid = "kill-1"
    env = {**os.environ, G.DSN_ENV: dsn, G.HANG_ENV: "v1:review"}
    child = subprocess.Popen(
        [sys.executable, str(HERE / "_child_versioning_run.py"), dsn, tid],
        env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
    )
    try:
        deadline = time.monotonic() + 90
        while "v1:review" not in G.executed(dsn, tid):
            assert child.poll() is None, child.communicate()
            assert time.monotonic() < deadline, "child never reached review"
            time.sleep(0.05)
        os.kill(child.pid, signal.SIGKILL)
    finally:
        if child.poll() is None:
            child.kill()
        child.wait()
    assert child.returncode == -signal.SIGKILL
    ran = G.executed(dsn, tid)
    assert ran == ["v1:fetch", "v1:review"]
    before = raw_rows(dsn, tid)
    # on_busy="wait": the dead run's lease (1.5 s) must expire before we get the thread.
    opts: dict[str, Any] = {"on_busy": "wait", "busy_timeout": 30}
    with DurablePostgresSaver.from_conn_string(dsn, graph_version="v2", **opts) as saver:
        g2 = G.build_v2().compile(checkpointer=saver)
        with pytest.raises(GraphVersionMismatchError) as err:
            g2.invoke(None, cfg(tid))
        assert (err.value.stored, err.value.current) == ("v1", "v2")
        assert G.executed(dsn, tid) == ran
        assert raw_rows(dsn, tid) == before
        assert g2.get_state(cfg(tid)).values["log"] == ["fetch"]

    with DurablePostgresSaver.from_conn_string(
        dsn, graph_version="v2", migrations=G.registry, **opts
    ) as saver:
        g2 = G.build_v2().compile(checkpointer=saver)
        out = g2.invoke(None, cfg(tid))  # review's pending work now runs on approve
        assert "__interrupt__" in out
        out = g2.invoke(Command(resume="yes"), cfg(tid))
        assert out["log"] == ["fetch", "approve", "summarize"]
        assert (out["subject"], out["priority"], out["answer"]) == ("urgent", 1, "yes")
    assert G.executed(dsn, tid) == [*ran, "v2:approve", "v2:approve", "v2:summarize"]


def test_pending_work_of_a_removed_node_needs_a_mapping(dsn: str) -> None:
    tid = "removed-1"
    with DurablePostgresSaver.from_conn_string(dsn) as saver:
        g1 = G.build_v1().compile(checkpointer=saver.bind(graph_version="v1"), interrupt_before=["audit"])
        g1.invoke({"log": [], "topic": "x"}, cfg(tid))
        g1.invoke(Command(resume="ok"), cfg(tid))
        assert g1.get_state(cfg(tid)).next == ("audit",)
        ran, before = G.executed(dsn, tid), raw_rows(dsn, tid)

        partial = MigrationRegistry()
        partial.register("v1", "v2", rename_nodes={"review": "approve"})
        g2 = G.build_v2().compile(checkpointer=saver.bind(graph_version="v2", migrations=partial))
        with pytest.raises(OrphanedWorkError) as err:
            g2.invoke(None, cfg(tid))
        assert err.value.nodes == ["audit"] and isinstance(err.value, MigrationError)
        assert (G.executed(dsn, tid), raw_rows(dsn, tid)) == (ran, before)
        assert log_count(dsn, tid) == 0

        # Discarding it on purpose passes the check (dry run: nothing written).
        dropping = MigrationRegistry()
        dropping.register("v1", "v2", rename_nodes={"review": "approve"}, drop_nodes=["audit"])
        report = migrate_threads(
            saver, "v1", "v2", graph=G.graph_v2, registry=dropping, dry_run=True, thread_ids=[tid]
        )
        assert report.migrated == [tid] and report.ok
        assert raw_rows(dsn, tid) == before

        # Mapped onto summarize (the module registry): the thread finishes there.
        g2 = G.build_v2().compile(checkpointer=saver.bind(graph_version="v2", migrations=G.registry))
        out = g2.invoke(None, cfg(tid))
        assert out["log"] == ["fetch", "review", "summarize"]
        assert G.executed(dsn, tid) == [*ran, "v2:summarize"]


def test_failing_migration_leaves_the_thread_untouched(dsn: str) -> None:
    tid = "failing-1"
    with DurablePostgresSaver.from_conn_string(dsn) as saver:
        pause_v1_in_review(saver, tid)
        ran, before = G.executed(dsn, tid), raw_rows(dsn, tid)

        def boom(state: dict[str, Any]) -> dict[str, Any]:
            raise RuntimeError("bad data")

        broken = MigrationRegistry()
        broken.register("v1", "v2", boom, rename_nodes={"review": "approve", "audit": "summarize"})
        def returns_nothing(state: dict[str, Any]) -> Any:
            state["priority"] = 3  # forgets to return the state

        not_a_dict = MigrationRegistry()
        not_a_dict.register("v1", "v2", returns_nothing)
        for registry, cause in ((broken, RuntimeError), (not_a_dict, TypeError)):
            g2 = G.build_v2().compile(checkpointer=saver.bind(graph_version="v2", migrations=registry))
            with pytest.raises(MigrationError) as err:
                g2.invoke(Command(resume="yes"), cfg(tid))
            assert isinstance(err.value.__cause__, cause)
            assert (err.value.thread_id, err.value.from_version, err.value.to_version) == (tid, "v1", "v2")
            assert "untouched" in str(err.value)
            assert G.executed(dsn, tid) == ran
            assert raw_rows(dsn, tid) == before
            assert log_count(dsn, tid) == 0
            row = thread_row(dsn, tid)
            assert (row["status"], row["graph_version"], row["lease_owner"]) == ("waiting", "v1", None)

        # Fixed: the same thread migrates and finishes.
        g2 = G.build_v2().compile(checkpointer=saver.bind(graph_version="v2", migrations=G.registry))
        assert g2.invoke(Command(resume="yes"), cfg(tid))["log"] == ["fetch", "approve", "summarize"]


def test_chained_migration_v1_v2_v3(dsn: str) -> None:
    tid = "chain-1"
    with DurablePostgresSaver.from_conn_string(dsn) as saver:
        pause_v1_in_review(saver, tid)
        g3 = G.build_v3().compile(checkpointer=saver.bind(graph_version="v3", migrations=G.registry))
        out = g3.invoke(Command(resume="yes"), cfg(tid))
        assert out["log"] == ["fetch", "confirm", "summarize"]
        assert (out["subject"], out["priority"]) == ("urgent", 12)  # (1) * 2 + 10
        assert G.executed(dsn, tid)[-2:] == ["v3:confirm", "v3:summarize"]
        [entry] = migration_log(saver, thread_id=tid)
        assert entry["steps"] == ["v1->v2", "v2->v3"] and entry["origin"] == "run"
        assert (entry["from_version"], entry["to_version"]) == ("v1", "v3")


def test_finished_task_of_a_renamed_node_is_not_rerun(dsn: str) -> None:
    """Parallel left/right joined by a barrier; left finished, right interrupted.
    left -> west: left's stored writes move to west's task id and are handed back."""
    tid = "parallel-1"
    with DurablePostgresSaver.from_conn_string(dsn) as saver:
        p1 = G.build_parallel("left").compile(checkpointer=saver.bind(graph_version="p1"))
        p1.invoke({"log": []}, cfg(tid))
        assert sorted(G.executed(dsn, tid)) == ["p1:left", "p1:right"]
        reg = MigrationRegistry()
        reg.register("p1", "p2", rename_nodes={"left": "west"})
        p2 = G.build_parallel("west").compile(
            checkpointer=saver.bind(graph_version="p2", migrations=reg)
        )
        out = p2.invoke(Command(resume="r"), cfg(tid))
        assert sorted(out["log"]) == ["combine", "left", "right"]
        assert out["answer"] == "r"
        ran = G.executed(dsn, tid)
        assert "p2:west" not in ran
        assert ran[2:] == ["p2:right", "p2:combine"]


def test_finished_sends_to_a_renamed_node_are_not_rerun(dsn: str) -> None:
    tid = "fanout-1"
    with DurablePostgresSaver.from_conn_string(dsn) as saver:
        f1 = G.build_fanout("worker").compile(checkpointer=saver.bind(graph_version="f1"))
        f1.invoke({"log": []}, cfg(tid))
        assert sorted(G.executed(dsn, tid)) == ["f1:worker:a", "f1:worker:b", "f1:worker:c"]
        reg = MigrationRegistry()
        reg.register("f1", "f2", rename_nodes={"worker": "handler"})
        f2 = G.build_fanout("handler").compile(
            checkpointer=saver.bind(graph_version="f2", migrations=reg)
        )
        out = f2.invoke(Command(resume="B"), cfg(tid))
        assert sorted(out["log"]) == ["done", "handler:b", "worker:a", "worker:c"]
        assert G.executed(dsn, tid)[3:] == ["f2:handler:b", "f2:done"]


def test_subgraph_change_is_refused(dsn: str) -> None:
    """A changed subgraph changes the fingerprint: strict refuses; the default policy
    lets the thread go on, as the changed subgraph has no pending work (the thread is
    paused in ``gate``, after it)."""
    tid = "subgraph-1"
    with DurablePostgresSaver.from_conn_string(dsn) as saver:
        old = G.build_with_subgraph(False).compile(checkpointer=saver)
        assert "__interrupt__" in old.invoke({"log": []}, cfg(tid))
        ran = G.executed(dsn, tid)
        new = G.build_with_subgraph(True).compile(checkpointer=saver.bind(version_policy="strict"))
        with pytest.raises(GraphVersionMismatchError) as err:
            new.invoke(Command(resume="go"), cfg(tid))
        assert err.value.stored == graph_fingerprint(old) != graph_fingerprint(new)
        assert G.executed(dsn, tid) == ran
        default = G.build_with_subgraph(True).compile(checkpointer=saver)
        default.invoke(Command(resume="go"), cfg(tid))
        assert G.executed(dsn, tid) == [*ran, "outer:gate"]


# --- policies ----------------------------------------------------------------------


def test_policies_warn_and_per_invoke_override(dsn: str, caplog: pytest.LogCaptureFixture) -> None:
    with DurablePostgresSaver.from_conn_string(dsn) as saver:
        for tid in ("warn-1", "override-1", "badpolicy-1"):
            pause_v1_in_review(saver, tid)

        warn = G.build_v2().compile(checkpointer=saver.bind(graph_version="v2", version_policy="warn"))
        with caplog.at_level(logging.WARNING, logger="langgraph_durable"):
            out = warn.invoke(None, cfg("warn-1"))
        messages = [r.getMessage() for r in caplog.records if "version_policy=warn" in r.getMessage()]
        assert len(messages) == 1 and "['review']" in messages[0]
        assert out["log"] == ["fetch"]  # LangGraph's stock behaviour: review's work is skipped

        refuse = G.build_v2().compile(checkpointer=saver.bind(graph_version="v2"))
        caplog.clear()
        with caplog.at_level(logging.WARNING, logger="langgraph_durable"):
            refuse.invoke({"log": []}, cfg("override-1", version_policy="auto-upgrade"))
        assert not [r for r in caplog.records if "version_policy" in r.getMessage()]
        latest = saver.get_tuple(cfg("override-1"))
        assert latest is not None and latest.metadata["graph_version"] == "v2"

        ran = G.executed(dsn, "badpolicy-1")
        with pytest.raises(ConfigurationError):
            refuse.invoke(None, cfg("badpolicy-1", version_policy="yolo"))
        assert G.executed(dsn, "badpolicy-1") == ran
    with pytest.raises(ConfigurationError):
        DurablePostgresSaver.from_conn_string(dsn, version_policy="yolo").__enter__()


def test_unversioned_threads_adopt_or_refuse(dsn: str) -> None:
    from langgraph.checkpoint.postgres import PostgresSaver

    with psycopg.connect(dsn, autocommit=True, prepare_threshold=0, row_factory=dict_row) as conn:
        stock = PostgresSaver(conn)
        graph = G.build_v2().compile(checkpointer=stock)
        for tid in ("legacy-adopt", "legacy-refuse"):
            graph.invoke({"log": []}, cfg(tid))
    with DurablePostgresSaver.from_conn_string(dsn, graph_version="v2") as saver:
        before = saver.get_tuple(cfg("legacy-adopt"))
        assert before is not None and "graph_version" not in before.metadata
        g2 = G.build_v2().compile(checkpointer=saver)
        g2.invoke(Command(resume="yes"), cfg("legacy-adopt"))
        after = saver.get_tuple(cfg("legacy-adopt"))
        assert after is not None and after.metadata["graph_version"] == "v2"
    with DurablePostgresSaver.from_conn_string(
        dsn, graph_version="v2", unversioned_policy="refuse"
    ) as saver:
        g2 = G.build_v2().compile(checkpointer=saver)
        ran = G.executed(dsn, "legacy-refuse")
        with pytest.raises(GraphVersionMismatchError) as err:
            g2.invoke(Command(resume="yes"), cfg("legacy-refuse"))
        assert (err.value.stored, err.value.current) == (None, "v2")
        assert G.executed(dsn, "legacy-refuse") == ran
        g2.invoke(Command(resume="yes"), cfg("legacy-refuse", version_policy="auto-upgrade"))


def test_new_input_on_an_old_thread_is_checked_too(dsn: str) -> None:
    """Decision: not only resumes; new input would run the old state on the new graph."""
    tid = "newinput-1"
    with DurablePostgresSaver.from_conn_string(dsn) as saver:
        g1 = pause_v1_in_review(saver, tid)
        g1.invoke(Command(resume="ok"), cfg(tid))
        assert g1.get_state(cfg(tid)).next == ()
        ran = G.executed(dsn, tid)
        g2 = G.build_v2().compile(checkpointer=saver.bind(graph_version="v2"))
        with pytest.raises(GraphVersionMismatchError):
            g2.invoke({"log": [], "subject": "again"}, cfg(tid))
        assert G.executed(dsn, tid) == ran
        # An identity migration declares v2 able to continue v1 threads as they are.
        same = MigrationRegistry()
        same.register("v1", "v2")
        g2 = G.build_v2().compile(checkpointer=saver.bind(graph_version="v2", migrations=same))
        out = g2.invoke({"log": [], "subject": "again"}, cfg(tid))
        assert out["log"][-2:] == ["summarize", "fetch"] and out["topic"] == "urgent"
        assert "__interrupt__" in out  # approve asks: it is v2 running the v1 thread
        assert G.executed(dsn, tid)[len(ran):] == ["v2:fetch", "v2:approve"]


async def test_async_saver_migrates_on_resume(dsn: str) -> None:
    tid = "async-1"
    async with AsyncDurablePostgresSaver.from_conn_string(dsn) as saver:
        g1 = G.build_v1().compile(checkpointer=saver.bind(graph_version="v1"))
        await g1.ainvoke({"log": [], "topic": "urgent"}, cfg(tid))
        g2 = G.build_v2().compile(checkpointer=saver.bind(graph_version="v2"))
        with pytest.raises(GraphVersionMismatchError):
            await g2.ainvoke(Command(resume="yes"), cfg(tid))
        g2 = G.build_v2().compile(
            checkpointer=saver.bind(graph_version="v2", migrations=G.registry)
        )
        out = await g2.ainvoke(Command(resume="yes"), cfg(tid))
        assert out["log"] == ["fetch", "approve", "summarize"]
        assert (out["subject"], out["priority"]) == ("urgent", 1)


async def test_async_batch_migration_reports_progress(dsn: str) -> None:
    tids = ["abatch-1", "abatch-2"]
    async with AsyncDurablePostgresSaver.from_conn_string(dsn) as saver:
        g1 = G.build_v1().compile(checkpointer=saver.bind(graph_version="v1"))
        for tid in tids:
            out = await g1.ainvoke({"log": [], "topic": "urgent"}, cfg(tid))
            assert "__interrupt__" in out
        seen: list[tuple[str, str]] = []
        report = await amigrate_threads(
            saver, "v1", "v2", graph=G.graph_v2, registry=G.registry, thread_ids=tids,
            on_progress=lambda tid, outcome: seen.append((tid, outcome)),
        )
        assert sorted(report.migrated) == tids and report.ok
        assert sorted(seen) == [(t, "migrated") for t in tids]
        g2 = G.build_v2().compile(checkpointer=saver.bind(graph_version="v2"))
        out = await g2.ainvoke(Command(resume="yes"), cfg(tids[0]))
        assert out["log"] == ["fetch", "approve", "summarize"]


async def test_async_undo_migration_restores_the_stored_version(dsn: str) -> None:
    """aundo_migration, undo_migration's async twin: the thread is back on v1 with the
    pre-migration checkpoint, and a second undo has nothing left to undo."""
    tid = "aundo-1"
    async with AsyncDurablePostgresSaver.from_conn_string(dsn) as saver:
        g1 = G.build_v1().compile(checkpointer=saver.bind(graph_version="v1"))
        await g1.ainvoke({"log": [], "topic": "urgent"}, cfg(tid))
        before = await saver.aget_tuple(cfg(tid))
        assert before is not None
        report = await amigrate_threads(
            saver, "v1", "v2", graph=G.graph_v2, registry=G.registry, thread_ids=[tid]
        )
        assert report.migrated == [tid]
        undone = await aundo_migration(saver, tid)
        assert (undone["restored_version"], undone["undone_version"]) == ("v1", "v2")
        after = await saver.aget_tuple(cfg(tid))
        assert after is not None and after.checkpoint == before.checkpoint
        assert after.metadata["graph_version"] == "v1"
        with pytest.raises(MigrationError, match="no migration to undo"):
            await aundo_migration(saver, tid)


# --- batch migration, interrupt ids, busy threads, undo ---------------------------------


def test_batch_migration_remaps_interrupt_ids_and_can_be_undone(dsn: str) -> None:
    from langgraph.types import _interrupt_id

    tids = ["batch-1", "batch-2", "batch-3"]
    with DurablePostgresSaver.from_conn_string(dsn) as saver:
        for tid in tids:
            pause_v1_in_review(saver, tid)
        before = {tid: raw_rows(dsn, tid) for tid in tids}

        dry = migrate_threads(saver, "v1", "v2", graph=G.graph_v2, registry=G.registry,
                              dry_run=True, thread_ids=tids)
        assert sorted(dry.migrated) == tids and dry.dry_run
        assert {tid: raw_rows(dsn, tid) for tid in tids} == before

        # batch-3 is held by a live run elsewhere: reported busy, left alone.
        with psycopg.connect(dsn, autocommit=True) as conn:
            conn.execute(
                "UPDATE durable_threads SET lease_owner = 'elsewhere', "
                "lease_expires_at = now() + interval '5 minutes' WHERE thread_id = 'batch-3'"
            )
        report = migrate_threads(saver, "v1", "v2", graph=G.graph_v2, registry=G.registry,
                                 thread_ids=tids)
        assert sorted(report.migrated) == ["batch-1", "batch-2"] and report.busy == ["batch-3"]
        assert not report.ok
        assert raw_rows(dsn, "batch-3") == before["batch-3"]
        with psycopg.connect(dsn, autocommit=True) as conn:
            conn.execute(
                "UPDATE durable_threads SET lease_owner = NULL, lease_expires_at = NULL "
                "WHERE thread_id = 'batch-3'"
            )

        # The pending interrupt now belongs to approve's task, with approve's id.
        g2 = G.build_v2().compile(checkpointer=saver.bind(graph_version="v2"))
        state = g2.get_state(cfg("batch-1"))
        [task] = state.tasks
        assert task.name == "approve"
        [intr] = task.interrupts
        assert intr.id == _interrupt_id(f"approve:{task.id}", 0)
        ran = G.executed(dsn, "batch-1")
        out = g2.invoke(Command(resume={intr.id: "mapped"}), cfg("batch-1"))
        assert (out["answer"], out["log"]) == ("mapped", ["fetch", "approve", "summarize"])
        assert G.executed(dsn, "batch-1") == [*ran, "v2:approve", "v2:summarize"]

        # Undo batch-2: the stored rows are back byte for byte; v1 code resumes it.
        undone = undo_migration(saver, "batch-2")
        assert (undone["restored_version"], undone["undone_version"]) == ("v1", "v2")
        after = raw_rows(dsn, "batch-2")
        assert after["checkpoints"] == before["batch-2"]["checkpoints"]
        assert after["writes"] == before["batch-2"]["writes"]
        assert set(before["batch-2"]["blobs"]) <= set(after["blobs"])
        g1 = G.build_v1().compile(checkpointer=saver.bind(graph_version="v1"))
        assert g1.invoke(Command(resume="ok"), cfg("batch-2"))["log"] == [
            "fetch", "review", "audit", "summarize"
        ]
        with pytest.raises(MigrationError, match="no migration to undo"):
            undo_migration(saver, "batch-2")
        with pytest.raises(MigrationError, match="moved on"):
            undo_migration(saver, "batch-1")
        assert {r["thread_id"] for r in list_threads(saver, version="v1", any_version=False)} >= {
            "batch-2", "batch-3"
        }
        # Deleting a thread deletes its migration backups too.
        assert log_count(dsn, "batch-1") == 1
        saver.delete_thread("batch-1")
        assert log_count(dsn, "batch-1") == 0


def test_apply_migrations_is_pure() -> None:
    """The function behind every migration never mutates what it is given."""
    from langgraph.types import Send

    checkpoint = {
        "v": 4, "id": "1f0e0000-0000-6000-8000-000000000000",
        "channel_values": {"branch:to:review": None, "log": ["fetch"], "topic": "t",
                           "__pregel_tasks": [Send("review", {"x": 1})]},
        "channel_versions": {"branch:to:review": "3.1", "log": "3.1", "topic": "2.1",
                             "__pregel_tasks": "3.1"},
        "versions_seen": {"fetch": {"branch:to:fetch": "2.1"}},
        "updated_channels": ["branch:to:review"],
    }
    snapshot = json.dumps(checkpoint, default=repr, sort_keys=True)
    reg = MigrationRegistry()
    reg.register("v1", "v2", G.v1_to_v2, rename_nodes={"review": "approve"},
                 rename_channels={"topic": "subject"})
    chain = reg.path("v1", "v2")
    assert chain is not None
    result = apply_migrations(chain, checkpoint, [], next_version=lambda v: "9.9", metadata={"step": 1})
    assert json.dumps(checkpoint, default=repr, sort_keys=True) == snapshot
    values = result.checkpoint["channel_values"]
    assert "branch:to:approve" in values and "branch:to:review" not in values
    assert values["__pregel_tasks"] == [Send("approve", {"x": 1})]
    assert (values["subject"], values["priority"]) == ("t", 0)
    assert result.checkpoint["channel_versions"]["priority"] == "9.9"
    assert result.checkpoint["updated_channels"] == ["branch:to:approve"]


@pytest.mark.parametrize(
    ("kwargs", "fragment"),
    [
        ({"from_version": "v1", "to_version": "v1"}, "must change the version"),
        ({"from_version": "", "to_version": "v2"}, "non-empty"),
        ({"from_version": "v1", "to_version": "v2", "rename_nodes": {"a": "a"}}, "cannot rename"),
        ({"from_version": "v1", "to_version": "v2", "rename_nodes": {"__start__": "b"}}, "cannot rename"),
        ({"from_version": "v1", "to_version": "v2", "rename_nodes": {"a": "b"}, "drop_nodes": ["a"]},
         "both renamed and dropped"),
        ({"from_version": "v1", "to_version": "v2", "rename_channels": {"branch:to:a": "x"}},
         "state keys only"),
        ({"from_version": "v1", "to_version": "v2", "fn": 42}, "callable"),
    ],
)
def test_registry_rejects_bad_migrations(kwargs: dict[str, Any], fragment: str) -> None:
    reg = MigrationRegistry()
    with pytest.raises(ConfigurationError, match=fragment):
        reg.register(**kwargs)
    assert len(reg) == 0


def test_registry_finds_the_shortest_chain() -> None:
    reg = MigrationRegistry()
    reg.register("v1", "v2")
    reg.register("v2", "v3")
    reg.register("v1", "v3")

    @reg.register("v3", "v4")
    def bump(state: dict[str, Any]) -> dict[str, Any]:
        return state

    assert [m.label for m in reg.path("v1", "v4") or []] == ["v1->v3", "v3->v4"]
    assert reg.path("v4", "v1") is None and reg.path("v2", "v2") == []
    assert next(m for m in reg if m.label == "v3->v4").fn is bump


# --- CLI ---------------------------------------------------------------------------------


@pytest.fixture
def cli_dsn(admin_dsn: str, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    """A database of its own, so counts are exact."""
    from conftest import drop_database, make_database

    url = make_database(admin_dsn, "versions_cli")
    with DurablePostgresSaver.from_conn_string(url) as saver:
        saver.setup()
    G.ensure_side_table(url)
    monkeypatch.setenv(G.DSN_ENV, url)
    yield url
    drop_database(admin_dsn, url)


def test_cli_list_migrate_log_undo(cli_dsn: str) -> None:
    from typer.testing import CliRunner

    from langgraph_durable.cli import app

    runner = CliRunner()

    def run(*args: str, code: int = 0) -> Any:
        result = runner.invoke(app, ["versions", *args, "--dsn", cli_dsn])
        assert result.exit_code == code, (result.output, result.exception)
        return result

    with DurablePostgresSaver.from_conn_string(cli_dsn) as saver:
        for tid in ("cli-1", "cli-2", "cli-3"):
            pause_v1_in_review(saver, tid)
        G.build_v1().compile(checkpointer=saver.bind(graph_version="v1")).invoke(
            Command(resume="ok"), cfg("cli-3")
        )
        G.build_v2().compile(checkpointer=saver.bind(graph_version="v2")).invoke(
            {"log": []}, cfg("cli-4")
        )
    before = {tid: raw_rows(cli_dsn, tid) for tid in ("cli-1", "cli-2", "cli-3")}

    groups = {g["graph_version"]: g for g in json.loads(run("list", "--json").stdout)}
    assert set(groups) == {"v1", "v2"}
    assert (groups["v1"]["threads"], groups["v1"]["unfinished"]) == (3, 2)
    assert groups["v1"]["by_status"] == {"waiting": 2, "done": 1}
    assert groups["v2"]["by_status"] == {"waiting": 1}
    table = run("list").stdout
    assert "v1" in table and "waiting 2" in table
    rows = json.loads(run("list", "--version", "v1", "--json").stdout)
    assert sorted(r["thread_id"] for r in rows) == ["cli-1", "cli-2", "cli-3"]
    waiting = json.loads(run("list", "--status", "waiting", "--json").stdout)
    assert sorted(r["thread_id"] for r in waiting) == ["cli-1", "cli-2", "cli-4"]

    graph = f"{GRAPHS_FILE}:graph_v2"
    dry = json.loads(run("migrate", "--from", "v1", "--to", "v2", "--graph", graph,
                         "--dry-run", "--json").stdout)
    assert sorted(dry["migrated"]) == ["cli-1", "cli-2", "cli-3"] and dry["dry_run"]
    assert {tid: raw_rows(cli_dsn, tid) for tid in before} == before

    out = run("migrate", "--from", "v1", "--to", "v2", "--graph", graph,
              "--migrations", f"{GRAPHS_FILE}:registry").stdout
    assert "migrated 3, failed 0, busy 0" in out
    groups = {g["graph_version"]: g for g in json.loads(run("list", "--json").stdout)}
    assert set(groups) == {"v2"} and groups["v2"]["threads"] == 4

    [entry] = json.loads(run("log", "--thread", "cli-1", "--json").stdout)
    assert (entry["from_version"], entry["to_version"], entry["origin"]) == ("v1", "v2", "batch")
    assert entry["steps"] == ["v1->v2"] and entry["old_writes"] == 1

    assert "undone" in run("undo", "cli-2").stdout
    assert raw_rows(cli_dsn, "cli-2")["checkpoints"] == before["cli-2"]["checkpoints"]
    rows = json.loads(run("list", "--version", "v1", "--json").stdout)
    assert [r["thread_id"] for r in rows] == ["cli-2"]
    run("undo", "cli-2", code=1)

    # No path, or no such graph: a clear message and exit code 2.
    failed = run("migrate", "--from", "v0", "--to", "v2", "--graph", graph, code=2)
    assert "no registered migration path" in failed.output
    failed = run("migrate", "--from", "v1", "--graph", "no_such_module_lgd:graph", code=2)
    assert "cannot import" in failed.output

    fp = runner.invoke(app, ["versions", "fingerprint", "--graph", graph, "--json"])
    assert fp.exit_code == 0, fp.output
    assert json.loads(fp.stdout)["fingerprint"] == graph_fingerprint(G.graph_v2)
