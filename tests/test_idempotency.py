"""@idempotent against a real PostgreSQL: records, replays, conflicts, in-flight calls,
unknown outcomes after a real SIGKILL, failures, transactional mode, tools, the
functional API, retention."""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import subprocess
import sys
import threading
import uuid
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest
from langchain_core.language_models.chat_models import BaseChatModel
from langchain_core.messages import AIMessage, BaseMessage, HumanMessage, ToolMessage
from langchain_core.outputs import ChatGeneration, ChatResult
from langchain_core.tools import tool
from langgraph.checkpoint.memory import InMemorySaver
from langgraph.checkpoint.postgres import PostgresSaver
from langgraph.func import entrypoint, task
from langgraph.graph import END, START, MessagesState, StateGraph
from langgraph.prebuilt import ToolNode, tools_condition
from langgraph.types import Command, RetryPolicy, interrupt

from langgraph_durable import (
    AsyncDurablePostgresSaver,
    CallInFlightError,
    ConfigurationError,
    DurablePostgresSaver,
    IdempotencyConflictError,
    IdempotencyError,
    IdempotentCallFailedError,
    IdempotentTool,
    InvalidIdempotencyKeyError,
    Ledger,
    NoLedgerError,
    OutcomeUnknownError,
    SerializationError,
    UnstableKeyError,
    apurge_expired_keys,
    idempotent,
    purge_expired_keys,
)

HERE = os.path.dirname(os.path.abspath(__file__))
CHILD = os.path.join(HERE, "_child_idempotency.py")
sys.path.insert(0, HERE)
import _child_idempotency as child  # noqa: E402


def k() -> str:
    return f"key-{uuid.uuid4().hex[:12]}"


def ledger_count(dsn: str) -> int:
    with psycopg.connect(dsn) as conn:
        return int(conn.execute("SELECT count(*) FROM durable_ledger").fetchone()[0])  # type: ignore[index]


def count(dsn: str, sql: str, params: tuple[Any, ...] = ()) -> int:
    with psycopg.connect(dsn) as conn:
        return int(conn.execute(sql, params).fetchone()[0])  # type: ignore[index]


# --- children: started once per module, so their imports overlap the other tests ----


@pytest.fixture(scope="module", autouse=True)
def children(dsn: str) -> Iterator[dict[str, Any]]:
    child.create_tables(dsn)
    env = {**os.environ, "IDEM_DSN": dsn}
    thread_id = f"unknown-{uuid.uuid4().hex[:6]}"
    key = f"refund:{uuid.uuid4().hex[:8]}"
    procs = {
        "graph": subprocess.Popen(
            [sys.executable, CHILD, "unknown-graph", thread_id], env=env, stdout=subprocess.PIPE
        ),
        "key": subprocess.Popen(
            [sys.executable, CHILD, "unknown-key", key], env=env, stdout=subprocess.PIPE
        ),
    }
    yield {"procs": procs, "thread_id": thread_id, "key": key}
    for p in procs.values():
        if p.poll() is None:
            p.kill()
        p.wait()
        assert p.stdout is not None
        p.stdout.close()


# --- records and replays -------------------------------------------------------------


def test_records_the_result_and_replays_it_without_running(saver: DurablePostgresSaver) -> None:
    key, runs = k(), []

    @idempotent(ledger=saver, key=lambda to, body: key)
    def send_email(to: str, body: str) -> dict[str, Any]:
        runs.append(to)
        return {"id": 7, "to": to, "parts": (1, 2)}

    first = send_email("a@example.com", "hi")
    again = send_email("a@example.com", "hi")
    assert runs == ["a@example.com"]
    # The first caller gets the recorded (round-tripped) value too: tuples become lists.
    assert first == again == {"id": 7, "to": "a@example.com", "parts": [1, 2]}
    entry = Ledger(saver).get(key)
    assert entry is not None and entry.status == "completed" and entry.attempts == 1
    assert entry.name == send_email.__qualname__ and entry.thread_id is None
    assert entry.args_preview is not None and "a@example.com" in entry.args_preview
    assert Ledger(saver).result(key) == first


def test_same_key_other_arguments_is_a_conflict(saver: DurablePostgresSaver) -> None:
    key, runs = k(), []

    @idempotent(ledger=saver, key=lambda order_id, amount: key)
    def refund(order_id: str, amount: int) -> int:
        runs.append(amount)
        return amount

    assert refund("o1", 10) == 10
    with pytest.raises(IdempotencyConflictError) as err:
        refund("o1", 11)
    assert err.value.key == key and err.value.stored_fingerprint != err.value.fingerprint

    @idempotent(ledger=saver, key=lambda order_id, amount: key)
    def charge(order_id: str, amount: int) -> int:  # same key, another operation
        runs.append(-amount)
        return amount

    with pytest.raises(IdempotencyConflictError):
        charge("o1", 10)
    # Keyword order and defaults do not change the fingerprint.
    assert refund(amount=10, order_id="o1") == 10
    assert runs == [10]


