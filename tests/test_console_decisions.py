"""The console's decisions and workers (issue 25) over HTTP (starlette's TestClient), on
real graph runs (tests/_walk_agent.py's two agents) on real PostgreSQL:

* each decision (resume, answer, cancel, fork, delete) goes through its confirmation
  page and needs the session and its CSRF token; refused where unsafe or meaningless
  (a live lease, a done or quarantined thread, no interrupt, an empty or invalid answer,
  a fork onto an existing id), on the confirmation page and again by the operator API
  when the page is skipped; a refusal changes nothing and records no audit row;
* an answer run by the console itself (started with the graph);
* the rewind choice never defaults to the head, a rewind to the head is refused, an
  empty resolve box is refused;
* the workers: an idle one on the overview, a version nobody serves warned about, a
  lease whose owner is a dead registered worker shown as such (not running);
* the natural order of thread ids ("order-2" before "order-10"), page by page.

The browser walk with a real worker process is tests/test_console_walk.py.
"""

from __future__ import annotations

import re
import sys
import threading
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import _hypothesis_profiles  # noqa: F401 (registers the profiles)
import psycopg
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from langchain_core.messages import HumanMessage
from langgraph.types import Command
from psycopg.rows import dict_row
from starlette.testclient import TestClient

from langgraph_durable import DurablePostgresSaver, PoisonCheckpointError
from langgraph_durable.console import create_app

sys.path.insert(0, str(Path(__file__).resolve().parent))
import _walk_agent as agent

TOKEN = "decide-" + uuid.uuid4().hex[:8]


def q(dsn: str, sql: str, *args: Any) -> list[dict[str, Any]]:
    with psycopg.connect(dsn, row_factory=dict_row) as conn:
        return conn.execute(sql, args).fetchall()


def _cfg(tid: str) -> dict[str, Any]:
    return {"configurable": {"thread_id": tid}}


class Data:
    def __init__(self, dsn: str) -> None:
        self.dsn = dsn
        self.tag = tag = uuid.uuid4().hex[:6]
        self.done = f"done-{tag}"
        self.waiting = f"waiting-{tag}"
        self.waiting_now = f"waiting-now-{tag}"
        self.poisoned = f"poison-{tag}"
        self.orders = [f"order-{n}-{tag}" for n in (10, 2, 1, 33, 3)]


@pytest.fixture(scope="module")
def data(dsn: str) -> Iterator[Data]:
    d = Data(dsn)
    with DurablePostgresSaver.from_conn_string(dsn, max_resume_attempts=2) as saver:
        support, billing = agent.support(saver), agent.billing(saver)
        ask = {"messages": [HumanMessage("Where is my order 42?")]}
        support.invoke(ask, _cfg(d.done))
        support.invoke(Command(resume="yes"), _cfg(d.done))
        support.invoke(ask, _cfg(d.waiting))
        support.invoke(ask, _cfg(d.waiting_now))
        with pytest.raises(RuntimeError):
            billing.invoke({"steps": 0, "fail": True}, _cfg(d.poisoned))
        with pytest.raises(RuntimeError):
            billing.invoke(None, _cfg(d.poisoned))
        with pytest.raises(PoisonCheckpointError):
            billing.invoke(None, _cfg(d.poisoned))
        for tid in d.orders:
            billing.invoke({"steps": 0}, _cfg(tid))
    yield d


@pytest.fixture(scope="module")
def saver(data: Data) -> Iterator[Any]:
    with DurablePostgresSaver.from_conn_string(data.dsn) as s:
        yield s


def _client(saver: Any, **kw: Any) -> TestClient:
    return TestClient(create_app(saver, allow_actions=True, token=TOKEN, sample_interval=0, **kw))


def _signed_in(client: TestClient) -> TestClient:
    r = client.post("/login", data={"token": TOKEN, "name": "erin"}, follow_redirects=False)
    assert r.status_code == 303
    return client


def _csrf(html: str) -> str:
    m = re.search(r'name="csrf" value="([^"]+)"', html)
    assert m, "no CSRF token on the page"
    return m.group(1)


def _confirm_form(html: str) -> dict[str, str]:
    """The hidden fields of the confirmation page's form (what its button POSTs)."""
    form = html[html.index('<form method="post" action="/act/'):]
    form = form[: form.index("</form>")]
    return dict(re.findall(r'<input type="hidden" name="([^"]+)" value="([^"]*)"', form))


