"""Graph and child entry point of tests/test_edges_machine.py (not a test module).

The graph puts the capabilities added last side by side in one run, each with its fault:

    START -> prep -> {charge, work} (two edges, or two ``Send``s) -> join -> [ask] -> final -> END

* ``prep`` may be deferred (node metadata ``{"checkpoint": "defer"}``), or the whole saver
  may run under ``ReworkBudget``: the tasks after it then run from a deferred checkpoint.
* ``charge`` performs an effect through ``@idempotent(transactional=True)``.
* ``work`` (a node, or a subgraph around one) calls a journaled model (``invoke`` or
  ``stream``) and parses its JSON answer under a ``RetryPolicy``; the consumer of the stream may raise after two chunks, and the model's
  first answer may be invalid JSON (an ``OutputParserException``).
* ``join`` may have its lease taken by another owner (the token moved, the expiry in the past).
* ``ask`` waits on an interrupt; ``final`` may return a value that cannot be stored.

A *kill point* SIGKILLs the child itself, at most once per (thread, turn, point) across
processes (``edges_kills``), at a place where the expected re-executions are exact:
in ``prep``, in ``charge`` after its effect, in ``work`` after the model answered and after
``charge``'s writes are stored, inside the model call, in ``join``, in ``final``.

Every node body records its start in ``edges_runs``; the model records each call in
``edges_calls``; the parent counts them. A child that ends on its own reports
``{"event": "done" | "interrupted" | "error", ...}`` to the parent.
"""

from __future__ import annotations

import json
import operator
import os
import signal
import time
from typing import Annotated, Any, TypedDict

import psycopg
from langchain_core.exceptions import OutputParserException
from langchain_core.language_models import BaseChatModel
from langchain_core.messages import AIMessage, AIMessageChunk, BaseMessage, HumanMessage
from langchain_core.outputs import ChatGeneration, ChatGenerationChunk, ChatResult
from langgraph.config import get_config
from langgraph.graph import END, START, StateGraph
from langgraph.types import Command, RetryPolicy, Send, interrupt

DDL = (
    "CREATE TABLE IF NOT EXISTS edges_runs (id BIGSERIAL PRIMARY KEY, thread_id TEXT, turn INT, "
    "node TEXT, pid INT, task_id TEXT)",
    "CREATE TABLE IF NOT EXISTS edges_calls (id BIGSERIAL PRIMARY KEY, thread_id TEXT, turn INT, pid INT)",
    "CREATE TABLE IF NOT EXISTS edges_effects (id BIGSERIAL PRIMARY KEY, thread_id TEXT, turn INT)",
    "CREATE TABLE IF NOT EXISTS edges_kills (thread_id TEXT, turn INT, point TEXT, "
    "PRIMARY KEY (thread_id, turn, point))",
)
KILL_POINTS = ("prep", "charge", "work", "model", "join", "final")
WORDS = "alpha beta gamma delta"
LEASE_TTL = 2.0


class ConsumerError(RuntimeError):
    """The code consuming the model's stream failed (not the model)."""


class State(TypedDict, total=False):
    turn: int
    log: Annotated[list[str], operator.add]
    answer: str
    doc: str
    bad: Any


def document(thread_id: str, turn: int) -> str:
    """A 3 KB value (above the artifact threshold): archives carry artifact rows."""
    import hashlib

    seed = hashlib.sha256(f"{thread_id}/{turn}".encode()).hexdigest()
    return (seed * 48)[:3000]


def setup(dsn: str) -> None:
    with psycopg.connect(dsn, autocommit=True) as conn:
        for stmt in DDL:
            conn.execute(stmt)


def _thread() -> str:
    return str(get_config()["configurable"]["thread_id"])


