"""Ordinary graph edits against what stock LangGraph does with them (issue 24, item 7).

Each row of ``CASES`` is one edit kind: the real graph v1 runs a thread to an interrupt
(or a SIGKILL inside a node, in a child process), v2 is swapped in and the thread is
resumed twice, once on a stock saver (InMemorySaver; PostgresSaver for the crash row)
and once on the durable saver with its default policy. Durable must either end in the
same state as stock, or refuse with a typed error where stock silently does something
the new graph would not (each row says why, and asserts what stock did). A refusal
must name the policies that let it go on; the row then checks that the named policy
(``version_policy="warn"``) does go on, to stock's result.

Real PostgreSQL, real processes, a real SIGKILL; no mocks.
"""

# No `from __future__ import annotations`: LangGraph evaluates the state schemas'
# annotations (get_type_hints) outside this module's scope.

import operator
import os
import pickle
import signal
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass
from typing import Annotated, Any, TypedDict

import pytest
from conftest import drop_database, make_database
from langchain_core.runnables import RunnableConfig
from langgraph.checkpoint.memory import InMemorySaver
from langgraph.graph import END, START, StateGraph
from langgraph.types import Command, interrupt

from langgraph_durable import DurablePostgresSaver, GraphVersionMismatchError

Ran = list[str]
CRASH_ENV = "LGD_GRAPH_EDITS_CRASH"


class S(TypedDict, total=False):
    log: Annotated[list[str], operator.add]
    topic: str


class Renamed(TypedDict, total=False):  # S with `topic` renamed to `subject`
    log: Annotated[list[str], operator.add]
    subject: str


class Extra(TypedDict, total=False):  # S with one more key
    log: Annotated[list[str], operator.add]
    topic: str
    extra: str


def cfg(thread_id: str, **configurable: Any) -> RunnableConfig:
    return {"configurable": {"thread_id": thread_id, **configurable}}


def step(name: str, ran: Ran, **update: Any) -> Callable[[Any], dict[str, Any]]:
    def run(state: Any) -> dict[str, Any]:
        ran.append(name)
        return {"log": [name], **update}

    return run


def asks(name: str, ran: Ran) -> Callable[[Any], dict[str, Any]]:
    def run(state: Any) -> dict[str, Any]:
        ran.append(name)
        answer = interrupt(f"{name}?")
        return {"log": [f"{name}:{answer}"]}

    return run


def crashes(name: str, ran: Ran) -> Callable[[Any], dict[str, Any]]:
    """A node that SIGKILLs its own process in the child (a crash inside the task)."""

    def run(state: Any) -> dict[str, Any]:
        if os.environ.get(CRASH_ENV):
            os.kill(os.getpid(), signal.SIGKILL)
        ran.append(name)
        return {"log": [name]}

    return run


# --- the graphs ---------------------------------------------------------------------------


def chain(
    ran: Ran,
    *names: str,
    schema: Any = S,
    ask: str = "ask",
    crash: str = "",
    code: dict[str, str] | None = None,
) -> StateGraph:
    """START -> names[0] -> ... -> END; ``ask`` interrupts, ``crash`` is killed;
    ``code``: node -> the label its function logs (other code, same topology)."""
    b = StateGraph(schema)
    for n in names:
        label = (code or {}).get(n, n)
        b.add_node(n, asks(n, ran) if n == ask else crashes(n, ran) if n == crash else step(label, ran))
    for a, z in zip((START, *names), (*names, END), strict=True):
        b.add_edge(a, z)
    return b


def fork(ran: Ran, *a_to: str, extra: tuple[str, ...] = ()) -> StateGraph:
    """START -> [a, waiter]: a finishes and routes to ``a_to`` (its decision is stored
    in the paused step's writes) while waiter interrupts."""
    b = StateGraph(S)
    b.add_node("a", step("a", ran))
    b.add_node("waiter", asks("waiter", ran))
    for n in sorted({*a_to, *extra} - {END}):
        b.add_node(n, step(n, ran))
    b.add_edge(START, "a")
    b.add_edge(START, "waiter")
    for t in a_to:
        b.add_edge("a", t)
    return b


def branching(ran: Ran, targets: list[str], *, router_asks: bool) -> StateGraph:
    """A conditional edge out of ``router`` to the last of ``targets`` (a path map).
    ``router_asks``: the router itself interrupts (its decision is not taken yet);
    else it finishes beside an interrupting ``waiter`` (its decision is stored)."""
    b = StateGraph(S)
    b.add_node("router", asks("router", ran) if router_asks else step("router", ran))
    for n in ("B", "C", "D"):
        b.add_node(n, step(n, ran))
    b.add_edge(START, "router")
    if not router_asks:
        b.add_node("waiter", asks("waiter", ran))
        b.add_edge(START, "waiter")
    b.add_conditional_edges("router", lambda s: targets[-1], {t: t for t in targets})
    return b


