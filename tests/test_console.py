"""The operator console (issue 17) on real data made by real graph runs: two graph
versions, finished, waiting and quarantined threads, a ledger call with an unknown
outcome, an in-graph @idempotent call.

* HTTP tests (starlette's TestClient): every view loads; the safety rules (read-only
  refuses every action, the token and the CSRF token are enforced, a POST without the
  confirmation step is refused) and that a refused action changes nothing.
* Audit tests: release/rewind/resolve/forget through the Python API, the CLI and the
  console each leave one durable_audit row (who, via, before/after ids), in the
  action's own transaction (a refused action leaves none).
* Browser tests (Playwright driving the system chromium, never a downloaded browser):
  load every view, click release, rewind and resolve, check the database afterwards
  and the audit rows; screenshots go to a temporary folder (and, with
  LGD_UPDATE_SCREENSHOT=1, to docs/img/console.png). A missing browser skips locally
  and fails with CI=true.
"""

from __future__ import annotations

import json
import operator
import os
import shutil
import socket
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Annotated, Any, TypedDict

import psycopg
import pytest
from conftest import require_or_skip
from langgraph.graph import END, START, StateGraph
from langgraph.types import interrupt
from psycopg.rows import dict_row
from starlette.testclient import TestClient

from langgraph_durable import (
    DurablePostgresSaver,
    Ledger,
    NotQuarantinedError,
    PoisonCheckpointError,
    audit,
    idempotent,
    poison,
)
from langgraph_durable.console import create_app

CHROMIUM = "/usr/bin/chromium"
REPO = Path(__file__).resolve().parents[1]
TOKEN = "test-token-" + uuid.uuid4().hex[:8]


class S(TypedDict, total=False):
    x: int
    log: Annotated[list[str], operator.add]
    answer: str


def q(dsn: str, sql: str, *args: Any) -> list[dict[str, Any]]:
    with psycopg.connect(dsn, row_factory=dict_row) as conn:
        return conn.execute(sql, args).fetchall()


def _graph(saver: Any, *, version: str, fail: bool = False, ask: bool = False) -> Any:
    @idempotent
    def receipt(x: int) -> str:
        return f"receipt-{x}"

    def plan(state: S) -> S:
        return {"x": state.get("x", 0) + 1, "log": ["plan"]}

    def work(state: S) -> S:
        if fail:
            raise ValueError("payment provider returned 500")
        return {"x": state["x"] * 10, "log": [receipt(state["x"])]}

    def approve(state: S) -> S:
        return {"answer": str(interrupt("approve the report?"))}

    b = StateGraph(S)
    b.add_node("plan", plan)
    b.add_node("work", work)
    b.add_edge(START, "plan")
    b.add_edge("plan", "work")
    if ask:
        b.add_node("approve", approve)
        b.add_edge("work", "approve")
        b.add_edge("approve", END)
    else:
        b.add_edge("work", END)
    return b.compile(checkpointer=saver.bind(graph_version=version))


class Data:
    def __init__(self, dsn: str) -> None:
        self.dsn = dsn
        tag = uuid.uuid4().hex[:6]
        self.done_v1 = f"done-v1-{tag}"
        self.done_v2 = f"done-v2-{tag}"
        self.waiting = f"waiting-{tag}"
        self.poisoned = {n: f"poison-{n}-{tag}" for n in ("browser", "http", "cli", "rewind", "py")}
        self.unknown = {n: f"charge-{n}-{tag}" for n in ("browser", "http", "py", "forget")}


def _cfg(tid: str) -> dict[str, Any]:
    return {"configurable": {"thread_id": tid}}


def _quarantine(graph: Any, tid: str) -> None:
    with pytest.raises(ValueError):
        graph.invoke({"x": 1, "log": []}, _cfg(tid))
    with pytest.raises(ValueError):
        graph.invoke(None, _cfg(tid))
    with pytest.raises(PoisonCheckpointError):
        graph.invoke(None, _cfg(tid))