def _record(dsn: str, table: str, turn: int, node: str | None = None) -> int:
    with psycopg.connect(dsn, autocommit=True) as conn:
        if table == "edges_runs":
            task = get_config()["configurable"].get("__pregel_task_id")
            conn.execute(
                "INSERT INTO edges_runs (thread_id, turn, node, pid, task_id) VALUES (%s, %s, %s, %s, %s)",
                (_thread(), turn, node, os.getpid(), task),
            )
            return 0
        conn.execute(
            "INSERT INTO edges_calls (thread_id, turn, pid) VALUES (%s, %s, %s)", (_thread(), turn, os.getpid())
        )
        row = conn.execute(
            "SELECT count(*) FROM edges_calls WHERE thread_id = %s AND turn = %s", (_thread(), turn)
        ).fetchone()
        return int(row[0]) if row else 0


def _kill_once(dsn: str, spec: dict[str, Any], turn: int, point: str) -> None:
    if spec.get("kill_at") == point and _first(dsn, turn, point):
        os.kill(os.getpid(), signal.SIGKILL)


def _wait_for_writes(dsn: str, turn: int, node: str) -> None:
    """Until the writes of ``node``'s last task of this turn are stored (at most 10 s): the
    kill point "work" must land after ``charge`` finished and LangGraph stored its writes,
    as in issue 23's defect 1. (Where they are never stored, the wait ends and the kill
    lands all the same: the re-execution is what the parent then counts.)"""
    deadline = time.monotonic() + 10
    with psycopg.connect(dsn, autocommit=True) as conn:
        while time.monotonic() < deadline:
            row = conn.execute(
                "SELECT EXISTS (SELECT 1 FROM checkpoint_writes w WHERE w.thread_id = r.thread_id "
                "AND w.task_id = r.task_id) FROM edges_runs r WHERE r.thread_id = %s AND r.turn = %s "
                "AND r.node = %s ORDER BY r.id DESC LIMIT 1",
                (_thread(), turn, node),
            ).fetchone()
            if row and row[0]:
                return
            time.sleep(0.02)


class CountingModel(BaseChatModel):
    """A chat model that counts its calls in Postgres and answers with the call's number;
    the first answer of a turn is invalid JSON when the spec says so."""

    dsn: str
    parser_fail: bool = False
    kill: bool = False

    @property
    def _llm_type(self) -> str:
        return "edges-counting"

    def _text(self, messages: list[BaseMessage]) -> str:
        turn = int(str(messages[-1].content))
        n = _record(self.dsn, "edges_calls", turn)
        if self.kill:
            _wait_for_writes(self.dsn, turn, "charge")  # the sibling branch finished: exact counts
            _kill_once(self.dsn, {"kill_at": "model"}, turn, "model")
        if self.parser_fail and n == 1:
            return "{not json " + WORDS
        return json.dumps({"answer": f"a{n}", "words": WORDS})

    def _generate(self, messages: list[BaseMessage], stop: Any = None, run_manager: Any = None, **kw: Any) -> ChatResult:
        return ChatResult(generations=[ChatGeneration(message=AIMessage(self._text(messages)))])

    def _stream(self, messages: list[BaseMessage], stop: Any = None, run_manager: Any = None, **kw: Any) -> Any:
        text = self._text(messages)
        for i in range(0, len(text), 8):
            yield ChatGenerationChunk(message=AIMessageChunk(content=text[i : i + 8]))


