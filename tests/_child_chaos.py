"""Graph and child-process entry points of tests/test_model_chaos.py (not a test module).

Children are forked from a ``multiprocessing`` *forkserver* that has LangGraph and the
package imported already (``preload``), so a child costs a fork, not the 1-2 s import:
the state machine can start and SIGKILL dozens of real processes per example.

Every node first records its execution in ``chaos_node_runs`` (autocommit, never
deduplicated: at-least-once is allowed for node bodies), then sleeps, then performs its
*effect* through ``@idempotent(transactional=True)``: one row in ``chaos_effects`` per
(thread, turn, node), written in the ledger's transaction, so the effect must happen at
most once per key however the run is killed and resumed. The parent counts both tables.

Each child writes one row to ``chaos_outcomes`` when it ends on its own (a SIGKILLed
child writes none): the event and, for an error, its type and whether it is a
``DurableError``.
"""

from __future__ import annotations

import faulthandler
import json
import operator
import os
import signal
import tempfile
import time
import traceback
from typing import Annotated, Any, TypedDict

import psycopg
from langchain_core.runnables import RunnableConfig
from langgraph.checkpoint.postgres import PostgresSaver
from langgraph.graph import END, START, StateGraph

from langgraph_durable import (
    CheckpointLoadError,
    DurableError,
    DurablePostgresSaver,
    MigrationRegistry,
    idempotent,
)
from langgraph_durable.saver import _DurableBase

if os.environ.get("LGD_MUTANT"):  # a deliberately broken package (tests/mutants/)
    import mutants

    mutants.apply(os.environ["LGD_MUTANT"])

NODES = ["n1", "n2", "n3", "n4"]
PAUSE = {"n1": 0.05, "n2": 0.12, "n3": 0.08, "n4": 0.05}
# n2 appends an entry above the artifact threshold (an element artifact); the others
# stay inline, so the log channel is an envelope mixing inline items and references.
PAD = {"n2": 300}
ARTIFACT_THRESHOLD = 128
LEASE_TTL = 1.0
MAX_RESUME_ATTEMPTS = 2
SKEW_NS = 5_000_000_000  # a writer whose clock is 5 s behind
SLOW = [1.0]  # node pause factor of this process (spec "slow": a run that stays live)

TABLES_DDL = (
    """CREATE TABLE IF NOT EXISTS chaos_node_runs (
        id BIGSERIAL PRIMARY KEY, thread_id TEXT NOT NULL, turn INT NOT NULL,
        node TEXT NOT NULL, pid INT NOT NULL, at TIMESTAMPTZ NOT NULL DEFAULT clock_timestamp())""",
    """CREATE TABLE IF NOT EXISTS chaos_effects (
        id BIGSERIAL PRIMARY KEY, thread_id TEXT NOT NULL, turn INT NOT NULL,
        node TEXT NOT NULL, pid INT NOT NULL, at TIMESTAMPTZ NOT NULL DEFAULT clock_timestamp())""",
    """CREATE TABLE IF NOT EXISTS chaos_outcomes (
        child_id TEXT PRIMARY KEY, thread_id TEXT, event TEXT NOT NULL, error_type TEXT,
        durable BOOLEAN, message TEXT, at TIMESTAMPTZ NOT NULL DEFAULT clock_timestamp())""",
)


class State(TypedDict, total=False):
    turn: int
    log: Annotated[list[str], operator.add]
    note: str


def entry(turn: int, node: str) -> str:
    return f"t{turn}:{node}:" + "x" * PAD.get(node, 0)


def migrate_note(values: dict[str, Any]) -> dict[str, Any]:
    return {**values, "note": (values.get("note") or "") + "+m"}


def registry() -> MigrationRegistry:
    reg = MigrationRegistry()
    reg.register("v1", "v2", migrate_note)
    return reg


def _autocommit(dsn: str) -> psycopg.Connection[Any]:
    return psycopg.connect(dsn, autocommit=True)


