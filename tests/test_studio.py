"""LangGraph Studio's server (``langgraph dev``) driving the durable saver end to end.

A real ``langgraph dev`` process serves ``examples/studio`` (its ``langgraph.json`` loads
``AsyncDurablePostgresSaver`` through ``./checkpointer.py:make_checkpointer``) on a test
database; the tests talk to it through ``langgraph_sdk`` only, and look at the rows in
PostgreSQL. What they prove:

* the server's adapter around the saver does not hide the run from it: a run takes a
  lease (``durable_threads`` row, live owner while in flight) and every checkpoint the
  server writes carries the ``graph_version`` stamp (the example graph's fingerprint);
* thread deletion (``adelete_thread``), copy (``acopy_thread``) and rollback
  (``multitask_strategy="rollback"`` -> ``adelete_for_runs``) act on the database.

The project is copied to a temporary directory first: the server keeps its own state in
``.langgraph_api/`` under its working directory, which must not land in the checkout.
The server runs in its own process group and is always killed at the end.
"""

from __future__ import annotations

import asyncio
import importlib.util
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import psycopg
import pytest
from conftest import require_or_skip
from psycopg.rows import dict_row

pytestmark = pytest.mark.studio

EXAMPLE = Path(__file__).resolve().parent.parent / "examples" / "studio"
GRAPH_ID = "research_assistant"
STARTUP_TIMEOUT = 120.0  # bound on waiting for /ok (2 shared cores, heavy imports)
WAIT_TIMEOUT = 60.0  # bound on every other wait


@dataclass
class Studio:
    url: str
    dsn: str
    project: Path
    log: Path
    proc: subprocess.Popen[bytes]

    def client(self) -> Any:
        from langgraph_sdk import get_client

        return get_client(url=self.url, timeout=WAIT_TIMEOUT)

    def rows(self, sql: str, *args: Any) -> list[dict[str, Any]]:
        with psycopg.connect(self.dsn, row_factory=dict_row) as conn:
            return conn.execute(sql, args).fetchall()

    def log_text(self) -> str:
        return self.log.read_text(errors="replace") if self.log.exists() else ""