def _first(dsn: str, turn: int, point: str) -> bool:
    """Whether this is the first time ``point`` is reached in this (thread, turn), across
    processes."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        cur = conn.execute(
            "INSERT INTO edges_kills VALUES (%s, %s, %s) ON CONFLICT DO NOTHING", (_thread(), turn, point)
        )
        return cur.rowcount == 1


def build(dsn: str, spec: dict[str, Any], *, stock: bool = False) -> StateGraph:
    from langgraph_durable import idempotent, journaled

    def effect(turn: int) -> str:
        with psycopg.connect(dsn, autocommit=True) as conn:
            conn.execute("INSERT INTO edges_effects (thread_id, turn) VALUES (%s, %s)", (_thread(), turn))
        return f"paid-{turn}"

    @idempotent(transactional=True)
    def charge_effect(conn: Any, turn: int) -> str:
        conn.execute("INSERT INTO edges_effects (thread_id, turn) VALUES (%s, %s)", (_thread(), turn))
        return f"paid-{turn}"

    model: Any = CountingModel(dsn=dsn, parser_fail=spec.get("parser_fail", False), kill=spec.get("kill_at") == "model")
    if not stock:
        model = journaled(model)

    def prep(s: State) -> dict[str, Any]:
        _record(dsn, "edges_runs", s["turn"], "prep")
        _kill_once(dsn, spec, s["turn"], "prep")
        return {"log": [f"prep{s['turn']}"], "doc": document(_thread(), s["turn"])}

    def charge(s: State) -> dict[str, Any]:
        _record(dsn, "edges_runs", s["turn"], "charge")
        paid = effect(s["turn"]) if stock else charge_effect(s["turn"])
        if spec.get("kill_at") == "charge":
            _wait_for_writes(dsn, s["turn"], "work")  # the sibling branch finished: exact counts
            _kill_once(dsn, spec, s["turn"], "charge")
        return {"log": [paid]}

    def work(s: State) -> dict[str, Any]:
        turn = s["turn"]
        _record(dsn, "edges_runs", turn, "work")
        msgs = [HumanMessage(str(turn))]
        if spec.get("stream"):
            parts = []
            for i, chunk in enumerate(model.stream(msgs)):
                parts.append(str(chunk.content))
                if spec.get("consumer_raise") and i == 1 and _first(dsn, turn, "consumer"):
                    raise ConsumerError("the consumer failed after two chunks")
            text = "".join(parts)
        else:
            text = str(model.invoke(msgs).content)
        try:
            parsed = json.loads(text)
        except ValueError as exc:
            raise OutputParserException(f"not JSON: {text!r}") from exc
        if spec.get("kill_at") == "work":
            _wait_for_writes(dsn, turn, "charge")
            _kill_once(dsn, spec, turn, "work")
        return {"log": [f"work:{parsed['words']}"], "answer": parsed["answer"]}

    def join(s: State) -> dict[str, Any]:
        _record(dsn, "edges_runs", s["turn"], "join")
        _kill_once(dsn, spec, s["turn"], "join")
        if spec.get("steal"):
            _steal_once(dsn, s["turn"])
        return {"log": ["join"]}

    def ask(s: State) -> dict[str, Any]:
        return {"log": [f"asked:{interrupt('go on?')}"]}

    def final(s: State) -> dict[str, Any]:
        _record(dsn, "edges_runs", s["turn"], "final")
        _kill_once(dsn, spec, s["turn"], "final")
        out: dict[str, Any] = {"log": ["final"]}
        if spec.get("poison"):
            out["bad"] = object()  # no serializer stores this
        return out

    retry = RetryPolicy(max_attempts=3, initial_interval=0.01, retry_on=(ConsumerError, OutputParserException))
    g = StateGraph(State)
    prep_meta = {"checkpoint": "defer"} if spec.get("defer_prep") else None
    g.add_node("prep", prep, metadata=prep_meta)
    g.add_node("charge", charge)
    if spec.get("subgraph"):  # the model call one level down: a subgraph called from the node
        inner = StateGraph(State)
        inner.add_node("work", work, retry_policy=retry)
        inner.add_edge(START, "work")
        sub = inner.compile()

        def work_outer(s: State) -> dict[str, Any]:
            out = sub.invoke({"turn": s["turn"], "log": []})
            return {"log": out["log"], "answer": out["answer"]}

        g.add_node("work", work_outer)
    else:
        g.add_node("work", work, retry_policy=retry)
    g.add_node("join", join)
    g.add_node("final", final)
    g.add_edge(START, "prep")
    if spec.get("send"):
        g.add_conditional_edges("prep", lambda s: [Send("charge", s), Send("work", s)], ["charge", "work"])
    else:
        g.add_edge("prep", "charge")
        g.add_edge("prep", "work")
    g.add_edge(["charge", "work"] if not spec.get("send") else "charge", "join")
    if spec.get("send"):
        g.add_edge("work", "join")
    if spec.get("interrupt"):
        g.add_node("ask", ask)
        g.add_edge("join", "ask")
        g.add_edge("ask", "final")
    else:
        g.add_edge("join", "final")
    g.add_edge("final", END)
    return g


def _steal_once(dsn: str, turn: int) -> None:
    """Another owner takes the lease (token moved on; its expiry in the past, so the next
    run may take it over): this run's next fenced write must fail, loudly."""
    if _first(dsn, turn, "steal"):
        with psycopg.connect(dsn, autocommit=True) as conn:
            conn.execute(
                "UPDATE durable_threads SET lease_owner = 'thief', lease_token = lease_token + 1, "
                "lease_expires_at = now() - interval '1 second' WHERE thread_id = %s",
                (_thread(),),
            )