def _unknown_outcome(saver: Any, key: str) -> None:
    """A call interrupted mid-way: its claim stays 'started', expired, no result."""

    @idempotent(ledger=saver, key=lambda order: key, name="charge_card")
    def charge(order: str) -> dict[str, Any]:
        raise KeyboardInterrupt  # the process died right after the effect

    with pytest.raises(KeyboardInterrupt):
        charge("order-1")


@pytest.fixture(scope="module")
def data(dsn: str) -> Iterator[Data]:
    d = Data(dsn)
    with DurablePostgresSaver.from_conn_string(dsn, max_resume_attempts=2) as saver:
        # v1 first (the old deployment: a finished thread, poisoned ones), then v2.
        _graph(saver, version="v1").invoke({"x": 1, "log": []}, _cfg(d.done_v1))
        failing = _graph(saver, version="v1", fail=True)
        for tid in d.poisoned.values():
            _quarantine(failing, tid)
        _graph(saver, version="v2").invoke({"x": 2, "log": []}, _cfg(d.done_v2))
        asking = _graph(saver, version="v2", ask=True)
        asking.invoke({"x": 3, "log": []}, _cfg(d.waiting))
        for key in d.unknown.values():
            _unknown_outcome(saver, key)
        assert asking.get_state(_cfg(d.waiting)).next == ("approve",)
    yield d


@pytest.fixture(scope="module")
def console_saver(dsn: str, data: Data) -> Iterator[Any]:
    with DurablePostgresSaver.from_conn_string(dsn) as saver:
        saver.setup()
        yield saver


def _status(dsn: str, tid: str) -> str:
    return str(q(dsn, "SELECT status FROM durable_threads WHERE thread_id = %s", tid)[0]["status"])


def _audit(dsn: str, **where: Any) -> list[dict[str, Any]]:
    clauses = " AND ".join(f"{k} = %s" for k in where) or "true"
    return q(dsn, f"SELECT * FROM durable_audit WHERE {clauses} ORDER BY id", *where.values())


def _ledger_status(dsn: str, key: str) -> str | None:
    rows = q(dsn, "SELECT status FROM durable_ledger WHERE key = %s", key)
    return rows[0]["status"] if rows else None


VIEWS = ["/", "/threads", "/quarantine", "/ledger", "/versions", "/storage", "/audit"]


# ------------------------------------------------------------------ HTTP: safety rules
def test_read_only_console_serves_every_view_and_refuses_every_action(
    console_saver: Any, data: Data
) -> None:
    app = create_app(console_saver, sample_interval=0)
    tid = data.poisoned["http"]
    with TestClient(app) as client:
        for path in [*VIEWS, f"/thread?id={data.waiting}", "/threads?state=quarantined"]:
            r = client.get(path)
            assert r.status_code == 200, (path, r.text[:500])
            assert "read-only" in r.text
            assert "/confirm/" not in r.text  # no action is offered
        assert client.get("/login").status_code == 403
        assert client.get(f"/confirm/release?thread={tid}").status_code == 403
        r = client.post("/act/release", data={"thread": tid, "confirmed": "yes", "csrf": "x"})
        assert r.status_code == 403 and "read-only" in r.text
    assert _status(data.dsn, tid) == "quarantined"
    assert _audit(data.dsn, thread_id=tid) == []


