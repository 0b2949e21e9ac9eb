"""The operator console's Done-when walk (issue 25): a real Chromium (Playwright on the
system chromium, never a downloaded browser) walks a real agent's threads, each with real
graph runs behind it, and a real worker process (``langgraph-durable worker``, its own
process, registered and heartbeating) beside the console:

* a finished tool-calling conversation (``support-agent``: model, ToolNode with an
  ``@idempotent`` tool, an approval interrupt answered in-process): transcript, ledger link;
* a thread waiting on an interrupt, answered from the console (queued) and finished by
  the worker process;
* a quarantined thread (``billing-agent`` failing in ``charge``) with its traceback;
* a running thread (run by the worker) cancelled from the console: it stops at a step
  boundary, ``stopped``, the worker leaves it alone; then resumed from the console and
  finished by the worker;
* a fork of the conversation at an earlier checkpoint (the new id shown, a link), then
  deleted from the console, archived first;
* the two graphs with their versions, each served by the worker;
* the worker on the overview, idle (nothing claimed) between the runs;
* the threads list in natural order ("order-2" before "order-10").

After each action the database and its durable_audit row are checked. Screenshots of each
view go to a temporary folder, and with LGD_UPDATE_SCREENSHOT=1 to docs/img/console-*.png.
"""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest
from langchain_core.messages import HumanMessage
from langgraph.types import Command
from psycopg.rows import dict_row
from test_console import CHROMIUM, _browser_or_skip, _listening
from test_console_operator import WRAPPED

from langgraph_durable import DurablePostgresSaver, PoisonCheckpointError, submit
from langgraph_durable.console import create_app

REPO = Path(__file__).resolve().parents[1]
AGENT = REPO / "tests" / "_walk_agent.py"
TOKEN = "walk-token-" + uuid.uuid4().hex[:8]
TIMEOUT = 60.0

sys.path.insert(0, str(REPO / "tests"))
import _walk_agent as agent  # noqa: E402


def q(dsn: str, sql: str, *args: Any) -> list[dict[str, Any]]:
    with psycopg.connect(dsn, row_factory=dict_row) as conn:
        return conn.execute(sql, args).fetchall()


def _cfg(tid: str) -> dict[str, Any]:
    return {"configurable": {"thread_id": tid}}


def _status(dsn: str, tid: str) -> str | None:
    rows = q(dsn, "SELECT status FROM durable_threads WHERE thread_id = %s", tid)
    return rows[0]["status"] if rows else None


def _until(what: str, check: Callable[[], Any], timeout: float = TIMEOUT) -> Any:
    """Poll ``check`` until it is truthy (a wait for another process, not a timed assert)."""
    deadline = time.monotonic() + timeout
    while True:
        value = check()
        if value:
            return value
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.1)


def _audit(dsn: str, tid: str, action: str) -> dict[str, Any]:
    """The one audit row of ``action`` on thread ``tid`` (its name as ops.control records it)."""
    rows = q(dsn, "SELECT * FROM durable_audit WHERE thread_id = %s ORDER BY id", tid)
    mine = [r for r in rows if r["action"].split(".")[-1] == action]
    assert len(mine) == 1, [(r["action"], r["via"]) for r in rows]
    return mine[0]


class Walk:
    def __init__(self, dsn: str, tmp: Path) -> None:
        tag = uuid.uuid4().hex[:6]
        self.dsn = dsn
        self.tmp = tmp
        self.old = f"old-{tag}"
        self.chat = f"chat-{tag}"
        self.waiting = f"waiting-{tag}"
        self.poisoned = f"poison-{tag}"
        self.running = f"run-{tag}"
        self.orders = [f"order-{n}-{tag}" for n in (10, 2, 1)]
        self.archive = tmp / "archive"


