"""Issue 11, defects 9-11: the ``@idempotent`` ledger at its seams.

9. a ``tool_call_id`` reused in a later turn (providers numbering calls per message)
   must run the tool again; a replay of the same message must not;
10. time travel (replay from an older checkpoint, ``update_state`` forks, ``copy_thread``)
    re-executes derived-key effects, ``key=`` effects stay deduplicated;
11. ``transactional=True`` with a saver call or a nested idempotent call inside, on a
    single-connection saver, works instead of hanging.

Every test talks to the real PostgreSQL. The hang tests run the call under a generous
bound (a thread joined with a timeout, ``asyncio.wait_for``) only so that a regression
fails instead of blocking the suite: no assert depends on timing.
"""

from __future__ import annotations

import asyncio
import operator
import os
import signal
import subprocess
import sys
import threading
import uuid
from collections.abc import Callable
from typing import Annotated, Any, TypedDict

import psycopg
import pytest
from langchain_core.language_models.chat_models import BaseChatModel
from langchain_core.messages import AIMessage, BaseMessage, HumanMessage, ToolMessage
from langchain_core.outputs import ChatGeneration, ChatResult
from langchain_core.tools import tool
from langgraph.graph import END, START, MessagesState, StateGraph
from langgraph.prebuilt import ToolNode, tools_condition
from psycopg.rows import dict_row

from langgraph_durable import (
    AsyncDurablePostgresSaver,
    DurablePostgresSaver,
    InvalidIdempotencyKeyError,
    Ledger,
    UnstableKeyError,
    idempotent,
)
from langgraph_durable.idempotency import _digest

# A regression must fail, not block the suite: far above any real duration.
HANG_BOUND = 60.0

HERE = os.path.dirname(os.path.abspath(__file__))
CHILD = os.path.join(HERE, "_child_seams_idem.py")
sys.path.insert(0, HERE)
import _child_seams_idem as child  # noqa: E402


def k(prefix: str = "t") -> str:
    return f"{prefix}-{uuid.uuid4().hex[:12]}"


def cfg(thread: str) -> dict[str, Any]:
    return {"configurable": {"thread_id": thread}}


# --- defect 9: tool_call_id reused in a later turn ------------------------------------


class PerMessageIds(BaseChatModel):
    """A provider that numbers tool calls per message: every turn asks for ``call_0``
    with the same arguments, and its messages carry no id (add_messages gives them
    one). Decides from the messages only, so a resumed run sees the same script."""

    def _generate(self, messages: list[BaseMessage], stop: Any = None, run_manager: Any = None, **kw: Any) -> ChatResult:
        if isinstance(messages[-1], HumanMessage):
            calls = [{"name": "send_email", "args": {"to": "a@x"}, "id": "call_0", "type": "tool_call"}]
            if "and look up" in str(messages[-1].content):
                calls.append({"name": "lookup", "args": {"q": "s"}, "id": "call_1", "type": "tool_call"})
            msg = AIMessage(content="", tool_calls=calls)
        else:
            msg = AIMessage(content="done")
        return ChatResult(generations=[ChatGeneration(message=msg)])

    @property
    def _llm_type(self) -> str:
        return "per-message-ids"


def _agent(tools: list[Any], saver: Any, *, is_async: bool = False) -> Any:
    model = PerMessageIds()

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


def _email_tools(sent: list[str], lookups: list[str]) -> list[Any]:
    @tool
    def send_email(to: str) -> str:
        """Send an email."""
        sent.append(to)
        return f"sent to {to}"

    @tool
    def lookup(q: str) -> str:
        """Look something up (fails the first time)."""
        lookups.append(q)
        if len(lookups) == 1:
            raise ConnectionError("lookup service down")
        return f"found {q}"

    return [idempotent(send_email), idempotent(lookup)]


def _tool_contents(out: dict[str, Any]) -> list[str]:
    return [str(m.content) for m in out["messages"] if isinstance(m, ToolMessage)]