@idempotent(transactional=True, name="chaos_effect")
def effect(thread_id: str, turn: int, node: str, conn: Any = None) -> bool:
    conn.execute(
        "INSERT INTO chaos_effects (thread_id, turn, node, pid) VALUES (%s, %s, %s, %s)",
        (thread_id, turn, node, os.getpid()),
    )
    return True


@idempotent(name="chaos_plain_effect")
def plain_effect(dsn: str, thread_id: str, turn: int, node: str) -> bool:
    """The same effect outside the ledger's transaction (claim, effect, record)."""
    with _autocommit(dsn) as c:
        c.execute(
            "INSERT INTO chaos_effects (thread_id, turn, node, pid) VALUES (%s, %s, %s, %s)",
            (thread_id, turn, node, os.getpid()),
        )
    return True


def make_node(name: str, dsn: str, transactional: bool = True) -> Any:
    def node(state: State, config: RunnableConfig) -> dict[str, Any]:
        tid = str(config["configurable"]["thread_id"])
        turn = int(state.get("turn", 0))
        with _autocommit(dsn) as c:
            c.execute(
                "INSERT INTO chaos_node_runs (thread_id, turn, node, pid) VALUES (%s, %s, %s, %s)",
                (tid, turn, name, os.getpid()),
            )
        time.sleep(PAUSE[name] * SLOW[0])
        if isinstance(config["configurable"].get("__pregel_checkpointer"), _DurableBase):
            if transactional:
                effect(tid, turn, name)
            else:
                plain_effect(dsn, tid, turn, name)
        else:  # the stock saver has no ledger: a plain insert
            with _autocommit(dsn) as c:
                c.execute(
                    "INSERT INTO chaos_effects (thread_id, turn, node, pid) VALUES (%s, %s, %s, %s)",
                    (tid, turn, name, os.getpid()),
                )
        return {"log": [entry(turn, name)]}

    return node


def build(dsn: str, *, transactional: bool = True) -> StateGraph[Any]:
    g: StateGraph[Any] = StateGraph(State)
    prev = START
    for name in NODES:
        g.add_node(name, make_node(name, dsn, transactional))
        g.add_edge(prev, name)
        prev = name
    g.add_edge(prev, END)
    return g


def saver_options() -> dict[str, Any]:
    return {
        "lease_ttl": LEASE_TTL,
        "max_resume_attempts": MAX_RESUME_ATTEMPTS,
        "artifact_threshold": ARTIFACT_THRESHOLD,
        "on_busy": "raise",
    }


def plan(values: dict[str, Any], has_checkpoint: bool, turn: int) -> Any:
    """The input that moves the thread toward the end of ``turn``: None (resume), a new
    turn's input, or the string "noop" (already there)."""
    log = values.get("log") or []
    if any(e.startswith(f"t{turn}:n4:") for e in log):
        return "noop"
    if not has_checkpoint:
        return {"turn": turn}
    if values.get("turn") == turn:
        return None
    last = values.get("turn")
    if last is None or any(e.startswith(f"t{last}:n4:") for e in log):
        return {"turn": turn}
    return None  # an earlier turn is unfinished: finish it first


def _outcome(
    dsn: str, spec: dict[str, Any], event: str, exc: BaseException | None = None, result: Any = None
) -> None:
    with _autocommit(dsn) as c:
        c.execute(
            "INSERT INTO chaos_outcomes (child_id, thread_id, event, error_type, durable, message) "
            "VALUES (%s, %s, %s, %s, %s, %s) ON CONFLICT (child_id) DO NOTHING",
            (
                spec["child_id"],
                spec.get("thread_id"),
                event,
                None if exc is None else f"{type(exc).__module__}.{type(exc).__qualname__}",
                None if exc is None else isinstance(exc, DurableError),
                json.dumps(result) if exc is None else "".join(traceback.format_exception(exc))[-4000:],
            ),
        )


def stack_file(child_id: str) -> str:
    """Where a child dumps its threads' stacks on SIGUSR1 (the parent's hang report)."""
    return os.path.join(tempfile.gettempdir(), f"lgd_chaos_stack_{child_id}.txt")


_STACKS: list[Any] = []  # the open dump file, kept for the process's life


