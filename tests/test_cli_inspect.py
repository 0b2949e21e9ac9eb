"""The inspection CLI (`threads list|show|history|diff|status`, `stats`) on real data.

A module fixture runs small graphs into the test database so that every state a
thread can be in exists: done, waiting (interrupt), error with a finished sibling
task, quarantined (poison), untracked (leases off), and a live run for `running`.
Each command is checked in its rich form and with --json, against LangGraph's own
view where one exists (``graph.get_state``, ``saver.list``).
"""

from __future__ import annotations

import json
import operator
import re
import threading
from collections.abc import Iterator
from typing import Annotated, Any, TypedDict

import pytest
from langgraph.graph import END, START, StateGraph
from langgraph.types import Command, interrupt
from typer.testing import CliRunner

from langgraph_durable import DurablePostgresSaver, PoisonCheckpointError
from langgraph_durable.cli import app
from langgraph_durable.ops import inspection as lgi

runner = CliRunner()

# Big, repeated documents: above the artifact threshold, shared by two threads.
DOCS = [f"document {i}: " + ("lorem ipsum dolor sit amet " * 80) for i in range(4)]


class State(TypedDict, total=False):
    docs: Annotated[list[str], operator.add]
    notes: Annotated[list[str], operator.add]
    answer: str


def _fetch(state: State) -> dict[str, Any]:
    return {"docs": DOCS}


def _note(name: str) -> Any:
    def node(state: State) -> dict[str, Any]:
        return {"notes": [f"{name} read {len(state['docs'])} docs"]}

    return node


def _pipeline() -> StateGraph:
    g = StateGraph(State)
    g.add_node("fetch", _fetch)
    g.add_node("summarize", _note("summarize"))
    g.add_node("review", _note("review"))
    g.add_edge(START, "fetch")
    g.add_edge("fetch", "summarize")
    g.add_edge("summarize", "review")
    g.add_edge("review", END)
    return g


def _ask(state: State) -> dict[str, Any]:
    return {"answer": interrupt("approve the summary?")}


def _waiting_graph() -> StateGraph:
    g = StateGraph(State)
    g.add_node("fetch", _fetch)
    g.add_node("ask", _ask)
    g.add_edge(START, "fetch")
    g.add_edge("fetch", "ask")
    g.add_edge("ask", END)
    return g


def _boom(state: State) -> dict[str, Any]:
    raise RuntimeError("upstream API returned 500")


def _failing_graph() -> StateGraph:
    """fetch, then `ok` and `boom` in one step: ok's writes persist beside boom's error."""
    g = StateGraph(State)
    g.add_node("fetch", _fetch)
    g.add_node("ok", _note("ok"))
    g.add_node("boom", _boom)
    g.add_edge(START, "fetch")
    g.add_edge("fetch", "ok")
    g.add_edge("fetch", "boom")
    g.add_edge(["ok", "boom"], END)
    return g


def cfg(thread_id: str) -> Any:
    return {"configurable": {"thread_id": thread_id}}


@pytest.fixture(scope="module")
def data(dsn: str) -> Iterator[dict[str, Any]]:
    with DurablePostgresSaver.from_conn_string(dsn, max_resume_attempts=1) as saver:
        saver.setup()
        pipeline = _pipeline().compile(checkpointer=saver)
        pipeline.invoke({"docs": [], "notes": []}, cfg("t-done"))
        pipeline.invoke({"docs": [], "notes": []}, cfg("t-done-2"))

        waiting = _waiting_graph().compile(checkpointer=saver)
        waiting.invoke({"docs": []}, cfg("t-wait"))

        failing = _failing_graph().compile(checkpointer=saver)
        for tid in ("t-error", "t-poison"):
            with pytest.raises(RuntimeError):
                failing.invoke({"docs": []}, cfg(tid))
        # A second failed resume at the same checkpoint passes max_resume_attempts=1.
        with pytest.raises(PoisonCheckpointError):
            failing.invoke(None, cfg("t-poison"))
        with DurablePostgresSaver.from_conn_string(dsn, leases=False) as plain:
            _pipeline().compile(checkpointer=plain).invoke(
                {"docs": [], "notes": []}, cfg("t-plain")
            )
        yield {
            "pipeline": pipeline,
            "waiting": waiting,
            "failing": failing,
            "wait_state": waiting.get_state(cfg("t-wait")),
            "error_state": failing.get_state(cfg("t-error")),
        }