def test_defect9_a_reused_tool_call_id_in_a_later_turn_runs_again(saver: DurablePostgresSaver) -> None:
    sent: list[str] = []
    app = _agent(_email_tools(sent, ["warm"]), saver)
    thread = k()
    app.invoke({"messages": [HumanMessage("email a")]}, cfg(thread))
    out = app.invoke({"messages": [HumanMessage("email a again")]}, cfg(thread))
    # Both turns asked for call_0 with the same arguments: two emails, two answers.
    assert sent == ["a@x", "a@x"]
    assert _tool_contents(out) == ["sent to a@x", "sent to a@x"]
    entries = Ledger(saver).entries(thread_id=thread)
    assert len(entries) == 2 and all(e.key.startswith("tool:") for e in entries)
    assert len({e.task_id for e in entries}) == 2


def test_defect9_a_replay_of_the_same_message_does_not_run_again(saver: DurablePostgresSaver) -> None:
    sent: list[str] = []
    lookups: list[str] = []
    app = _agent(_email_tools(sent, lookups), saver)
    thread = k()
    with pytest.raises(ConnectionError):  # the parallel lookup fails the tools task
        app.invoke({"messages": [HumanMessage("email a and look up")]}, cfg(thread))
    assert sent == ["a@x"]
    out = app.invoke(None, cfg(thread))  # the same AI message's calls again
    assert sent == ["a@x"] and lookups == ["s", "s"]
    assert _tool_contents(out) == ["sent to a@x", "found s"]
    # A new turn with the same call ids is a new call.
    app.invoke({"messages": [HumanMessage("email a and look up")]}, cfg(thread))
    assert sent == ["a@x", "a@x"]


async def test_defect9_async_tool_reused_call_id(asaver: AsyncDurablePostgresSaver) -> None:
    sent: list[str] = []

    @tool
    async def send_email(to: str) -> str:
        """Send an email."""
        sent.append(to)
        return f"sent to {to}"

    app = _agent([idempotent(send_email)], asaver, is_async=True)
    thread = k()
    await app.ainvoke({"messages": [HumanMessage("email a")]}, cfg(thread))
    await app.ainvoke({"messages": [HumanMessage("email a again")]}, cfg(thread))
    assert sent == ["a@x", "a@x"]


def test_defect9_a_tools_task_sigkilled_after_an_effect_replays_it(saver: DurablePostgresSaver, dsn: str) -> None:
    """The task-scoped tool key survives a real crash: the child process dies inside the
    tools task after call_0's email was recorded, before the task's writes were stored;
    the resumed task (same task id, rebuilt from the stored checkpoint) replays it."""
    child.create_table(dsn)
    thread = k("kill")
    proc = subprocess.run([sys.executable, CHILD, dsn, thread], timeout=120, capture_output=True)
    assert proc.returncode == -signal.SIGKILL, proc.stderr.decode()[-2000:]
    assert child.emails(dsn, thread) == 1
    app = child.build(saver, dsn, kill=False)
    out = app.invoke(None, cfg(thread))
    assert child.emails(dsn, thread) == 1  # replayed, not re-sent
    assert _tool_contents(out) == ["sent to a@x", "found s"]
    app.invoke({"messages": [HumanMessage("email a")]}, cfg(thread))  # call_0 again
    assert child.emails(dsn, thread) == 2


@pytest.mark.filterwarnings("ignore::DeprecationWarning")
def test_defect9_tool_calls_sent_one_per_task(saver: DurablePostgresSaver) -> None:
    """``create_react_agent(version="v2")`` runs each tool call as its own ``Send`` task:
    each turn's call_0 is another task, so it runs."""
    from langgraph.prebuilt import create_react_agent

    class Bindable(PerMessageIds):
        def bind_tools(self, tools: Any, **kw: Any) -> Any:
            return self

    sent: list[str] = []
    send_email = _email_tools(sent, ["warm"])[0]
    app = create_react_agent(Bindable(), [send_email], checkpointer=saver, version="v2")
    thread = k()
    app.invoke({"messages": [HumanMessage("email a")]}, cfg(thread))
    app.invoke({"messages": [HumanMessage("email a again")]}, cfg(thread))
    assert sent == ["a@x", "a@x"]


def _legacy_key(thread: str, tool_call_id: str) -> str:
    """The key the package derived for a tool call before this fix."""
    return "tool:" + _digest("tool", thread, tool_call_id)