def child_main(spec: dict[str, Any]) -> None:
    """Entry point of every child (run in a process forked by the forkserver)."""
    dump = open(stack_file(spec["child_id"]), "w")  # open for the process's life
    _STACKS.append(dump)
    faulthandler.register(signal.SIGUSR1, file=dump, all_threads=True)
    if spec.get("skew"):
        real = time.time_ns

        def behind() -> int:
            return real() - SKEW_NS

        # uuid6 checkpoint ids (langgraph.checkpoint.base.id) read time.time_ns().
        time.time_ns = behind
    SLOW[0] = float(spec.get("slow") or 1.0)
    dsn = psycopg.conninfo.make_conninfo(spec["dsn"], application_name=f"chaos_{spec['child_id']}")
    try:
        with _saver(dsn, spec) as saver:
            mode = spec["mode"]
            result = None
            if mode == "run":
                result = _run(dsn, saver, spec)
            elif mode == "update":
                _update(dsn, saver, spec)
            elif mode == "recover":
                _recover(dsn, saver, spec)
            else:
                raise AssertionError(mode)
    except BaseException as exc:
        _outcome(spec["dsn"], spec, "error", exc)
        return
    _outcome(spec["dsn"], spec, "done", result=result)


def _saver(dsn: str, spec: dict[str, Any]) -> Any:
    """The durable saver, or the stock one (spec "stock": the machine's stock examples)."""
    if spec.get("stock"):
        return PostgresSaver.from_conn_string(dsn)
    return DurablePostgresSaver.from_conn_string(dsn, pool_size=3, **saver_options())


def _graph(dsn: str, saver: Any, version: str) -> Any:
    if not isinstance(saver, _DurableBase):
        return build(dsn).compile(checkpointer=saver)
    return build(dsn).compile(
        checkpointer=saver.bind(graph_version=version, migrations=registry())
    )


def _run(dsn: str, saver: Any, spec: dict[str, Any]) -> Any:
    """Returns the run's final state (turn and log) as the graph returned it."""
    graph = _graph(dsn, saver, spec["version"])
    config: RunnableConfig = {
        "configurable": {"thread_id": spec["thread_id"], "run_id": spec["run_id"]}
    }
    if spec.get("claim"):
        # A caller forging the internal hand-off key with the live owner's string
        # (ThreadBusyError.owner and `threads status` show it): issue 11 item 12. The
        # key the package used before the hand-off moved to a ContextVar.
        config["configurable"]["__durable_claim"] = (spec["thread_id"], spec["claim"])
    if spec.get("gate"):
        # A slow start made exact (tests/test_seams_chaos_regressions.py): the child is
        # up but plans and runs only once the test creates this file.
        deadline = time.monotonic() + 60
        while not os.path.exists(spec["gate"]):
            if time.monotonic() > deadline:
                raise AssertionError(f"gate {spec['gate']} never opened")
            time.sleep(0.01)
    try:
        snap = graph.get_state(config)
    except CheckpointLoadError:
        # The plan's own read fails on a damaged head. A user would run the thread
        # anyway (a resume): the run start must quarantine it (issue 11 item 13). The
        # model expected that of every run child of a damaged thread, and the child
        # never started one (found by the long run; not a saver fault: get_state is a
        # read, and raising the typed error is right for it).
        graph.invoke(None, config)
        return None
    inp = plan(dict(snap.values), snap.created_at is not None, spec["turn"])
    if inp == "noop":
        return None
    out = graph.invoke(inp, config)
    return {"turn": out.get("turn"), "log": out.get("log")}


def _update(dsn: str, saver: Any, spec: dict[str, Any]) -> None:
    graph = _graph(dsn, saver, spec["version"])
    graph.update_state({"configurable": {"thread_id": spec["thread_id"]}}, {"note": spec["note"]})


def _recover(dsn: str, saver: Any, spec: dict[str, Any]) -> None:
    from langgraph_durable import recover

    graphs = [_graph(dsn, saver, v) for v in ("v1", "v2")]
    recover(graphs, poll_interval=0.1, retry_errors=False)
