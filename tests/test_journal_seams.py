"""Issue 23, defects 3 and 4: journaled calls at their seams.

3. A journaled stream its consumer stopped (an exception while consuming, ``break``,
   ``close()``) did not complete: it must not be recorded as the call's answer, or a
   retry and every resume replay a part of the answer as if it were all of it.
4. A node attempt that raised rejected the answers it got (a parser refused invalid
   JSON): the next attempt, a ``RetryPolicy`` retry or the resume of the failed run,
   must ask the model again instead of replaying them for ever; answers an
   ``@idempotent`` effect recorded after them may depend on are kept (the decision,
   docs/journal.md).

The models are LangChain's fakes (no network); everything else is real: PostgreSQL, and
for the crash tests a child process (tests/_child_journal_seams.py) that SIGKILLs itself.
"""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import sys
import uuid
from typing import Any

import psycopg
import pytest
from langchain_core.exceptions import OutputParserException
from langchain_core.messages import AIMessage, HumanMessage
from langchain_core.output_parsers import JsonOutputParser
from langgraph.graph import END, START, MessagesState, StateGraph
from langgraph.types import Command, RetryPolicy, interrupt

from langgraph_durable import (
    AsyncDurablePostgresSaver,
    DurablePostgresSaver,
    Ledger,
    idempotent,
    journaled,
)

HERE = os.path.dirname(os.path.abspath(__file__))
CHILD = os.path.join(HERE, "_child_journal_seams.py")
sys.path.insert(0, HERE)
import _child_journal_seams as child  # noqa: E402
from _child_journal_seams import HELLO, WHOLE, answers, build_parse, build_stream, words  # noqa: E402

RETRY = RetryPolicy(max_attempts=3, initial_interval=0.01, jitter=False, retry_on=OutputParserException)


def cfg(thread: str) -> dict[str, Any]:
    return {"configurable": {"thread_id": thread}}


def new_thread(prefix: str = "seam") -> str:
    return f"{prefix}-{uuid.uuid4().hex[:12]}"


def crash(dsn: str, mode: str) -> str:
    """Run MODE in a child that SIGKILLs itself (see the child's docstring); its thread."""
    thread = new_thread(mode)
    proc = subprocess.run([sys.executable, CHILD, dsn, thread, mode], timeout=180, capture_output=True)
    assert proc.returncode == -signal.SIGKILL, proc.stderr.decode()[-3000:]
    return thread


def recorded(saver: Any, thread: str) -> list[str]:
    """The text of every completed journal record of ``thread``."""
    ledger = Ledger(saver)
    out = []
    for entry in ledger.entries(thread_id=thread):
        assert entry.key.startswith("llm:")
        if entry.status == "completed":
            out.append(str(ledger.result(entry.key).content))
    return sorted(out)


def last(out: dict[str, Any]) -> str:
    return str(out["messages"][-1].content)


# --- 3. a stream its consumer stopped is not the answer ----------------------------------


def _stream_graph(saver: Any, model: Any, *, asynchronous: bool, fail_first: bool) -> Any:
    """The issue's graph: the consumer raises after two chunks on the first attempt only
    (uncaught: the node raises), and RetryPolicy retries the node."""
    jm = journaled(model)
    attempts: list[int] = []

    def node(state: MessagesState) -> dict[str, Any]:
        attempts.append(1)
        seen = []
        for chunk in jm.stream(state["messages"]):
            seen.append(str(chunk.content))
            if fail_first and len(attempts) == 1 and len(seen) == 2:
                raise child.ConsumerGone("the client went away")
        return {"messages": [AIMessage("".join(seen))]}

    async def anode(state: MessagesState) -> dict[str, Any]:
        attempts.append(1)
        seen = []
        async for chunk in jm.astream(state["messages"]):
            seen.append(str(chunk.content))
            if fail_first and len(attempts) == 1 and len(seen) == 2:
                raise child.ConsumerGone("the client went away")
        return {"messages": [AIMessage("".join(seen))]}

    policy = RetryPolicy(max_attempts=3, initial_interval=0.01, jitter=False, retry_on=child.ConsumerGone)
    builder = StateGraph(MessagesState)
    builder.add_node("n", anode if asynchronous else node, retry_policy=policy)
    builder.add_edge(START, "n")
    builder.add_edge("n", END)
    return builder.compile(checkpointer=saver)