def test_views_show_the_runs(console_saver: Any, data: Data) -> None:
    app = create_app(console_saver, sample_interval=0)
    with TestClient(app) as client:
        overview = client.get("/").text
        assert 'href="/threads?state=quarantined"' in overview
        quarantined = client.get("/threads?state=quarantined").text
        assert all(t in quarantined for t in data.poisoned.values())
        assert data.done_v1 not in quarantined
        by_version = client.get("/threads?version=v2").text
        assert data.done_v2 in by_version and data.waiting in by_version
        assert data.done_v1 not in by_version
        page = client.get("/threads?limit=2").text
        assert 'id="next-page"' in page
        thread = client.get(f"/thread?id={data.poisoned['http']}").text
        assert "payment provider returned 500" in thread and "max_attempts" in thread
        waiting = client.get(f"/thread?id={data.waiting}").text
        assert "approve the report?" in waiting
        done = client.get(f"/thread?id={data.done_v1}&a=latest~1&b=latest").text
        assert 'id="diff"' in done and "changed" in done
        assert "receipt" in client.get(f"/thread?id={data.done_v1}").text  # its ledger call
        ledger = client.get("/ledger").text
        assert all(k[:30] in ledger for k in data.unknown.values())
        for versions in (client.get("/versions").text, client.get("/versions?exact=1").text):
            assert "v1" in versions and "v2" in versions
            # v1 has unfinished (quarantined) threads: it must drain.
            drain = versions[versions.index('id="drain"'):]
            assert "v1" in drain[: drain.index("</ul>")]
        largest = client.get("/storage?largest=1").text
        assert "/thread?id=" in largest[largest.index('id="largest"'):]
        storage = client.get("/storage?dry_run=1&older_than_days=0").text
        assert 'id="retention-report"' in storage and data.done_v1 in storage
        assert client.get("/thread?id=no-such-thread").status_code == 404
        assert client.get("/threads?limit=abc").status_code == 400
        assert client.get("/storage?dry_run=1&older_than_days=soon").status_code == 400


def test_versions_migrate_dry_run_writes_nothing(console_saver: Any, data: Data) -> None:
    from langgraph_durable.versioning import MigrationRegistry

    registry = MigrationRegistry()
    registry.register("v1", "v2")  # v2 runs v1 checkpoints as they are
    with DurablePostgresSaver.from_conn_string(data.dsn) as saver:
        graph = _graph(saver, version="v2")
    before = q(data.dsn, "SELECT count(*) AS n FROM checkpoints")[0]["n"]
    app = create_app(console_saver, sample_interval=0, graph=graph, registry=registry)
    with TestClient(app) as client:
        page = client.get("/versions").text
        assert 'class="inline dry-form"' in page
        r = client.get("/versions?from=v1&to=v2")
        assert r.status_code == 200, r.text[-800:]
        dry = r.text[r.text.index('id="dry"'):]
        assert "v1 → v2" in dry and "would migrate" in dry and "Nothing was written" in dry
        assert client.get("/versions?from=v1&to=v9").status_code == 400  # no path
    assert q(data.dsn, "SELECT count(*) AS n FROM checkpoints")[0]["n"] == before
    assert _audit(data.dsn, action="versions.migrate") == []  # a dry run is not recorded


def _sign_in(client: TestClient, token: str = TOKEN) -> Any:
    return client.post(
        "/login", data={"token": token, "name": "alice"}, follow_redirects=False
    )


def _csrf(html: str) -> str:
    marker = 'name="csrf" value="'
    i = html.index(marker) + len(marker)
    return html[i : html.index('"', i)]