def test_the_key_is_handed_to_the_function(saver: DurablePostgresSaver) -> None:
    import inspect

    key, seen = k(), []

    @idempotent(ledger=saver, key=lambda url: key)
    def post(url: str, idempotency_key: str) -> str:
        seen.append(idempotency_key)  # e.g. an HTTP Idempotency-Key header
        return url

    assert "idempotency_key" not in inspect.signature(post).parameters
    assert post("https://x") == "https://x"
    assert seen == [key]
    with pytest.raises(TypeError):
        post("https://x", idempotency_key="mine")  # the wrapper owns that parameter


def test_an_exception_is_not_cached(saver: DurablePostgresSaver) -> None:
    key, runs = k(), []

    @idempotent(ledger=saver, key=lambda: key)
    def flaky() -> str:
        runs.append(1)
        if len(runs) == 1:
            raise ConnectionError("receiver down")
        return "ok"

    with pytest.raises(ConnectionError):
        flaky()
    assert Ledger(saver).get(key) is None  # released: the next attempt runs again
    assert flaky() == "ok"
    assert flaky() == "ok"
    assert len(runs) == 2


def test_cache_failures_records_chosen_exceptions(saver: DurablePostgresSaver) -> None:
    key, key2, runs = k(), k(), []

    @idempotent(ledger=saver, key=lambda kind, kk: kk, cache_failures=(ValueError,))
    def declined(kind: str, kk: str) -> str:
        runs.append(kind)
        if kind == "value":
            raise ValueError("card declined")
        raise ConnectionError("timeout")

    with pytest.raises(ValueError):
        declined("value", key)
    with pytest.raises(IdempotentCallFailedError) as err:
        declined("value", key)
    assert err.value.error_type == "ValueError" and "declined" in str(err.value.error)
    with pytest.raises(ConnectionError):
        declined("conn", key2)
    with pytest.raises(ConnectionError):
        declined("conn", key2)  # not a cached type: runs again
    assert runs == ["value", "conn", "conn"]
    assert Ledger(saver).forget(key) is True
    with pytest.raises(ValueError):
        declined("value", key)


def test_an_unserializable_result_is_a_clear_error_and_never_reruns(saver: DurablePostgresSaver) -> None:
    key, runs = k(), []

    @idempotent(ledger=saver, key=lambda: key)
    def make_lock() -> Any:
        runs.append(1)
        return threading.Lock() if len(runs) == 1 else "fine"

    with pytest.raises(SerializationError) as err:
        make_lock()
    assert err.value.key == key and "lock" in err.value.value_type
    entry = Ledger(saver).get(key)
    assert entry is not None and entry.status == "failed" and entry.error_type == "SerializationError"
    # The effect happened: the call is not repeated until an operator says so.
    with pytest.raises(IdempotentCallFailedError):
        make_lock()
    assert len(runs) == 1
    Ledger(saver).forget(key)
    assert make_lock() == "fine"


def test_an_argument_without_a_canonical_form_must_be_excluded(saver: DurablePostgresSaver) -> None:
    key = k()

    @idempotent(ledger=saver, key=lambda n, lock: key)
    def locked(n: int, lock: Any) -> int:
        return n

    with pytest.raises(SerializationError, match="exclude"):
        locked(1, threading.Lock())
    assert Ledger(saver).get(key) is None

    @idempotent(ledger=saver, key=lambda n, lock: key, exclude=["lock"])
    def locked2(n: int, lock: Any) -> int:
        return n

    assert locked2(1, threading.Lock()) == 1


# --- in flight -----------------------------------------------------------------------


class _Seen(logging.Handler):
    def __init__(self, needle: str) -> None:
        super().__init__(logging.DEBUG)
        self.needle, self.event = needle, threading.Event()

    def emit(self, record: logging.LogRecord) -> None:
        if self.needle in record.getMessage():
            self.event.set()


def test_a_second_caller_waits_for_the_call_in_flight(saver: DurablePostgresSaver) -> None:
    key, runs, results = k(), [], []
    gate, entered = threading.Event(), threading.Event()

    @idempotent(ledger=saver, key=lambda x: key)
    def slow(x: int) -> int:
        entered.set()
        assert gate.wait(30)
        runs.append(x)
        return x * 2

    log = logging.getLogger("langgraph_durable.idempotency")
    seen, level = _Seen("in flight elsewhere"), log.level
    log.addHandler(seen)
    log.setLevel(logging.DEBUG)
    try:
        a = threading.Thread(target=lambda: results.append(slow(21)))
        a.start()
        assert entered.wait(30)
        entry = Ledger(saver).get(key)
        assert entry is not None and entry.in_flight and not entry.outcome_unknown
        with pytest.raises(CallInFlightError):
            Ledger(saver).forget(key)  # an operator cannot pull a live call's key
        b = threading.Thread(target=lambda: results.append(slow(21)))
        b.start()
        assert seen.event.wait(30)  # b saw the live claim and is waiting
        gate.set()
        a.join(30)
        b.join(30)
    finally:
        gate.set()
        log.removeHandler(seen)
        log.setLevel(level)
    assert results == [42, 42] and runs == [21]


