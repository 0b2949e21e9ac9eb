"""What the operator looks at (issue 25), on real graph runs on real PostgreSQL, over HTTP
(starlette's TestClient):

* a finished tool-calling conversation (a model node, a ToolNode with an ``@idempotent``
  tool): the thread page shows a transcript of human/AI/tool/system turns, each AI tool
  call with its name and arguments, linked to its ToolMessage and to the ledger row its
  tool recorded (status, attempts, recorded result); long contents folded; hostile
  content escaped (no HTML from a message reaches the page); the same in state-at,
  pending writes and diff views;
* a thread waiting on an interrupt: the value the graph asked with, as JSON, and the node;
* an error thread and a quarantined one: failing node, exception type, message and
  traceback, recorded at failure (bounded: a huge traceback is cut, the cut said);
* time: absolute timestamps beside relative ones, step durations; the storage page's row
  estimates are numbers (never "?").
"""

from __future__ import annotations

import json
import operator
import re
import uuid
from collections.abc import Iterator
from typing import Annotated, Any, TypedDict

import psycopg
import pytest
from langchain_core.messages import AIMessage, HumanMessage, SystemMessage, ToolMessage
from langchain_core.tools import tool
from langgraph.graph import END, START, MessagesState, StateGraph
from langgraph.prebuilt import ToolNode
from langgraph.types import Command, interrupt
from psycopg.rows import dict_row
from starlette.testclient import TestClient

from langgraph_durable import DurablePostgresSaver, PoisonCheckpointError, idempotent
from langgraph_durable.console import create_app
from langgraph_durable.lifecycle import FAILURE_TRACEBACK_MAX

HOSTILE = '<script>alert("x")</script><img src=x onerror=alert(1)>'
LONG = "the weather report, line by line.\n" * 200  # folded: > 600 chars


def q(dsn: str, sql: str, *args: Any) -> list[dict[str, Any]]:
    with psycopg.connect(dsn, row_factory=dict_row) as conn:
        return conn.execute(sql, args).fetchall()


def _cfg(tid: str) -> dict[str, Any]:
    return {"configurable": {"thread_id": tid}}


CALLS: list[str] = []


@idempotent
@tool
def lookup_weather(city: str) -> str:
    """The weather in a city."""
    CALLS.append(city)
    return f"sunny in {city} " + HOSTILE + " " + LONG


def _agent(saver: Any) -> Any:
    """A model node that asks for a tool once, then answers; the ToolNode runs it."""

    def model(state: MessagesState) -> dict[str, Any]:
        if not any(isinstance(m, ToolMessage) for m in state["messages"]):
            return {"messages": [AIMessage(
                content="let me look that up " + HOSTILE,
                tool_calls=[{"id": "call_0", "name": "lookup_weather",
                             "args": {"city": "Paris" + HOSTILE}}],
            )]}
        return {"messages": [AIMessage(content="It is sunny in Paris.")]}

    def route(state: MessagesState) -> str:
        last = state["messages"][-1]
        return "tools" if getattr(last, "tool_calls", None) else END

    b = StateGraph(MessagesState)
    b.add_node("model", model)
    b.add_node("tools", ToolNode([lookup_weather]))
    b.add_edge(START, "model")
    b.add_conditional_edges("model", route, ["tools", END])
    b.add_edge("tools", "model")
    return b.compile(checkpointer=saver.bind(graph_version="agent-v1"))


class S(TypedDict, total=False):
    x: int
    log: Annotated[list[str], operator.add]
    answer: str


def _asking(saver: Any) -> Any:
    def plan(state: S) -> S:
        return {"x": 1, "log": ["plan"]}

    def approve(state: S) -> S:
        answer = interrupt({"question": "ship order 42?", "order": {"id": 42, "note": HOSTILE}})
        return {"answer": str(answer)}

    b = StateGraph(S)
    b.add_node("plan", plan)
    b.add_node("approve", approve)
    b.add_edge(START, "plan")
    b.add_edge("plan", "approve")
    b.add_edge("approve", END)
    return b.compile(checkpointer=saver.bind(graph_version="ask-v1"))


def _deep(n: int, detail: str) -> None:
    if n:
        _deep(n - 1, detail)
    raise RuntimeError("payment provider returned 500 " + HOSTILE + detail)


