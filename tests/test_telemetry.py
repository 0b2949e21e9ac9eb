"""Observability (issue 15, item 4): OpenTelemetry spans seen by the SDK's in-memory
exporter during a real graph run on real PostgreSQL; Prometheus metrics scraped over
real HTTP from a running ``langgraph-durable worker --metrics-port`` subprocess, and its
``/healthz`` probe (200 alive, 503 once its database refuses connections); and the
package working unchanged when neither library can be imported."""

from __future__ import annotations

import json
import operator
import os
import signal
import socket
import subprocess
import sys
import textwrap
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Annotated, Any, TypedDict

import psycopg
import pytest
from langgraph.graph import END, START, StateGraph
from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from prometheus_client import REGISTRY
from psycopg import conninfo as ci

from langgraph_durable import DurablePostgresSaver, idempotent, telemetry
from langgraph_durable.errors import IdempotencyConflictError, LeaseLostError
from langgraph_durable.recovery import submit

ROOT = Path(__file__).resolve().parent.parent


class State(TypedDict):
    done: Annotated[list[str], operator.add]


def _builder(steps: int = 3) -> StateGraph:
    b = StateGraph(State)
    prev = START
    for i in range(steps):
        b.add_node(f"s{i}", lambda state, i=i: {"done": [f"s{i}"]})
        b.add_edge(prev, f"s{i}")
        prev = f"s{i}"
    b.add_edge(prev, END)
    return b


@pytest.fixture(scope="module")
def exporter() -> Iterator[InMemorySpanExporter]:
    exp = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exp))
    # The global provider can be set once per process; telemetry's tracer is a proxy
    # that follows it even if it was created before.
    trace.set_tracer_provider(provider)
    current = trace.get_tracer_provider()
    if current is not provider:  # set earlier in this process: listen to that one
        assert isinstance(current, TracerProvider), f"a non-SDK tracer provider is set: {current!r}"
        current.add_span_processor(SimpleSpanProcessor(exp))
    yield exp
    # The provider stays global for the rest of this process: stop keeping its spans.
    exp.shutdown()
    exp.clear()


def _sample(name: str, **labels: str) -> float:
    return REGISTRY.get_sample_value(name, labels) or 0.0


def _spans(exporter: InMemorySpanExporter, name: str) -> list[Any]:
    return [s for s in exporter.get_finished_spans() if s.name == f"langgraph_durable.{name}"]


def test_spans_and_metrics_of_a_real_graph_run(dsn: str, exporter: InMemorySpanExporter) -> None:
    assert telemetry.ENABLED and telemetry.HAS_OTEL and telemetry.HAS_PROMETHEUS
    exporter.clear()
    puts_before = _sample("langgraph_durable_put_seconds_count")
    acquired_before = _sample("langgraph_durable_lease_acquisitions_total", result="ok")
    thread = f"otel-{uuid.uuid4().hex[:8]}"
    with DurablePostgresSaver.from_conn_string(dsn) as saver:
        graph = _builder().compile(checkpointer=saver)
        final = graph.invoke({"done": []}, {"configurable": {"thread_id": thread}})
        assert final["done"] == ["s0", "s1", "s2"]
        head = saver.get_tuple({"configurable": {"thread_id": thread}})
        assert head is not None

        puts = [s for s in _spans(exporter, "put") if s.attributes["langgraph_durable.thread_id"] == thread]
        # input checkpoint + one per node (4 at least), each naming its checkpoint
        assert len(puts) >= 4
        ids = {s.attributes["langgraph_durable.checkpoint_id"] for s in puts}
        assert head.config["configurable"]["checkpoint_id"] in ids
        assert all(s.status.is_ok for s in puts)

        (start,) = [s for s in _spans(exporter, "run_start")
                    if s.attributes["langgraph_durable.thread_id"] == thread]
        assert start.attributes["langgraph_durable.lease_token"] >= 1
        assert start.attributes["langgraph_durable.attempts"] == 1
        assert start.attributes["langgraph_durable.resumed"] is False
        acquire = [s for s in _spans(exporter, "lease.acquire")
                   if s.attributes["langgraph_durable.thread_id"] == thread]
        assert acquire and acquire[0].attributes["langgraph_durable.result"] == "ok"
        gets = [s for s in _spans(exporter, "get") if s.attributes.get("langgraph_durable.thread_id") == thread]
        assert len(gets) >= 2  # the run's start and the read above
        assert _spans(exporter, "put_writes")

        # metrics of the same run, in the default registry
        assert _sample("langgraph_durable_put_seconds_count") >= puts_before + 4
        assert _sample("langgraph_durable_lease_acquisitions_total", result="ok") >= acquired_before + 1
        assert _sample("langgraph_durable_checkpoint_bytes_count") >= 4