def _rekey(dsn: str, thread: str, old: str, new: str) -> None:
    with psycopg.connect(dsn, autocommit=True) as conn:
        cur = conn.execute(
            "UPDATE durable_ledger SET key = %s WHERE key = %s AND thread_id = %s", (new, old, thread)
        )
        assert cur.rowcount == 1


def test_defect9_a_call_recorded_under_the_old_key_scheme_is_not_repeated(
    saver: DurablePostgresSaver, dsn: str
) -> None:
    """A thread mid-flight across the upgrade: the email was sent (and recorded under
    the old key) by the tools task that then failed; the resumed task must replay it.
    A call of an earlier turn recorded under the old key must not suppress a new one."""
    sent: list[str] = []
    lookups: list[str] = []
    app = _agent(_email_tools(sent, lookups), saver)
    thread = k()
    with pytest.raises(ConnectionError):
        app.invoke({"messages": [HumanMessage("email a and look up")]}, cfg(thread))
    (email,) = [e for e in Ledger(saver).entries(thread_id=thread) if e.name == "send_email"]
    _rekey(dsn, thread, email.key, _legacy_key(thread, "call_0"))  # as the old code stored it
    app.invoke(None, cfg(thread))
    assert sent == ["a@x"]  # replayed from the old-scheme record
    # The next turn reuses call_0: the old-scheme row belongs to another task.
    app.invoke({"messages": [HumanMessage("email a")]}, cfg(thread))
    assert sent == ["a@x", "a@x"]


def test_defect9_tool_keys_refuse_durability_exit(saver: DurablePostgresSaver) -> None:
    sent: list[str] = []
    app = _agent(_email_tools(sent, ["warm"]), saver)
    with pytest.raises(UnstableKeyError, match="durability='exit'"):
        app.invoke({"messages": [HumanMessage("email a")]}, cfg(k()), durability="exit")
    assert sent == []


# --- defect 10: time travel re-executes derived-key effects, key= stays deduplicated ----


class Order(TypedDict):
    order: str
    log: Annotated[list[str], operator.add]


class Effects:
    """One derived-key effect, one key= effect and one tool, counted."""

    def __init__(self, saver: Any) -> None:
        self.paid: list[str] = []
        self.refunded: list[str] = []
        self.emailed: list[str] = []
        self.tag = uuid.uuid4().hex[:8]
        paid, refunded, emailed, tag = self.paid, self.refunded, self.emailed, self.tag

        @idempotent
        def pay(order: str) -> str:
            paid.append(order)
            return f"paid {order}"

        @idempotent(key=lambda order: f"refund:{tag}:{order}")
        def refund(order: str) -> str:
            refunded.append(order)
            return f"refunded {order}"

        @tool
        def email(to: str) -> str:
            """Send an email."""
            emailed.append(to)
            return f"emailed {to}"

        tools = ToolNode([idempotent(email)], handle_tool_errors=False)

        def charge(state: Order) -> dict[str, Any]:
            return {"log": [pay(state["order"]), refund(state["order"])]}

        def notify(state: Order) -> dict[str, Any]:
            call = {"name": "email", "args": {"to": state["order"]}, "id": "call_0", "type": "tool_call"}
            out = tools.invoke({"messages": [AIMessage(content="", tool_calls=[call])]})
            return {"log": [m.content for m in out["messages"]]}

        builder = StateGraph(Order)
        builder.add_node("charge", charge)
        builder.add_node("notify", notify)
        builder.add_edge(START, "charge")
        builder.add_edge("charge", "notify")
        builder.add_edge("notify", END)
        self.app = builder.compile(checkpointer=saver)

    def counts(self) -> tuple[int, int, int]:
        return len(self.paid), len(self.refunded), len(self.emailed)

    def before(self, thread: str, node: str) -> Any:
        return next(s for s in self.app.get_state_history(cfg(thread)) if s.next == (node,))