def test_actions_need_the_token_csrf_and_the_confirmation(console_saver: Any, data: Data) -> None:
    tid = data.poisoned["http"]
    app = create_app(console_saver, allow_actions=True, token=TOKEN, sample_interval=0)
    with TestClient(app) as client:
        # Not signed in: the confirmation page sends to the login; the POST is refused.
        r = client.get(f"/confirm/release?thread={tid}", follow_redirects=False)
        assert r.status_code == 303 and r.headers["location"].startswith("/login")
        assert client.post("/act/release", data={"thread": tid, "confirmed": "yes"}).status_code == 403
        # A wrong token signs nobody in.
        assert _sign_in(client, "wrong").status_code == 403
        assert client.cookies.get("lgd_console") is None
        r = client.post("/login?next=/\\evil.example", data={"token": TOKEN, "name": "alice"},
                        follow_redirects=False)
        assert r.status_code == 303 and r.headers["location"] == "/"  # no open redirect
        r = _sign_in(client)
        assert r.status_code == 303 and client.cookies.get("lgd_console")
        page = client.get(f"/confirm/release?thread={tid}")
        assert page.status_code == 200
        assert "quarantined" in page.text and "stopped" in page.text and "deleted" in page.text
        csrf = _csrf(page.text)
        # Missing and wrong CSRF tokens; a POST that skipped the confirmation page.
        for form, code in (
            ({"thread": tid, "confirmed": "yes"}, 403),
            ({"thread": tid, "confirmed": "yes", "csrf": "forged"}, 403),
            ({"thread": tid, "csrf": csrf}, 400),
        ):
            assert client.post("/act/release", data=form).status_code == code
        assert _status(data.dsn, tid) == "quarantined"
        # Another session's CSRF token does not work in this one.
        other = TestClient(app)
        _sign_in(other)
        other_csrf = _csrf(other.get(f"/confirm/release?thread={tid}").text)
        r = client.post("/act/release", data={"thread": tid, "confirmed": "yes", "csrf": other_csrf})
        assert r.status_code == 403
        assert _audit(data.dsn, thread_id=tid) == []
        # The real thing.
        r = client.post(
            "/act/release", data={"thread": tid, "confirmed": "yes", "csrf": csrf},
            follow_redirects=False,
        )
        assert r.status_code == 303
        assert _status(data.dsn, tid) == "stopped"
        assert q(data.dsn, "SELECT 1 FROM durable_quarantine WHERE thread_id = %s", tid) == []
        [row] = _audit(data.dsn, thread_id=tid)
        assert row["action"] == "quarantine.release" and row["via"] == "console"
        assert row["actor"].startswith("alice")
        assert "released" in client.get(r.headers["location"]).text  # the flash message
        # Releasing again: refused on the confirmation page, nothing recorded.
        assert client.get(f"/confirm/release?thread={tid}").status_code == 409
        r = client.post("/act/release", data={"thread": tid, "confirmed": "yes", "csrf": csrf})
        assert r.status_code == 409 and "NotQuarantinedError" in r.text
        assert len(_audit(data.dsn, thread_id=tid)) == 1
        # Resolve with a result that is not JSON: refused before anything happens.
        key = data.unknown["http"]
        r = client.get("/confirm/resolve", params={"key": key, "result": "{not json"})
        assert r.status_code == 409
        assert _ledger_status(data.dsn, key) == "started"
        # Forget: the confirmation names the row, the POST deletes it, one audit row.
        page = client.get("/confirm/forget", params={"key": key})
        assert page.status_code == 200 and "charge_card" in page.text and "deleted" in page.text
        r = client.post(
            "/act/forget", data={"key": key, "confirmed": "yes", "csrf": _csrf(page.text)},
            follow_redirects=False,
        )
        assert r.status_code == 303 and _ledger_status(data.dsn, key) is None
        [row] = [x for x in _audit(data.dsn, action="ledger.forget") if x["detail"]["key"] == key]
        assert row["via"] == "console" and row["actor"].startswith("alice")


# ------------------------------------------------------------------ audit: API and CLI
def test_python_api_and_cli_actions_are_audited(console_saver: Any, data: Data) -> None:
    tid = data.poisoned["py"]
    with audit.acting_as("bob", via="notebook"):
        entry = poison.release(console_saver, tid)
    [row] = _audit(data.dsn, thread_id=tid)
    assert (row["actor"], row["via"], row["action"]) == ("bob", "notebook", "quarantine.release")
    assert row["before_id"] == entry.checkpoint_id and row["detail"]["attempts"] == entry.attempts
    # A refused action records nothing (the row is written by the action's transaction).
    with pytest.raises(NotQuarantinedError):
        poison.release(console_saver, tid)
    assert len(_audit(data.dsn, thread_id=tid)) == 1
    # The ledger: forget without acting_as is recorded as the process user, via python.
    key = data.unknown["forget"]
    assert Ledger(console_saver).forget(key)
    [row] = [r for r in _audit(data.dsn, action="ledger.forget") if r["detail"]["key"] == key]
    assert row["via"] == "python" and row["detail"]["status"] == ["started", None]
    assert row["detail"]["name"] == "charge_card"
    # The CLI (its real entry point, in a child process).
    cli_tid = data.poisoned["cli"]
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    out = subprocess.run(
        [sys.executable, "-c", "from langgraph_durable.cli import main; main()",
         "quarantine", "release", cli_tid, "--dsn", data.dsn, "--json"],
        capture_output=True, text=True, env=env, timeout=120,
    )
    assert out.returncode == 0, out.stderr
    [row] = _audit(data.dsn, thread_id=cli_tid)
    assert row["via"] == "cli" and row["action"] == "quarantine.release"
    # The console's audit page lists them all.
    app = create_app(console_saver, sample_interval=0)
    with TestClient(app) as client:
        page = client.get("/audit").text
        assert tid in page and cli_tid in page and "ledger.forget" in page
        assert client.get(f"/audit?thread={cli_tid}").text.count("quarantine.release") >= 1