def test_idempotent_call_outcomes(dsn: str, exporter: InMemorySpanExporter) -> None:
    exporter.clear()
    key = f"charge-{uuid.uuid4().hex[:8]}"
    before = {o: _sample("langgraph_durable_ledger_outcomes_total", outcome=o) for o in ("run", "hit", "conflict")}
    calls: list[int] = []
    with DurablePostgresSaver.from_conn_string(dsn) as saver:

        @idempotent(key=lambda amount: key, ledger=saver)
        def charge(amount: int) -> int:
            calls.append(amount)
            return amount

        assert charge(5) == 5
        assert charge(5) == 5  # replayed from the ledger
        with pytest.raises(IdempotencyConflictError):
            charge(7)  # same key, other arguments
    assert calls == [5]
    outcomes = [s.attributes.get("langgraph_durable.outcome") for s in _spans(exporter, "idempotent")]
    assert outcomes == ["run", "hit", "conflict"]
    spans = _spans(exporter, "idempotent")
    assert {s.attributes["langgraph_durable.key"] for s in spans} == {key}
    assert not spans[2].status.is_ok  # the conflict is recorded as an error
    for outcome in ("run", "hit", "conflict"):
        assert _sample("langgraph_durable_ledger_outcomes_total", outcome=outcome) == before[outcome] + 1


def test_fenced_write_is_counted(dsn: str, exporter: InMemorySpanExporter) -> None:
    """A run whose lease was taken over: its next write is refused by the fence and
    counted (fenced_writes_total{reason="lease_lost"})."""
    before = _sample("langgraph_durable_fenced_writes_total", reason="lease_lost")
    thread = f"fence-{uuid.uuid4().hex[:8]}"
    with DurablePostgresSaver.from_conn_string(dsn) as saver:
        b = StateGraph(State)

        def steal(state: State) -> dict[str, Any]:
            # Another owner takes the lease while this node runs (as after an expiry).
            with psycopg.connect(dsn, autocommit=True) as conn:
                conn.execute(
                    "UPDATE durable_threads SET lease_token = lease_token + 1, lease_owner = 'thief' "
                    "WHERE thread_id = %s", (thread,),
                )
            return {"done": ["stolen"]}

        b.add_node("steal", steal)
        b.add_edge(START, "steal")
        b.add_edge("steal", END)
        with pytest.raises(LeaseLostError):
            b.compile(checkpointer=saver).invoke({"done": []}, {"configurable": {"thread_id": thread}})
    # the task's writes (and the run's error write, if any): each refused write counts once
    assert _sample("langgraph_durable_fenced_writes_total", reason="lease_lost") >= before + 1


# ----------------------------------------------------------------------------- worker