def test_defect10_replay_from_an_older_checkpoint_re_executes(saver: DurablePostgresSaver) -> None:
    fx = Effects(saver)
    thread = k()
    fx.app.invoke({"order": "o1", "log": []}, cfg(thread))
    assert fx.counts() == (1, 1, 1)
    older = fx.before(thread, "charge")
    out = fx.app.invoke(None, older.config)  # time travel: LangGraph writes a fork
    assert fx.counts() == (2, 1, 2)  # derived keys run again, key= replays
    assert out["log"] == ["paid o1", "refunded o1", "emailed o1"]
    sources = [s.metadata["source"] for s in fx.app.get_state_history(cfg(thread))]
    assert "fork" in sources
    # A plain resume of the (finished) thread runs nothing.
    fx.app.invoke(None, cfg(thread))
    assert fx.counts() == (2, 1, 2)


def test_defect10_update_state_fork_re_executes(saver: DurablePostgresSaver) -> None:
    fx = Effects(saver)
    thread = k()
    fx.app.invoke({"order": "o1", "log": []}, cfg(thread))
    fork = fx.app.update_state(fx.before(thread, "charge").config, {"log": ["edited"]})
    fx.app.invoke(None, fork)
    assert fx.counts() == (2, 1, 2)
    # Forking just before the tool node re-executes the tool too (no longer replayed
    # from the same tool_call_id, as the old key scheme did).
    fork = fx.app.update_state(fx.before(thread, "notify").config, {"log": ["edited"]})
    fx.app.invoke(None, fork)
    assert fx.counts() == (2, 1, 3)


def test_defect10_copy_thread_re_executes(saver: DurablePostgresSaver) -> None:
    fx = Effects(saver)
    src, dst = k("src"), k("dst")
    fx.app.invoke({"order": "o1", "log": []}, cfg(src))
    saver.copy_thread(src, dst)
    # The copy has the same checkpoints (so the same task ids) under another thread id.
    fx.app.invoke(None, fx.before(dst, "charge").config)
    assert fx.counts() == (2, 1, 2)
    assert {e.thread_id for e in Ledger(saver).entries(thread_id=dst)} == {dst}


def test_defect10_a_resume_replays_but_addressing_the_head_by_id_is_time_travel(
    saver: DurablePostgresSaver,
) -> None:
    """The rule the docs state: LangGraph's task ids decide. A resume (thread config
    only) rebuilds the same task: the effect replays. Addressing a checkpoint by id,
    even the latest one, is time travel on langgraph 1.2: a fork, new task ids, the
    derived-key effect runs again."""
    calls: list[str] = []
    crash = {"n": 0}

    @idempotent
    def pay(order: str) -> str:
        calls.append(order)
        return f"paid {order}"

    def node(state: Order) -> dict[str, Any]:
        receipt = pay(state["order"])
        crash["n"] += 1
        if crash["n"] <= 2:
            raise RuntimeError("died after the effect, before the checkpoint")
        return {"log": [receipt]}

    builder = StateGraph(Order)
    builder.add_node("n", node)
    builder.add_edge(START, "n")
    builder.add_edge("n", END)
    app = builder.compile(checkpointer=saver)
    thread = k()
    with pytest.raises(RuntimeError):
        app.invoke({"order": "o1", "log": []}, cfg(thread))
    with pytest.raises(RuntimeError):
        app.invoke(None, cfg(thread))
    assert calls == ["o1"]  # the resume replayed the effect
    head = app.get_state(cfg(thread))
    assert head.next == ("n",)
    out = app.invoke(None, head.config)  # carries checkpoint_id: time travel
    assert calls == ["o1", "o1"] and out["log"] == ["paid o1"]


# --- defect 11: transactional=True on a single-connection saver -------------------------


def _bounded(fn: Callable[[], Any]) -> Any:
    """Run ``fn`` in a thread; a call that never returns fails the test."""
    result: list[Any] = []
    error: list[BaseException] = []

    def target() -> None:
        try:
            result.append(fn())
        except BaseException as exc:  # handed to the test thread
            error.append(exc)

    worker = threading.Thread(target=target, daemon=True)
    worker.start()
    worker.join(HANG_BOUND)
    if worker.is_alive():
        pytest.fail(f"the call did not return within {HANG_BOUND} s: it hangs")
    if error:
        raise error[0]
    return result[0]