def nested(ran: Ran, *inner: str) -> StateGraph:
    """START -> sub (a subgraph: START -> inner... -> END) -> done -> END."""
    b = StateGraph(S)
    b.add_node("sub", chain(ran, *inner).compile())
    b.add_node("done", step("done", ran))
    b.add_edge(START, "sub")
    b.add_edge("sub", "done")
    b.add_edge("done", END)
    return b


# --- the table ----------------------------------------------------------------------------


@dataclass(frozen=True)
class Case:
    id: str
    v1: Callable[[Ran], StateGraph]
    v2: Callable[[Ran], StateGraph]
    # None: durable ends where stock does. Else a text the refusal's reason contains,
    # and what stock did that the new graph would not.
    refused: str | None = None
    stock_wrong: Callable[[dict[str, Any], Ran], bool] | None = None
    why: str = ""
    inputs: tuple[tuple[str, Any], ...] = ()
    crash: bool = False


CASES = [
    Case(
        "add-node-after-interrupted-node",
        lambda r: chain(r, "ask", "finish"),
        lambda r: chain(r, "ask", "audit", "finish"),
        why="ask has not finished: it re-runs with the answer and routes by the new edge",
    ),
    Case(
        "add-node-after-crashed-node",
        lambda r: chain(r, "prep", "work", "finish", crash="work"),
        lambda r: chain(r, "prep", "work", "audit", "finish", crash="work"),
        crash=True,
        why="a task killed inside stored nothing: it re-runs on the new graph and takes the new edge",
    ),
    Case(
        "add-node-before-interrupted-node",
        lambda r: chain(r, "ask", "finish"),
        lambda r: chain(r, "pre", "ask", "finish"),
        why="the thread is already in ask (its trigger is stored, ask still exists): like stock it "
        "stays there; only new threads pass through pre",
    ),
    Case(
        "repoint-edge-out-of-interrupted-node",
        lambda r: chain(r, "ask", "finish"),
        lambda r: chain(r, "ask", "other"),
        why="ask has not finished, so it has made no routing decision: the new edge applies",
    ),
    Case(
        "remove-interrupted-node",
        lambda r: chain(r, "fetch", "ask", "finish"),
        lambda r: chain(r, "fetch", "finish"),
        refused="node 'ask' was removed or renamed but the checkpoint has pending work",
        stock_wrong=lambda out, ran: "finish" not in ran and not any("ask:" in x for x in out["log"]),
        why="stock drops ask's trigger and interrupt: the answer is lost and the thread ends "
        "without running finish, silently",
    ),
    Case(
        "remove-node-a-finished-task-routed-to",
        lambda r: fork(r, "X"),
        lambda r: fork(r, "Y"),
        refused="node 'X' was removed or renamed but the checkpoint has pending work",
        stock_wrong=lambda out, ran: "Y" not in ran,
        why="a finished, so stock replays its write to the removed X (dropped) and never "
        "re-runs a: neither X nor the new a -> Y runs",
    ),
    Case(
        "remove-edge-a-finished-task-routed-along",
        lambda r: fork(r, "X", extra=("Y",)),
        lambda r: fork(r, "Y", extra=("X",)),
        refused="stored routing decision 'a' -> 'X' is along an edge the running graph no longer has",
        stock_wrong=lambda out, ran: "X" in ran and "Y" not in ran,
        why="stock replays a's stored decision along the removed edge a -> X: X runs, the new "
        "a -> Y never does",
    ),
    Case(
        "add-edge-out-of-a-finished-task",
        lambda r: fork(r, "X"),
        lambda r: fork(r, "X", "Y"),
        refused="the running graph adds the edge(s) 'a' -> 'Y'",
        stock_wrong=lambda out, ran: "X" in ran and "Y" not in ran,
        why="a finished, so stock replays its stored writes (to X) and never re-runs it: "
        "the new edge a -> Y is never taken",
    ),
    Case(
        "add-edge-out-of-an-interrupted-node",
        lambda r: chain(r, "ask", "finish"),
        lambda r: chain(r, "ask", "finish").add_node("also", step("also", r)).add_edge("ask", "also"),
        why="ask has not finished: it re-runs and takes both edges",
    ),
    Case(
        "rename-state-key",
        lambda r: chain(r, "ask", "finish"),
        lambda r: chain(r, "ask", "finish", schema=Renamed),
        inputs=(("topic", "urgent"),),
        refused="state key 'topic' was removed but holds data",
        stock_wrong=lambda out, ran: "topic" not in out and "subject" not in out,
        why="stock drops the stored value of the old key on load: the value is gone under "
        "both names (a migration's rename_channels carries it over)",
    ),
    Case(
        "add-state-key",
        lambda r: chain(r, "ask", "finish"),
        lambda r: chain(r, "ask", "finish", schema=Extra),
        inputs=(("topic", "urgent"),),
        why="a new key starts empty for old threads, as in stock",
    ),
    Case(
        "change-conditional-targets-of-interrupted-router",
        lambda r: branching(r, ["B", "C"], router_asks=True),
        lambda r: branching(r, ["B", "D"], router_asks=True),
        why="the router has not finished: its conditional edge is evaluated on the new graph",
    ),
    Case(
        "change-conditional-targets-after-stored-decision",
        lambda r: branching(r, ["B", "C"], router_asks=False),
        lambda r: branching(r, ["B", "D"], router_asks=False),
        refused="stored routing decision 'router' -> 'C' is along an edge",
        stock_wrong=lambda out, ran: "C" in ran and "D" not in ran,
        why="the router finished beside the interrupted waiter and its decision (C) is stored: "
        "stock replays it although the new conditional edge no longer goes to C",
    ),
    Case(
        "change-node-function-only",
        lambda r: chain(r, "ask", "finish"),
        lambda r: chain(r, "ask", "finish", code={"finish": "finish-v2"}),
        why="the topology, hence the fingerprint, is the same: there is nothing to check",
    ),
    Case(
        "subgraph-add-node-after-interrupted-node",
        lambda r: nested(r, "ask", "finish"),
        lambda r: nested(r, "ask", "audit", "finish"),
        why="the thread is paused inside the subgraph; its own checkpoint is compatible with "
        "the new subgraph (the same rule one level down)",
    ),
    Case(
        "subgraph-remove-interrupted-node",
        lambda r: nested(r, "fetch", "ask", "finish"),
        lambda r: nested(r, "fetch", "finish"),
        refused="in subgraph 'sub': node 'ask' was removed or renamed",
        stock_wrong=lambda out, ran: not any("ask:" in x for x in out["log"]),
        why="stock resumes the subgraph's checkpoint on the new subgraph, which drops ask's "
        "interrupt: the answer is lost",
    ),
]