def _act(client: TestClient, path: str) -> tuple[Any, Any]:
    """GET the confirmation page, then POST its form: (confirmation, result)."""
    page = client.get(path)
    if page.status_code != 200:
        return page, None
    action = path.split("/confirm/", 1)[1].split("?", 1)[0]
    import html as _html

    fields = {k: _html.unescape(v) for k, v in _confirm_form(page.text).items()}
    return page, client.post(f"/act/{action}", data=fields, follow_redirects=False)


def _audit(dsn: str, tid: str) -> list[dict[str, Any]]:
    return q(dsn, "SELECT * FROM durable_audit WHERE thread_id = %s ORDER BY id", tid)


def test_read_only_console_offers_no_decision(saver: Any, data: Data) -> None:
    client = TestClient(create_app(saver, sample_interval=0))
    for action in ("resume", "answer", "cancel", "fork", "delete"):
        assert client.get(f"/confirm/{action}?thread={data.waiting}").status_code == 403
        assert client.post(f"/act/{action}", data={"thread": data.waiting}).status_code == 403
    page = client.get(f"/thread?id={data.waiting}").text
    assert 'id="decide"' not in page and "/confirm/" not in page


@pytest.mark.parametrize(
    ("path", "said"),
    [
        ("/confirm/resume?thread={done}", "is done"),
        ("/confirm/resume?thread={waiting}", "answer it instead"),
        ("/confirm/resume?thread={poisoned}", "release or rewind"),
        ("/confirm/cancel?thread={done}", "nothing is running"),
        ("/confirm/answer?thread={done}&value=1", "does not wait on an interrupt"),
        ("/confirm/answer?thread={waiting}&value=", "box is empty"),
        ("/confirm/answer?thread={waiting}&value=%7Bnope", "not valid JSON"),
        ("/confirm/answer?thread={waiting}&value=1&mode=now", "without --graph"),
        ("/confirm/fork?thread={done}&cp=latest&new_thread={waiting}", "exists already"),
        ("/confirm/rewind?thread={poisoned}&to=latest", "changes nothing"),
        ("/confirm/resolve?key=nope&result=", "not in the ledger"),
    ],
)
def test_a_decision_that_does_not_apply_is_refused_on_its_page(
    saver: Any, data: Data, path: str, said: str
) -> None:
    """Regression (main): rewind to the head was offered and confirmed (a no-op)."""
    with _signed_in(_client(saver)) as client:
        r = client.get(path.format(**data.__dict__))
    assert r.status_code == 409, r.text[:400]
    assert said in r.text


def test_decisions_need_the_session_and_its_csrf_token(saver: Any, data: Data) -> None:
    with _client(saver) as client:
        r = client.get(f"/confirm/resume?thread={data.waiting}", follow_redirects=False)
        assert r.status_code == 303 and r.headers["location"].startswith("/login")
        tid = data.orders[2]
        assert client.post("/act/fork", data={"thread": tid, "cp": "latest",
                                              "confirmed": "yes"}).status_code == 403
        _signed_in(client)
        r = client.post("/act/fork", data={"thread": tid, "cp": "latest", "confirmed": "yes",
                                           "csrf": "forged"})
        assert r.status_code == 403 and "CSRF" in r.text
        csrf = _csrf(client.get(f"/thread?id={tid}").text)
        r = client.post("/act/fork", data={"thread": tid, "cp": "latest", "csrf": csrf})
        assert r.status_code == 400 and "confirmed" in r.text
    assert _audit(data.dsn, tid) == []


def test_answer_queued_then_answer_run_by_the_console(saver: Any, data: Data) -> None:
    with _signed_in(_client(saver)) as client:
        page, r = _act(client, f"/confirm/answer?thread={data.waiting}&value=%22ship+it%22")
        assert "no live worker serves this version" in page.text  # nobody registered here
        assert r.status_code == 303
        flash = client.get(r.headers["location"]).text
        assert "answer queued" in flash and "NO live worker" in flash
    [row] = q(data.dsn, "SELECT status, answer_blob IS NOT NULL AS queued FROM durable_threads "
              "WHERE thread_id = %s", data.waiting)
    assert row["queued"]
    [a] = _audit(data.dsn, data.waiting)
    assert a["action"].endswith("answer") and a["via"] == "console" and a["actor"].startswith("erin")

    graph = agent.support(saver)
    with _signed_in(_client(saver, graph=graph)) as client:
        page, r = _act(client, f"/confirm/answer?thread={data.waiting_now}&value=%22now%22&mode=now")
        assert "this console's process" in page.text
        assert r.status_code == 303, r.text[:400]
        assert "answered" in client.get(r.headers["location"]).text
    state = graph.get_state(_cfg(data.waiting_now))
    assert state.values["approved"] == "now" and not state.next
    assert q(data.dsn, "SELECT status FROM durable_threads WHERE thread_id = %s",
             data.waiting_now)[0]["status"] == "done"
    assert [r["action"].split(".")[-1] for r in _audit(data.dsn, data.waiting_now)] == ["answer"]