@pytest.fixture(scope="module")
def walk(dsn: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Walk]:
    w = Walk(dsn, tmp_path_factory.mktemp("walk"))
    with DurablePostgresSaver.from_conn_string(dsn, max_resume_attempts=2) as saver:
        support, billing = agent.support(saver), agent.billing(saver)
        ask = {"messages": [HumanMessage("Where is my order 42?")]}
        # The previous deployment's version: a thread still waiting on it (must drain).
        agent.support(saver, "support-v0").invoke(ask, _cfg(w.old))
        support.invoke(ask, _cfg(w.chat))
        support.invoke(Command(resume="yes"), _cfg(w.chat))
        support.invoke(ask, _cfg(w.waiting))
        with pytest.raises(RuntimeError):
            billing.invoke({"steps": 0, "fail": True}, _cfg(w.poisoned))
        with pytest.raises(RuntimeError):
            billing.invoke(None, _cfg(w.poisoned))
        with pytest.raises(PoisonCheckpointError):
            billing.invoke(None, _cfg(w.poisoned))
        for tid in w.orders:
            billing.invoke({"steps": 0}, _cfg(tid))
    yield w


@pytest.fixture(scope="module")
def worker(walk: Walk) -> Iterator[subprocess.Popen[bytes]]:
    """``langgraph-durable worker`` serving both graphs, in its own process."""
    log = open(walk.tmp / "worker.log", "wb")
    proc = subprocess.Popen(
        [sys.executable, "-c", "from langgraph_durable.cli import main; main()", "worker",
         "--dsn", walk.dsn, "--graph", f"{AGENT}:support", "--graph", f"{AGENT}:billing",
         "--poll-interval", "0.2", "--max-resume-attempts", "2"],
        cwd=REPO, env={**os.environ, "PYTHONPATH": str(REPO)}, stdout=log, stderr=subprocess.STDOUT,
    )
    try:
        _until("the worker to register", lambda: proc.poll() is None and q(
            walk.dsn, "SELECT 1 FROM durable_workers WHERE pid = %s AND stopped_at IS NULL", proc.pid))
        yield proc
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        log.close()


@pytest.fixture(scope="module")
def console(walk: Walk) -> Iterator[str]:
    import uvicorn

    with DurablePostgresSaver.from_conn_string(walk.dsn) as saver:
        app = create_app(saver, allow_actions=True, token=TOKEN, sample_interval=0,
                         archive_url=walk.archive.as_uri())
        sock, port = _listening()
        srv = uvicorn.Server(uvicorn.Config(app, log_level="warning"))
        t = threading.Thread(target=srv.run, kwargs={"sockets": [sock]}, daemon=True)
        t.start()
        _until("the console to start", lambda: srv.started)
        yield f"http://127.0.0.1:{port}"
        srv.should_exit = True
        t.join(timeout=10)