# ------------------------------------------------------------------ browser
def _browser_or_skip() -> Any:
    reason = None
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        reason = "playwright is not installed"
    if reason is None and not (os.path.exists(CHROMIUM) or shutil.which("chromium")):
        reason = f"no chromium at {CHROMIUM} (apt-get install chromium)"
    if reason is not None:
        require_or_skip(f"browser: {reason}")
    return sync_playwright


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _listening() -> tuple[socket.socket, int]:
    """A socket bound to a port the kernel chose, for uvicorn's ``run(sockets=...)``:
    no window in which another connection can take the port (``_free_port`` serves
    only a server started in another process)."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.bind(("127.0.0.1", 0))
    return sock, int(sock.getsockname()[1])


@pytest.fixture(scope="module")
def server(console_saver: Any, data: Data) -> Iterator[str]:
    import uvicorn

    app = create_app(console_saver, allow_actions=True, token=TOKEN, sample_interval=0.3)
    sock, port = _listening()
    srv = uvicorn.Server(uvicorn.Config(app, log_level="warning"))
    t = threading.Thread(target=srv.run, kwargs={"sockets": [sock]}, daemon=True)
    t.start()
    deadline = time.monotonic() + 30
    while not srv.started:
        assert time.monotonic() < deadline, "the console did not start"
        time.sleep(0.05)
    # Some writes while the sampler runs, so the overview's charts have a shape.
    with DurablePostgresSaver.from_conn_string(data.dsn) as saver:
        g = _graph(saver, version="v2")
        for i in range(12):
            g.invoke({"x": i, "log": []}, _cfg(f"busy-{i}-{uuid.uuid4().hex[:4]}"))
            time.sleep(0.1)
    yield f"http://127.0.0.1:{port}"
    srv.should_exit = True
    t.join(timeout=10)


def test_browser_every_view_and_release_rewind_resolve(
    server: str, data: Data, tmp_path_factory: pytest.TempPathFactory
) -> None:
    sync_playwright = _browser_or_skip()
    shots = tmp_path_factory.mktemp("console-screenshots")
    with sync_playwright() as pw:
        browser = pw.chromium.launch(
            executable_path=CHROMIUM, args=["--no-sandbox", "--disable-dev-shm-usage"]
        )
        page = browser.new_page(viewport={"width": 1360, "height": 900})
        errors: list[str] = []
        page.on("pageerror", lambda e: errors.append(str(e)))

        # Every view loads, before signing in too.
        for path in VIEWS:
            resp = page.goto(server + path)
            assert resp is not None and resp.status == 200, path
            page.screenshot(path=str(shots / f"{path.strip('/') or 'overview'}.png"), full_page=True)
        page.goto(server + "/")
        assert page.locator("#count-quarantined .n").inner_text().strip() != "0"
        assert page.locator("svg.chart").count() >= 3

        # Sign in, then release a quarantined thread from the quarantine page.
        page.goto(server + "/login")
        page.fill("input[name=name]", "carol")
        page.fill("input[name=token]", TOKEN)
        page.click("#sign-in")
        assert "carol" in page.locator("header .mode").inner_text()
        tid = data.poisoned["browser"]
        page.goto(server + "/quarantine")
        page.locator(f"section.qentry:has-text('{tid}') a.release").click()
        assert "/confirm/release" in page.url
        changes = page.locator("#changes").inner_text()
        assert "quarantined" in changes and "stopped" in changes
        page.screenshot(path=str(shots / "confirm-release.png"), full_page=True)
        page.click("#confirm")
        assert "released" in page.locator(".flash").inner_text()
        assert _status(data.dsn, tid) == "stopped"
        assert q(data.dsn, "SELECT 1 FROM durable_quarantine WHERE thread_id = %s", tid) == []

        # Rewind another one to its first checkpoint, from the thread's timeline.
        tid = data.poisoned["rewind"]
        first = q(
            data.dsn,
            "SELECT checkpoint_id FROM checkpoints WHERE thread_id = %s AND checkpoint_ns = '' "
            "ORDER BY checkpoint_id LIMIT 1", tid,
        )[0]["checkpoint_id"]
        head_before = q(
            data.dsn,
            "SELECT max(checkpoint_id) AS id FROM checkpoints WHERE thread_id = %s", tid,
        )[0]["id"]
        page.goto(server + f"/thread?id={tid}")
        page.screenshot(path=str(shots / "thread.png"), full_page=True)
        page.locator(f"a.rewind[href*='{first}']").click()
        assert first in page.locator("#changes").inner_text()
        page.click("#confirm")
        assert "rewound" in page.locator(".flash").inner_text()
        head = q(
            data.dsn,
            "SELECT checkpoint_id, metadata FROM checkpoints WHERE thread_id = %s "
            "AND checkpoint_ns = '' ORDER BY checkpoint_id DESC LIMIT 1", tid,
        )[0]
        assert head["metadata"]["source"] == "fork" and head["metadata"]["rewound_to"] == first
        assert _status(data.dsn, tid) == "stopped"
        [row] = _audit(data.dsn, thread_id=tid)
        assert row["action"] == "quarantine.rewind" and row["via"] == "console"
        assert (row["before_id"], row["after_id"]) == (head_before, head["checkpoint_id"])
        assert row["actor"].startswith("carol")

        # Resolve an unknown ledger outcome with the verified result.
        key = data.unknown["browser"]
        page.goto(server + "/ledger")
        form = page.locator(f"form.resolve-form:has(input[value='{key}'])")
        # The box starts empty (a placeholder is not a value): submitting it as it is goes nowhere.
        assert form.locator("textarea").input_value() == ""
        form.locator("button").click()
        assert page.url.endswith("/ledger")
        form.locator("textarea").fill('{"charge_id": "ch_42", "amount": 1200}')
        form.locator("button").click()
        assert "ch_42" in page.locator("#result-value").inner_text()
        page.click("#confirm")
        assert "resolved" in page.locator(".flash").inner_text()
        assert _ledger_status(data.dsn, key) == "completed"
        with DurablePostgresSaver.from_conn_string(data.dsn) as s:
            assert Ledger(s).result(key) == {"charge_id": "ch_42", "amount": 1200}
        [row] = [r for r in _audit(data.dsn, action="ledger.resolve") if r["detail"]["key"] == key]
        assert row["via"] == "console" and row["detail"]["status"] == ["started", "completed"]

        # The audit page shows the three actions.
        page.goto(server + "/audit")
        text = page.locator("table.audit").inner_text()
        for action in ("quarantine.release", "quarantine.rewind", "ledger.resolve"):
            assert action in text
        page.screenshot(path=str(shots / "audit.png"), full_page=True)
        page.goto(server + "/")
        page.screenshot(path=str(shots / "overview-after.png"), full_page=True)
        if os.environ.get("LGD_UPDATE_SCREENSHOT") == "1":
            page.goto(server + "/")
            page.screenshot(path=str(REPO / "docs" / "img" / "console.png"), full_page=True)
        assert errors == []
        browser.close()
    assert len(list(shots.glob("*.png"))) >= len(VIEWS) + 3
    print("screenshots in", shots, json.dumps(sorted(p.name for p in shots.glob("*.png"))))


# ------------------------------------------------------------------ audit edge cases
def test_a_retry_after_a_lost_commit_reply_records_the_action_once(data: Data) -> None:
    """The driver retries an op whose COMMIT reply was lost: the first attempt's audit
    row committed with it, the retry's insert (same event id) adds none."""
    from langgraph_durable import _io

    key = data.unknown["py"]
    seen = {"injected": 0}

    def hook(conn: Any, attempt: int) -> None:
        if attempt == 0:
            seen["injected"] += 1
            conn.pgconn.finish()
            raise psycopg.OperationalError("injected: connection lost before the COMMIT reply")

    # A pool: the retry needs a fresh connection (a single one is gone with the reply).
    with DurablePostgresSaver.from_conn_string(data.dsn) as saver:
        previous = _io.set_after_commit_hook(hook)
        try:
            Ledger(saver).resolve(key, {"verified": True})
        finally:
            _io.set_after_commit_hook(previous)
        assert seen["injected"] == 1
        assert Ledger(saver).result(key) == {"verified": True}
    rows = [r for r in _audit(data.dsn, action="ledger.resolve") if r["detail"]["key"] == key]
    assert len(rows) == 1 and rows[0]["detail"]["status"] == ["started", "completed"]