def _failing(saver: Any, depth: int, detail: str = "") -> Any:
    def plan(state: S) -> S:
        return {"x": 1}

    def charge(state: S) -> S:
        _deep(depth, detail)
        return {}

    b = StateGraph(S)
    b.add_node("plan", plan)
    b.add_node("charge", charge)
    b.add_edge(START, "plan")
    b.add_edge("plan", "charge")
    b.add_edge("charge", END)
    return b.compile(checkpointer=saver.bind(graph_version="fail-v1"))


class Data:
    def __init__(self, dsn: str) -> None:
        tag = uuid.uuid4().hex[:6]
        self.dsn = dsn
        self.chat = f"chat-{tag}"
        self.dict_chat = f"dictchat-{tag}"
        self.waiting = f"waiting-{tag}"
        self.error = f"error-{tag}"
        self.deep = f"deep-{tag}"
        self.poisoned = f"poison-{tag}"
        self.damaged = f"damaged-{tag}"


@pytest.fixture(scope="module")
def data(dsn: str) -> Iterator[Data]:
    d = Data(dsn)
    with DurablePostgresSaver.from_conn_string(dsn, max_resume_attempts=1) as saver:
        saver.setup()
        agent = _agent(saver)
        agent.invoke({"messages": [SystemMessage("you are a weather bot"),
                                   HumanMessage("weather in Paris? " + HOSTILE)]}, _cfg(d.chat))
        assert len(agent.get_state(_cfg(d.chat)).values["messages"]) == 5
        # Messages in their dict form (as a JSON API would hand them over).
        b = StateGraph(MessagesState)
        b.add_node("echo", lambda s: {"messages": [{"role": "assistant", "content": "echo"}]})
        b.add_edge(START, "echo")
        b.add_edge("echo", END)
        plain = b.compile(checkpointer=saver.bind(graph_version="echo-v1"))
        plain.invoke({"messages": [{"role": "user", "content": "hi " + HOSTILE}]}, _cfg(d.dict_chat))
        _asking(saver).invoke({"x": 0, "log": []}, _cfg(d.waiting))
        with pytest.raises(RuntimeError):
            _failing(saver, 3).invoke({"x": 0}, _cfg(d.error))
        with pytest.raises(RuntimeError):
            _failing(saver, 3, "; body: " + "x" * 40_000).invoke({"x": 0}, _cfg(d.deep))
        failing = _failing(saver, 2)
        with pytest.raises(RuntimeError):
            failing.invoke({"x": 0}, _cfg(d.poisoned))
        with pytest.raises(PoisonCheckpointError):
            failing.invoke(None, _cfg(d.poisoned))
        asking = _asking(saver)
        asking.invoke({"x": 0, "log": []}, _cfg(d.damaged))
    # A stored value that no longer decodes (0xc1 is never valid msgpack): the next run
    # start quarantines the thread at once (reason load_error).
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("UPDATE checkpoint_blobs SET blob = '\\xc1'::bytea "
                     "WHERE thread_id = %s AND channel = 'log'", (d.damaged,))
    with DurablePostgresSaver.from_conn_string(dsn) as saver:
        with pytest.raises(PoisonCheckpointError):
            _asking(saver).invoke(Command(resume="yes"), _cfg(d.damaged))
    yield d


@pytest.fixture(scope="module")
def client(data: Data) -> Iterator[TestClient]:
    with DurablePostgresSaver.from_conn_string(data.dsn) as saver:
        saver.setup()
        with TestClient(create_app(saver, sample_interval=0)) as c:
            yield c


def _page(client: TestClient, path: str) -> str:
    r = client.get(path)
    assert r.status_code == 200, (path, r.text[:800])
    return r.text


def _no_injection(html: str) -> None:
    assert "<script>alert" not in html and "<img src=x" not in html
    assert "&lt;script&gt;alert" in html


def _turns(html: str) -> list[str]:
    return re.findall(r'class="turn turn-(\w+)"', html)