def test_a_caller_gives_up_after_wait_timeout(saver: DurablePostgresSaver) -> None:
    key, gate, entered = k(), threading.Event(), threading.Event()

    @idempotent(ledger=saver, key=lambda: key, wait_timeout=0.2)
    def slow() -> str:
        entered.set()
        assert gate.wait(30)
        return "done"

    out: list[str] = []
    a = threading.Thread(target=lambda: out.append(slow()))
    a.start()
    try:
        assert entered.wait(30)
        with pytest.raises(CallInFlightError) as err:
            slow()
        assert err.value.key == key
    finally:
        gate.set()
        a.join(30)
    assert out == ["done"] and slow() == "done"


# --- configuration and bad input -----------------------------------------------------


def test_no_ledger_and_no_key_are_clear_errors(saver: DurablePostgresSaver, dsn: str) -> None:
    @idempotent
    def plain(x: int) -> int:
        return x

    with pytest.raises(NoLedgerError, match="outside a LangGraph run"):
        plain(1)

    builder = StateGraph(child.State)
    builder.add_node("n", lambda s: {"receipts": [str(plain(1))]})
    builder.add_edge(START, "n")
    builder.add_edge("n", END)
    app = builder.compile(checkpointer=InMemorySaver())
    with pytest.raises(NoLedgerError, match="InMemorySaver"):
        app.invoke({"order": "o", "receipts": []}, {"configurable": {"thread_id": "x"}})

    before = ledger_count(dsn)

    @idempotent(ledger=saver)
    def keyless(x: int) -> int:
        return x

    with pytest.raises(InvalidIdempotencyKeyError, match="outside a LangGraph task"):
        keyless(1)
    for bad in ["", "x" * 256, 42, "a\x00b"]:

        @idempotent(ledger=saver, key=lambda x, bad=bad: bad)  # type: ignore[misc]
        def badkey(x: int) -> int:
            return x

        with pytest.raises(InvalidIdempotencyKeyError):
            badkey(1)
    with pytest.raises(TypeError):
        keyless(1, 2)  # type: ignore[call-arg]
    assert ledger_count(dsn) == before  # nothing half-written


def test_bad_configuration_is_refused_at_decoration() -> None:
    def f(x: int) -> int:
        return x

    with pytest.raises(ConfigurationError, match="on_unknown"):
        idempotent(on_unknown="maybe")(f)  # type: ignore[call-overload]
    with pytest.raises(ConfigurationError, match="conn"):
        idempotent(transactional=True)(f)
    with pytest.raises(ConfigurationError, match="ttl"):
        idempotent(ttl=60)(f)
    with pytest.raises(ConfigurationError, match="exclude"):
        idempotent(exclude=["nope"])(f)
    with pytest.raises(ConfigurationError, match="cache_failures"):
        idempotent(cache_failures=["x"])(f)  # type: ignore[call-overload]
    with pytest.raises(ConfigurationError, match="claim_ttl"):
        idempotent(claim_ttl=0.1)(f)
    with pytest.raises(ConfigurationError, match="wait_timeout"):
        idempotent(wait_timeout=-1)(f)
    with pytest.raises(ConfigurationError, match="below @task"):
        idempotent(task(f))
    with pytest.raises(ConfigurationError):
        idempotent(42)  # type: ignore[call-overload]
    with pytest.raises(ConfigurationError, match="ledger"):
        idempotent(ledger=object(), key=lambda x: "k")(f)
    with pytest.raises(ConfigurationError, match="ledger"):
        idempotent(ledger=lambda: object(), key=lambda x: "k")(f)(1)
    with pytest.raises(ConfigurationError):
        Ledger(object())  # type: ignore[arg-type]


# --- inside graphs -------------------------------------------------------------------


def _one_node_graph(node: Any, saver: Any, retry: RetryPolicy | None = None) -> Any:
    builder = StateGraph(child.State)
    builder.add_node("n", node, retry_policy=retry)
    builder.add_edge(START, "n")
    builder.add_edge("n", END)
    return builder.compile(checkpointer=saver)


def test_a_resumed_node_replays_its_recorded_calls(saver: DurablePostgresSaver) -> None:
    calls: list[str] = []
    crash = {"n": 0}

    @idempotent
    def pay(order: str, step: int) -> str:
        calls.append(f"{order}:{step}")
        return f"r-{order}-{step}"

    def node(state: child.State) -> dict[str, Any]:
        first, second = pay(state["order"], 1), pay(state["order"], 2)
        crash["n"] += 1
        if crash["n"] == 1:
            raise RuntimeError("died after both effects, before the checkpoint")
        return {"receipts": [first, second]}

    app = _one_node_graph(node, saver)
    thread = f"t-{uuid.uuid4().hex[:6]}"
    cfg = {"configurable": {"thread_id": thread}}
    with pytest.raises(RuntimeError):
        app.invoke({"order": "o1", "receipts": []}, cfg)
    out = app.invoke(None, cfg)
    assert out["receipts"] == ["r-o1-1", "r-o1-2"]
    assert calls == ["o1:1", "o1:2"]  # the resume re-ran the node, not the effects
    entries = Ledger(saver).entries(thread_id=thread)
    assert len(entries) == 2 and {e.status for e in entries} == {"completed"}
    assert all(e.key.startswith("call:") and e.thread_id == thread for e in entries)

    # A fork (update_state makes a new checkpoint, so new task ids) is a new run: its
    # calls get new keys and run.
    history = list(app.get_state_history(cfg))
    before_node = next(s for s in history if s.next == ("n",))
    fork = app.update_state(before_node.config, {"order": "o1"})
    app.invoke(None, fork)
    assert calls == ["o1:1", "o1:2", "o1:1", "o1:2"]
    assert len(Ledger(saver).entries(thread_id=thread)) == 4