def test_consumer_raises_mid_stream_the_retry_gets_the_whole_answer(saver: DurablePostgresSaver) -> None:
    """Base: the retry replayed 'alpha ' (the two chunks seen), and so did every resume."""
    model, thread = words(), new_thread()
    app = _stream_graph(saver, model, asynchronous=False, fail_first=True)
    out = app.invoke(HELLO, cfg(thread))
    assert last(out) == WHOLE
    assert model.calls == ["stream", "stream"]  # the retry asked the model again
    assert recorded(saver, thread) == [WHOLE]
    # The answer replayed from now on is the whole one.
    assert last(app.invoke(None, cfg(thread))) == WHOLE and len(model.calls) == 2


async def test_async_consumer_raises_mid_stream_the_retry_gets_the_whole_answer(
    asaver: AsyncDurablePostgresSaver,
) -> None:
    model, thread = words(), new_thread()
    out = await _stream_graph(asaver, model, asynchronous=True, fail_first=True).ainvoke(HELLO, cfg(thread))
    assert last(out) == WHOLE
    assert model.calls == ["stream", "stream"]
    ledger = Ledger(asaver)
    (entry,) = await ledger.aentries(thread_id=thread)
    assert entry.status == "completed" and (await ledger.aresult(entry.key)).content == WHOLE


@pytest.mark.parametrize("stop", ["raise", "break"])
def test_a_stream_its_consumer_stopped_is_not_recorded(saver: DurablePostgresSaver, stop: str) -> None:
    """A consumer exception (caught in the node) and a deliberate break close the
    generator alike; neither call completed, so neither is recorded as completed (base:
    'alpha ' / 'alpha' recorded as the answer). The node itself finishes normally."""
    thread = new_thread()
    out = build_stream(saver, words(), asynchronous=False, stop=stop).invoke(HELLO, cfg(thread))
    assert last(out) == ("alpha " if stop == "raise" else "alpha")
    assert recorded(saver, thread) == []


@pytest.mark.parametrize("stop", ["raise", "break"])
async def test_an_astream_its_consumer_stopped_is_not_recorded(asaver: AsyncDurablePostgresSaver, stop: str) -> None:
    thread = new_thread()
    out = await build_stream(asaver, words(), asynchronous=True, stop=stop).ainvoke(HELLO, cfg(thread))
    assert last(out) == ("alpha " if stop == "raise" else "alpha")
    assert await Ledger(asaver).aentries(thread_id=thread) == []


def test_a_stream_read_to_its_end_is_still_recorded_and_replayed(saver: DurablePostgresSaver) -> None:
    """The other side of the rule: a complete stream records the sum of its chunks and a
    re-execution (here after an interrupt) replays it without calling the model."""
    model, thread = words(), new_thread()
    jm = journaled(model)

    def node(state: MessagesState) -> dict[str, Any]:
        text = "".join(str(c.content) for c in jm.stream(state["messages"]))
        interrupt("re-execute me")
        return {"messages": [AIMessage(text)]}

    builder = StateGraph(MessagesState)
    builder.add_node("n", node)
    builder.add_edge(START, "n")
    builder.add_edge("n", END)
    app: Any = builder.compile(checkpointer=saver)
    app.invoke(HELLO, cfg(thread))
    assert last(app.invoke(Command(resume=True), cfg(thread))) == WHOLE
    assert model.calls == ["stream"] and recorded(saver, thread) == [WHOLE]


@pytest.mark.parametrize("mode", ["stream-raise", "stream-break", "astream-raise", "astream-break"])
def test_sigkill_after_a_stopped_stream_the_resume_gets_the_whole_answer(
    saver: DurablePostgresSaver, dsn: str, mode: str
) -> None:
    """The child's consumer stopped mid-stream, then the process was SIGKILLed before the
    node's checkpoint. The resumed node reads the stream to its end (the consumer is
    fine now): it gets the whole answer from a new call (base: the recorded part,
    replayed as if it were the whole answer, 'alpha ' or 'alpha')."""
    thread = crash(dsn, mode)
    assert recorded(saver, thread) == []  # the dead process recorded nothing complete
    model = words()
    out = build_stream(saver, model, asynchronous=False, stop="").invoke(None, cfg(thread))
    assert last(out) == WHOLE and model.calls == ["stream"]
    assert recorded(saver, thread) == [WHOLE]