@pytest.fixture
def tx_table(dsn: str) -> str:
    name = f"seat_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(
            psycopg.sql.SQL("CREATE TABLE {} (id BIGSERIAL PRIMARY KEY, v TEXT)").format(
                psycopg.sql.Identifier(name)
            )
        )
    return name


def _rows(dsn: str, table: str) -> list[str]:
    with psycopg.connect(dsn) as conn:
        q = psycopg.sql.SQL("SELECT v FROM {} ORDER BY id").format(psycopg.sql.Identifier(table))
        return [r[0] for r in conn.execute(q).fetchall()]


def test_defect11_transactional_with_saver_and_nested_calls_on_one_connection(
    dsn: str, tx_table: str
) -> None:
    insert = psycopg.sql.SQL("INSERT INTO {} (v) VALUES (%s)").format(psycopg.sql.Identifier(tx_table))
    tag = uuid.uuid4().hex[:8]
    with psycopg.Connection.connect(dsn, autocommit=True, row_factory=dict_row) as conn:
        saver = DurablePostgresSaver(conn)
        runs: list[str] = []

        @idempotent(ledger=saver, key=lambda seat: f"notify:{tag}:{seat}")
        def notify(seat: str) -> str:
            runs.append(f"notify {seat}")
            return f"notified {seat}"

        @idempotent(ledger=saver, key=lambda seat: f"book:{tag}:{seat}", transactional=True)
        def book(conn: psycopg.Connection[Any], seat: str) -> str:
            runs.append(f"book {seat}")
            conn.execute(insert, (seat,))
            assert saver.get_tuple(cfg(k())) is None  # a saver call inside
            assert Ledger(saver).get(f"notify:{tag}:{seat}") is None or seat == "1A"
            return notify(seat)  # a nested idempotent call

        assert _bounded(lambda: book("1A")) == "notified 1A"
        assert _bounded(lambda: book("1A")) == "notified 1A"  # replayed
        assert runs == ["book 1A", "notify 1A"]
        assert _rows(dsn, tx_table) == ["1A"]
        entry = Ledger(saver).get(f"notify:{tag}:1A")
        assert entry is not None and entry.status == "completed"


async def test_defect11_async_transactional_on_one_connection(dsn: str, tx_table: str) -> None:
    insert = psycopg.sql.SQL("INSERT INTO {} (v) VALUES (%s)").format(psycopg.sql.Identifier(tx_table))
    tag = uuid.uuid4().hex[:8]
    aconn = await psycopg.AsyncConnection.connect(dsn, autocommit=True, row_factory=dict_row)
    try:
        saver = AsyncDurablePostgresSaver(aconn)
        runs: list[str] = []

        @idempotent(ledger=saver, key=lambda seat: f"anotify:{tag}:{seat}")
        async def notify(seat: str) -> str:
            runs.append(f"notify {seat}")
            return f"notified {seat}"

        @idempotent(ledger=saver, key=lambda seat: f"abook:{tag}:{seat}", transactional=True)
        async def book(conn: psycopg.AsyncConnection[Any], seat: str) -> str:
            runs.append(f"book {seat}")
            await conn.execute(insert, (seat,))
            assert await saver.aget_tuple(cfg(k())) is None
            return await notify(seat)

        assert await asyncio.wait_for(book("2B"), HANG_BOUND) == "notified 2B"
        assert await asyncio.wait_for(book("2B"), HANG_BOUND) == "notified 2B"
        assert runs == ["book 2B", "notify 2B"]
        assert _rows(dsn, tx_table) == ["2B"]
    finally:
        await aconn.close()