def test_durability_exit_refuses_derived_keys(saver: DurablePostgresSaver) -> None:
    @idempotent
    def pay(x: int) -> int:
        return x

    @idempotent(key=lambda x: f"exit-{x}-{uuid.uuid4().hex[:6]}")
    def pay_keyed(x: int) -> int:
        return x

    app = _one_node_graph(lambda s: {"receipts": [str(pay(1))]}, saver)
    with pytest.raises(UnstableKeyError, match="durability='exit'"):
        app.invoke({"order": "o", "receipts": []}, {"configurable": {"thread_id": k()}}, durability="exit")
    keyed = _one_node_graph(lambda s: {"receipts": [str(pay_keyed(2))]}, saver)
    out = keyed.invoke({"order": "o", "receipts": []}, {"configurable": {"thread_id": k()}}, durability="exit")
    assert out["receipts"] == ["2"]


def test_a_retried_task_counts_its_calls_from_zero_again(saver: DurablePostgresSaver) -> None:
    calls: list[int] = []
    attempts = {"n": 0}

    @idempotent
    def pay(step: int) -> int:
        calls.append(step)
        return step

    def node(state: child.State) -> dict[str, Any]:
        got = [pay(1), pay(2)]
        attempts["n"] += 1
        if attempts["n"] < 3:
            raise ConnectionError("transient")
        return {"receipts": [str(g) for g in got]}

    app = _one_node_graph(node, saver, RetryPolicy(max_attempts=3, initial_interval=0.01, jitter=False))
    out = app.invoke({"order": "o", "receipts": []}, {"configurable": {"thread_id": k()}})
    assert out["receipts"] == ["1", "2"] and calls == [1, 2] and attempts["n"] == 3


def test_nested_calls_are_keyed_under_their_parent(saver: DurablePostgresSaver) -> None:
    calls: list[str] = []
    crash = {"n": 0}

    @idempotent
    def inner(x: str) -> str:
        calls.append(f"inner:{x}")
        return x.upper()

    @idempotent
    def outer(x: str) -> str:
        calls.append(f"outer:{x}")
        return inner(x) + inner(x + x)

    @idempotent
    def after(x: str) -> str:
        calls.append(f"after:{x}")
        return x

    def node(state: child.State) -> dict[str, Any]:
        a = outer("a")
        crash["n"] += 1
        if crash["n"] == 1:
            raise RuntimeError("crash")
        # On the resume outer replays without calling inner: after() must still get
        # its own key, not one of inner's.
        return {"receipts": [a, after("b")]}

    app = _one_node_graph(node, saver)
    cfg = {"configurable": {"thread_id": k()}}
    with pytest.raises(RuntimeError):
        app.invoke({"order": "o", "receipts": []}, cfg)
    assert app.invoke(None, cfg)["receipts"] == ["AAA", "b"]
    assert calls == ["outer:a", "inner:a", "inner:aa", "after:b"]


def test_an_interrupt_inside_the_call_is_not_an_outcome(saver: DurablePostgresSaver) -> None:
    calls: list[str] = []

    @idempotent
    def approve_then_pay(order: str) -> str:
        answer = interrupt(f"pay {order}?")  # before the effect: see docs
        calls.append(order)
        return f"{answer}:{order}"

    app = _one_node_graph(lambda s: {"receipts": [approve_then_pay(s["order"])]}, saver)
    cfg = {"configurable": {"thread_id": k()}}
    first = app.invoke({"order": "o7", "receipts": []}, cfg)
    assert "__interrupt__" in first and calls == []
    assert Ledger(saver).entries(thread_id=cfg["configurable"]["thread_id"]) == []
    assert app.invoke(Command(resume="yes"), cfg)["receipts"] == ["yes:o7"]
    assert calls == ["o7"]