def test_retention_gc_and_restore_are_audited_dry_runs_are_not(data: Data, tmp_path: Path) -> None:
    from langgraph_durable import archive
    from langgraph_durable.ops import retention

    with DurablePostgresSaver.from_conn_string(data.dsn) as saver:
        dry = retention.retain(saver, older_than_days=0, dry_run=True)
        assert data.done_v1 in dry.deleted_thread_ids
        assert _audit(data.dsn, action="storage.retain") == []
        with audit.acting_as("dave", via="cron"):
            report = retention.retain(saver, older_than_days=0, archive=str(tmp_path))
            retention.gc(saver, grace=0)
            restored = archive.restore(saver, str(tmp_path), thread_ids=[data.done_v1])
        assert restored.thread_ids == [data.done_v1]
    [row] = _audit(data.dsn, action="storage.retain")
    assert (row["actor"], row["via"]) == ("dave", "cron")
    assert sorted(row["detail"]["deleted_thread_ids"]) == sorted(report.deleted_thread_ids)
    assert data.done_v1 in row["detail"]["deleted_thread_ids"]
    assert row["detail"]["threads_archived"] == len(report.deleted_thread_ids)
    [gc_row] = _audit(data.dsn, action="storage.gc")
    assert gc_row["detail"]["dry_run"] is False
    [restore_row] = _audit(data.dsn, action="storage.restore")
    assert restore_row["thread_id"] == data.done_v1 and restore_row["actor"] == "dave"
    assert q(data.dsn, "SELECT 1 FROM checkpoints WHERE thread_id = %s LIMIT 1", data.done_v1)