def run(*args: str) -> Any:
    result = runner.invoke(app, list(args))
    return result


def run_json(*args: str) -> Any:
    result = runner.invoke(app, [*args, "--json"])
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout)


# ------------------------------------------------------------------ list
def test_list_json_states(dsn: str, data: dict[str, Any]) -> None:
    rows = {r["thread_id"]: r for r in run_json("threads", "list", "--dsn", dsn)}
    assert {rows[t]["state"] for t in ("t-done", "t-done-2")} == {"done"}
    assert rows["t-wait"]["state"] == "waiting"
    assert rows["t-error"]["state"] == "recoverable" and rows["t-error"]["status"] == "error"
    assert rows["t-poison"]["state"] == "quarantined"
    assert rows["t-plain"]["state"] == "untracked" and rows["t-plain"]["status"] is None
    done = rows["t-done"]
    history = list(data["pipeline"].get_state_history(cfg("t-done")))
    assert done["checkpoints"] == len(history)
    assert done["step"] == history[0].metadata["step"]
    assert done["graph_version"].startswith("fp-")
    assert done["bytes"] == done["row_bytes"] + done["artifact_bytes"] > 0
    assert done["artifacts"] >= len(DOCS)
    assert done["last_activity"]


def test_list_filters(dsn: str, data: dict[str, Any]) -> None:
    assert [
        r["thread_id"] for r in run_json("threads", "list", "--status", "waiting", "--dsn", dsn)
    ] == ["t-wait"]
    assert [r["thread_id"] for r in run_json("threads", "list", "-s", "error", "--dsn", dsn)] == [
        "t-error"
    ]
    assert {
        r["thread_id"] for r in run_json("threads", "list", "--prefix", "t-done", "--dsn", dsn)
    } == {
        "t-done",
        "t-done-2",
    }
    assert len(run_json("threads", "list", "--limit", "2", "--dsn", dsn)) == 2


def test_list_table(dsn: str, data: dict[str, Any]) -> None:
    result = run("threads", "list", "--dsn", dsn)
    assert result.exit_code == 0, result.output
    for tid in ("t-done", "t-wait", "t-error", "t-poison", "t-plain"):
        assert tid in result.output
    for state in ("done", "waiting", "recoverable", "quarantined", "untracked"):
        assert state in result.output
    empty = run("threads", "list", "--status", "running", "--dsn", dsn)
    assert empty.exit_code == 0 and "no threads match" in empty.output


# ------------------------------------------------------------------ show
def test_show_waiting_thread(dsn: str, data: dict[str, Any]) -> None:
    info = run_json("threads", "show", "t-wait", "--dsn", dsn)
    snapshot = data["wait_state"]
    assert info["state"] == "waiting"
    assert info["next"] == list(snapshot.next) == ["ask"]
    assert info["checkpoint"]["id"] == snapshot.config["configurable"]["checkpoint_id"]
    assert info["checkpoint"]["step"] == snapshot.metadata["step"]
    assert [i["node"] for i in info["interrupts"]] == ["ask"]
    assert "approve the summary?" in info["interrupts"][0]["value"]
    docs = next(c for c in info["channels"] if c["channel"] == "docs")
    # The list is decoded through the saver (artifacts re-hydrated): its logical size
    # is the documents' size, while the row holds a small reference envelope.
    assert docs["size"] > sum(len(d) for d in DOCS)
    assert docs["storage"] == "artifact-ref" and docs["stored"] < docs["size"] / 10
    assert info["lease"] is None and info["quarantine"] is None

    result = run("threads", "show", "t-wait", "--dsn", dsn)
    assert result.exit_code == 0, result.output
    assert "interrupt" in result.output and "approve the summary?" in result.output
    assert "artifact-ref" in result.output and "docs" in result.output