# ------------------------------------------------------------------ conversations
def test_a_tool_calling_conversation_is_a_transcript_linked_to_its_ledger_row(
    client: TestClient, data: Data
) -> None:
    html = _page(client, f"/thread?id={data.chat}")
    assert "Conversation: <span" in html
    assert _turns(html) == ["system", "human", "ai", "tool", "ai"]
    _no_injection(html)
    # The AI's tool call: its name, its arguments (escaped), linked to its result turn.
    assert 'class="mono tool-name">lookup_weather<' in html
    assert "Paris&lt;script&gt;" in html
    assert 'href="#latest-1-m3">result #3</a>' in html
    assert "result of <span class=\"mono\">lookup_weather</span> call <span class=\"mono\">call_0</span>" in html
    # The ledger row the @idempotent tool recorded: completed, 1 attempt, its result.
    rows = q(data.dsn, "SELECT key, status, attempts FROM durable_ledger WHERE thread_id = %s",
             data.chat)
    assert [(r["status"], r["attempts"]) for r in rows] == [("completed", 1)]
    link = html.split('class="ledger-link small"', 1)[1].split("</div>\n</div>", 1)[0]
    assert "completed" in link and "1 attempt " in link and "recorded result" in link
    assert "sunny in Paris" in link
    # Long contents are folded: the tool result (and the recorded result) in <details>.
    assert html.count('<details class="fold">') >= 2
    assert CALLS.count("Paris" + HOSTILE) == 1


def test_dict_form_messages_are_a_transcript_too(client: TestClient, data: Data) -> None:
    html = _page(client, f"/thread?id={data.dict_chat}")
    # add_messages turns dicts into messages; the dict form itself is shown by the
    # pending writes of the first checkpoint (the input, as the caller gave it).
    assert _turns(html)[:2] == ["human", "ai"]
    _no_injection(html)
    first = q(data.dsn, "SELECT checkpoint_id FROM checkpoints WHERE thread_id = %s "
              "ORDER BY checkpoint_id LIMIT 1", data.dict_chat)[0]["checkpoint_id"]
    at = _page(client, f"/thread?id={data.dict_chat}&cp={first}")
    pending = at.split('id="pending"', 1)[1].split("</table>", 1)[0]
    assert 'class="turn turn-human"' in pending
    _no_injection(at)


def test_state_at_pending_writes_and_diff_render_messages(client: TestClient, data: Data) -> None:
    cps = [r["checkpoint_id"] for r in q(
        data.dsn, "SELECT checkpoint_id FROM checkpoints WHERE thread_id = %s AND "
        "checkpoint_ns = '' ORDER BY checkpoint_id", data.chat)]
    # State at the checkpoint after the model asked for the tool: 3 turns, the call.
    mid = _page(client, f"/thread?id={data.chat}&cp={cps[2]}")
    state_at = mid.split('id="state-at"', 1)[1].split("<h3", 1)[0]
    assert _turns(state_at) == ["system", "human", "ai"]
    assert "no result yet" in state_at
    # Its pending writes: the ToolNode's ToolMessage, as a turn.
    pending = mid.split('id="pending"', 1)[1].split("</table>", 1)[0]
    assert _turns(pending) == ["tool"]
    _no_injection(mid)
    # The diff from it to the latest: the unchanged prefix counted, the new turns shown.
    diff = _page(client, f"/thread?id={data.chat}&a={cps[2]}&b=latest")
    part = diff.split('id="diff"', 1)[1].split("<h2", 1)[0]
    assert "3 messages unchanged" in part
    assert _turns(part) == ["tool", "ai"]
    _no_injection(diff)


# ------------------------------------------------------------------ interrupts
def test_a_waiting_thread_shows_the_value_asked_and_the_node(client: TestClient, data: Data) -> None:
    html = _page(client, f"/thread?id={data.waiting}")
    block = html.split('id="interrupts"', 1)[1].split("</div>", 1)[0]
    assert 'class="mono interrupt-node">approve<' in block
    value = block.split('<pre class="interrupt-value">', 1)[1].split("</pre>", 1)[0]
    import html as h

    assert json.loads(h.unescape(value)) == {
        "question": "ship order 42?", "order": {"id": 42, "note": HOSTILE}
    }
    _no_injection(html)