def test_functional_api_task_and_entrypoint(saver: DurablePostgresSaver) -> None:
    calls: list[str] = []
    crash = {"task": 0, "entry": 0}

    @idempotent
    def charge(order: str) -> str:
        calls.append(f"charge:{order}")
        return f"c-{order}"

    @task
    def charge_and_work(order: str) -> str:
        receipt = charge(order)
        crash["task"] += 1
        if crash["task"] == 1:
            raise RuntimeError("task died after its effect")
        return receipt

    @task
    @idempotent
    def ship(order: str) -> str:
        calls.append(f"ship:{order}")
        return f"s-{order}"

    @idempotent
    def notify(order: str) -> str:
        calls.append(f"notify:{order}")
        return f"n-{order}"

    @entrypoint(checkpointer=saver)
    def flow(order: str) -> list[str]:
        out = [charge_and_work(order).result(), ship(order).result(), notify(order)]
        crash["entry"] += 1
        if crash["entry"] == 1:
            raise RuntimeError("entrypoint died after its effects")
        return out

    cfg = {"configurable": {"thread_id": k()}}
    with pytest.raises(RuntimeError, match="task died"):
        flow.invoke("o1", cfg)
    with pytest.raises(RuntimeError, match="entrypoint died"):
        flow.invoke(None, cfg)
    assert flow.invoke(None, cfg) == ["c-o1", "s-o1", "n-o1"]
    assert calls == ["charge:o1", "ship:o1", "notify:o1"]


# --- tools ---------------------------------------------------------------------------


class ScriptedModel(BaseChatModel):
    """Asks for three tool calls at once, then answers. Decides from the messages only,
    so a resumed run sees the same script."""

    def _generate(self, messages: list[BaseMessage], stop: Any = None, run_manager: Any = None, **kw: Any) -> ChatResult:
        if not any(isinstance(m, ToolMessage) for m in messages):
            msg = AIMessage(
                content="",
                tool_calls=[
                    {"name": "charge_card", "args": {"order": "o1", "amount": 5}, "id": "call_a", "type": "tool_call"},
                    {"name": "charge_card", "args": {"order": "o2", "amount": 7}, "id": "call_b", "type": "tool_call"},
                    {"name": "lookup", "args": {"q": "status"}, "id": "call_c", "type": "tool_call"},
                ],
            )
        else:
            msg = AIMessage(content="all done")
        return ChatResult(generations=[ChatGeneration(message=msg)])

    @property
    def _llm_type(self) -> str:
        return "scripted"


def _agent(tools: list[Any], saver: Any, is_async: bool = False) -> Any:
    model = ScriptedModel()

    def agent(state: MessagesState) -> dict[str, Any]:
        return {"messages": [model.invoke(state["messages"])]}

    async def aagent(state: MessagesState) -> dict[str, Any]:
        return {"messages": [await model.ainvoke(state["messages"])]}

    builder = StateGraph(MessagesState)
    builder.add_node("agent", aagent if is_async else agent)
    builder.add_node("tools", ToolNode(tools, handle_tool_errors=False))
    builder.add_edge(START, "agent")
    builder.add_conditional_edges("agent", tools_condition)
    builder.add_edge("tools", "agent")
    return builder.compile(checkpointer=saver)


def _tools(charges: list[str], lookups: list[str]) -> tuple[Any, Any]:
    @tool
    def charge_card(order: str, amount: int) -> str:
        """Charge the customer's card."""
        charges.append(order)
        return f"charged {order} {amount}"

    @tool
    def lookup(q: str) -> str:
        """Look something up (fails the first time)."""
        lookups.append(q)
        if len(lookups) == 1:
            raise ConnectionError("lookup service down")
        return f"found {q}"

    return charge_card, lookup


def _tool_messages(out: dict[str, Any]) -> dict[str, str]:
    return {m.tool_call_id: m.content for m in out["messages"] if isinstance(m, ToolMessage)}


def test_toolnode_agent_loop_replays_parallel_tool_calls(saver: DurablePostgresSaver, dsn: str) -> None:
    charges: list[str] = []
    lookups: list[str] = []
    charge_card, lookup = _tools(charges, lookups)
    wrapped = [idempotent(charge_card), idempotent(lookup)]
    assert isinstance(wrapped[0], IdempotentTool) and wrapped[0].name == "charge_card"
    assert wrapped[0].tool_call_schema.model_json_schema() == charge_card.tool_call_schema.model_json_schema()
    app = _agent(wrapped, saver)
    thread = k()
    cfg = {"configurable": {"thread_id": thread}}
    with pytest.raises(ConnectionError):
        app.invoke({"messages": [HumanMessage("pay both orders")]}, cfg)
    assert sorted(charges) == ["o1", "o2"]
    out = app.invoke(None, cfg)  # the tools node runs again: the charges replay
    assert sorted(charges) == ["o1", "o2"] and len(lookups) == 2
    assert _tool_messages(out) == {
        "call_a": "charged o1 5",
        "call_b": "charged o2 7",
        "call_c": "found status",
    }
    assert out["messages"][-1].content == "all done"
    keys = {e.key for e in Ledger(saver).entries(thread_id=thread)}
    assert len(keys) == 3 and all(key.startswith("tool:") for key in keys)

    # The same tool_call_id in another thread is another call.
    lookups.clear()
    lookups.append("warm")  # lookup succeeds at once now
    app.invoke({"messages": [HumanMessage("again")]}, {"configurable": {"thread_id": k()}})
    assert sorted(charges) == ["o1", "o1", "o2", "o2"]

    # The stock saver with the bare tools re-runs the charges that had succeeded.
    stock_charges: list[str] = []
    stock_lookups: list[str] = []
    bare = _tools(stock_charges, stock_lookups)
    with PostgresSaver.from_conn_string(dsn) as stock:
        stock_app = _agent(list(bare), stock)
        scfg = {"configurable": {"thread_id": k()}}
        with pytest.raises(ConnectionError):
            stock_app.invoke({"messages": [HumanMessage("pay both orders")]}, scfg)
        stock_app.invoke(None, scfg)
    assert sorted(stock_charges) == ["o1", "o1", "o2", "o2"]