def test_show_error_thread_lists_finished_sibling(dsn: str, data: dict[str, Any]) -> None:
    info = run_json("threads", "show", "t-error", "--dsn", dsn)
    snapshot = data["error_state"]
    assert info["state"] == "recoverable" and info["status"] == "error"
    assert "upstream API returned 500" in info["last_error"]
    assert [t["node"] for t in info["finished_tasks"]] == ["ok"]
    assert [e["node"] for e in info["errors"]] == ["boom"]
    assert info["next"] == list(snapshot.next) == ["boom"]
    result = run("threads", "show", "t-error", "--dsn", dsn)
    assert result.exit_code == 0, result.output
    assert "restored on resume" in result.output and "upstream API returned 500" in result.output


def test_show_quarantined_thread(dsn: str, data: dict[str, Any]) -> None:
    info = run_json("threads", "show", "t-poison", "--dsn", dsn)
    assert info["state"] == "quarantined"
    assert info["quarantine"]["attempts"] >= 1
    assert "upstream API returned 500" in info["quarantine"]["last_error"]
    result = run("threads", "show", "t-poison", "--dsn", dsn)
    assert result.exit_code == 0 and "quarantined" in result.output


def test_show_done_and_missing(dsn: str, data: dict[str, Any]) -> None:
    info = run_json("threads", "show", "t-done", "--all", "--dsn", dsn)
    assert info["next"] == [] and info["state"] == "done" and info["attempts"] == 0
    notes = next(c for c in info["channels"] if c["channel"] == "notes")
    assert "summarize read 4 docs" in notes["preview"]
    result = run("threads", "show", "t-done", "--dsn", dsn)
    assert "the run is complete" in result.output
    missing = run("threads", "show", "no-such-thread", "--dsn", dsn)
    assert missing.exit_code == 1 and "not found" in missing.output


def test_show_running_thread_and_status_counts(dsn: str, data: dict[str, Any]) -> None:
    """A run blocked inside a node holds a live lease: `running` in every view."""
    entered, release = threading.Event(), threading.Event()

    def slow(state: State) -> dict[str, Any]:
        entered.set()
        release.wait()
        return {"notes": ["slow done"]}

    g = StateGraph(State)
    g.add_node("slow", slow)
    g.add_edge(START, "slow")
    g.add_edge("slow", END)
    errors: list[BaseException] = []
    with DurablePostgresSaver.from_conn_string(dsn) as saver:
        graph = g.compile(checkpointer=saver)

        def target() -> None:
            try:
                graph.invoke({"notes": []}, cfg("t-live"))
            except BaseException as exc:  # surfaced by the assert below
                errors.append(exc)

        worker = threading.Thread(target=target)
        worker.start()
        try:
            entered.wait()
            info = run_json("threads", "show", "t-live", "--dsn", dsn)
            assert info["state"] == "running" and info["lease"]["live"] is True
            counts = run_json("threads", "status", "--dsn", dsn)
            assert counts["running"] == 1
            table = run("threads", "show", "t-live", "--dsn", dsn)
            assert "token" in table.output and "expires in" in table.output
        finally:
            release.set()
            worker.join()
    assert not errors
    assert run_json("threads", "show", "t-live", "--dsn", dsn)["state"] == "done"


def test_status_counts(dsn: str, data: dict[str, Any]) -> None:
    counts = run_json("threads", "status", "--untracked", "--dsn", dsn)
    expected = {r["state"]: 0 for r in run_json("threads", "list", "--limit", "1000", "--dsn", dsn)}
    for r in run_json("threads", "list", "--limit", "1000", "--dsn", dsn):
        expected[r["state"]] += 1
    for state, n in expected.items():
        assert counts[state] == n
    assert counts["waiting"] == 1 and counts["quarantined"] == 1 and counts["error"] == 1
    assert counts["recoverable"] >= 1 and counts["untracked"] == 1
    assert counts["total"] == sum(counts[s] for s in lgi.STATES)
    assert run_json("threads", "--status", "--untracked", "--dsn", dsn) == counts
    for args in (("threads", "status"), ("threads", "--status")):
        result = run(*args, "--dsn", dsn)
        assert result.exit_code == 0, result.output
        assert "recoverable" in result.output and "quarantined" in result.output
        # Untracked threads are counted only when asked (a scan of every thread id):
        # the table says so rather than showing a 0 that was not measured.
        assert "not counted" in result.output and "total tracked" in result.output
        counted = run(*args, "--untracked", "--dsn", dsn)
        assert "not counted" not in counted.output and "written without run tracking" in counted.output
    fast = run_json("threads", "status", "--dsn", dsn)
    assert fast["untracked"] is None
    assert fast["total"] == counts["total"] - counts["untracked"]
    assert {k: v for k, v in fast.items() if k not in ("untracked", "total")} == {
        k: v for k, v in counts.items() if k not in ("untracked", "total")
    }