# ------------------------------------------------------------------ the command
def _serve(args: list[str], env: dict[str, str]) -> tuple[subprocess.Popen[str], str]:
    port = _free_port()
    proc = subprocess.Popen(
        [sys.executable, "-c", "from langgraph_durable.cli import main; main()", "ui",
         "--port", str(port), "--sample-interval", "0", *args],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
    )
    return proc, f"http://127.0.0.1:{port}"


def _wait_up(url: str, proc: subprocess.Popen[str]) -> Any:
    import httpx

    deadline = time.monotonic() + 60
    while True:
        assert proc.poll() is None, proc.communicate()[1]
        try:
            return httpx.get(url + "/", timeout=2)
        except httpx.TransportError:
            assert time.monotonic() < deadline, "langgraph-durable ui did not start"
            time.sleep(0.2)


def test_ui_command_serves_read_only_by_default_and_prints_a_token(data: Data) -> None:
    import httpx

    env = {**os.environ, "PYTHONPATH": str(REPO)}
    env.pop("LGD_CONSOLE_TOKEN", None)
    proc, url = _serve(["--dsn", data.dsn], env)
    try:
        r = _wait_up(url, proc)
        assert r.status_code == 200 and "read-only" in r.text
        assert httpx.post(url + "/act/release", data={"thread": "x"}).status_code == 403
        # DNS rebinding: a request naming another host is refused.
        assert httpx.get(url + "/", headers={"host": "evil.example"}).status_code == 400
    finally:
        proc.terminate()
        _, err = proc.communicate(timeout=30)
    assert "read-only" in err and "127.0.0.1" in err

    env["LGD_CONSOLE_TOKEN"] = "from-the-environment"
    proc, url = _serve(["--dsn", data.dsn, "--allow-actions"], env)
    try:
        _wait_up(url, proc)
        ok = httpx.post(url + "/login", data={"token": "from-the-environment", "name": "eve"})
        assert ok.status_code == 303 and "lgd_console" in ok.headers.get("set-cookie", "")
        assert httpx.post(url + "/login", data={"token": "nope", "name": "eve"}).status_code == 403
        # A POST from another origin is refused even with the session cookie.
        cookies = {"lgd_console": ok.cookies["lgd_console"]}
        r = httpx.post(url + "/act/release", data={"thread": "x", "confirmed": "yes"},
                       headers={"origin": "http://evil.example"}, cookies=cookies)
        assert r.status_code == 403 and "cross-origin" in r.text
    finally:
        proc.terminate()
        _, err = proc.communicate(timeout=30)
    assert "actions enabled" in err and "from-the-environment" not in err