GRAPH_FILE = textwrap.dedent(
    """
    import operator, time
    from typing import Annotated, TypedDict
    from langgraph.graph import END, START, StateGraph

    class State(TypedDict):
        done: Annotated[list[str], operator.add]

    builder = StateGraph(State)
    prev = START
    for i in range(3):
        def node(state, i=i):
            time.sleep(0.01)
            return {"done": [f"s{i}"]}
        builder.add_node(f"s{i}", node)
        builder.add_edge(prev, f"s{i}")
        prev = f"s{i}"
    builder.add_edge(prev, END)
    """
)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _get(url: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(url, timeout=10) as resp:
            return resp.status, resp.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()


def _value(text: str, sample: str) -> float:
    """The value of one exposition line ``name{labels} value`` (0 when absent)."""
    for line in text.splitlines():
        if line.startswith(sample + " "):
            return float(line.rsplit(" ", 1)[1])
    return 0.0


def _child_env() -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = str(ROOT) + os.pathsep + env.get("PYTHONPATH", "")
    return env


@pytest.mark.chaos
def test_worker_serves_metrics_and_healthz(dsn: str, admin_dsn: str, tmp_path: Path) -> None:
    (tmp_path / "obs_graph.py").write_text(GRAPH_FILE)
    sys.path.insert(0, str(tmp_path))
    try:
        import obs_graph  # type: ignore[import-not-found]
    finally:
        sys.path.remove(str(tmp_path))
    n = 6
    with DurablePostgresSaver.from_conn_string(dsn) as saver:
        graph = obs_graph.builder.compile(checkpointer=saver)
        for i in range(n):
            submit(graph, {"done": []}, {"configurable": {"thread_id": f"obs-{i}"}})
    port = _free_port()
    base = f"http://127.0.0.1:{port}"
    log = tmp_path / "worker.log"
    with open(log, "wb") as fh:
        proc = subprocess.Popen(
            [sys.executable, "-c", "from langgraph_durable.cli import main; main()", "worker",
             "--graph", f"{tmp_path / 'obs_graph.py'}:builder", "--dsn", dsn, "--concurrency", "2",
             "--poll-interval", "0.2", "--metrics-port", str(port), "--metrics-host", "127.0.0.1"],
            env=_child_env(), stdout=fh, stderr=subprocess.STDOUT,
        )
    name = ci.conninfo_to_dict(dsn)["dbname"]
    try:
        deadline = time.monotonic() + 90
        text = ""
        while time.monotonic() < deadline:
            try:
                status, text = _get(base + "/metrics")
            except OSError:  # not listening yet
                status = 0
            finished = _value(text, 'langgraph_durable_worker_recoveries_total{outcome="finished"}')
            if status == 200 and finished >= n:
                break
            assert proc.poll() is None, log.read_text()
            time.sleep(0.3)
        else:
            pytest.fail(f"the worker did not finish {n} threads: {text[-2000:]}\n{log.read_text()[-3000:]}")
        assert _value(text, 'langgraph_durable_worker_claims_total{previous_status="queued"}') >= n
        assert _value(text, "langgraph_durable_put_seconds_count") >= n * 3
        assert _value(text, "langgraph_durable_put_seconds_sum") > 0
        assert _value(text, 'langgraph_durable_put_seconds_bucket{le="+Inf"}') >= n * 3
        assert _value(text, "langgraph_durable_get_seconds_count") >= n
        assert _value(text, "langgraph_durable_checkpoint_bytes_sum") > 0
        assert _value(text, 'langgraph_durable_lease_acquisitions_total{result="ok"}') >= n
        assert "# TYPE langgraph_durable_put_seconds histogram" in text
        # queue depth by status, counted on scrape (cached a few seconds)
        deadline = time.monotonic() + 30
        while _value(text, 'langgraph_durable_threads{status="done"}') < n and time.monotonic() < deadline:
            time.sleep(1)
            text = _get(base + "/metrics")[1]
        assert _value(text, 'langgraph_durable_threads{status="done"}') >= n
        assert _value(text, 'langgraph_durable_threads{status="recoverable"}') == 0

        status, body = _get(base + "/healthz")
        assert (status, body.strip()) == (200, "ok")
        # The database stops accepting connections: the probe fails (503), the worker lives.
        with psycopg.connect(admin_dsn, autocommit=True) as admin:
            admin.execute(psycopg.sql.SQL("ALTER DATABASE {} ALLOW_CONNECTIONS false").format(
                psycopg.sql.Identifier(name)))
            try:
                status, body = _get(base + "/healthz")
                assert status == 503, body
                assert "database unreachable" in body
            finally:
                admin.execute(psycopg.sql.SQL("ALTER DATABASE {} ALLOW_CONNECTIONS true").format(
                    psycopg.sql.Identifier(name)))
        assert _get(base + "/healthz")[0] == 200
        assert _get(base + "/nope")[0] == 404
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
    assert proc.returncode == 0, log.read_text()[-3000:]


# ----------------------------------------------------------------------------- absent


ABSENT = textwrap.dedent(
    """
    import importlib.abc, json, sys

    class Block(importlib.abc.MetaPathFinder):
        def find_spec(self, name, path=None, target=None):
            if name.split(".")[0] in ("opentelemetry", "prometheus_client"):
                raise ImportError(f"blocked: {name}")
            return None

    sys.meta_path.insert(0, Block())
    from langgraph.graph import END, START, StateGraph
    from typing import TypedDict
    from langgraph_durable import DurablePostgresSaver, idempotent, telemetry

    class S(TypedDict):
        n: int

    b = StateGraph(S)
    b.add_node("a", lambda s: {"n": s["n"] + 1})
    b.add_edge(START, "a")
    b.add_edge("a", END)
    with DurablePostgresSaver.from_conn_string(sys.argv[1]) as saver:
        out = b.compile(checkpointer=saver).invoke({"n": 1}, {"configurable": {"thread_id": sys.argv[2]}})
        charge = idempotent(key=lambda x: sys.argv[2], ledger=saver)(lambda x: x * 2)
        twice = [charge(3), charge(3)]
    with telemetry.span("x", a=1):
        telemetry.count("put_seconds")
        telemetry.observe("put_seconds", 1.0)
    print(json.dumps({
        "n": out["n"], "twice": twice, "enabled": telemetry.ENABLED,
        "put_wrapped": hasattr(DurablePostgresSaver.put, "__wrapped__"),
        "loaded": sorted(m for m in sys.modules if m.split(".")[0] in ("opentelemetry", "prometheus_client")),
    }))
    """
)


@pytest.mark.parametrize("how", ["blocked", "env-off"])
def test_without_the_libraries_nothing_changes(dsn: str, how: str) -> None:
    env = _child_env()
    code = ABSENT
    if how == "env-off":
        env["LANGGRAPH_DURABLE_TELEMETRY"] = "off"
        code = code.replace("sys.meta_path.insert(0, Block())", "")
    out = subprocess.run(
        [sys.executable, "-c", code, dsn, f"absent-{how}-{uuid.uuid4().hex[:6]}"],
        env=env, capture_output=True, text=True, timeout=120,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    result = json.loads(out.stdout.strip().splitlines()[-1])
    loaded = result.pop("loaded")
    assert result == {"n": 2, "twice": [6, 6], "enabled": False, "put_wrapped": False}
    if how == "blocked":
        assert loaded == []  # (with env-off, other libraries, e.g. langsmith, may import them)