# ------------------------------------------------------------------ history
def test_history(dsn: str, data: dict[str, Any]) -> None:
    rows = run_json("threads", "history", "t-done", "--dsn", dsn)
    history = list(data["pipeline"].get_state_history(cfg("t-done")))
    assert [r["checkpoint_id"] for r in rows] == [
        s.config["configurable"]["checkpoint_id"] for s in history
    ]
    assert [r["step"] for r in rows] == [s.metadata["step"] for s in history]
    assert rows[-1]["source"] == "input" and rows[0]["source"] == "loop"
    by_step = {r["step"]: r for r in rows}
    # Tasks that ran from the step-0 checkpoint: fetch, which wrote the documents.
    assert [t["node"] for t in by_step[0]["writes"]] == ["fetch"]
    assert "docs" in by_step[0]["writes"][0]["channels"]
    assert "docs" in by_step[1]["updated_channels"]
    assert all(r["bytes"] > 0 for r in rows)
    assert len(run_json("threads", "history", "t-done", "--limit", "2", "--dsn", dsn)) == 2

    result = run("threads", "history", "t-done", "--dsn", dsn)
    assert result.exit_code == 0, result.output
    assert "fetch: docs" in result.output and "input" in result.output
    assert run("threads", "history", "nope", "--dsn", dsn).exit_code == 1


# ------------------------------------------------------------------ diff
def test_diff(dsn: str, data: dict[str, Any]) -> None:
    history = list(data["pipeline"].get_state_history(cfg("t-done")))
    first = history[-1].config["configurable"]["checkpoint_id"]
    last = history[0].config["configurable"]["checkpoint_id"]
    diff = run_json("threads", "diff", "t-done", first, last, "--dsn", dsn)
    assert diff["a"]["checkpoint_id"] == first and diff["b"]["checkpoint_id"] == last
    channels = {c["channel"]: c for c in diff["channels"]}
    assert channels["docs"]["change"] == "added"
    assert channels["docs"]["size_b"] > sum(len(d) for d in DOCS)
    assert channels["notes"]["change"] == "added"
    assert set(diff["changed"]) == {"docs", "notes"}

    # latest~1 -> latest: only `review` ran, adding a note; docs unchanged.
    step = run_json("threads", "diff", "t-done", "latest~1", "latest", "--dsn", dsn)
    channels = {c["channel"]: c for c in step["channels"]}
    assert step["changed"] == ["notes"]
    assert channels["notes"]["change"] == "changed" and channels["notes"]["delta"] > 0
    assert channels["docs"]["change"] == "same"

    prefix = run_json("threads", "diff", "t-done", last[:30], "latest", "--dsn", dsn)
    assert prefix["a"]["checkpoint_id"] == last and prefix["changed"] == []

    result = run("threads", "diff", "t-done", "latest~1", "latest", "--dsn", dsn)
    assert result.exit_code == 0, result.output
    assert "notes" in result.output and "changed" in result.output
    assert not re.search(r"^│ docs ", result.output, re.M)  # unchanged: hidden without --all
    full = run("threads", "diff", "t-done", "latest~1", "latest", "--all", "--dsn", dsn).output
    assert re.search(r"^│ docs ", full, re.M)
    assert (
        "no channel changed"
        in run("threads", "diff", "t-done", "latest", "latest", "--dsn", dsn).output
    )

    bad = run("threads", "diff", "t-done", "zzz", "latest", "--dsn", dsn)
    assert bad.exit_code == 1 and "no checkpoint" in bad.output
    ambiguous = run("threads", "diff", "t-done", first[:4], "latest", "--dsn", dsn)
    assert ambiguous.exit_code == 1 and "ambiguous" in ambiguous.output