def test_browser_walks_a_real_agents_threads_with_a_worker(
    walk: Walk, worker: subprocess.Popen[bytes], console: str, tmp_path: Path
) -> None:
    sync_playwright = _browser_or_skip()
    shots = tmp_path
    update = os.environ.get("LGD_UPDATE_SCREENSHOT") == "1"
    dsn, url = walk.dsn, console

    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox", "--disable-dev-shm-usage"])
        page = browser.new_page(viewport={"width": 1280, "height": 860})
        errors: list[str] = []
        page.on("pageerror", lambda e: errors.append(str(e)))

        def shot(name: str, locator: str | None = None) -> None:
            if locator:
                page.locator(locator).first.evaluate("e => e.scrollIntoView({block: 'start'})")
            for folder in [shots] + ([REPO / "docs" / "img"] if update else []):
                page.screenshot(path=str(folder / f"console-{name}.png"))

        def confirm(flash: str) -> str:
            assert "/confirm/" in page.url, page.url
            page.click("#confirm")
            text = page.locator(".flash").inner_text()
            assert flash in text, text
            return text

        page.goto(url + "/login")
        page.fill("input[name=name]", "dana")
        page.fill("input[name=token]", TOKEN)
        page.click("#sign-in")

        # 1. The idle worker on the overview: registered, alive, nothing claimed.
        page.goto(url + "/")
        row = page.locator("#workers tr.worker", has_text=str(worker.pid))
        assert row.count() == 1
        cells = row.inner_text()
        assert "yes" in cells and "idle" in cells and "support-v1" in cells and "billing-v1" in cells
        assert "No live lease: no run is under way now (the live workers above are idle)" in page.content()
        shot("workers", "#workers")

        # 2. The finished tool-calling conversation: transcript, tool call, ledger row.
        page.goto(url + f"/thread?id={walk.chat}")
        assert page.locator(".state.st-done").count() >= 1
        assert page.locator("#latest-1 .turn").count() >= 4
        assert "lookup_order" in page.locator("#latest-1").inner_text()
        assert page.locator("#latest-1 .ledger-link").first.inner_text().startswith("ledger")
        shot("conversation", "#conversation-1")

        # 3. A thread waiting on an interrupt, answered from the console, finished by the worker.
        page.goto(url + f"/thread?id={walk.waiting}")
        assert "send this reply to the customer?" in page.locator(".interrupt-value").inner_text()
        assert page.locator(".interrupt-node").inner_text() == "confirm"
        box = page.locator("#answer-form textarea")
        assert box.input_value() == ""  # nothing pre-filled: a placeholder is never an answer
        box.fill('"yes, send it"')
        shot("waiting", "#interrupts")
        page.click("#answer")
        assert "yes, send it" in page.locator("#answer-value").inner_text()
        assert str(worker.pid) in page.locator("#served-by").inner_text()
        shot("confirm-answer")
        confirm("answer queued")
        _until("the worker to finish the answered thread", lambda: _status(dsn, walk.waiting) == "done")
        with DurablePostgresSaver.from_conn_string(dsn) as saver:
            state = agent.support(saver).get_state(_cfg(walk.waiting))
        assert state.values["approved"] == "yes, send it" and not state.next
        row_a = _audit(dsn, walk.waiting, "answer")
        assert row_a["via"] == "console" and row_a["actor"].startswith("dana")

        # 4. The quarantined thread: failing node, exception, traceback.
        page.goto(url + f"/thread?id={walk.poisoned}")
        assert page.locator("#failure-node").inner_text() == "charge"
        assert page.locator("#failure-type").inner_text().endswith("RuntimeError")
        tb = page.locator("#traceback").inner_text()
        assert "_provider_call" in tb and "card_declined" in tb
        shot("quarantined", "#failure")

        # 5. A running thread (the worker runs it) cancelled, then resumed.
        with DurablePostgresSaver.from_conn_string(dsn) as saver:
            submit(agent.billing(saver), {"steps": 30}, _cfg(walk.running))
        page.goto(url + f"/thread?id={walk.running}")
        _until("the worker to start the run", lambda: q(
            dsn, "SELECT 1 FROM durable_threads WHERE thread_id = %s AND lease_expires_at > now()"
            " AND status = 'running'", walk.running))
        page.goto(url + f"/thread?id={walk.running}")
        assert page.locator("h1 .state").inner_text() == "running"
        page.click("#cancel-run")
        shot("confirm-cancel")
        confirm("cancel requested")
        _until("the run to stop at a step boundary", lambda: _status(dsn, walk.running) == "stopped")
        [t] = q(dsn, "SELECT cancelled_at, lease_expires_at > now() AS live FROM durable_threads "
                "WHERE thread_id = %s", walk.running)
        assert t["cancelled_at"] is not None and not t["live"]
        with DurablePostgresSaver.from_conn_string(dsn) as saver:
            done_at_cancel = agent.billing(saver).get_state(_cfg(walk.running)).values.get("done", 0)
        assert done_at_cancel < 30  # stopped before its end
        assert _audit(dsn, walk.running, "cancel")["via"] == "console"
        page.goto(url + f"/thread?id={walk.running}")
        page.click("#resume")
        assert str(worker.pid) in page.locator("#served-by").inner_text()
        shot("confirm-resume")
        confirm("resume queued")
        _until("the worker to finish the resumed run", lambda: _status(dsn, walk.running) == "done")
        with DurablePostgresSaver.from_conn_string(dsn) as saver:
            values = agent.billing(saver).get_state(_cfg(walk.running)).values
        assert values["done"] == 30 and values["log"][-1] == "charged"
        assert len([x for x in values["log"] if x.startswith("tick")]) == 30  # no step twice
        assert _audit(dsn, walk.running, "resume")["via"] == "console"

        # 6. A fork of the conversation at the checkpoint before the approval.
        cps = q(dsn, "SELECT checkpoint_id FROM checkpoints WHERE thread_id = %s AND checkpoint_ns = '' "
                "ORDER BY checkpoint_id", walk.chat)
        at = cps[-3]["checkpoint_id"]
        page.goto(url + f"/thread?id={walk.chat}")
        page.locator(f"a.fork[href*='{at}']").click()
        assert at in page.locator("#changes").inner_text()
        shot("confirm-fork")
        text = confirm("forked")
        new = text.rsplit(" into ", 1)[1].strip()
        assert page.url.endswith("/thread?id=" + new) and new != walk.chat
        head = q(dsn, "SELECT checkpoint_id, metadata FROM checkpoints WHERE thread_id = %s "
                 "AND checkpoint_ns = '' ORDER BY checkpoint_id DESC LIMIT 1", new)
        assert head, "the fork has no checkpoint"
        row_f = _audit(dsn, walk.chat, "fork")
        assert row_f["via"] == "console" and new in str(row_f["detail"]) + str(row_f["after_id"])
        q(dsn, "SELECT 1")  # the original is unchanged:
        assert _status(dsn, walk.chat) == "done"
        assert len(q(dsn, "SELECT 1 FROM checkpoints WHERE thread_id = %s", walk.chat)) == len(cps)

        # 7. ... then the fork deleted, archived first.
        page.click("#delete")
        assert walk.archive.as_uri() in page.locator("#archive").inner_text()
        shot("confirm-delete")
        confirm("archived first")
        assert q(dsn, "SELECT 1 FROM checkpoints WHERE thread_id = %s", new) == []
        assert q(dsn, "SELECT 1 FROM durable_threads WHERE thread_id = %s", new) == []
        assert any(walk.archive.rglob("*")), "nothing was archived"
        assert _audit(dsn, new, "delete")["via"] == "console"

        # 8. Two graphs with their versions, each served by the worker.
        page.goto(url + "/versions")
        table = page.locator("#versions").inner_text()
        for name, version in (("support-agent", "support-v1"), ("billing-agent", "billing-v1")):
            line = page.locator("#versions tr", has_text=version)
            assert name in line.inner_text() and str(worker.pid) in line.locator(".served").inner_text()
        old = page.locator("#versions tr", has_text="support-v0").inner_text()
        assert "no live worker serves it" in old and "current" not in old
        assert "support-v0" in page.locator("#drain").inner_text()
        assert table.count("no live worker") == 1
        shot("versions")

        # 9. The worker is idle again; the threads list is in natural order.
        page.goto(url + "/")
        _until("the worker to report idle", lambda: q(
            dsn, "SELECT 1 FROM durable_workers WHERE pid = %s AND claimed = 0", worker.pid))
        page.goto(url + "/")
        assert "idle" in page.locator("#workers tr.worker", has_text=str(worker.pid)).inner_text()
        page.goto(url + "/threads?prefix=order-")
        ids = [x.strip() for x in page.locator("#threads tbody tr td:first-child").all_inner_texts()]
        assert ids == sorted(walk.orders, key=lambda t: int(t.split("-")[1])), ids
        shot("threads", "#threads")

        # No hash, id or size wraps at 1024 px on the new views.
        page.set_viewport_size({"width": 1024, "height": 860})
        for path in ("/", "/versions", f"/thread?id={walk.running}", "/threads"):
            page.goto(url + path)
            assert page.evaluate(WRAPPED) == [], path
        assert errors == []
        browser.close()
    assert len(list(shots.glob("console-*.png"))) >= 10