def test_migrate_and_undo_are_audited(data: Data) -> None:
    from langgraph_durable.ops import migrations as versioning
    from langgraph_durable.versioning import MigrationRegistry

    registry = MigrationRegistry()
    registry.register("v1", "v2")
    tid = f"migrated-{uuid.uuid4().hex[:6]}"
    with DurablePostgresSaver.from_conn_string(data.dsn) as saver:
        _graph(saver, version="v1", ask=True).invoke({"x": 5, "log": []}, _cfg(tid))
        v2 = _graph(saver, version="v2", ask=True)
        dry = versioning.migrate_threads(
            saver, "v1", "v2", graph=v2, registry=registry, thread_ids=[tid], dry_run=True
        )
        assert dry.migrated == [tid] and _audit(data.dsn, action="versions.migrate") == []
        report = versioning.migrate_threads(
            saver, "v1", "v2", graph=v2, registry=registry, thread_ids=[tid]
        )
        assert report.migrated == [tid]
        undone = versioning.undo_migration(saver, tid)
    [row] = _audit(data.dsn, action="versions.migrate")
    assert row["thread_id"] == tid and row["detail"]["version"] == ["v1", "v2"]
    assert row["detail"]["migrated"] == [tid]
    [row] = _audit(data.dsn, action="versions.undo")
    assert row["thread_id"] == tid and row["detail"]["migration_id"] == undone["migration_id"]
    assert row["detail"]["version"] == ["v2", "v1"]


def test_the_audit_row_commits_with_the_action_or_neither_does(data: Data) -> None:
    """The audit insert is the action's last statement, in its transaction: when it
    fails (here a trigger refuses it), the release rolls back with it."""
    tid = f"poison-tx-{uuid.uuid4().hex[:6]}"
    with DurablePostgresSaver.from_conn_string(data.dsn, max_resume_attempts=2) as saver:
        _quarantine(_graph(saver, version="v1", fail=True), tid)
        with psycopg.connect(data.dsn, autocommit=True) as conn:
            conn.execute(
                "CREATE FUNCTION lgd_test_refuse() RETURNS trigger LANGUAGE plpgsql AS "
                "$$ BEGIN RAISE EXCEPTION 'audit refused'; END $$"
            )
            conn.execute(
                "CREATE TRIGGER lgd_test_refuse BEFORE INSERT ON durable_audit "
                "FOR EACH ROW EXECUTE FUNCTION lgd_test_refuse()"
            )
        try:
            with pytest.raises(psycopg.errors.RaiseException, match="audit refused"):
                poison.release(saver, tid)
            assert _status(data.dsn, tid) == "quarantined"
            assert q(data.dsn, "SELECT 1 FROM durable_quarantine WHERE thread_id = %s", tid)
        finally:
            with psycopg.connect(data.dsn, autocommit=True) as conn:
                conn.execute("DROP TRIGGER lgd_test_refuse ON durable_audit")
                conn.execute("DROP FUNCTION lgd_test_refuse()")
        poison.release(saver, tid)
    assert _status(data.dsn, tid) == "stopped"
    assert len(_audit(data.dsn, thread_id=tid)) == 1