async def test_toolnode_agent_loop_async(asaver: AsyncDurablePostgresSaver) -> None:
    charges: list[str] = []
    lookups: list[str] = []

    @tool
    async def charge_card(order: str, amount: int) -> str:
        """Charge the customer's card."""
        charges.append(order)
        return f"charged {order} {amount}"

    @tool
    async def lookup(q: str) -> str:
        """Look something up (fails the first time)."""
        lookups.append(q)
        if len(lookups) == 1:
            raise ConnectionError("lookup service down")
        return f"found {q}"

    app = _agent([idempotent(charge_card), idempotent(lookup)], asaver, is_async=True)
    cfg = {"configurable": {"thread_id": k()}}
    with pytest.raises(ConnectionError):
        await app.ainvoke({"messages": [HumanMessage("pay")]}, cfg)
    out = await app.ainvoke(None, cfg)
    assert sorted(charges) == ["o1", "o2"] and len(lookups) == 2
    assert _tool_messages(out)["call_b"] == "charged o2 7"


def test_a_tool_built_on_an_idempotent_function(saver: DurablePostgresSaver) -> None:
    key, runs = k(), []

    @tool
    @idempotent(ledger=saver, key=lambda to: key)
    def email(to: str, idempotency_key: str) -> str:
        """Send an email."""
        runs.append(idempotency_key)
        return f"sent to {to}"

    assert set(email.tool_call_schema.model_json_schema()["properties"]) == {"to"}
    assert email.invoke({"to": "x@y"}) == email.invoke({"to": "x@y"}) == "sent to x@y"
    assert runs == [key]


# --- async ---------------------------------------------------------------------------


async def test_async_function_records_replays_and_conflicts(asaver: AsyncDurablePostgresSaver) -> None:
    key, runs = k(), []

    @idempotent(ledger=asaver, key=lambda order_id, amount: key)
    async def refund(order_id: str, amount: int) -> dict[str, Any]:
        runs.append(amount)
        await asyncio.sleep(0)
        return {"refunded": amount}

    results = await asyncio.gather(refund("o", 5), refund("o", 5), refund("o", 5))
    assert results == [{"refunded": 5}] * 3 and runs == [5]
    with pytest.raises(IdempotencyConflictError):
        await refund("o", 6)
    entry = await Ledger(asaver).aget(key)
    assert entry is not None and entry.status == "completed"


async def test_async_function_with_a_sync_ledger(saver: DurablePostgresSaver) -> None:
    key, runs = k(), []

    @idempotent(ledger=saver, key=lambda: key)
    async def ping() -> str:
        runs.append(1)
        return "pong"

    assert await ping() == await ping() == "pong" and runs == [1]


async def test_a_cancelled_call_has_an_unknown_outcome(asaver: AsyncDurablePostgresSaver) -> None:
    key, started = k(), asyncio.Event()

    @idempotent(ledger=asaver, key=lambda: key)
    async def hang() -> str:
        started.set()
        await asyncio.sleep(60)
        return "never"

    running = asyncio.create_task(hang())
    await started.wait()
    running.cancel()
    with pytest.raises(asyncio.CancelledError):
        await running
    entry = await Ledger(asaver).aget(key)
    assert entry is not None and entry.status == "started" and entry.outcome_unknown
    with pytest.raises(OutcomeUnknownError) as err:
        await hang()
    assert err.value.key == key
    assert await Ledger(asaver).aforget(key) is True


async def test_an_async_graph_resume_replays(asaver: AsyncDurablePostgresSaver) -> None:
    calls: list[str] = []
    crash = {"n": 0}

    @idempotent
    async def pay(order: str) -> str:
        calls.append(order)
        return f"r-{order}"

    async def node(state: child.State) -> dict[str, Any]:
        r = await pay(state["order"])
        crash["n"] += 1
        if crash["n"] == 1:
            raise RuntimeError("crash")
        return {"receipts": [r]}

    app = _one_node_graph(node, asaver)
    cfg = {"configurable": {"thread_id": k()}}
    with pytest.raises(RuntimeError):
        await app.ainvoke({"order": "o3", "receipts": []}, cfg)
    assert (await app.ainvoke(None, cfg))["receipts"] == ["r-o3"] and calls == ["o3"]


# --- transactional mode --------------------------------------------------------------


@pytest.fixture
def tx_table(dsn: str) -> str:
    name = f"tx_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(
            psycopg.sql.SQL("CREATE TABLE {} (id BIGSERIAL PRIMARY KEY, v TEXT)").format(
                psycopg.sql.Identifier(name)
            )
        )
    return name


