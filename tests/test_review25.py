"""Adversarial review of issue 25's decisions (rev25): an operator's confirmation and
the POST that carries it out are two requests; between them the thread may change. A
decision confirmed for one run / one question must never reach another:

* a cancel confirmed for the run holding lease token T must not stop the next run on
  the thread (token T+1) when T's run ended in between;
* an answer confirmed for the question asked at checkpoint C must not be queued as the
  answer to the next question (another checkpoint) when the thread moved on in between;
* with an encrypting serializer a queued answer is nowhere in plaintext (the
  durable_threads row, the audit row).

Real graph runs on real PostgreSQL, the console over starlette's TestClient."""

from __future__ import annotations

import html as _html
import re
import threading
import uuid
from collections.abc import Iterator
from typing import Any, TypedDict

import psycopg
import pytest
from langchain_core.runnables import RunnableConfig
from langgraph.checkpoint.serde.encrypted import EncryptedSerializer
from langgraph.graph import END, START, StateGraph
from langgraph.types import Command, interrupt
from psycopg.rows import dict_row
from starlette.testclient import TestClient

from langgraph_durable import ControlRefusedError, DurablePostgresSaver, RunCancelledError
from langgraph_durable.console import create_app
from langgraph_durable.ops import control

TOKEN = "rev25-" + uuid.uuid4().hex[:8]
CANARY = "CANARYrev25Qx7"


def q(dsn: str, sql: str, *args: Any) -> list[dict[str, Any]]:
    with psycopg.connect(dsn, row_factory=dict_row) as conn:
        return conn.execute(sql, args).fetchall()


def _cfg(tid: str) -> dict[str, Any]:
    return {"configurable": {"thread_id": tid}}


class Ask(TypedDict, total=False):
    a1: str
    a2: str


def _q1(state: Ask) -> Ask:
    return {"a1": str(interrupt({"question": "refund the order?"}))}


def _q2(state: Ask) -> Ask:
    return {"a2": str(interrupt({"question": "also close the account?"}))}


def two_questions(saver: Any) -> Any:
    b = StateGraph(Ask)
    b.add_node("q1", _q1)
    b.add_node("q2", _q2)
    b.add_edge(START, "q1")
    b.add_edge("q1", "q2")
    b.add_edge("q2", END)
    return b.compile(checkpointer=saver)


class Gated(TypedDict, total=False):
    steps: int
    done: int


GATES: dict[str, threading.Event] = {}
ENTERED: dict[str, threading.Event] = {}


def _tick(state: Gated, config: RunnableConfig) -> Gated:
    run = config["configurable"]["run_tag"]
    ENTERED[run].set()
    assert GATES[run].wait(60)
    return {"done": state.get("done", 0) + 1}


def _more(state: Gated) -> str:
    return "tick" if state.get("done", 0) < state.get("steps", 0) else END


def gated(saver: Any) -> Any:
    b = StateGraph(Gated)
    b.add_node("tick", _tick)
    b.add_conditional_edges(START, _more, ["tick", END])
    b.add_conditional_edges("tick", _more, ["tick", END])
    return b.compile(checkpointer=saver)


@pytest.fixture(scope="module")
def saver(dsn: str) -> Iterator[Any]:
    with DurablePostgresSaver.from_conn_string(dsn) as s:
        yield s


def _client(saver: Any, **kw: Any) -> TestClient:
    c = TestClient(create_app(saver, allow_actions=True, token=TOKEN, sample_interval=0, **kw))
    r = c.post("/login", data={"token": TOKEN, "name": "rev"}, follow_redirects=False)
    assert r.status_code == 303
    return c


def _confirm_form(page: str) -> dict[str, str]:
    form = page[page.index('<form method="post" action="/act/'):]
    form = form[: form.index("</form>")]
    return {k: _html.unescape(v) for k, v in re.findall(r'<input type="hidden" name="([^"]+)" value="([^"]*)"', form)}


def _audit(dsn: str, tid: str) -> list[dict[str, Any]]:
    return q(dsn, "SELECT * FROM durable_audit WHERE thread_id = %s ORDER BY id", tid)