def test_defect11_transactional_in_a_graph_on_one_connection(dsn: str, tx_table: str) -> None:
    insert = psycopg.sql.SQL("INSERT INTO {} (v) VALUES (%s)").format(psycopg.sql.Identifier(tx_table))
    with psycopg.Connection.connect(dsn, autocommit=True, row_factory=dict_row) as conn:
        saver = DurablePostgresSaver(conn)
        runs: list[str] = []

        @idempotent
        def confirm(seat: str) -> str:
            runs.append(f"confirm {seat}")
            return f"confirmed {seat}"

        @idempotent(transactional=True)
        def book(conn: psycopg.Connection[Any], seat: str) -> str:
            runs.append(f"book {seat}")
            conn.execute(insert, (seat,))
            return confirm(seat)  # nested, default-derived key under book's key

        def node(state: Order) -> dict[str, Any]:
            return {"log": [book(state["order"])]}

        builder = StateGraph(Order)
        builder.add_node("n", node)
        builder.add_edge(START, "n")
        builder.add_edge("n", END)
        app = builder.compile(checkpointer=saver)
        thread = k()
        out = _bounded(lambda: app.invoke({"order": "3C", "log": []}, cfg(thread)))
        assert out["log"] == ["confirmed 3C"]
        assert runs == ["book 3C", "confirm 3C"] and _rows(dsn, tx_table) == ["3C"]
        assert {e.status for e in Ledger(saver).entries(thread_id=thread)} == {"completed"}


def test_defect11_a_nested_call_with_its_parents_key_fails_at_once(saver: DurablePostgresSaver) -> None:
    """A nested call that reuses the key of the transactional call around it would wait
    for that call's own uncommitted claim: refused at once with a typed error."""
    key = f"same:{uuid.uuid4().hex[:8]}"

    @idempotent(ledger=saver, key=lambda: key)
    def inner() -> str:
        return "inner"

    @idempotent(ledger=saver, key=lambda: key, transactional=True)
    def outer(conn: psycopg.Connection[Any]) -> str:
        return inner()

    with pytest.raises(InvalidIdempotencyKeyError, match="enclosing"):
        _bounded(outer)
    assert Ledger(saver).get(key) is None  # nothing half-written


def test_defect11_transactional_on_a_pool_of_one(dsn: str, tx_table: str) -> None:
    """A pool with one connection is a single connection too: the nested call used to
    wait for the pool's only connection until psycopg_pool's PoolTimeout."""
    tag = uuid.uuid4().hex[:8]
    with DurablePostgresSaver.from_conn_string(dsn, pool_size=1) as saver:

        @idempotent(ledger=saver, key=lambda: f"inner1:{tag}")
        def inner() -> str:
            return "inner"

        @idempotent(ledger=saver, key=lambda: f"outer1:{tag}", transactional=True)
        def outer(conn: psycopg.Connection[Any]) -> str:
            conn.execute("SELECT 1")
            return inner() + "+outer"

        assert _bounded(outer) == _bounded(outer) == "inner+outer"
        assert {Ledger(saver).get(f"{p}:{tag}").status for p in ("inner1", "outer1")} == {"completed"}  # type: ignore[union-attr]


async def test_defect11_async_transactional_in_a_graph_on_one_connection(dsn: str, tx_table: str) -> None:
    insert = psycopg.sql.SQL("INSERT INTO {} (v) VALUES (%s)").format(psycopg.sql.Identifier(tx_table))
    aconn = await psycopg.AsyncConnection.connect(dsn, autocommit=True, row_factory=dict_row)
    try:
        saver = AsyncDurablePostgresSaver(aconn)
        runs: list[str] = []

        @idempotent
        async def confirm(seat: str) -> str:
            runs.append(f"confirm {seat}")
            return f"confirmed {seat}"

        @idempotent(transactional=True)
        async def book(conn: psycopg.AsyncConnection[Any], seat: str) -> str:
            runs.append(f"book {seat}")
            await conn.execute(insert, (seat,))
            return await confirm(seat)

        async def node(state: Order) -> dict[str, Any]:
            return {"log": [await book(state["order"])]}

        builder = StateGraph(Order)
        builder.add_node("n", node)
        builder.add_edge(START, "n")
        builder.add_edge("n", END)
        app = builder.compile(checkpointer=saver)
        thread = k()
        out = await asyncio.wait_for(app.ainvoke({"order": "4D", "log": []}, cfg(thread)), HANG_BOUND)
        assert out["log"] == ["confirmed 4D"]
        assert runs == ["book 4D", "confirm 4D"] and _rows(dsn, tx_table) == ["4D"]
    finally:
        await aconn.close()