def test_transactional_effect_and_record_commit_together(
    saver: DurablePostgresSaver, dsn: str, tx_table: str
) -> None:
    table = psycopg.sql.Identifier(tx_table)
    insert = psycopg.sql.SQL("INSERT INTO {} (v) VALUES (%s)").format(table)
    rows = psycopg.sql.SQL("SELECT count(*) FROM {}").format(table)
    mode = {"fail": True}

    def book(conn: psycopg.Connection[Any], v: str) -> str:
        conn.execute(insert, (v,))
        if v == "boom" and mode["fail"]:
            raise ConnectionError("after the write")
        if v == "declined":
            raise LookupError("no seats")
        if v == "lock":
            return threading.Lock()  # type: ignore[return-value]
        return f"booked {v}"

    book_tx = idempotent(
        ledger=saver, key=lambda v: f"tx:{tx_table}:{v}", transactional=True,
        cache_failures=(LookupError,),
    )(book)
    assert book_tx("a") == book_tx("a") == "booked a"
    assert count(dsn, rows.as_string()) == 1
    with pytest.raises(ConnectionError):
        book_tx("boom")
    assert count(dsn, rows.as_string()) == 1  # the write rolled back with the failure
    assert Ledger(saver).get(f"tx:{tx_table}:boom") is None
    mode["fail"] = False
    assert book_tx("boom") == "booked boom"
    with pytest.raises(LookupError):
        book_tx("declined")
    with pytest.raises(IdempotentCallFailedError):
        book_tx("declined")  # the failure is recorded, its write is not
    with pytest.raises(SerializationError):
        book_tx("lock")
    assert Ledger(saver).get(f"tx:{tx_table}:lock") is None  # nothing half-written
    assert count(dsn, rows.as_string()) == 2
    with pytest.raises(IdempotencyConflictError):
        idempotent(ledger=saver, key=lambda v, w: f"tx:{tx_table}:{v}", transactional=True)(
            lambda conn, v, w: v
        )("a", 1)


def test_transactional_call_in_flight_times_out(saver: DurablePostgresSaver, tx_table: str) -> None:
    key, gate, entered = k(), threading.Event(), threading.Event()

    @idempotent(ledger=saver, key=lambda: key, transactional=True, wait_timeout=0.3)
    def hold(conn: psycopg.Connection[Any]) -> str:
        entered.set()
        assert gate.wait(30)
        return "held"

    out: list[str] = []
    a = threading.Thread(target=lambda: out.append(hold()))
    a.start()
    try:
        assert entered.wait(30)
        # The claim is uncommitted: invisible, but the second INSERT waits on it.
        with pytest.raises(CallInFlightError):
            hold()
    finally:
        gate.set()
        a.join(30)
    assert out == ["held"] and hold() == "held"


async def test_transactional_async(asaver: AsyncDurablePostgresSaver, dsn: str, tx_table: str) -> None:
    table = psycopg.sql.Identifier(tx_table)
    insert = psycopg.sql.SQL("INSERT INTO {} (v) VALUES (%s)").format(table)

    @idempotent(ledger=asaver, key=lambda v: f"atx:{tx_table}:{v}", transactional=True)
    async def book(conn: psycopg.AsyncConnection[Any], v: str) -> str:
        await conn.execute(insert, (v,))
        return v

    assert await book("x") == await book("x") == "x"

    # A sync function with an async saver gets a connection of its own.
    @idempotent(ledger=asaver, key=lambda v: f"stx:{tx_table}:{v}", transactional=True)
    def book_sync(conn: psycopg.Connection[Any], v: str) -> str:
        conn.execute(insert, (v,))
        return v

    assert await asyncio.to_thread(book_sync, "y") == "y"
    assert await asyncio.to_thread(book_sync, "y") == "y"
    n = psycopg.sql.SQL("SELECT count(*) FROM {}").format(table).as_string()
    assert count(dsn, n) == 2


# --- retention -----------------------------------------------------------------------


def test_ttl_keys_expire_and_are_purged(saver: DurablePostgresSaver, dsn: str) -> None:
    key, runs = k(), []

    @idempotent(ledger=saver, key=lambda: key, ttl=3600)
    def once() -> int:
        runs.append(1)
        return len(runs)

    assert once() == once() == 1
    entry = Ledger(saver).get(key)
    assert entry is not None and entry.expires_at is not None
    # Time passes (moved by hand rather than waited for).
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("UPDATE durable_ledger SET expires_at = now() - interval '1 second' WHERE key = %s", (key,))
    assert once() == 2  # an expired key counts as absent
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("UPDATE durable_ledger SET expires_at = now() - interval '1 second' WHERE key = %s", (key,))
    assert purge_expired_keys(saver) >= 1
    assert Ledger(saver).get(key) is None


async def test_apurge_expired_keys(asaver: AsyncDurablePostgresSaver, dsn: str) -> None:
    key = k()

    @idempotent(ledger=asaver, key=lambda: key, ttl=3600)
    async def once() -> int:
        return 1

    await once()
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("UPDATE durable_ledger SET expires_at = now() - interval '1 second' WHERE key = %s", (key,))
    assert await apurge_expired_keys(asaver) >= 1
    assert await Ledger(asaver).aget(key) is None