def test_an_answer_confirmed_for_one_question_is_not_queued_for_the_next(saver: Any, dsn: str) -> None:
    """The operator confirms "yes" to q1 ("refund the order?"); before the POST the
    application answers q1 itself and the thread now waits on q2 ("also close the
    account?"). The POST must be refused (the question changed), not queue "yes" as
    the answer to q2. Fails on main at the status-code assertion (303: queued for q2)."""
    tid = f"two-q-{uuid.uuid4().hex[:6]}"
    graph = two_questions(saver)
    graph.invoke({}, _cfg(tid))
    with _client(saver) as client:
        page = client.get(f"/confirm/answer?thread={tid}&value=%22yes%22")
        assert page.status_code == 200 and "refund the order?" in page.text
        fields = _confirm_form(page.text)
        # Meanwhile the application itself answers q1: the thread waits on q2 now.
        graph.invoke(Command(resume="no refund"), _cfg(tid))
        assert graph.get_state(_cfg(tid)).interrupts[0].value["question"] == "also close the account?"
        r = client.post("/act/answer", data=fields, follow_redirects=False)
        assert r.status_code == 409, f"an answer to q1 was queued for q2: {r.status_code}"
    row = q(dsn, "SELECT status, answer_blob FROM durable_threads WHERE thread_id = %s", tid)[0]
    assert row["status"] == "waiting" and row["answer_blob"] is None
    assert [a for a in _audit(dsn, tid) if a["action"].endswith("answer")] == []


def test_queue_answer_with_the_confirmed_checkpoint_refuses_a_moved_head(saver: Any, dsn: str) -> None:
    """The operator API itself: ``checkpoint_id=`` names the waiting checkpoint the
    answer is for; a head that moved on refuses (ControlRefusedError), nothing stored."""
    tid = f"two-q-api-{uuid.uuid4().hex[:6]}"
    graph = two_questions(saver)
    graph.invoke({}, _cfg(tid))
    asked_at = graph.get_state(_cfg(tid)).config["configurable"]["checkpoint_id"]
    graph.invoke(Command(resume="no refund"), _cfg(tid))
    with pytest.raises(ControlRefusedError, match="moved on"):
        control.queue_answer(saver, tid, "yes", checkpoint_id=asked_at)
    assert q(dsn, "SELECT answer_blob FROM durable_threads WHERE thread_id = %s", tid)[0]["answer_blob"] is None
    now_at = graph.get_state(_cfg(tid)).config["configurable"]["checkpoint_id"]
    control.queue_answer(saver, tid, "close it", checkpoint_id=now_at)
    assert q(dsn, "SELECT status FROM durable_threads WHERE thread_id = %s", tid)[0]["status"] == "queued"


def _run_in_thread(graph: Any, tid: str, inp: Any, tag: str) -> tuple[threading.Thread, list[Any]]:
    GATES[tag], ENTERED[tag] = threading.Event(), threading.Event()
    out: list[Any] = []

    def run() -> None:
        cfg = {"configurable": {"thread_id": tid, "run_tag": tag}}
        try:
            out.append(graph.invoke(inp, cfg))
        except BaseException as exc:
            out.append(exc)

    t = threading.Thread(target=run)
    t.start()
    return t, out


def test_a_cancel_confirmed_for_one_run_does_not_stop_the_next(saver: Any, dsn: str) -> None:
    """Run A (lease token T) holds the thread when the operator opens the cancel page;
    A ends, run B (token T+1) starts; the operator's POST must be refused (the run it
    confirmed has ended), not stop B. Fails on main at the status-code assertion (303)
    and B ends with RunCancelledError."""
    tid = f"cancel-race-{uuid.uuid4().hex[:6]}"
    graph = gated(saver)
    a, a_out = _run_in_thread(graph, tid, {"steps": 1}, "A")
    assert ENTERED["A"].wait(30)
    with _client(saver) as client:
        page = client.get(f"/confirm/cancel?thread={tid}")
        assert page.status_code == 200, page.text[:300]
        fields = _confirm_form(page.text)
        token_a = q(dsn, "SELECT lease_token FROM durable_threads WHERE thread_id = %s", tid)[0]["lease_token"]
        GATES["A"].set()
        a.join(30)
        assert a_out and not isinstance(a_out[0], BaseException), a_out
        b, b_out = _run_in_thread(graph, tid, {"steps": 3, "done": 0}, "B")
        assert ENTERED["B"].wait(30)
        token_b = q(dsn, "SELECT lease_token FROM durable_threads WHERE thread_id = %s", tid)[0]["lease_token"]
        assert token_b != token_a
        r = client.post("/act/cancel", data=fields, follow_redirects=False)
        GATES["B"].set()
        b.join(60)
    assert r.status_code == 409, f"a cancel confirmed for token {token_a} was sent to {token_b}: {r.status_code}"
    assert b_out and not isinstance(b_out[0], RunCancelledError), b_out
    assert b_out[0]["done"] == 3
    assert q(dsn, "SELECT status FROM durable_threads WHERE thread_id = %s", tid)[0]["status"] == "done"
    assert [a for a in _audit(dsn, tid) if a["action"].endswith("cancel")] == []