# --- running one side ---------------------------------------------------------------------


def _resume_value(case: Case) -> Any:
    return None if case.crash else Command(resume="yes")


def _pause(case: Case, saver: Any, tid: str) -> None:
    ran: Ran = []
    out = case.v1(ran).compile(checkpointer=saver).invoke({"log": [], **dict(case.inputs)}, cfg(tid))
    assert "__interrupt__" in out, out


def _crash_in_child(dsn: str, tid: str, kind: str) -> None:
    env = {**os.environ, CRASH_ENV: "1"}
    proc = subprocess.run(
        [sys.executable, __file__, kind, dsn, tid], env=env, capture_output=True, text=True, timeout=120
    )
    assert proc.returncode == -signal.SIGKILL, (proc.returncode, proc.stderr[-2000:])


def _stock_run(case: Case, stock_dsn: str, tid: str) -> tuple[dict[str, Any], Ran]:
    ran: Ran = []
    if case.crash:
        from langgraph.checkpoint.postgres import PostgresSaver

        _crash_in_child(stock_dsn, tid, "stock")
        with PostgresSaver.from_conn_string(stock_dsn) as stock:
            out = case.v2(ran).compile(checkpointer=stock).invoke(None, cfg(tid))
        return out, ran
    mem = InMemorySaver()
    _pause(case, mem, tid)
    out = case.v2(ran).compile(checkpointer=mem).invoke(_resume_value(case), cfg(tid))
    return out, ran


@pytest.fixture(scope="module")
def stock_dsn(admin_dsn: str) -> Any:
    from langgraph.checkpoint.postgres import PostgresSaver

    url = make_database(admin_dsn, "graph_edits_stock")
    with PostgresSaver.from_conn_string(url) as stock:
        stock.setup()
    yield url
    drop_database(admin_dsn, url)


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_graph_edit_against_stock(case: Case, dsn: str, stock_dsn: str) -> None:
    """One edit kind: durable ends where stock does, or refuses where stock is wrong."""
    tid = f"edit-{case.id}"
    stock_out, stock_ran = _stock_run(case, stock_dsn, tid)
    ran: Ran = []
    with DurablePostgresSaver.from_conn_string(dsn, lease_ttl=1.5) as saver:
        if case.crash:
            _crash_in_child(dsn, tid, "durable")
        else:
            _pause(case, saver, tid)
        before = saver.get_tuple(cfg(tid))
        v2 = case.v2(ran).compile(checkpointer=saver)
        if case.refused is None:
            out = v2.invoke(_resume_value(case), cfg(tid))
            assert out == stock_out, (case.why, out, stock_out)
            assert ran == stock_ran, (case.why, ran, stock_ran)
            assert v2.get_state(cfg(tid)).next == ()
            return
        assert case.stock_wrong is not None and case.stock_wrong(stock_out, stock_ran), (
            "stock did not show the failure the refusal prevents",
            case.why,
            stock_out,
            stock_ran,
        )
        with pytest.raises(GraphVersionMismatchError) as err:
            v2.invoke(_resume_value(case), cfg(tid))
        _check_refusal(err.value, case, tid)
        assert ran == []  # nothing ran
        after = saver.get_tuple(cfg(tid))
        assert before is not None and after is not None
        assert after.config == before.config and after.pending_writes == before.pending_writes
        # The policy the error names lets it go on, to what stock does.
        out = v2.invoke(_resume_value(case), cfg(tid, version_policy="warn"))
        assert out == stock_out and ran == stock_ran, (out, stock_out, ran, stock_ran)