def test_a_live_lease_refuses_delete_and_resume_even_past_the_page(saver: Any, data: Data) -> None:
    """A run holds the lease (a real billing run in a thread of this process): the
    confirmation page refuses; a POST that skips it is refused by the operator API."""
    tid = f"busy-{data.tag}"
    started, release = threading.Event(), threading.Event()
    billing = agent.billing(saver)
    errors: list[BaseException] = []

    def run() -> None:
        try:
            for _ in billing.stream({"steps": 3}, _cfg(tid)):
                started.set()
                release.wait(30)
        except BaseException as exc:
            errors.append(exc)

    t = threading.Thread(target=run)
    t.start()
    try:
        assert started.wait(30)
        with _signed_in(_client(saver)) as client:
            for action in ("delete", "resume", "answer"):
                r = client.get(f"/confirm/{action}?thread={tid}&value=1")
                assert r.status_code == 409 and "running now" in r.text, action
            # A fork only reads the source: allowed while it runs.
            assert client.get(f"/confirm/fork?thread={tid}&cp=latest").status_code == 200
            csrf = _csrf(client.get(f"/thread?id={tid}").text)
            r = client.post("/act/delete", data={"thread": tid, "confirmed": "yes", "csrf": csrf})
            assert r.status_code == 409, r.text[:300]
            assert "Cancel the run" in client.get(f"/thread?id={tid}").text
    finally:
        release.set()
        t.join(30)
    assert not errors
    assert q(data.dsn, "SELECT 1 FROM checkpoints WHERE thread_id = %s LIMIT 1", tid)
    assert _audit(data.dsn, tid) == []


def test_fork_shows_the_new_id_and_delete_archives_first(saver: Any, data: Data, tmp_path: Path) -> None:
    archive = tmp_path / "archive"
    with _signed_in(_client(saver, archive_url=archive.as_uri())) as client:
        new = f"fork-{data.tag}"
        page, r = _act(client, f"/confirm/fork?thread={data.done}&cp=latest~2&new_thread={new}")
        assert new in page.text and r.status_code == 303
        assert r.headers["location"] == f"/thread?id={new}"
        assert f"into {new}" in client.get(r.headers["location"]).text
        assert q(data.dsn, "SELECT 1 FROM checkpoints WHERE thread_id = %s LIMIT 1", new)
        [f] = _audit(data.dsn, data.done)
        assert f["action"].endswith("fork") and f["via"] == "console"
        page, r = _act(client, f"/confirm/delete?thread={new}")
        assert archive.as_uri() in page.text and r.status_code == 303
        assert "archived first" in client.get(r.headers["location"]).text
    assert q(data.dsn, "SELECT 1 FROM checkpoints WHERE thread_id = %s", new) == []
    assert any(archive.rglob("*"))
    assert [r["action"].split(".")[-1] for r in _audit(data.dsn, new)][-1] == "delete"


def test_the_rewind_choice_does_not_default_to_the_head(saver: Any, data: Data) -> None:
    """Regression (main): the quarantine page's rewind select started on its first
    option, the head: a rewind that changes nothing."""
    with _signed_in(_client(saver)) as client:
        html = client.get("/quarantine").text
    entry = html[html.index(data.poisoned):]
    select = entry[entry.index("<select"): entry.index("</select>")]
    head = q(data.dsn, "SELECT max(checkpoint_id) AS id FROM checkpoints WHERE thread_id = %s "
             "AND checkpoint_ns = ''", data.poisoned)[0]["id"]
    assert re.search(rf'value="{head}" disabled', select)
    chosen = re.search(r'value="([^"]+)" selected', select)
    assert chosen and chosen.group(1) < head