def expected_log(spec: dict[str, Any], turns: int) -> list[str]:
    """The log of an uncrashed run of ``turns`` turns (parallel writes in node order)."""
    log: list[str] = []
    for turn in range(1, turns + 1):
        log += [f"prep{turn}", f"paid-{turn}", f"work:{WORDS}", "join"]
        if spec.get("interrupt"):
            log.append("asked:yes")
        log.append("final")
    return log


def _run(graph: Any, inputs: Any, config: Any, spec: dict[str, Any]) -> dict[str, Any]:
    """``invoke``, or ``stream`` in values mode (an interrupt arrives as a chunk of its own)."""
    durability = spec.get("durability", "async")
    if not spec.get("via_stream"):
        return dict(graph.invoke(inputs, config, durability=durability))
    last: dict[str, Any] = {}
    waiting = False
    for chunk in graph.stream(inputs, config, stream_mode="values", durability=durability):
        if "__interrupt__" in chunk:
            waiting = True
        else:
            last = dict(chunk)
    return {**last, "__interrupt__": True} if waiting else last


def child_main(dsn: str, thread_id: str, spec: dict[str, Any], action: str, turn: int, stock: bool) -> dict[str, Any]:
    """One run of a child process: start a turn, resume, or answer the interrupt."""
    from langgraph.checkpoint.postgres import PostgresSaver

    from langgraph_durable import DurableError, DurablePostgresSaver, ReworkBudget

    out: dict[str, Any]
    config = {"configurable": {"thread_id": thread_id}}
    inputs: Any = {"start": {"turn": turn}, "resume": None, "answer": Command(resume="yes")}[action]
    try:
        if stock:
            with PostgresSaver.from_conn_string(dsn) as saver:
                result = _run(build(dsn, spec, stock=True).compile(checkpointer=saver), inputs, config, spec)
        else:
            policy = ReworkBudget(seconds=1.0) if spec.get("budget") else None
            with DurablePostgresSaver.from_conn_string(
                dsn, checkpoint_policy=policy, lease_ttl=LEASE_TTL
            ) as saver:
                graph = build(dsn, spec).compile(checkpointer=saver)
                result = _run(graph, inputs, config, spec)
        waiting = "__interrupt__" in result
        out = {"event": "interrupted" if waiting else "done", "log": result.get("log", [])}
    except Exception as exc:  # reported to the parent, which judges it
        out = {"event": "error", "type": type(exc).__name__, "durable": isinstance(exc, DurableError),
               "message": str(exc)[:300]}
    return out


def child_entry(conn: Any, *args: Any) -> None:
    """multiprocessing target: ``child_main``'s report sent back through ``conn`` (a
    SIGKILLed child sends nothing)."""
    conn.send(child_main(*args))
    conn.close()