# --- 4. a model answer the node rejected ---------------------------------------------------


@pytest.mark.parametrize("journal", [False, True])
def test_parser_rejects_the_first_answer_the_retry_asks_again(saver: DurablePostgresSaver, journal: bool) -> None:
    """The issue's graph: first answer invalid JSON, second valid. The plain model
    recovers on its retry, and so must the journaled one (base: it replayed 'not json'
    on all 3 attempts)."""
    model, thread = answers("not json", '{"ok": 1}'), new_thread()
    out = build_parse(saver, model, retry=True, journal=journal).invoke(HELLO, cfg(thread))
    assert last(out) == "parsed {'ok': 1}"
    assert model.given == ["not json", '{"ok": 1}']
    if journal:
        # Only the accepted answer is recorded, and a resume replays it.
        assert recorded(saver, thread) == ['{"ok": 1}']
        assert last(build_parse(saver, answers("unused"), retry=True).invoke(None, cfg(thread))) == "parsed {'ok': 1}"


async def test_async_parser_rejects_the_first_answer_the_retry_asks_again(asaver: AsyncDurablePostgresSaver) -> None:
    model, thread = answers("not json", '{"ok": 1}'), new_thread()
    out = await build_parse(asaver, model, retry=True).ainvoke(HELLO, cfg(thread))
    assert last(out) == "parsed {'ok': 1}" and model.given == ["not json", '{"ok": 1}']


@pytest.mark.parametrize("journal", [False, True])
def test_resume_after_the_node_raised_asks_again(saver: DurablePostgresSaver, journal: bool) -> None:
    """No RetryPolicy: the run ends with the parser's error; ``invoke(None)`` re-runs the
    node. Twice in a row: each failed run's answer is superseded (the failure's
    ``__error__`` write is rewritten by each run). Base: 'not json' replayed for ever."""
    model, thread = answers("not json", "still not json", '{"ok": 3}'), new_thread()
    app = build_parse(saver, model, retry=False, journal=journal)
    with pytest.raises(OutputParserException):
        app.invoke(HELLO, cfg(thread))
    with pytest.raises(OutputParserException):
        app.invoke(None, cfg(thread))
    assert last(app.invoke(None, cfg(thread))) == "parsed {'ok': 3}"
    assert model.given == ["not json", "still not json", '{"ok": 3}']


async def test_async_resume_after_the_node_raised_asks_again(asaver: AsyncDurablePostgresSaver) -> None:
    model, thread = answers("not json", '{"ok": 2}'), new_thread()
    app = build_parse(asaver, model, retry=False)
    with pytest.raises(OutputParserException):
        await app.ainvoke(HELLO, cfg(thread))
    assert last(await app.ainvoke(None, cfg(thread))) == "parsed {'ok': 2}"


def test_sigkill_after_the_run_failed_the_resume_asks_again(saver: DurablePostgresSaver, dsn: str) -> None:
    """The child's run ended with the parser's error, then the worker was SIGKILLed; a
    fresh process resumes with ``invoke(None)`` and gets a new answer (base: the resume
    replayed 'not json' and failed again)."""
    thread = crash(dsn, "parse-error")
    model = answers('{"ok": 2}')
    assert last(build_parse(saver, model, retry=False).invoke(None, cfg(thread))) == "parsed {'ok': 2}"
    assert model.given == ['{"ok": 2}'] and recorded(saver, thread) == ['{"ok": 2}']


def test_sigkill_after_a_successful_retry_the_resume_replays_the_accepted_answer(
    saver: DurablePostgresSaver, dsn: str
) -> None:
    """Superseding does not cost the journal its point: the child's retry got valid JSON
    and the process died before the checkpoint; the resume replays the accepted answer
    without calling the model (base: the child's retries replayed 'not json', so the
    run failed instead of reaching the kill)."""
    thread = crash(dsn, "parse-retry")
    model = answers("not json")  # would fail the node if it were called
    assert last(build_parse(saver, model, retry=True).invoke(None, cfg(thread))) == "parsed {'ok': 1}"
    assert model.given == []