def test_workers_idle_unserved_and_dead_owners(saver: Any, data: Data) -> None:
    tag = data.tag
    with psycopg.connect(data.dsn, autocommit=True) as conn:
        conn.execute(
            """INSERT INTO durable_workers (worker_id, name, host, pid, identity, ttl_s, versions,
                   graph_names, concurrency, claimed, heartbeat_at, last_poll_at)
               VALUES (%s, %s, 'far-host', 11, %s, 30, ARRAY['support-v1'], ARRAY['support-agent'],
                       4, 0, now(), now()),
                      (%s, %s, 'gone-host', 12, %s, 30, ARRAY['billing-v1'], ARRAY['billing-agent'],
                       4, 1, now() - interval '10 minutes', now() - interval '10 minutes')""",
            (f"idle-{tag}", "far-host:11", "far-host:11", f"dead-{tag}", "gone-host:12", "gone-host:12"),
        )
        # A live lease (by the clock) held by the dead worker's run.
        conn.execute(
            "UPDATE durable_threads SET status = 'running', lease_owner = 'gone-host:12:abc', "
            "lease_token = 7, lease_expires_at = now() + interval '10 minutes' WHERE thread_id = %s",
            (data.orders[0],),
        )
    with _client(saver) as client:
        over = client.get("/").text
        idle = over[over.index("far-host:11"):]
        assert "(idle)" in idle[: idle.index("</tr>")] and "support-v1" in idle[: idle.index("</tr>")]
        dead = over[over.index("gone-host:12"):]
        assert "no (dead)" in dead[: dead.index("</tr>")]
        versions = client.get("/versions").text
        row = versions[versions.index("billing-v1"):]
        assert "no live worker serves it" in row[: row.index("</tr>")]
        row = versions[versions.index("support-v1"):]
        assert "far-host pid 11" in row[: row.index("</tr>")]
        page = client.get(f"/thread?id={data.orders[0]}").text
        assert "owner worker gone-host:12 on gone-host is dead" in page
        assert 'state st-running' not in page[: page.index("</h1>")]
        listed = client.get("/threads?prefix=order-&state=running").text
        assert data.orders[0] not in listed
        assert "Cancel the run" not in page


def test_the_threads_list_is_in_natural_order_page_by_page(saver: Any, data: Data) -> None:
    """Regression (main): thread ids in byte order, order-10 before order-2."""
    want = sorted(data.orders, key=lambda t: int(t.split("-")[1]))
    with _client(saver) as client:
        seen: list[str] = []
        url = "/threads?prefix=order-&limit=2"
        while url:
            html = client.get(url).text
            seen += [t for t in re.findall(r'href="/thread\?id=([^"]+)"', html) if t.startswith("order-")]
            m = re.search(r'href="([^"]+)" id="next-page"', html)
            url = m.group(1).replace("&amp;", "&") if m else ""
        assert seen == want
        html = client.get("/threads?limit=500").text
        ids = [t for t in re.findall(r'href="/thread\?id=([^"]+)"', html) if t.startswith("order-")]
        assert ids == want
        html = client.get("/threads?sort=id&limit=500&prefix=order-").text
        assert [t for t in re.findall(r'href="/thread\?id=([^"]+)"', html)] == sorted(data.orders)


_IDS = st.lists(
    st.builds(
        lambda word, zeros, n, tail: f"{word}-{'0' * zeros}{n}{tail}",
        st.sampled_from(["nat", "nat-x", "Nat", "nat2"]),
        st.integers(0, 2),
        st.integers(0, 1200),
        st.sampled_from(["", "b", "-1", ".5"]),
    ),
    min_size=1, max_size=30, unique=True,
)


@settings(max_examples=25)
@given(ids=_IDS, page=st.integers(1, 7))
def test_natural_pages_partition_the_natural_order(saver: Any, data: Data, ids: list[str], page: int) -> None:
    """Property: walking the natural-order pages (the keyset compared in the same
    collation) yields every thread once, in the server's natural order, whatever the ids
    (leading zeros that tie numerically, suffixes, case) and the page size; ids that
    differ only in their number come in numeric order."""
    from langgraph_durable.sql import console as cq

    prefix = f"p{uuid.uuid4().hex[:6]}-"
    rows = [prefix + i for i in ids]
    with psycopg.connect(data.dsn, autocommit=True) as conn:
        conn.execute("INSERT INTO durable_threads (thread_id, status) SELECT unnest(%s::text[]), 'done'",
                     (rows,))
        want = [r[0] for r in conn.execute(
            "SELECT thread_id FROM durable_threads WHERE starts_with(thread_id, %s) "
            "ORDER BY thread_id COLLATE durable_natural", (prefix,))]
        seen: list[str] = []
        after = None
        while True:
            got = [r[0] for r in conn.execute(cq.THREADS_NATURAL_SQL, {
                "after": after, "prefix": prefix, "version": None, "older": None, "newer": None,
                "status": None, "limit": page, "dead": []})]
            seen += got
            if len(got) < page:
                break
            after = got[-1]
        conn.execute("DELETE FROM durable_threads WHERE starts_with(thread_id, %s)", (prefix,))
    assert seen == want and sorted(seen) == sorted(rows)
    plain = [t for t in seen if re.fullmatch(re.escape(prefix) + r"nat-[1-9]\d*", t)]
    assert plain == sorted(plain, key=lambda t: int(t.rsplit("-", 1)[1]))