# ------------------------------------------------------------------ stats
def test_stats(dsn: str, data: dict[str, Any]) -> None:
    stats = run_json("stats", "--dsn", dsn)
    tables = {t["table"]: t for t in stats["tables"]}
    for name in (
        *lgi.STOCK_TABLES,
        "durable_threads",
        "durable_artifacts",
        "durable_artifact_refs",
    ):
        assert tables[name]["total"] > 0
    assert tables["durable_quarantine"]["rows"] == 1
    assert tables["checkpoints"]["rows"] == sum(
        r["checkpoints"] for r in run_json("threads", "list", "--limit", "1000", "--dsn", dsn)
    )
    art = stats["artifacts"]
    # Each document is stored once; it is referenced by every checkpoint blob and
    # write of every thread that carries it, so the logical bytes dwarf the stored.
    assert art["artifacts"] == tables["durable_artifacts"]["rows"]
    assert art["unique_bytes"] >= sum(len(d) for d in DOCS)
    assert art["logical_bytes"] > 4 * art["unique_bytes"]
    assert art["dedup_ratio"] == pytest.approx(art["logical_bytes"] / art["stored_bytes"], rel=1e-3)
    assert art["dedup_ratio"] > 10

    result = run("stats", "--dsn", dsn)
    assert result.exit_code == 0, result.output
    assert "durable_artifacts" in result.output and "dedup ratio" in result.output


def test_resume_after_inspection_still_works(dsn: str, data: dict[str, Any]) -> None:
    """Inspection takes no lease and writes nothing: the waiting thread resumes."""
    run_json("threads", "show", "t-wait", "--dsn", dsn)
    out = data["waiting"].invoke(Command(resume="yes"), cfg("t-wait"))
    assert out["answer"] == "yes"
    assert run_json("threads", "show", "t-wait", "--dsn", dsn)["state"] == "done"


def test_stats_expands_chunked_lists(dsn: str, data: dict[str, Any]) -> None:
    """A long list is stored as chunk artifacts of 16 elements plus a tail: the
    logical bytes count every element of every chunk, once per reference."""

    class Chunky(TypedDict, total=False):
        items: list[str]

    items = [f"item {i} " + ("chunked payload " * 100) for i in range(40)]

    def produce(state: Chunky) -> dict[str, Any]:
        return {"items": items}

    g = StateGraph(Chunky)
    g.add_node("produce", produce)
    g.add_edge(START, "produce")
    g.add_edge("produce", END)
    before = run_json("stats", "--dsn", dsn)["artifacts"]
    with DurablePostgresSaver.from_conn_string(dsn) as saver:
        g.compile(checkpointer=saver).invoke({}, cfg("t-chunks"))
        # Uncompressed content of one element artifact: kind byte, type tag, NUL, data.
        one_copy = 0
        for item in items:
            tag, blob = saver.serde.dumps_typed(item)
            one_copy += 1 + len(tag.encode()) + 1 + len(blob)
    after = run_json("stats", "--dsn", dsn)["artifacts"]
    # Two references to the whole list: produce's write and the channel's blob.
    assert after["logical_bytes"] - before["logical_bytes"] == 2 * one_copy
    assert after["references"] - before["references"] == 2 * (2 + 40 % 16)  # 2 chunks + tail
    assert after["artifacts"] - before["artifacts"] == 40 + 2


def test_ui_on_a_busy_port_says_so_without_printing_a_url(dsn: str) -> None:
    """The console binds its socket before it prints its URL: on a port another console
    holds, one line says so, and no URL (which would be the other console's, maybe of
    another database) is printed (newcomer review, stop 32)."""
    import socket

    pytest.importorskip("uvicorn")
    with socket.create_server(("127.0.0.1", 0)) as busy:
        port = busy.getsockname()[1]
        out = runner.invoke(app, ["ui", "--dsn", dsn, "--port", str(port)])
    assert out.exit_code != 0
    assert f"cannot listen on 127.0.0.1:{port}" in out.output, out.output
    assert "console on" not in out.output and "Traceback" not in out.output