def test_delete_thread_removes_its_keys_but_not_operation_keys(saver: DurablePostgresSaver) -> None:
    op_key = k()

    @idempotent
    def derived(x: int) -> int:
        return x

    @idempotent(key=lambda x: op_key)
    def keyed(x: int) -> int:
        return x

    app = _one_node_graph(lambda s: {"receipts": [str(derived(1) + keyed(2))]}, saver)
    thread = k()
    app.invoke({"order": "o", "receipts": []}, {"configurable": {"thread_id": thread}})
    assert len(Ledger(saver).entries(thread_id=thread)) == 2  # origin thread included
    saver.delete_thread(thread)
    left = Ledger(saver).entries(thread_id=thread)
    assert [e.key for e in left] == [op_key] and left[0].origin_thread_id == thread


def test_ledger_operator_errors(saver: DurablePostgresSaver) -> None:
    key = k()
    with pytest.raises(IdempotencyError, match="not in the ledger"):
        Ledger(saver).resolve(key, "x")
    assert Ledger(saver).forget(key) is False

    @idempotent(ledger=saver, key=lambda: key)
    def done() -> str:
        return "d"

    done()
    with pytest.raises(IdempotencyError, match="already completed"):
        Ledger(saver).resolve(key, "other")
    with pytest.raises(SerializationError):
        Ledger(saver).resolve(k(), threading.Lock())
    with pytest.raises(IdempotencyError, match="no recorded result"):
        Ledger(saver).result(k())


# --- unknown outcomes after a real SIGKILL -------------------------------------------


def _wait_killed(proc: subprocess.Popen[bytes]) -> None:
    assert proc.wait(timeout=120) == -signal.SIGKILL


def test_unknown_outcome_in_a_graph_then_operator_resolves(dsn: str, children: dict[str, Any]) -> None:
    _wait_killed(children["procs"]["graph"])
    thread = children["thread_id"]
    assert count(dsn, "SELECT count(*) FROM effects WHERE tag = 'pay:o-1'") == 1
    calls: list[str] = []

    @idempotent(name="pay_once")
    def pay_once(order: str) -> dict[str, str]:
        calls.append(order)
        return {"receipt": f"r-{order}"}

    builder = StateGraph(child.State)
    builder.add_node("pay", lambda s: {"receipts": [pay_once(s["order"])["receipt"]]})
    builder.add_edge(START, "pay")
    builder.add_edge("pay", END)
    with DurablePostgresSaver.from_conn_string(
        dsn, lease_ttl=1.0, on_busy="wait", busy_timeout=30, max_resume_attempts=10
    ) as s:
        app = builder.compile(checkpointer=s)
        cfg = {"configurable": {"thread_id": thread}}
        with pytest.raises(OutcomeUnknownError) as err:
            app.invoke(None, cfg)
        assert err.value.thread_id == thread and err.value.name == "pay_once"
        entry = Ledger(s).get(err.value.key)
        assert entry is not None and entry.outcome_unknown and entry.thread_id == thread
        assert calls == []  # never re-run on its own
        # The operator checked the receiver: the payment went through.
        Ledger(s).resolve(err.value.key, {"receipt": "r-o-1"})
        assert app.invoke(None, cfg)["receipts"] == ["r-o-1"]
    assert calls == []
    assert count(dsn, "SELECT count(*) FROM effects WHERE tag = 'pay:o-1'") == 1


def test_unknown_outcome_retry_hands_the_key_to_a_deduplicating_receiver(
    saver: DurablePostgresSaver, dsn: str, children: dict[str, Any]
) -> None:
    _wait_killed(children["procs"]["key"])
    key = children["key"]
    seen: list[str] = []

    def body(order: str, idempotency_key: str) -> str:
        seen.append(idempotency_key)
        with psycopg.connect(dsn, autocommit=True) as conn:
            conn.execute(
                "INSERT INTO effects (tag, idem_key, pid) VALUES ('refund', %s, %s)",
                (idempotency_key, os.getpid()),
            )
            conn.execute(
                "INSERT INTO receiver (idem_key, body) VALUES (%s, %s) ON CONFLICT (idem_key) DO NOTHING",
                (idempotency_key, f"refund {order}"),
            )
        return "refunded"

    strict = idempotent(ledger=saver, key=lambda order: key, name="refund")(body)
    with pytest.raises(OutcomeUnknownError) as err:
        strict("o-9")
    assert err.value.key == key and err.value.thread_id is None and seen == []
    retry = idempotent(ledger=saver, key=lambda order: key, name="refund", on_unknown="retry")(body)
    assert retry("o-9") == retry("o-9") == "refunded"
    assert seen == [key]
    # Ran twice in all (the killed attempt and the retry); the receiver applied it once.
    assert count(dsn, "SELECT count(*) FROM effects WHERE tag = 'refund' AND idem_key = %s", (key,)) == 2
    assert count(dsn, "SELECT count(*) FROM receiver WHERE idem_key = %s", (key,)) == 1
    entry = Ledger(saver).get(key)
    assert entry is not None and entry.status == "completed" and entry.attempts == 2