# ------------------------------------------------------------------ failures
def test_an_error_thread_shows_node_type_message_and_traceback(client: TestClient, data: Data) -> None:
    row = q(data.dsn, "SELECT status, last_failure FROM durable_threads WHERE thread_id = %s",
            data.error)[0]
    assert row["status"] == "error"
    failure = row["last_failure"]
    assert failure["node"] == "charge" and failure["type"] == "builtins.RuntimeError"
    assert "_deep" in failure["traceback"] and failure["traceback_cut"] == 0
    html = _page(client, f"/thread?id={data.error}")
    assert 'id="failure-node">charge<' in html
    assert 'id="failure-type">builtins.RuntimeError<' in html
    tb = html.split('id="traceback">', 1)[1].split("</pre>", 1)[0]
    assert "Traceback (most recent call last)" in tb and "in _deep" in tb
    assert "During task with name &#39;charge&#39;" in tb
    _no_injection(html)


def test_a_huge_traceback_is_stored_bounded_and_the_cut_said(client: TestClient, data: Data) -> None:
    failure = q(data.dsn, "SELECT last_failure FROM durable_threads WHERE thread_id = %s",
                data.deep)[0]["last_failure"]
    assert len(failure["traceback"]) <= FAILURE_TRACEBACK_MAX
    assert failure["traceback_cut"] > 0
    # The tail is kept: the end of the message and LangGraph's note naming the node.
    assert failure["traceback"].rstrip().endswith("During task with name 'charge' and id '"
                                                  + failure["task_id"] + "'")
    assert len(failure["message"]) == 4000 and failure["node"] == "charge"
    html = _page(client, f"/thread?id={data.deep}")
    assert f"the first {failure['traceback_cut']} characters were cut" in html


def test_a_quarantined_thread_keeps_its_traceback(client: TestClient, data: Data) -> None:
    row = q(data.dsn, "SELECT status, last_failure FROM durable_threads WHERE thread_id = %s",
            data.poisoned)[0]
    assert row["status"] == "quarantined"
    assert row["last_failure"]["node"] == "charge"
    html = _page(client, f"/thread?id={data.poisoned}")
    assert 'id="quarantine"' in html and 'id="failure-node">charge<' in html
    assert "in _deep" in html.split('id="traceback">', 1)[1]


# ------------------------------------------------------------------ time, storage
def test_timestamps_are_absolute_beside_relative_and_steps_have_durations(
    client: TestClient, data: Data
) -> None:
    html = _page(client, f"/thread?id={data.chat}")
    timeline = html.split('id="timeline"', 1)[1].split("</table>", 1)[0]
    stamps = re.findall(r'<span class="abs">(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d UTC)</span>', timeline)
    n = q(data.dsn, "SELECT count(*) AS n FROM checkpoints WHERE thread_id = %s", data.chat)[0]["n"]
    assert len(stamps) == n == 5  # one per checkpoint
    durations = re.findall(r'<td class="nowrap">([\d.]+ (?:ms|s|min|h)|-)</td>', timeline)
    assert len(durations) == n and durations[-1] == "-"  # the first step has no parent
    assert all(d != "-" for d in durations[:-1])


def test_storage_row_estimates_are_numbers_and_sizes_one_unit(
    client: TestClient, data: Data
) -> None:
    never = {r["relname"] for r in q(data.dsn, "SELECT relname FROM pg_class WHERE reltuples < 0")}
    html = _page(client, "/storage")
    table = html.split('id="tables"', 1)[1].split("</table>", 1)[0]
    rows = re.findall(r'<tr><td class="mono">(\w+)</td><td class="num" title="([^"]*)">([^<]*)</td>'
                      r'((?:<td class="num">[^<]*</td>){3})', table)
    assert len(rows) >= 5, table[:500]
    units = set()
    for name, how, est, sizes in rows:
        assert est != "?" and int(est.replace(",", "")) >= 0, (name, est)
        if name in never and how.startswith("counted"):  # never analyzed: counted exactly
            exact = q(data.dsn, f'SELECT count(*) AS n FROM "{name}"')[0]["n"]
            assert int(est.replace(",", "")) == exact, name
        units |= set(re.findall(r" ([KMGT]?i?B)</td>", sizes))
    assert len(units) == 1, units  # one unit for every size in the table
    assert any(how.startswith("counted") for _, how, _, _ in rows)  # an empty, never analyzed one