def test_request_cancel_with_a_token_refuses_another_run(saver: Any, dsn: str) -> None:
    """The operator API: ``token=`` names the lease the cancel is for; another token
    refuses (ControlRefusedError) and sets no request."""
    tid = f"cancel-tok-{uuid.uuid4().hex[:6]}"
    graph = gated(saver)
    t, out = _run_in_thread(graph, tid, {"steps": 1}, "C")
    try:
        assert ENTERED["C"].wait(30)
        token = q(dsn, "SELECT lease_token FROM durable_threads WHERE thread_id = %s", tid)[0]["lease_token"]
        with pytest.raises(ControlRefusedError, match="ended"):
            control.request_cancel(saver, tid, token=int(token) - 1)
        assert q(dsn, "SELECT cancel_token FROM durable_threads WHERE thread_id = %s", tid)[0]["cancel_token"] is None
        control.request_cancel(saver, tid, token=int(token))
        assert q(dsn, "SELECT cancel_token FROM durable_threads WHERE thread_id = %s",
                 tid)[0]["cancel_token"] == token
    finally:
        GATES["C"].set()
        t.join(30)


def test_a_queued_answer_is_not_stored_in_plaintext_with_an_encrypting_serde(dsn: str) -> None:
    key = b"0123456789abcdef0123456789abcdef"
    serde = EncryptedSerializer.from_pycryptodome_aes(key=key)
    tid = f"sealed-answer-{uuid.uuid4().hex[:6]}"
    with DurablePostgresSaver.from_conn_string(dsn, serde=serde) as saver:
        graph = two_questions(saver)
        graph.invoke({}, _cfg(tid))
        control.queue_answer(saver, tid, {"note": f"refund {CANARY}"})
        row = q(dsn, "SELECT * FROM durable_threads WHERE thread_id = %s", tid)[0]
        assert row["answer_blob"] is not None
        for col, value in row.items():
            raw = bytes(value) if isinstance(value, bytes | memoryview) else str(value).encode()
            assert CANARY.encode() not in raw, f"durable_threads.{col} holds the answer in plaintext"
        for a in _audit(dsn, tid):
            assert CANARY not in str(a), "the audit row holds the answer"


@pytest.mark.parametrize("depth", [200, 600, 3000])
def test_a_deeply_nested_answer_is_refused_cleanly(saver: Any, dsn: str, depth: int) -> None:
    """Hostile JSON in the answer box: nested ``depth`` deep. The confirmation page
    refuses it (409/400) or shows it; never a 500, and the POST never stores what the
    serde cannot read back."""
    tid = f"deep-{depth}-{uuid.uuid4().hex[:6]}"
    graph = two_questions(saver)
    graph.invoke({}, _cfg(tid))
    text = "[" * depth + "1" + "]" * depth
    with _client(saver) as client:
        page = client.get("/confirm/answer", params={"thread": tid, "value": text})
        assert page.status_code in (200, 400, 409), page.status_code
        if page.status_code == 200:
            r = client.post("/act/answer", data=_confirm_form(page.text), follow_redirects=False)
            assert r.status_code in (303, 400, 409), r.status_code
        # The page skipped: a POST of its own (the session's CSRF token, confirmed=yes).
        csrf = re.search(r'name="csrf" value="([^"]+)"', client.get(f"/thread?id={tid}").text)
        assert csrf
        r = client.post("/act/answer", data={"thread": tid, "value": text, "confirmed": "yes",
                                             "csrf": csrf.group(1)}, follow_redirects=False)
        assert r.status_code in (303, 400, 409), r.status_code
    row = q(dsn, "SELECT answer_type, answer_blob FROM durable_threads WHERE thread_id = %s", tid)[0]
    if row["answer_blob"] is not None:
        assert saver.serde.loads_typed((row["answer_type"], bytes(row["answer_blob"]))) is not None