def test_an_interrupt_after_a_failed_run_still_replays(saver: DurablePostgresSaver) -> None:
    """Run 1 fails; run 2 gets a new answer and stops at an interrupt (a human approves
    it); run 3 resumes with Command(resume=...). Run 1's ``__error__`` write is still
    there, but run 2's answer was recorded after it: run 3 replays what the human
    approved (base: run 2 replayed 'not json' and failed)."""
    model, thread = answers("not json", '{"draft": 2}', '{"draft": 3}'), new_thread()
    chain = journaled(model) | JsonOutputParser()

    def node(state: MessagesState) -> dict[str, Any]:
        draft = chain.invoke(state["messages"])
        verdict = interrupt({"draft": draft})
        return {"messages": [AIMessage(f"{draft} {verdict}")]}

    builder = StateGraph(MessagesState)
    builder.add_node("n", node)
    builder.add_edge(START, "n")
    builder.add_edge("n", END)
    app: Any = builder.compile(checkpointer=saver)
    with pytest.raises(OutputParserException):
        app.invoke(HELLO, cfg(thread))
    assert app.invoke(None, cfg(thread))["__interrupt__"][0].value == {"draft": {"draft": 2}}
    assert last(app.invoke(Command(resume="approved"), cfg(thread))) == "{'draft': 2} approved"
    assert model.given == ["not json", '{"draft": 2}']


# --- 4, decided: answers a durable effect may depend on are kept --------------------------


def _effects_table(dsn: str) -> None:
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("CREATE TABLE IF NOT EXISTS seam_effects (id BIGSERIAL PRIMARY KEY, thread TEXT, body TEXT)")


def _effects(dsn: str, thread: str) -> list[str]:
    with psycopg.connect(dsn) as conn:
        rows = conn.execute("SELECT body FROM seam_effects WHERE thread = %s ORDER BY id", (thread,)).fetchall()
    return [r[0] for r in rows]


def _effect_graph(saver: Any, dsn: str, thread: str, model: Any, *, order: str, retry: bool) -> Any:
    """``order`` says where the effect (``send``, @idempotent, an external row) runs:
    'draft-send-parse': draft = model(q1); send(draft); parse(model(q2));
    'send-draft-parse': send('starting'); parse(model(q1));
    'draft-send-parse-draft': draft = model(q); send(draft); parse(draft)."""
    jm = journaled(model)
    parser = JsonOutputParser()

    @idempotent
    def send(body: str) -> str:
        with psycopg.connect(dsn, autocommit=True) as conn:
            conn.execute("INSERT INTO seam_effects (thread, body) VALUES (%s, %s)", (thread, body))
        return "sent"

    def node(state: MessagesState) -> dict[str, Any]:
        if order == "send-draft-parse":
            send("starting")
            return {"messages": [AIMessage(f"parsed {parser.invoke(jm.invoke([HumanMessage('q1')]))}")]}
        draft = jm.invoke([HumanMessage("q1")])
        send(str(draft.content))
        if order == "draft-send-parse-draft":
            return {"messages": [AIMessage(f"parsed {parser.invoke(draft)}")]}
        parsed = parser.invoke(jm.invoke([HumanMessage("q2")]))
        return {"messages": [AIMessage(f"{draft.content}: parsed {parsed}")]}

    builder = StateGraph(MessagesState)
    builder.add_node("n", node, retry_policy=RETRY if retry else None)
    builder.add_edge(START, "n")
    builder.add_edge("n", END)
    return builder.compile(checkpointer=saver)