# ------------------------------------------------------------------ graph names
def test_versions_are_grouped_by_graph_name_with_a_current_version_each(data: Data) -> None:
    """Two graphs in one database: each has its current version; an older version of
    one graph with unfinished threads must drain, the other graph's live version does
    not (on the base it was "must drain": whichever graph wrote last was current)."""
    tag = uuid.uuid4().hex[:6]
    with DurablePostgresSaver.from_conn_string(data.dsn) as saver:
        def billing(version: str) -> Any:
            b = StateGraph(S)
            b.add_node("plan", lambda s: {"x": 1})
            b.add_node("approve", lambda s: {"answer": str(interrupt("ok?"))})
            b.add_edge(START, "plan")
            b.add_edge("plan", "approve")
            b.add_edge("approve", END)
            return b.compile(checkpointer=saver.bind(graph_version=version), name="billing")

        billing(f"bill-1-{tag}").invoke({"x": 0}, _cfg(f"bill-old-{tag}"))  # waits: unfinished
        billing(f"bill-2-{tag}").invoke({"x": 0}, _cfg(f"bill-new-{tag}"))  # waits: unfinished
        b = StateGraph(S)
        b.add_node("answer", lambda s: {"answer": "hi"})
        b.add_edge(START, "answer")
        b.add_edge("answer", END)
        support = b.compile(checkpointer=saver.bind(graph_version=f"sup-1-{tag}"))
        # Written last: on the base, the only "current" version of the whole database.
        support.invoke({"x": 0}, {"configurable": {"thread_id": f"sup-{tag}"},
                                  "metadata": {"graph_id": "support"}})
        names = {r["version"]: r["graph_name"] for r in q(
            data.dsn, "SELECT version, graph_name FROM durable_graph_versions "
            "WHERE version LIKE %s", f"%-{tag}")}
        assert names == {f"bill-1-{tag}": "billing", f"bill-2-{tag}": "billing",
                         f"sup-1-{tag}": "support"}
        with TestClient(create_app(saver, sample_interval=0)) as client:
            html = _page(client, "/versions")
    rows = {v: (name, "current</span>" in cell) for name, v, cell in re.findall(
        r'<td class="graph-name">([^<]*)</td><td class="mono">([^< ]+)(.*?)</td>', html)}
    assert rows[f"bill-2-{tag}"] == ("billing", True)
    assert rows[f"sup-1-{tag}"] == ("support", True)
    assert rows[f"bill-1-{tag}"] == ("billing", False)
    drain = html.split('<ul id="drain">', 1)[1].split("</ul>", 1)[0]
    must = dict(re.findall(r'<li>(?:[^<]* )?<span class="mono">([^<]+)</span> \(current: '
                           r'<span class="mono">([^<]+)</span>', drain))
    assert must[f"bill-1-{tag}"] == f"bill-2-{tag}"  # billing's old version, drains to its current
    assert f"bill-2-{tag}" not in must and f"sup-1-{tag}" not in must


def test_a_thread_quarantined_on_a_load_error_shows_that_traceback(
    client: TestClient, data: Data
) -> None:
    row = q(data.dsn, "SELECT t.status, t.last_failure, q.reason, q.checkpoint_id FROM "
            "durable_threads t JOIN durable_quarantine q USING (thread_id) WHERE thread_id = %s",
            data.damaged)[0]
    assert row["status"] == "quarantined" and row["reason"] == "load_error"
    failure = row["last_failure"]
    assert failure["type"].endswith("Error") and "Load" in failure["type"], failure["type"]
    assert failure["checkpoint_id"] == row["checkpoint_id"] and failure["node"] is None
    html = _page(client, f"/thread?id={data.damaged}")
    assert failure["type"] in html.split('id="failure-type">', 1)[1].split("<", 1)[0]
    assert "Traceback (most recent call last)" in html.split('id="traceback">', 1)[1]


# ------------------------------------------------------------------ browser
# The id, hash and size cells whose text is drawn on more than one line.
WRAPPED = """() => [...document.querySelectorAll('td.hash, td.num, td.mono:not(.pre):not(.small)')]
    .filter(td => td.textContent.trim() && !td.querySelector('br'))  // <br>: two lines on purpose
    .filter(td => { const r = document.createRange(); r.selectNodeContents(td);
                    const tops = [...r.getClientRects()].map(x => x.top);
                    return Math.max(...tops) - Math.min(...tops) > 8; })  // a second line
    .map(td => td.textContent.trim())"""