def _blocked_on_locks(dsn: str, n: int, timeout: float = 30.0) -> None:
    """Wait until ``n`` sessions of this database wait on a row lock (the forks)."""
    import time

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        rows = q(dsn, "SELECT count(*) AS n FROM pg_stat_activity WHERE datname = current_database() "
                      "AND wait_event_type = 'Lock'")
        if rows[0]["n"] >= n:
            return
        time.sleep(0.05)
    raise AssertionError(f"fewer than {n} sessions blocked")


def test_two_forks_into_one_new_id_at_once_leave_one_fork(saver: Any, dsn: str) -> None:
    """Two operators fork two different threads into the same new id at once. Each
    fork checks that the id has no checkpoint (neither has committed yet), so both
    used to write their copy: the new thread held two unrelated root checkpoints (two
    histories mixed in one thread). One fork must win; the other is refused
    (ControlRefusedError), its checkpoint not written. Fails on main at the
    ``len(errors) == 1`` assertion (both forks succeed).

    Made deterministic with a third session holding the new id's durable_threads row
    uncommitted (as a third fork would) until both forks wait on it."""
    tag = uuid.uuid4().hex[:6]
    s1, s2, new = f"fork-src1-{tag}", f"fork-src2-{tag}", f"fork-into-{tag}"
    graph = two_questions(saver)
    graph.invoke({}, _cfg(s1))
    graph.invoke({}, _cfg(s2))
    graph.invoke(Command(resume="x"), _cfg(s2))
    cp1 = graph.get_state(_cfg(s1)).config["configurable"]["checkpoint_id"]
    cp2 = graph.get_state(_cfg(s2)).config["configurable"]["checkpoint_id"]
    results: list[Any] = []
    errors: list[BaseException] = []

    def fork(src: str, cp: str) -> None:
        try:
            results.append(control.fork(saver, src, cp, new))
        except BaseException as exc:
            errors.append(exc)

    with psycopg.connect(dsn) as holder:
        holder.execute("INSERT INTO durable_threads (thread_id, status, updated_at) VALUES (%s, 'stopped', now())",
                       (new,))
        forks = [threading.Thread(target=fork, args=a) for a in ((s1, cp1), (s2, cp2))]
        for f in forks:
            f.start()
        _blocked_on_locks(dsn, 2)
        holder.rollback()
    for f in forks:
        f.join(30)
    assert len(results) == 1 and len(errors) == 1, (results, errors)
    assert isinstance(errors[0], ControlRefusedError), errors
    roots = q(dsn, "SELECT checkpoint_id FROM checkpoints WHERE thread_id = %s AND checkpoint_ns = '' "
                   "AND parent_checkpoint_id IS NULL", new)
    assert len(roots) == 1, f"the new thread holds {len(roots)} unrelated root checkpoints"
    forks_audited = [a for a in _audit(dsn, s1) + _audit(dsn, s2) if a["action"].endswith("fork")]
    assert len(forks_audited) == 1


def test_a_fork_into_an_id_with_a_thread_row_is_refused(saver: Any, dsn: str) -> None:
    """The new id has a durable_threads row but no checkpoint yet (queued by
    recovery's RECOVERY_QUEUE_SQL, or a run's lease taken before its first put): the
    id is in use; the fork is refused and writes nothing. Fails on main (the fork
    writes into it, the row stays 'queued': a worker runs the "held" fork at once)."""
    tag = uuid.uuid4().hex[:6]
    src, new = f"fork-src-{tag}", f"fork-queued-{tag}"
    graph = two_questions(saver)
    graph.invoke({}, _cfg(src))
    cp = graph.get_state(_cfg(src)).config["configurable"]["checkpoint_id"]
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("INSERT INTO durable_threads (thread_id, status, updated_at) VALUES (%s, 'queued', now())",
                     (new,))
    with pytest.raises(ControlRefusedError, match="exists already"):
        control.fork(saver, src, cp, new)
    assert q(dsn, "SELECT 1 FROM checkpoints WHERE thread_id = %s", new) == []