@pytest.mark.parametrize("via", ["retry", "resume"])
def test_an_answer_an_effect_used_is_kept_the_rejected_one_is_asked_again(
    saver: DurablePostgresSaver, dsn: str, via: str
) -> None:
    """draft -> send(draft) (recorded) -> parse(second answer) fails. The next attempt
    (a RetryPolicy retry, or invoke(None) after the failed run) replays the draft the
    sent message was made of, the effect is not repeated, and only the rejected answer
    is asked again. Base: the second answer 'not json' was replayed for ever."""
    _effects_table(dsn)
    thread = new_thread()
    model = answers("draft A", "not json", '{"ok": 1}')
    app = _effect_graph(saver, dsn, thread, model, order="draft-send-parse", retry=via == "retry")
    if via == "resume":
        with pytest.raises(OutputParserException):
            app.invoke(HELLO, cfg(thread))
        out = app.invoke(None, cfg(thread))
    else:
        out = app.invoke(HELLO, cfg(thread))
    assert last(out) == "draft A: parsed {'ok': 1}"
    assert model.given == ["draft A", "not json", '{"ok": 1}']  # the draft was asked once
    assert _effects(dsn, thread) == ["draft A"]  # and sent once


def test_an_effect_before_the_model_call_pins_nothing(saver: DurablePostgresSaver, dsn: str) -> None:
    """send('starting') -> parse(model) fails: the effect came before the answer, so
    nothing it did depends on it; the retry asks again (base: 'not json' for ever)."""
    _effects_table(dsn)
    thread = new_thread()
    model = answers("not json", '{"ok": 1}')
    out = _effect_graph(saver, dsn, thread, model, order="send-draft-parse", retry=True).invoke(HELLO, cfg(thread))
    assert last(out) == "parsed {'ok': 1}" and _effects(dsn, thread) == ["starting"]


def test_an_answer_rejected_after_an_effect_used_it_is_kept_and_said(
    saver: DurablePostgresSaver, dsn: str, caplog: pytest.LogCaptureFixture
) -> None:
    """The decision's price: draft -> send(draft) -> parse(draft) fails. The message sent
    was made of this answer, so it is kept: every attempt replays it and fails the same
    way, the effect runs once, and each retry logs a WARNING that names the effect that
    pins the answer (base: the same replays, silently)."""
    _effects_table(dsn)
    thread = new_thread()
    model = answers("not json", '{"ok": 1}')
    app = _effect_graph(saver, dsn, thread, model, order="draft-send-parse-draft", retry=True)
    with caplog.at_level(logging.WARNING, logger="langgraph_durable.journal"), pytest.raises(OutputParserException):
        app.invoke(HELLO, cfg(thread))
    assert model.given == ["not json"] and _effects(dsn, thread) == ["not json"]
    warnings = [r.getMessage() for r in caplog.records if r.name == "langgraph_durable.journal"]
    assert len(warnings) == 2  # attempts 2 and 3
    assert all(".send'" in w and "kept" in w for w in warnings), warnings


def test_a_rejected_answer_inside_an_effect_is_asked_again(saver: DurablePostgresSaver, dsn: str) -> None:
    """The journaled call runs inside an @idempotent function (keyed under it) that
    parses the answer before its effect: the parse fails, the function raises (nothing
    sent, its claim released), the node raises. The retry runs the function again and
    its journaled call asks the model again; the function's own claim, in flight, pins
    nothing (base: 'not json' replayed inside it for ever)."""
    _effects_table(dsn)
    thread = new_thread()
    model = answers("not json", '{"ok": 1}')
    jm, parser = journaled(model), JsonOutputParser()

    @idempotent
    def send_summary(text: str) -> str:
        summary = str(parser.invoke(jm.invoke([HumanMessage(text)])))
        with psycopg.connect(dsn, autocommit=True) as conn:
            conn.execute("INSERT INTO seam_effects (thread, body) VALUES (%s, %s)", (thread, summary))
        return summary

    def node(state: MessagesState) -> dict[str, Any]:
        return {"messages": [AIMessage(send_summary("q"))]}

    builder = StateGraph(MessagesState)
    builder.add_node("n", node, retry_policy=RETRY)
    builder.add_edge(START, "n")
    builder.add_edge("n", END)
    out = builder.compile(checkpointer=saver).invoke(HELLO, cfg(thread))
    assert last(out) == "{'ok': 1}" and _effects(dsn, thread) == ["{'ok': 1}"]
    assert model.given == ["not json", '{"ok": 1}']