def _check_refusal(err: GraphVersionMismatchError, case: Case, tid: str) -> None:
    """Typed, picklable, and actionable in one read: why, and each way on."""
    assert case.refused is not None
    compat = err.compatibility
    assert compat is not None and compat["verdict"] == "incompatible", compat
    assert any(case.refused in r for r in compat["reasons"]), compat["reasons"]
    assert err.thread_id == tid and err.policy == "refuse"
    assert err.policies == ("warn", "auto-upgrade")
    text = str(err)
    assert case.refused in text
    for hint in ("version_policy='warn'", "'auto-upgrade'", "langgraph dev", "migrations.register("):
        assert hint in text, (hint, text)
    again = pickle.loads(pickle.dumps(err))
    assert str(again) == text and again.compatibility == compat and again.policies == err.policies


@pytest.mark.parametrize(
    "case", [c for c in CASES if c.id.startswith("subgraph-")], ids=lambda c: c.id
)
async def test_graph_edit_against_stock_async(case: Case, dsn: str) -> None:
    """The subgraph rows on the async saver: the subgraph's checkpoint is read in the
    async run start as in the sync one."""
    from langgraph_durable import AsyncDurablePostgresSaver

    tid = f"aedit-{case.id}"
    stock_ran: Ran = []
    mem = InMemorySaver()
    await case.v1([]).compile(checkpointer=mem).ainvoke({"log": []}, cfg(tid))
    stock_out = await case.v2(stock_ran).compile(checkpointer=mem).ainvoke(Command(resume="yes"), cfg(tid))
    ran: Ran = []
    async with AsyncDurablePostgresSaver.from_conn_string(dsn) as saver:
        assert "__interrupt__" in await case.v1([]).compile(checkpointer=saver).ainvoke(
            {"log": []}, cfg(tid)
        )
        v2 = case.v2(ran).compile(checkpointer=saver)
        if case.refused is None:
            assert await v2.ainvoke(Command(resume="yes"), cfg(tid)) == stock_out
            assert ran == stock_ran
            return
        with pytest.raises(GraphVersionMismatchError) as err:
            await v2.ainvoke(Command(resume="yes"), cfg(tid))
        _check_refusal(err.value, case, tid)
        assert ran == []


def test_strict_refusal_says_the_default_would_let_it_through(dsn: str) -> None:
    """Under version_policy='strict' a compatible edit is refused, and the error says
    that 'refuse' (the default) would let it go on."""
    ran: Ran = []
    with DurablePostgresSaver.from_conn_string(dsn, version_policy="strict") as saver:
        chain(ran, "ask", "finish").compile(checkpointer=saver).invoke({"log": []}, cfg("strict-1"))
        with pytest.raises(GraphVersionMismatchError) as err:
            chain(ran, "ask", "audit", "finish").compile(checkpointer=saver).invoke(
                Command(resume="yes"), cfg("strict-1")
            )
    assert err.value.compatibility is not None
    assert err.value.compatibility["verdict"] == "compatible"
    assert err.value.policy == "strict"
    assert "version_policy='strict'" in str(err.value) and "'refuse'" in str(err.value)


# --- the crash row's child ----------------------------------------------------------------


def _child(kind: str, dsn: str, tid: str) -> None:
    """Run v1 of the crash row until its node SIGKILLs this process."""
    case = next(c for c in CASES if c.crash)
    ran: Ran = []
    if kind == "stock":
        from langgraph.checkpoint.postgres import PostgresSaver

        with PostgresSaver.from_conn_string(dsn) as stock:
            case.v1(ran).compile(checkpointer=stock).invoke({"log": []}, cfg(tid), durability="sync")
    else:
        with DurablePostgresSaver.from_conn_string(dsn, lease_ttl=1.5) as saver:
            case.v1(ran).compile(checkpointer=saver).invoke({"log": []}, cfg(tid), durability="sync")
    print("finished without being killed", file=sys.stderr)
    sys.exit(3)


if __name__ == "__main__":
    _child(sys.argv[1], sys.argv[2], sys.argv[3])