def test_a_cancelled_run_killed_before_its_boundary_is_not_resumed_by_a_worker(dsn: str) -> None:
    """The operator cancels a run; its process is SIGKILLed before the run reaches its
    next step boundary (the operator killed the pod too, an OOM). The request was for
    that run (cancel_token = its lease token): a recovery worker must not take the
    dead lease over and run the thread on (the operator asked it to stop); the thread
    is held as a cancelled one is, and an operator's resume still runs it. Fails on
    main at ``recover_one() is None`` (the worker resumes the cancelled thread and
    runs s1, s2)."""
    import os
    import signal
    import subprocess
    import sys
    import time
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parent))
    import _child_control as cc

    from langgraph_durable.recovery import RecoveryWorker

    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(cc.SCHEMA_SQL)
    cc.DSN = dsn
    tid = f"cancel-kill-{uuid.uuid4().hex[:6]}"
    env = {**os.environ, "LGD_DSN": dsn, "LGD_STEPS": "3", "LGD_SLEEP": "60"}
    child = subprocess.Popen([sys.executable, str(Path(__file__).with_name("_child_control.py")), "run", tid],
                             env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        deadline = time.monotonic() + 60
        while not q(dsn, "SELECT 1 FROM ctl_effects WHERE thread_id = %s AND detail = 's0'", tid):
            assert time.monotonic() < deadline and child.poll() is None, "the child never ran s0"
            time.sleep(0.05)
        with DurablePostgresSaver.from_conn_string(dsn) as saver:
            control.request_cancel(saver, tid)
            os.kill(child.pid, signal.SIGKILL)
            child.wait(30)
            graph = cc.make_steps(3).compile(checkpointer=saver)
            result = RecoveryWorker(graph, register=False).recover_one()
            ran = [r["detail"] for r in q(dsn, "SELECT detail FROM ctl_effects WHERE thread_id = %s ORDER BY id", tid)]
            assert result is None, f"a worker resumed the cancelled thread: {result}, ran {ran}"
            assert ran == ["s0"]
            # Resumed with invoke(None) (the dead owner's lease taken over at once): it
            # runs from its last checkpoint to the end, and is claimable as ever after.
            out = graph.invoke(None, _cfg(tid))
            assert out["log"][-1] == "s2"
            assert q(dsn, "SELECT status FROM durable_threads WHERE thread_id = %s", tid)[0]["status"] == "done"
    finally:
        if child.poll() is None:
            child.kill()
            child.wait(30)


def test_a_dead_worker_named_like_the_host_does_not_mark_every_live_run_dead(saver: Any, dsn: str) -> None:
    """A stopped worker registered under the host's name (``RecoveryWorker(name=
    socket.gethostname())``, the pod's name): every lease owner of this host starts with
    ``<host>:``, so the console's prefix match judged every live run of the host a dead
    worker's: shown 'recoverable', its Cancel button hidden. Fails on main at the
    ``cancel-run`` assertion."""
    import socket

    tid = f"live-{uuid.uuid4().hex[:6]}"
    worker_id = uuid.uuid4().hex
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(
            """INSERT INTO durable_workers (worker_id, name, host, pid, identity, ttl_s, concurrency,
                   started_at, heartbeat_at, stopped_at)
               VALUES (%s, %s, %s, 1, %s, 30, 1, now() - interval '1 hour', now() - interval '1 hour',
                       now() - interval '1 hour')""",
            (worker_id, socket.gethostname(), socket.gethostname(), f"{socket.gethostname()}:1:0:ns0.0"),
        )
    graph = gated(saver)
    t, out = _run_in_thread(graph, tid, {"steps": 1}, "D")
    try:
        assert ENTERED["D"].wait(30)
        with _client(saver) as client:
            page = client.get(f"/thread?id={tid}").text
        assert 'id="cancel-run"' in page, "a live run shown as a dead worker's"
    finally:
        GATES["D"].set()
        t.join(30)
        q(dsn, "DELETE FROM durable_workers WHERE worker_id = %s RETURNING worker_id", worker_id)


def test_a_fork_confirmed_once_and_posted_twice_makes_one_fork(saver: Any, dsn: str) -> None:
    """A double-clicked (or replayed) "Fork now" with no new id typed: the id was drawn
    per POST, so each POST made another fork. The confirmation page now picks the id
    (shown to the operator), so the second POST is refused as a fork onto an existing
    id. Fails on main at the second status-code assertion (303: a second fork)."""
    tid = f"fork-twice-{uuid.uuid4().hex[:6]}"
    graph = two_questions(saver)
    graph.invoke({}, _cfg(tid))
    with _client(saver) as client:
        page = client.get(f"/confirm/fork?thread={tid}&cp=latest")
        assert page.status_code == 200
        fields = _confirm_form(page.text)
        first = client.post("/act/fork", data=fields, follow_redirects=False)
        second = client.post("/act/fork", data=fields, follow_redirects=False)
    assert first.status_code == 303
    assert second.status_code == 409, second.status_code
    forks = q(dsn, "SELECT DISTINCT thread_id FROM checkpoints WHERE thread_id LIKE %s", f"{tid}-fork-%")
    assert len(forks) == 1, forks


def test_delete_with_an_archive_that_cannot_be_written_deletes_nothing(saver: Any, dsn: str, tmp_path: Any) -> None:
    """The archive URL names a directory under a regular file (the write fails): the
    delete raises, every row stays, no audit row is written."""
    tid = f"del-fail-{uuid.uuid4().hex[:6]}"
    graph = two_questions(saver)
    graph.invoke({}, _cfg(tid))
    before = q(dsn, "SELECT count(*) AS n FROM checkpoints WHERE thread_id = %s", tid)[0]["n"]
    blocker = tmp_path / "not-a-dir"
    blocker.write_text("x")
    with pytest.raises(Exception):  # noqa: B017 (whatever the store raises: nothing deleted)
        control.delete_thread(saver, tid, archive_url=(blocker / "archive").as_uri())
    assert q(dsn, "SELECT count(*) AS n FROM checkpoints WHERE thread_id = %s", tid)[0]["n"] == before
    assert q(dsn, "SELECT status FROM durable_threads WHERE thread_id = %s", tid)[0]["status"] == "waiting"
    assert [a for a in _audit(dsn, tid) if a["action"].endswith("delete")] == []


FAIL_ONCE: dict[str, bool] = {}


class Once(TypedDict, total=False):
    answer: str


def _ask_then_fail_once(state: Once, config: RunnableConfig) -> Once:
    value = interrupt({"question": "ship it?"})
    tid = config["configurable"]["thread_id"]
    if not FAIL_ONCE.get(tid):
        FAIL_ONCE[tid] = True
        raise RuntimeError("provider down after the answer")
    return {"answer": str(value)}


def test_a_queued_answer_survives_a_node_that_fails_after_it(saver: Any, dsn: str) -> None:
    """The worker runs the queued answer; the answered node fails after interrupt()
    returned (status error). The answer must not be lost: the next run (a retry)
    finishes with the operator's answer, never waits on the same question again."""
    from langgraph_durable.recovery import RecoveryWorker

    tid = f"ans-fail-{uuid.uuid4().hex[:6]}"
    b = StateGraph(Once)
    b.add_node("ask", _ask_then_fail_once)
    b.add_edge(START, "ask")
    b.add_edge("ask", END)
    graph = b.compile(checkpointer=saver)
    graph.invoke({}, _cfg(tid))
    control.queue_answer(saver, tid, "operator says yes")
    first = RecoveryWorker(graph, register=False).recover_one()
    assert first is not None and first.status == "error", first
    control.queue_resume(saver, tid)
    second = RecoveryWorker(graph, register=False).recover_one()
    assert second is not None, "nothing to retry"
    state = graph.get_state(_cfg(tid))
    assert state.values.get("answer") == "operator says yes", (second, state.values, state.interrupts)


def test_answer_now_with_the_confirmed_checkpoint_refuses_a_moved_head(saver: Any, dsn: str) -> None:
    tid = f"two-q-now-{uuid.uuid4().hex[:6]}"
    graph = two_questions(saver)
    graph.invoke({}, _cfg(tid))
    asked_at = graph.get_state(_cfg(tid)).config["configurable"]["checkpoint_id"]
    graph.invoke(Command(resume="no refund"), _cfg(tid))
    with pytest.raises(ControlRefusedError, match="moved on"):
        control.answer_now(graph, tid, "yes", checkpoint_id=asked_at)
    state = graph.get_state(_cfg(tid))
    assert state.values == {"a1": "no refund"} and state.interrupts
    now_at = state.config["configurable"]["checkpoint_id"]
    control.answer_now(graph, tid, "close it", checkpoint_id=now_at)
    assert graph.get_state(_cfg(tid)).values == {"a1": "no refund", "a2": "close it"}


class Pair(TypedDict, total=False):
    left: str
    right: str


def _left(state: Pair) -> Pair:
    return {"left": str(interrupt({"question": "left?"}))}


def _right(state: Pair) -> Pair:
    return {"right": str(interrupt({"question": "right?"}))}


def test_a_plain_answer_to_two_pending_interrupts_is_refused_not_queued(saver: Any, dsn: str) -> None:
    """Two parallel nodes wait on two questions. A plain value answers neither
    (LangGraph refuses Command(resume=value) with several pending interrupts): queued,
    every worker run of it fails (status error, retried into quarantine). It must be
    refused at once, nothing stored; a map of interrupt ids to answers is accepted and
    a worker finishes the thread with both."""
    from langgraph_durable.recovery import RecoveryWorker

    tid = f"pair-{uuid.uuid4().hex[:6]}"
    b = StateGraph(Pair)
    b.add_node("left", _left)
    b.add_node("right", _right)
    b.add_edge(START, "left")
    b.add_edge(START, "right")
    b.add_edge("left", END)
    b.add_edge("right", END)
    graph = b.compile(checkpointer=saver)
    graph.invoke({}, _cfg(tid))
    interrupts = graph.get_state(_cfg(tid)).interrupts
    assert len(interrupts) == 2
    with pytest.raises(ControlRefusedError, match="interrupts"):
        control.queue_answer(saver, tid, "yes")
    row = q(dsn, "SELECT status, answer_blob FROM durable_threads WHERE thread_id = %s", tid)[0]
    assert row["status"] == "waiting" and row["answer_blob"] is None
    control.queue_answer(saver, tid, {i.id: f"ok {i.value['question']}" for i in interrupts})
    result = RecoveryWorker(graph, register=False).recover_one()
    assert result is not None and result.status == "done", result
    assert graph.get_state(_cfg(tid)).values == {"left": "ok left?", "right": "ok right?"}


def test_a_fork_resumed_by_an_operator_is_run_by_a_worker(saver: Any, dsn: str) -> None:
    """The claim's hold of cancelled threads (rev25) leaves a resumed fork claimable
    (its row never had a lease: token 0, no cancel request)."""
    from langgraph_durable.recovery import RecoveryWorker

    tag = uuid.uuid4().hex[:6]
    src, new = f"fork-run-src-{tag}", f"fork-run-{tag}"
    graph = two_questions(saver)
    graph.invoke({}, _cfg(src))
    graph.invoke(Command(resume="r1"), _cfg(src))
    first = [s.config["configurable"]["checkpoint_id"] for s in graph.get_state_history(_cfg(src))][-2]
    control.fork(saver, src, first, new)
    control.queue_resume(saver, new)
    # Other tests of this module may leave queued threads: claim until this one.
    worker = RecoveryWorker(graph, register=False)
    ran = [worker.recover_one() for _ in range(8)]
    assert new in [r.thread_id for r in ran if r is not None], ran
    assert q(dsn, "SELECT status FROM durable_threads WHERE thread_id = %s", new)[0]["status"] == "waiting"


def test_an_answer_the_worker_cannot_decode_is_left_not_claimed_at_every_poll(saver: Any, dsn: str) -> None:
    """A console with the encryption key queues an answer; a worker without it (or with
    another serializer) cannot decode it. That failure came before the run (never an
    attempt, never quarantined, no skip): the same worker claimed the thread again at
    every poll, forever. Now the worker reports a typed error and leaves the thread
    (skipped like the refusals that need an operator). Fails on main at the count assertion (claimed at every poll)."""
    from langgraph_durable.recovery import RecoveryWorker

    tid = f"undecodable-{uuid.uuid4().hex[:6]}"
    graph = two_questions(saver)
    graph.invoke({}, _cfg(tid))
    key = b"0123456789abcdef0123456789abcdef"
    with DurablePostgresSaver.from_conn_string(
        dsn, serde=EncryptedSerializer.from_pycryptodome_aes(key=key)
    ) as sealed:
        control.queue_answer(sealed, tid, "approved")
    worker = RecoveryWorker(graph, register=False)
    mine = [r for r in (worker.recover_one() for _ in range(8)) if r is not None and r.thread_id == tid]
    assert len(mine) == 1, f"claimed {len(mine)} times in a row: {[r.error for r in mine]}"
    # A typed refusal naming the answer's column (DecryptionError, issue 27) or, for a
    # serializer that is not an encrypting one, AnswerDecodeError.
    assert "answer" in str(mine[0].error), mine[0]
    row = q(dsn, "SELECT status, answer_blob FROM durable_threads WHERE thread_id = %s", tid)[0]
    assert row["status"] == "queued" and row["answer_blob"] is not None  # left for an operator