def test_browser_transcript_view_at_1024_px(data: Data, tmp_path: Any) -> None:
    """The transcript in a real Chromium at 1024 px: the turns and the ledger link are
    drawn, no hash, id or size cell wraps, no script ran (none is sent); a screenshot
    (LGD_UPDATE_SCREENSHOT=1: docs/img/console-transcript.png)."""
    import os
    import threading
    import time
    from pathlib import Path

    from test_console import CHROMIUM, _browser_or_skip

    sync_playwright = _browser_or_skip()
    import socket

    import uvicorn

    # A socket bound here, port chosen by the kernel, handed to uvicorn: a fixed range
    # inside the ephemeral ports collided with a client connection's port in CI
    # ("address already in use"), and a port found free and bound later can be taken.
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.bind(("127.0.0.1", 0))
    port = int(sock.getsockname()[1])
    with DurablePostgresSaver.from_conn_string(data.dsn) as saver:
        app = create_app(saver, sample_interval=0)
        srv = uvicorn.Server(uvicorn.Config(app, log_level="warning"))
        t = threading.Thread(target=srv.run, kwargs={"sockets": [sock]}, daemon=True)
        t.start()
        deadline = time.monotonic() + 30
        while not srv.started:
            assert time.monotonic() < deadline, "the console did not start"
            time.sleep(0.05)
        try:
            with sync_playwright() as pw:
                browser = pw.chromium.launch(
                    executable_path=CHROMIUM, args=["--no-sandbox", "--disable-dev-shm-usage"]
                )
                page = browser.new_page(viewport={"width": 1024, "height": 900})
                dialogs: list[str] = []
                page.on("dialog", lambda d: (dialogs.append(d.message), d.dismiss()))
                page.goto(f"http://127.0.0.1:{port}/thread?id={data.chat}")
                turns = page.locator("#latest-1 .turn")
                assert turns.count() == 5
                assert page.locator("#latest-1 .ledger-link").inner_text().startswith("ledger")
                # Nothing hostile ran: the alert() in the messages is text.
                assert dialogs == []
                wrapped = page.evaluate(WRAPPED)
                assert wrapped == [], wrapped
                # ... and nothing is pushed off the page to the right.
                widths = page.evaluate("() => [document.querySelector('main').scrollWidth, "
                                       "document.querySelector('main').clientWidth]")
                assert widths[0] <= widths[1], widths
                # The other views at 1024 px: no wrapped hash, id or size either.
                for path in ("/threads", "/versions", "/storage?dedup=0", "/quarantine",
                             "/ledger?show=all", f"/thread?id={data.poisoned}"):
                    page.goto(f"http://127.0.0.1:{port}{path}")
                    assert page.evaluate(WRAPPED) == [], path
                page.goto(f"http://127.0.0.1:{port}/thread?id={data.chat}")
                shot = tmp_path / "console-transcript.png"
                page.locator("#conversation-1").scroll_into_view_if_needed()
                page.screenshot(path=str(shot), full_page=True)
                if os.environ.get("LGD_UPDATE_SCREENSHOT") == "1":
                    out = Path(__file__).resolve().parents[1] / "docs" / "img" / "console-transcript.png"
                    page.screenshot(path=str(out), full_page=True)
                browser.close()
        finally:
            srv.should_exit = True
            t.join(timeout=10)


def test_an_async_run_records_its_failure_too(data: Data) -> None:
    import asyncio

    from langgraph_durable import AsyncDurablePostgresSaver

    tid = f"async-error-{uuid.uuid4().hex[:6]}"

    async def run() -> None:
        async with AsyncDurablePostgresSaver.from_conn_string(data.dsn) as saver:
            with pytest.raises(RuntimeError):
                await _failing(saver, 1).ainvoke({"x": 0}, _cfg(tid))

    asyncio.run(run())
    row = q(data.dsn, "SELECT status, last_failure FROM durable_threads WHERE thread_id = %s", tid)[0]
    assert row["status"] == "error"
    assert row["last_failure"]["node"] == "charge" and "in _deep" in row["last_failure"]["traceback"]