def _langgraph_cli() -> str:
    beside = Path(sys.executable).parent / "langgraph"
    found = str(beside) if beside.exists() else shutil.which("langgraph")
    if found is None or importlib.util.find_spec("langgraph_api") is None:
        msg = 'langgraph dev is not installed: pip install "langgraph-cli[inmem]"'
        require_or_skip(f"Studio: {msg}")
    return found


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _stop(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is not None:
        return
    for sig, grace in ((signal.SIGTERM, 15.0), (signal.SIGKILL, 10.0)):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            return
        try:
            proc.wait(timeout=grace)
            return
        except subprocess.TimeoutExpired:
            continue


@pytest.fixture(scope="module")
def studio(dsn: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Studio]:
    cli = _langgraph_cli()
    root = tmp_path_factory.mktemp("studio")
    project = root / "project"
    shutil.copytree(
        EXAMPLE, project, ignore=shutil.ignore_patterns(".langgraph_api", "__pycache__")
    )
    port = _free_port()
    log = root / "server.log"
    env = {
        **os.environ,
        "LANGGRAPH_DURABLE_DSN": dsn,
        "LANGGRAPH_DURABLE_HOME": str(root / "home"),  # never the user's embedded server
        "LANGGRAPH_CLI_NO_ANALYTICS": "1",
        "LANGSMITH_TRACING": "false",
        "LANGCHAIN_TRACING_V2": "false",
        "NO_COLOR": "1",
    }
    with open(log, "wb") as out:
        proc = subprocess.Popen(
            [cli, "dev", "--no-browser", "--no-reload", "--host", "127.0.0.1", "--port", str(port)],
            cwd=project,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,  # its own process group: killpg reaches the workers
        )
    server = Studio(f"http://127.0.0.1:{port}", dsn, project, log, proc)
    try:
        deadline = time.monotonic() + STARTUP_TIMEOUT
        while True:
            if proc.poll() is not None:
                pytest.fail(
                    f"langgraph dev exited with {proc.returncode}:\n{server.log_text()[-4000:]}"
                )
            try:
                if httpx.get(server.url + "/ok", timeout=2.0).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if time.monotonic() > deadline:
                pytest.fail(
                    f"langgraph dev not healthy after {STARTUP_TIMEOUT}s:\n{server.log_text()[-4000:]}"
                )
            time.sleep(0.25)
        yield server
    finally:
        _stop(proc)


def _example_fingerprint(project: Path) -> str:
    """The version the saver stamps for the example graph: its fingerprint."""
    from langgraph_durable import graph_fingerprint

    spec = importlib.util.spec_from_file_location("lgd_studio_example_graph", project / "graph.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # get_type_hints resolves the state's annotations there
    spec.loader.exec_module(module)
    return graph_fingerprint(module.graph)


async def _wait_for(predicate: Any, what: str) -> None:
    deadline = time.monotonic() + WAIT_TIMEOUT
    while not predicate():
        if time.monotonic() > deadline:
            pytest.fail(f"timed out waiting for {what}")
        await asyncio.sleep(0.1)


async def _finished_thread(studio: Studio, question: str) -> tuple[str, str, dict[str, Any]]:
    client = studio.client()
    thread = await client.threads.create()
    run = await client.runs.create(thread["thread_id"], GRAPH_ID, input={"question": question})
    values = await client.runs.join(thread["thread_id"], run["run_id"])
    finished = await client.runs.get(thread["thread_id"], run["run_id"])
    assert finished["status"] == "success", finished
    return thread["thread_id"], run["run_id"], values


def test_custom_checkpointer_is_loaded_with_all_capabilities(studio: Studio) -> None:
    log = studio.log_text()
    assert "Using custom checkpointer: AsyncDurablePostgresSaver" in log
    # The adapter warns about each of adelete_thread/adelete_for_runs/acopy_thread/aprune
    # it cannot find on the class: none may be missing.
    assert "Custom checkpointer missing" not in log


async def test_run_takes_a_lease_and_stamps_the_graph_version(studio: Studio) -> None:
    thread_id, run_id, values = await _finished_thread(
        studio, "How does a durable checkpoint survive a crash?"
    )
    assert values["verdict"] == "approved"
    assert len(values["notes"]) == 2

    version = _example_fingerprint(studio.project)
    cps = studio.rows(
        "SELECT checkpoint_id, metadata FROM checkpoints WHERE thread_id = %s ORDER BY checkpoint_id",
        thread_id,
    )
    assert len(cps) >= 5  # input, plan, research, write, review
    for cp in cps:
        md = cp["metadata"]
        assert md["graph_version"] == version, md
        # the server's adapter enriched the same rows: ours and its metadata coexist
        assert md["run_id"] == run_id
        assert md["graph_id"] == GRAPH_ID
        assert md.get("assistant_id")

    # The run start was recognised behind the adapter: a lease was taken and released.
    [row] = studio.rows("SELECT * FROM durable_threads WHERE thread_id = %s", thread_id)
    assert row["status"] == "done"
    assert row["graph_version"] == version
    assert row["lease_owner"] is None
    assert row["lease_token"] == 1

    state = await studio.client().threads.get_state(thread_id)
    assert state["metadata"]["graph_version"] == version
    assert state["values"] == values


async def test_delete_thread_removes_its_rows(studio: Studio) -> None:
    thread_id, _, _ = await _finished_thread(studio, "What is a lease?")
    tables = ("checkpoints", "checkpoint_blobs", "checkpoint_writes", "durable_threads")
    before = {
        t: studio.rows(f"SELECT count(*) AS n FROM {t} WHERE thread_id = %s", thread_id)[0]["n"]
        for t in tables
    }
    assert before["checkpoints"] > 0 and before["checkpoint_blobs"] > 0
    assert before["checkpoint_writes"] > 0 and before["durable_threads"] == 1
    other_id, _, _ = await _finished_thread(studio, "storage")

    await studio.client().threads.delete(thread_id)

    for t in tables:
        assert (
            studio.rows(f"SELECT count(*) AS n FROM {t} WHERE thread_id = %s", thread_id)[0]["n"]
            == 0
        ), t
    # only that thread
    assert (
        studio.rows("SELECT count(*) AS n FROM checkpoints WHERE thread_id = %s", other_id)[0]["n"]
        > 0
    )


async def test_copy_thread_copies_history_and_the_copy_runs_on(studio: Studio) -> None:
    source_id, _, values = await _finished_thread(studio, "version migration")
    client = studio.client()

    copy = await client.threads.copy(source_id)
    target_id = copy["thread_id"]
    assert target_id != source_id

    def ids(thread_id: str) -> list[str]:
        return [
            r["checkpoint_id"]
            for r in studio.rows(
                "SELECT checkpoint_id FROM checkpoints WHERE thread_id = %s ORDER BY checkpoint_id",
                thread_id,
            )
        ]

    source_ids = ids(source_id)
    assert ids(target_id) == source_ids
    meta = studio.rows(
        "SELECT DISTINCT metadata ->> 'thread_id' AS t FROM checkpoints WHERE thread_id = %s",
        target_id,
    )
    assert [m["t"] for m in meta] == [target_id]
    blobs = "SELECT count(*) AS n FROM checkpoint_blobs WHERE thread_id = %s"
    assert studio.rows(blobs, target_id)[0]["n"] == studio.rows(blobs, source_id)[0]["n"] > 0
    state = await client.threads.get_state(target_id)
    assert state["values"] == values
    history = await client.threads.get_history(target_id, limit=100)
    assert len(history) == len(source_ids)

    # The copy is a thread of its own: a run continues it, the source is untouched.
    run = await client.runs.create(target_id, GRAPH_ID, input={"question": "idempotent"})
    after = await client.runs.join(target_id, run["run_id"])
    assert after["question"] == "idempotent"
    assert set(values["notes"]) <= set(after["notes"])  # the copied state was resumed
    assert ids(source_id) == source_ids
    [row] = studio.rows(
        "SELECT status, lease_owner FROM durable_threads WHERE thread_id = %s", target_id
    )
    assert row == {"status": "done", "lease_owner": None}


async def test_rollback_deletes_the_interrupted_runs_checkpoints(studio: Studio) -> None:
    thread_id, first_run, first_values = await _finished_thread(studio, "poison")
    client = studio.client()

    # A slow run: research sleeps 30 s, long enough to be caught in flight.
    slow = await client.runs.create(
        thread_id, GRAPH_ID, input={"question": "checkpoint", "delay": 30}
    )
    slow_id = slow["run_id"]

    def slow_in_flight() -> bool:
        n = studio.rows(
            "SELECT count(*) AS n FROM checkpoints WHERE metadata ->> 'run_id' = %s", slow_id
        )
        return int(n[0]["n"]) >= 2  # input + after plan: research is running

    await _wait_for(slow_in_flight, "the slow run to checkpoint its first steps")
    [lease] = studio.rows(
        "SELECT status, lease_owner FROM durable_threads WHERE thread_id = %s", thread_id
    )
    assert (
        lease["status"] == "running" and lease["lease_owner"]
    )  # the in-flight run holds the lease

    fresh = await client.runs.create(
        thread_id, GRAPH_ID, input={"question": "storage"}, multitask_strategy="rollback"
    )
    values = await client.runs.join(thread_id, fresh["run_id"])
    assert values["question"] == "storage"

    # adelete_for_runs removed every row of the rolled-back run, and the run is gone.
    assert (
        studio.rows(
            "SELECT count(*) AS n FROM checkpoints WHERE metadata ->> 'run_id' = %s", slow_id
        )[0]["n"]
        == 0
    )
    from langgraph_sdk.errors import NotFoundError

    with pytest.raises(NotFoundError):
        await client.runs.get(thread_id, slow_id)
    runs = studio.rows(
        "SELECT DISTINCT metadata ->> 'run_id' AS r FROM checkpoints WHERE thread_id = %s",
        thread_id,
    )
    assert {r["r"] for r in runs} == {first_run, fresh["run_id"]}
    # The new run continued from the first run's last checkpoint: no dangling parents,
    # and the state never saw the rolled-back run's query.
    cps = studio.rows(
        "SELECT checkpoint_id, parent_checkpoint_id FROM checkpoints WHERE thread_id = %s",
        thread_id,
    )
    known = {c["checkpoint_id"] for c in cps}
    assert all(c["parent_checkpoint_id"] in known for c in cps if c["parent_checkpoint_id"])
    assert set(first_values["notes"]) <= set(values["notes"])
    history = await client.threads.get_history(thread_id, limit=100)
    assert all(h["values"].get("queries") != ["checkpoint"] for h in history)
    # The cancelled run released its lease; the fresh one finished cleanly.
    [row] = studio.rows(
        "SELECT status, lease_owner, attempts FROM durable_threads WHERE thread_id = %s", thread_id
    )
    assert row == {"status": "done", "lease_owner": None, "attempts": 0}