async def test_concurrent_calls_of_a_retry_keep_each_other_s_answers(asaver: AsyncDurablePostgresSaver) -> None:
    """Attempt 2 runs two journaled calls at once (asyncio.gather): both are prepared
    before either has superseded attempt 1's records, so both supersede. Attempt 2's two
    answers are the ones kept, and the re-execution after the interrupt replays them
    (the interleaving where one supersedes after the other recorded is forced below)."""
    import asyncio

    model, thread = answers("a1", "b1", "a2", "b2"), new_thread()
    jm = journaled(model)
    attempts: list[int] = []

    async def node(state: MessagesState) -> dict[str, Any]:
        attempts.append(1)
        msgs = await asyncio.gather(jm.ainvoke([HumanMessage("a")]), jm.ainvoke([HumanMessage("b")]))
        if len(attempts) == 1:
            raise OutputParserException("attempt 1 rejects both")
        interrupt("re-execute me")
        return {"messages": [AIMessage(" ".join(sorted(str(m.content) for m in msgs)))]}

    builder = StateGraph(MessagesState)
    builder.add_node("n", node, retry_policy=RETRY)
    builder.add_edge(START, "n")
    builder.add_edge("n", END)
    app: Any = builder.compile(checkpointer=asaver)
    await app.ainvoke(HELLO, cfg(thread))
    ledger = Ledger(asaver)
    kept = sorted([str((await ledger.aresult(e.key)).content) for e in await ledger.aentries(thread_id=thread)])
    assert len(kept) == 2 and kept != ["a1", "b1"]  # attempt 2's two answers, both kept
    out = await app.ainvoke(Command(resume=True), cfg(thread))
    assert last(out) == " ".join(kept) and len(model.given) == 4


def test_a_late_supersede_spares_the_records_of_its_own_attempt(saver: DurablePostgresSaver) -> None:
    """The interleaving gather cannot force: call b of attempt 2 was prepared before call
    a superseded, and its lookup (which supersedes again) runs after a recorded its
    answer. Attempt 1's record goes, a's stays: every record of an attempt carries the
    attempt's tag in its owner, and supersede spares it."""
    from langgraph_durable import journal as J

    execution, thread, task = J._Execution(), new_thread(), str(uuid.uuid4())

    def entry(key: str, attempt: int) -> Any:
        guard = J._Guard(
            execution=execution, attempt=attempt, thread_id=thread, graph_ns="", checkpoint_id="cp",
            task_id=task, supersede=attempt > 1, check_failed_run=False,
        )
        return J._Entry(
            ledger=saver, key=key, name="m", fingerprint="f", preview="p", thread_id=thread, origin=thread,
            checkpoint_ns=f"n:{task}", task_id=task, ttl=None, taken=None, guard=guard,
        )

    first = entry(f"llm:{thread}-1", 1)
    saver.run_op(lambda: J._op_store(first, AIMessage("attempt 1")))
    a, b = entry(f"llm:{thread}-a", 2), entry(f"llm:{thread}-b", 2)
    assert saver.run_op(lambda: J._op_lookup(a)) == (False, None)  # supersedes attempt 1
    saver.run_op(lambda: J._op_store(a, AIMessage("attempt 2, a")))
    assert saver.run_op(lambda: J._op_lookup(b)) == (False, None)  # supersedes again
    assert recorded(saver, thread) == ["attempt 2, a"]


def test_a_retried_subgraph_asks_its_inner_node_again(saver: DurablePostgresSaver) -> None:
    """A control (it passes on 569be7e too): the RetryPolicy sits on the parent's
    subgraph node, the inner node parses the journaled answer. The retried subgraph runs
    its inner node as a new task, which asks the model again; the failed-run check must
    not get in the way."""
    model, thread = answers("not json", '{"ok": 1}'), new_thread()
    chain = journaled(model) | JsonOutputParser()
    inner = StateGraph(MessagesState)
    inner.add_node("n", lambda s: {"messages": [AIMessage(f"parsed {chain.invoke(s['messages'])}")]})
    inner.add_edge(START, "n")
    inner.add_edge("n", END)
    parent = StateGraph(MessagesState)
    parent.add_node("sub", inner.compile(), retry_policy=RETRY)
    parent.add_edge(START, "sub")
    parent.add_edge("sub", END)
    app: Any = parent.compile(checkpointer=saver)
    assert last(app.invoke(HELLO, cfg(thread))) == "parsed {'ok': 1}"
    assert model.given == ["not json", '{"ok": 1}']
