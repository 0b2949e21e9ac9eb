"""Archives are untrusted input (issue 23, defect 5 and the four archive suspicions).

Every hostile file here is a real archive written by ``retain(archive=...)`` and then
edited the way an attacker who can write to the archive directory would: rows added or
changed in the msgpack payload, the manifest's counts and sha256 recomputed (``encode``
does exactly that), so the file passes every integrity check that only hashes the
payload. Real PostgreSQL, real files; each test works in a schema of its own.
"""

from __future__ import annotations

import io
import json
import operator
import os
import random
import string
import struct
import tracemalloc
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Annotated, Any, TypedDict

import ormsgpack
import psycopg
import pytest
import zstandard
from langchain_core.language_models.fake_chat_models import GenericFakeChatModel
from langchain_core.messages import AIMessage, HumanMessage, RemoveMessage
from langchain_core.tools import tool
from langgraph.graph import END, START, StateGraph
from langgraph.graph.message import REMOVE_ALL_MESSAGES, add_messages
from langgraph.prebuilt import ToolNode, tools_condition

from langgraph_durable import DurablePostgresSaver, idempotent
from langgraph_durable import archive as A
from langgraph_durable.artifacts import _digest, _element_content, _zstd_dict
from langgraph_durable.errors import ArchiveError, ArchiveIntegrityError, ArtifactIntegrityError
from langgraph_durable.idempotency.keys import _digest as key_digest
from langgraph_durable.idempotency.keys import _fingerprint
from langgraph_durable.journal import journaled
from langgraph_durable.ops.retention import gc, retain

SEED = int(os.environ.get("LGD_TEST_SEED", random.randrange(2**32)))
print(f"test_archive_hostile seed={SEED}")
MiB = 1024**2


def big(seed: object, size: int = 900) -> str:
    rng = random.Random(f"{SEED}-{seed}")
    return "".join(rng.choices(string.ascii_letters + "     ", k=size))


class State(TypedDict, total=False):
    notes: Annotated[list[str], operator.add]
    value: str
    paid: str


@idempotent
def charge(who: str) -> str:
    return f"receipt-{who}"


def _graph(saver: Any, value: str | None = None) -> Any:
    def work(s: State) -> dict[str, Any]:
        who = s.get("value", "?")[:8]
        return {"notes": [big(f"{who}-note")], "value": value or s.get("value", ""), "paid": charge(who)}

    g = StateGraph(State)
    g.add_node("work", work)
    g.add_edge(START, "work")
    g.add_edge("work", END)
    return g.compile(checkpointer=saver)


def _cfg(thread: str) -> dict[str, Any]:
    return {"configurable": {"thread_id": thread}}


def _q(dsn: str, schema: str, query: str, *args: Any) -> list[tuple[Any, ...]]:
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(psycopg.sql.SQL("SET search_path TO {}").format(psycopg.sql.Identifier(schema)))
        cur = conn.execute(query, args)
        return cur.fetchall() if cur.description else []


def _backdate(dsn: str, schema: str) -> None:
    _q(
        dsn,
        schema,
        "UPDATE checkpoints SET checkpoint = jsonb_set(checkpoint, '{ts}', to_jsonb("
        "to_char((now() - interval '40 days') AT TIME ZONE 'UTC', 'YYYY-MM-DD\"T\"HH24:MI:SS.US\"+00:00\"')))",
    )
    _q(dsn, schema, "UPDATE durable_threads SET updated_at = now() - interval '40 days'")


def _counts(dsn: str, schema: str) -> dict[str, int]:
    return {t: _q(dsn, schema, f"SELECT count(*) FROM {t}")[0][0] for t in (*A.TABLES, "durable_artifacts")}


@pytest.fixture
def schema() -> str:
    return "h_" + uuid.uuid4().hex[:10]


@pytest.fixture
def saver(dsn: str, schema: str) -> Iterator[DurablePostgresSaver]:
    with DurablePostgresSaver.from_conn_string(dsn, schema=schema, artifact_threshold=256) as s:
        s.setup()
        yield s


# --------------------------------------------------------------------------- forging


def read_body(path: Path) -> dict[str, Any]:
    """The payload of an archive, read without any check (as an attacker would)."""
    data = path.read_bytes()
    (size,) = struct.unpack_from("<I", data, 4)
    return dict(ormsgpack.unpackb(zstandard.ZstdDecompressor().decompress(data[8 + size :])))


def forge(path: Path, body: dict[str, Any]) -> None:
    """Write ``body`` back with a manifest recomputed to match (counts, sha256)."""
    dump = A.ThreadDump(
        thread_id=body["thread_id"],
        head_checkpoint_id=body["head_checkpoint_id"],
        fingerprint=body["fingerprint"],
        tables=body["tables"],
        artifacts=body["artifacts"],
    )
    path.write_bytes(A.encode(dump, created_at=body["created_at"]))


def add_row(part: dict[str, Any], **values: Any) -> None:
    names = [c[0] for c in part["columns"]]
    part["rows"].append([values.get(n) for n in names])


def archived(dsn: str, schema: str, saver: DurablePostgresSaver, tmp_path: Path, thread: str) -> Path:
    """One finished, backdated thread archived (and deleted) by retention: its file."""
    _graph(saver).invoke({"value": big(thread)}, _cfg(thread))
    _backdate(dsn, schema)
    url = tmp_path / "arch"
    report = retain(saver, older_than_days=30, archive=str(url))
    assert report.threads_archived == 1, report
    gc(saver, grace=0)
    (name,) = os.listdir(url)
    return url / name


def _assert_nothing_restored(dsn: str, schema: str, before: dict[str, int]) -> None:
    assert _counts(dsn, schema) == before


# --------------------------------------------------------------------------- defect 5


def test_planted_artifact_is_refused_and_cannot_poison_a_later_thread(
    dsn: str, schema: str, saver: DurablePostgresSaver, tmp_path: Path
) -> None:
    """The attack of defect 5: the file carries junk under the digest of a value an
    unrelated thread stores later. On 569be7e restore inserted it (DO NOTHING), the
    later put deduplicated onto it, and a fresh saver's get_state raised
    ArtifactIntegrityError. Now restore and verify refuse the file, naming it and the
    reason, and nothing is restored."""
    path = archived(dsn, schema, saver, tmp_path, "attacker")
    victim_value = big("victim-value", 2000)
    tag, data = saver.serde.dumps_typed(victim_value)
    digest = _digest(_element_content(tag, data))
    junk = _element_content(tag, saver.serde.dumps_typed("junk " * 100)[1])
    body = read_body(path)
    add_row(
        body["artifacts"],
        digest=digest,
        size=len(junk),
        data=zstandard.ZstdCompressor(dict_data=_zstd_dict(), write_dict_id=False).compress(junk),
        created_at="2026-01-01T00:00:00+00:00",
        last_used_at="2026-01-01T00:00:00+00:00",
    )
    forge(path, body)

    err: ArchiveIntegrityError | None = None
    try:
        A.restore(saver, str(path))
    except ArchiveIntegrityError as exc:
        err = exc
    # The later, unrelated thread stores its value and reads it back from a cold cache.
    _graph(saver, victim_value).invoke({"value": "v"}, _cfg("victim"))
    assert _q(dsn, schema, "SELECT count(*) FROM durable_artifacts WHERE digest = %s", digest)[0][0] == 1
    with DurablePostgresSaver.from_conn_string(dsn, schema=schema, artifact_threshold=256) as fresh:
        try:
            state = _graph(fresh).get_state(_cfg("victim"))
        except ArtifactIntegrityError as exc:  # what 569be7e gave
            pytest.fail(f"the planted artifact poisoned the victim: {exc}")
        assert state.values["value"] == victim_value

    assert err is not None, "restore accepted a file whose artifact does not hash to its digest"
    print(f"refused: {err}")
    assert err.fields["reason"] == "artifact_digest" and err.fields["thread_id"] == "attacker"
    assert err.fields["url"].endswith(path.name) and digest.hex() in str(err)
    # Nothing of the file came back (one transaction): no row of the attacker's thread.
    for t in A.TABLES:
        assert _q(dsn, schema, f"SELECT count(*) FROM {t} WHERE thread_id = 'attacker'")[0][0] == 0, t
    with pytest.raises(ArchiveIntegrityError):
        A.verify(str(path))


def test_verify_checks_artifacts_too(dsn: str, schema: str, saver: DurablePostgresSaver, tmp_path: Path) -> None:
    """verify() makes the checks restore makes: an artifact edited in place (content no
    longer hashing to its digest) is refused by both. 569be7e's verify passed it."""
    path = archived(dsn, schema, saver, tmp_path, "edited")
    body = read_body(path)
    rows = body["artifacts"]["rows"]
    names = [c[0] for c in body["artifacts"]["columns"]]
    d = names.index("data")
    rows[0][d] = zstandard.ZstdCompressor(dict_data=_zstd_dict(), write_dict_id=False).compress(b"Emsgpack\x00\xa3bad")
    forge(path, body)
    with pytest.raises(ArchiveIntegrityError) as info:
        A.verify(str(path))
    assert info.value.fields.get("reason") == "artifact_digest", info.value
    before = _counts(dsn, schema)
    with pytest.raises(ArchiveIntegrityError):
        A.restore(saver, str(path))
    _assert_nothing_restored(dsn, schema, before)


@pytest.mark.parametrize("edit", ["nul_checkpoint_id", "int_checkpoint_id", "dangling_ref", "head_not_newest"])
def test_rows_the_thread_could_not_have_are_refused_typed(
    dsn: str, schema: str, saver: DurablePostgresSaver, tmp_path: Path, edit: str
) -> None:
    """Rows checked against the thread: a NUL in an id (569be7e: an untyped psycopg
    error from the middle of the inserts), a reference to an artifact neither the file
    nor the database has (569be7e: ForeignKeyViolation), a head the rows do not have.
    Each is an ArchiveIntegrityError subclass naming the file and thread; nothing is
    restored."""
    path = archived(dsn, schema, saver, tmp_path, f"rows-{edit}")
    body = read_body(path)
    tables = body["tables"]
    if edit == "nul_checkpoint_id":
        w = tables["checkpoint_writes"]
        names = [c[0] for c in w["columns"]]
        w["rows"][0][names.index("checkpoint_id")] = "bad\x00id"
    elif edit == "int_checkpoint_id":
        cps = tables["checkpoints"]
        names = [col[0] for col in cps["columns"]]
        cps["rows"][0][names.index("checkpoint_id")] = 12345
    elif edit == "dangling_ref":
        add_row(tables["durable_artifact_refs"], thread_id=body["thread_id"], digest=b"\x01" * 32)
    else:
        body["head_checkpoint_id"] = "ffffffff-ffff-6fff-ffff-ffffffffffff"
    forge(path, body)
    before = _counts(dsn, schema)
    with pytest.raises(ArchiveIntegrityError) as info:
        A.restore(saver, str(path))
    print(f"{edit}: {type(info.value).__name__}: {info.value}")
    assert info.value.fields["thread_id"] == body["thread_id"]
    assert info.value.fields["url"].endswith(path.name)
    assert "reason" in info.value.fields
    _assert_nothing_restored(dsn, schema, before)


# --------------------------------------------------------------------------- ledger keys


REFUNDS: list[int] = []


@idempotent(key=lambda order: f"refund-{order}", name="refund")
def refund(order: int) -> str:
    REFUNDS.append(order)
    return f"refunded {order}"


def _ledger_row(body: dict[str, Any], key: str, fingerprint: str, result: tuple[str, bytes]) -> None:
    add_row(
        body["tables"]["durable_ledger"],
        key=key,
        thread_id=body["thread_id"],
        fingerprint=fingerprint,
        status="completed",
        result_type=result[0],
        result=result[1],
        name="refund",
        attempts=1,
        created_at="2026-01-01T00:00:00+00:00",
        completed_at="2026-01-01T00:00:00+00:00",
    )


@pytest.mark.parametrize("target", ["key=", "other thread's derived key"])
def test_planted_ledger_key_cannot_precomplete_another_workflows_call(
    dsn: str, schema: str, saver: DurablePostgresSaver, tmp_path: Path, target: str
) -> None:
    """Suspicion confirmed: on 569be7e a hostile file could insert a completed ledger
    row under its own thread id with any key. With the key of another workflow's key=
    call (and the fingerprint that call computes, which anyone knowing its arguments
    can), that workflow's call replayed the planted result and its effect never ran;
    with another thread's derived key, the same for that thread's call. Now a ledger
    row whose key does not derive from the restored thread refuses the file."""
    path = archived(dsn, schema, saver, tmp_path, "planter")
    fp, _ = _fingerprint("refund", {"order": 42}, saver.serde)
    planted = saver.serde.dumps_typed("refunded 42")
    body = read_body(path)
    if target == "key=":
        key = "refund-42"
    else:
        key = "call:" + key_digest("task", "victim-thread", "", str(uuid.uuid4()), "0")
    _ledger_row(body, key, fp, planted)
    forge(path, body)
    before = _counts(dsn, schema)
    err: ArchiveIntegrityError | None = None
    try:
        A.restore(saver, str(path))
    except ArchiveIntegrityError as exc:
        err = exc
    # The victim's call runs its effect.
    REFUNDS.clear()

    def pay(s: State) -> dict[str, Any]:
        return {"paid": refund(42)}

    g = StateGraph(State)
    g.add_node("pay", pay)
    g.add_edge(START, "pay")
    g.add_edge("pay", END)
    g.compile(checkpointer=saver).invoke({"value": "x"}, _cfg("victim-thread"))
    assert REFUNDS == [42], "the refund was skipped: a planted ledger row answered for it"
    assert err is not None, f"restore accepted a planted ledger key {key!r}"
    print(f"{target}: {err}")
    assert err.fields["reason"] == "foreign_ledger_key" and err.fields["key"] == key
    assert _q(dsn, schema, "SELECT count(*) FROM checkpoints WHERE thread_id = 'planter'")[0][0] == 0
    assert before["durable_ledger"] == 0
    with pytest.raises(ArchiveIntegrityError):
        A.verify(str(path))


@tool
def lookup(q: str) -> str:
    """Look something up."""
    return f"found {q}"


@idempotent
def outer(who: str) -> str:
    return inner(who) + "!"


@idempotent
def inner(who: str) -> str:
    return f"inner-{who}"


def test_every_kind_of_ledger_key_a_thread_makes_restores(
    dsn: str, schema: str, saver: DurablePostgresSaver, tmp_path: Path
) -> None:
    """The ledger check must not refuse real archives: a thread with a journaled model
    (llm: keys), an idempotent tool run by ToolNode (tool: keys, which hash the model's
    tool_call_id), a call nested in another (keyed by its parent) and plain task calls
    is archived, verified and restored, every ledger row back."""
    answers = iter(
        [
            AIMessage(content="", tool_calls=[{"name": "lookup", "args": {"q": "x"}, "id": f"call_{SEED % 997}"}]),
            AIMessage(content="done"),
        ]
    )
    model = journaled(GenericFakeChatModel(messages=answers))
    itool = idempotent(lookup)

    class MState(TypedDict, total=False):
        messages: Annotated[list[Any], operator.add]
        paid: str

    def agent(s: MState) -> dict[str, Any]:
        return {"messages": [model.invoke(s["messages"])], "paid": outer("t")}

    g = StateGraph(MState)
    g.add_node("agent", agent)
    g.add_node("tools", ToolNode([itool], handle_tool_errors=False))
    g.add_edge(START, "agent")
    g.add_conditional_edges("agent", tools_condition)
    g.add_edge("tools", "agent")
    graph = g.compile(checkpointer=saver)
    graph.invoke({"messages": [HumanMessage("hello")]}, _cfg("kinds"))
    keys = sorted(r[0] for r in _q(dsn, schema, "SELECT key FROM durable_ledger WHERE thread_id = 'kinds'"))
    assert {k.split(":")[0] for k in keys} == {"call", "llm", "tool"}, keys
    _backdate(dsn, schema)
    url = str(tmp_path / "arch")
    report = retain(saver, older_than_days=30, archive=url)
    assert report.threads_archived == 1 and not report.archive_failed, report
    assert A.verify(url)[0]["thread_id"] == "kinds"
    restored = A.restore(saver, url)
    assert restored.rows["durable_ledger"] == len(keys)
    back = sorted(r[0] for r in _q(dsn, schema, "SELECT key FROM durable_ledger WHERE thread_id = 'kinds'"))
    assert back == keys


# --------------------------------------------------------------------------- sizes


def _bomb(path: Path, thread: str, size: int, *, declare: bool) -> None:
    """A valid-looking archive whose payload is a zstd frame of ``size`` zero bytes
    (a few KB on disk), the manifest made to match."""
    buf = io.BytesIO()
    cctx = zstandard.ZstdCompressor(level=3, write_content_size=declare)
    with cctx.stream_writer(buf, size=size if declare else -1, closefd=False) as w:
        chunk = b"\x00" * MiB
        for _ in range(size // MiB):
            w.write(chunk)
    payload = buf.getvalue()
    manifest = {
        "format": A.FORMAT, "version": A.VERSION, "package_version": "x", "created_at": "2026-01-01",
        "thread_id": thread, "head_checkpoint_id": None, "fingerprint": "f", "tables": [], "counts": {},
        "compression": "zstd", "payload_sha256": __import__("hashlib").sha256(payload).hexdigest(),
        "payload_bytes": len(payload),
    }
    m = json.dumps(manifest).encode()
    path.write_bytes(struct.pack("<II", 0x184D2A5E, len(m)) + m + payload)


def _peak(fn: Any) -> tuple[BaseException | None, int]:
    tracemalloc.start()
    try:
        fn()
        err = None
    except Exception as exc:
        err = exc
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    return err, peak


def test_a_small_bomb_is_refused_without_allocating_it(tmp_path: Path) -> None:
    """Suspicion confirmed: a 600 MiB payload (a few KB of file) was decompressed whole
    by verify/restore on 569be7e (the cap was 4 GiB). Now a frame that declares a size
    over ArchiveLimits.max_payload_bytes is refused before anything is allocated."""
    path = tmp_path / f"bomb-x--none{A.SUFFIX}"
    _bomb(path, "bomb", 600 * MiB, declare=True)
    print(f"bomb file: {path.stat().st_size} bytes for 600 MiB")
    err, peak = _peak(lambda: A.verify(str(path)))
    print(f"verify: {type(err).__name__}: {err}; traced peak {peak / MiB:.1f} MiB")
    assert isinstance(err, ArchiveIntegrityError)
    assert peak < 32 * MiB, f"verify allocated {peak / MiB:.0f} MiB for a {path.stat().st_size}-byte file"
    assert err.fields.get("reason") == "payload_too_large"


def test_an_undeclared_bomb_stops_at_the_limit(tmp_path: Path) -> None:
    """A frame without a declared size is read in steps and refused past the limit, so
    it costs at most the (configurable) limit."""
    path = tmp_path / f"bomb-y--none{A.SUFFIX}"
    _bomb(path, "bomb", 200 * MiB, declare=False)
    limits = A.ArchiveLimits(max_payload_bytes=8 * MiB)
    err, peak = _peak(lambda: A.verify(str(path), limits=limits))
    print(f"verify: {type(err).__name__}: {err}; traced peak {peak / MiB:.1f} MiB")
    assert isinstance(err, A.ArchiveTooLargeError) and err.fields["limit"] == 8 * MiB
    assert peak < 40 * MiB


def test_an_artifact_bomb_is_refused(dsn: str, schema: str, saver: DurablePostgresSaver, tmp_path: Path) -> None:
    """One record over the limit: an artifact whose few KB decompress to 600 MiB. 569be7e's
    verify passed the file and restore inserted the row (any later read would inflate
    it); now both refuse it before decompressing."""
    path = archived(dsn, schema, saver, tmp_path, "artbomb")
    body = read_body(path)
    buf = io.BytesIO()
    cctx = zstandard.ZstdCompressor(dict_data=_zstd_dict(), write_dict_id=False)
    with cctx.stream_writer(buf, size=600 * MiB, closefd=False) as w:
        for _ in range(600):
            w.write(b"\x00" * MiB)
    add_row(
        body["artifacts"], digest=b"\x02" * 32, size=600 * MiB, data=buf.getvalue(),
        created_at="2026-01-01T00:00:00+00:00", last_used_at="2026-01-01T00:00:00+00:00",
    )
    forge(path, body)
    err, peak = _peak(lambda: A.verify(str(path)))
    print(f"verify: {type(err).__name__}: {err}; traced peak {peak / MiB:.1f} MiB")
    assert isinstance(err, ArchiveIntegrityError) and err.fields.get("reason") == "value_too_large"
    assert peak < 64 * MiB
    before = _counts(dsn, schema)
    with pytest.raises(ArchiveIntegrityError):
        A.restore(saver, str(path))
    _assert_nothing_restored(dsn, schema, before)


# --------------------------------------------------------------------------- file names


def _thread_with_head(saver: DurablePostgresSaver, thread: str, checkpoint_id: str) -> None:
    """A thread whose head checkpoint has an arbitrary id (a put through the stock API:
    LangGraph never checks the id, an imported or hand-made checkpoint can hold any)."""
    from langgraph.checkpoint.base import empty_checkpoint

    cp = empty_checkpoint()
    cp["id"] = checkpoint_id
    saver.put(_cfg(thread) | {"configurable": {"thread_id": thread, "checkpoint_ns": ""}}, cp, {"source": "input", "step": -1}, {})


@pytest.mark.parametrize("head", ["a/b", "../../escape", "x" * 300])
def test_odd_checkpoint_ids_archive_under_safe_names(
    dsn: str, schema: str, saver: DurablePostgresSaver, tmp_path: Path, head: str
) -> None:
    """Suspicion confirmed: the head checkpoint id went verbatim into the file name, so
    an id with '/' (or 300 characters) made every retention run fail with ArchiveError
    and retain nothing after that batch. Now the name is one safe path component, the
    thread is archived and restored, and the other threads' retention goes on."""
    _thread_with_head(saver, "odd", head)
    _graph(saver).invoke({"value": big("plain")}, _cfg("plain"))
    _backdate(dsn, schema)
    url = tmp_path / "arch"
    report = retain(saver, older_than_days=30, archive=str(url), batch_size=1)
    print(report.as_dict())
    assert sorted(report.deleted_thread_ids) == ["odd", "plain"]
    names = os.listdir(url)
    assert len(names) == 2 and all("/" not in n and len(n) < 200 and n.endswith(A.SUFFIX) for n in names)
    assert not any(p.name not in names for p in tmp_path.rglob("*.lgda.zst")), "a file escaped the directory"
    restored = A.restore(saver, str(url), thread_ids=["odd"])
    assert restored.thread_ids == ["odd"]
    assert saver.get_tuple(_cfg("odd")).checkpoint["id"] == head  # type: ignore[union-attr]


def test_one_thread_that_cannot_be_archived_does_not_block_the_others(
    dsn: str, schema: str, saver: DurablePostgresSaver, tmp_path: Path
) -> None:
    """A thread whose archive cannot be verified (here: over the configured limits) is
    kept and reported; every other thread, in its batch and in the next ones, is still
    archived and deleted, and so on every run."""
    _graph(saver).invoke({"value": big("huge", 3 * MiB // 2)}, _cfg("huge"))
    for i in range(3):
        _graph(saver).invoke({"value": big(f"small{i}")}, _cfg(f"small{i}"))
    _backdate(dsn, schema)
    url = str(tmp_path / "arch")
    limits = A.ArchiveLimits(max_payload_bytes=1 * MiB, max_value_bytes=1 * MiB)
    report = retain(saver, older_than_days=30, archive=url, batch_size=2, archive_limits=limits)
    print(report.as_dict())
    assert sorted(report.deleted_thread_ids) == ["small0", "small1", "small2"]
    assert report.skipped.get("archive_failed") == 1
    assert [f["thread_id"] for f in report.archive_failed] == ["huge"]
    assert _q(dsn, schema, "SELECT count(*) FROM checkpoints WHERE thread_id = 'huge'")[0][0] > 0
    again = retain(saver, older_than_days=30, archive=url, archive_limits=limits)
    assert again.skipped.get("archive_failed") == 1 and again.threads_deleted == 0


# --------------------------------------------------------------------------- URLs


@pytest.mark.parametrize(
    ("url", "secrets"),
    [
        ("s3://AKIAEXAMPLE:wJalrXUtnFEMI@bucket/prefix", ["AKIAEXAMPLE", "wJalrXUtnFEMI"]),
        ("https://ghp_tok3n@host/path", ["ghp_tok3n"]),
        (
            "https://b.s3.amazonaws.com/p?X-Amz-Credential=AKIA%2F1&X-Amz-Signature=abc123&x=1",
            ["AKIA", "abc123"],
        ),
        ("gs://b/p?token=t0k&api_key=k3y&password=pw9&secret=s3c&sig=5ig", ["t0k", "k3y", "pw9", "s3c", "5ig"]),
    ],
)
def test_redact_url(url: str, secrets: list[str]) -> None:
    from langgraph_durable.audit import redact_url

    shown = redact_url(url)
    assert all(s not in shown for s in secrets), shown
    assert shown.split("://")[0] == url.split("://")[0] and "***" in shown
    assert redact_url("/var/lib/lgd-archive") == "/var/lib/lgd-archive"


def test_archive_url_credentials_never_reach_the_audit_trail(
    dsn: str, schema: str, saver: DurablePostgresSaver
) -> None:
    """Suspicion confirmed: retain's and restore's audit rows (the console's /audit page
    shows them) held the archive URL verbatim, credentials included. Now every URL in
    the audit trail, the report and the errors is redacted."""
    pytest.importorskip("fsspec")
    secret = f"hunter{SEED % 10_000}"
    url = f"memory://user:{secret}@lgd-{uuid.uuid4().hex[:8]}/arch"
    _graph(saver).invoke({"value": big("cred")}, _cfg("cred"))
    _backdate(dsn, schema)
    report = retain(saver, older_than_days=30, archive=url)
    assert report.threads_archived == 1
    assert secret not in json.dumps(report.as_dict())
    restored = A.restore(saver, url)
    assert restored.thread_ids == ["cred"] and secret not in json.dumps(restored.as_dict())
    with pytest.raises(ArchiveError) as info:
        A.restore(saver, url, thread_ids=["absent"])
    assert secret not in str(info.value) and secret not in json.dumps(info.value.fields, default=str)
    rows = _q(dsn, schema, "SELECT action, detail::text FROM durable_audit WHERE action LIKE 'storage.%%'")
    assert {r[0] for r in rows} >= {"storage.retain", "storage.restore"}, rows
    leaked = [r for r in rows if secret in r[1]]
    assert not leaked, f"credentials in durable_audit: {leaked}"


class ForgetState(TypedDict, total=False):
    messages: Annotated[list[Any], add_messages]
    paid: str


def test_tool_rows_of_forgotten_messages_are_left_out_not_refused(
    dsn: str, schema: str, saver: DurablePostgresSaver, tmp_path: Path
) -> None:
    """A tool key hashes the model's tool_call_id, which the ledger row does not keep:
    restore finds it in the thread's stored messages. A thread that removed its
    messages and was trimmed (retain keep_last) stores it nowhere any more; such a
    real archive must still restore: the dead tool row (no run of the thread can make
    its key again) is left out and counted, every other row comes back."""
    tcid = f"call_forgotten_{SEED % 9973}"
    answers = iter(
        [
            AIMessage(content="", tool_calls=[{"name": "lookup", "args": {"q": "y"}, "id": tcid}]),
            AIMessage(content="done"),
        ]
    )
    model = GenericFakeChatModel(messages=answers)

    def agent(s: ForgetState) -> dict[str, Any]:
        return {"messages": [model.invoke(s["messages"])], "paid": charge("forgetful")}

    def route(s: ForgetState) -> str:
        return "tools" if getattr(s["messages"][-1], "tool_calls", None) else "forget"

    def forget(s: ForgetState) -> dict[str, Any]:
        return {"messages": [RemoveMessage(id=REMOVE_ALL_MESSAGES)]}

    g = StateGraph(ForgetState)
    g.add_node("agent", agent)
    g.add_node("tools", ToolNode([idempotent(lookup)], handle_tool_errors=False))
    g.add_node("forget", forget)
    g.add_edge(START, "agent")
    g.add_conditional_edges("agent", route, ["tools", "forget"])
    g.add_edge("tools", "agent")
    g.add_edge("forget", END)
    g.compile(checkpointer=saver).invoke({"messages": [HumanMessage("hello")]}, _cfg("forgetful"))
    retain(saver, older_than_days=30, keep_last=1)
    gc(saver, grace=0)
    stored = b"".join(
        bytes(r[0]) for r in _q(dsn, schema, "SELECT blob FROM checkpoint_blobs UNION ALL SELECT blob FROM checkpoint_writes")
    ) + b"".join(bytes(r[0]) for r in _q(dsn, schema, "SELECT data FROM durable_artifacts"))
    assert tcid.encode() not in stored, "the trim kept the tool call id: the test proves nothing"
    keys = sorted(r[0] for r in _q(dsn, schema, "SELECT key FROM durable_ledger WHERE thread_id = 'forgetful'"))
    assert any(k.startswith("tool:") for k in keys), keys
    _backdate(dsn, schema)
    url = str(tmp_path / "arch")
    report = retain(saver, older_than_days=30, archive=url)
    assert report.threads_archived == 1 and not report.archive_failed, report
    assert A.verify(url)[0]["ledger_rows_dropped"] == 1
    restored = A.restore(saver, url)
    print(restored.as_dict())
    assert restored.ledger_rows_dropped == 1
    back = sorted(r[0] for r in _q(dsn, schema, "SELECT key FROM durable_ledger WHERE thread_id = 'forgetful'"))
    assert back == [k for k in keys if not k.startswith("tool:")]


def test_a_planted_tool_key_is_never_inserted(
    dsn: str, schema: str, saver: DurablePostgresSaver, tmp_path: Path
) -> None:
    """A tool-shaped key the thread cannot prove (another thread's tool call, say) is
    one of the dead rows: the restore goes on, and the row is not in the ledger."""
    path = archived(dsn, schema, saver, tmp_path, "tooler")
    key = "tool:" + key_digest("tool-task", "victim-thread", "", str(uuid.uuid4()), "call_0")
    body = read_body(path)
    _ledger_row(body, key, "f" * 64, saver.serde.dumps_typed("planted"))
    forge(path, body)
    restored = A.restore(saver, str(path))
    assert _q(dsn, schema, "SELECT count(*) FROM durable_ledger WHERE key = %s", key)[0][0] == 0, "planted row inserted"
    assert restored.thread_ids == ["tooler"] and restored.ledger_rows_dropped == 1
    assert _q(dsn, schema, "SELECT count(*) FROM durable_ledger WHERE thread_id = 'tooler'")[0][0] == 1


def test_encrypted_archive_round_trips_and_is_checked_with_the_cipher(
    dsn: str, schema: str, tmp_path: Path
) -> None:
    """With an EncryptedSerializer, artifacts are checked after decryption (their
    digests live in the cipher's namespace) and tool keys are proven from decrypted
    messages: a real encrypted archive with every key kind restores. Without the
    cipher, verify() counts what it could not check and restore refuses."""
    from langgraph.checkpoint.serde.encrypted import EncryptedSerializer

    serde = EncryptedSerializer.from_pycryptodome_aes(key=b"0123456789abcdef")
    answers = iter(
        [
            AIMessage(content="", tool_calls=[{"name": "lookup", "args": {"q": big("q", 400)}, "id": "call_enc"}]),
            AIMessage(content=big("final", 600)),
        ]
    )
    model = GenericFakeChatModel(messages=answers)

    def agent(s: ForgetState) -> dict[str, Any]:
        return {"messages": [model.invoke(s["messages"])], "paid": charge("enc")}

    with DurablePostgresSaver.from_conn_string(dsn, schema=schema, serde=serde, artifact_threshold=256) as enc:
        enc.setup()
        g = StateGraph(ForgetState)
        g.add_node("agent", agent)
        g.add_node("tools", ToolNode([idempotent(lookup)], handle_tool_errors=False))
        g.add_edge(START, "agent")
        g.add_conditional_edges("agent", tools_condition)
        g.add_edge("tools", "agent")
        g.compile(checkpointer=enc).invoke({"messages": [HumanMessage(big("hello", 500))]}, _cfg("enc"))
        keys = sorted(r[0] for r in _q(dsn, schema, "SELECT key FROM durable_ledger WHERE thread_id = 'enc'"))
        assert any(k.startswith("tool:") for k in keys)
        sealed = _q(dsn, schema, "SELECT count(*) FROM durable_artifacts WHERE substring(data from 1 for 1) <> '\\x28'::bytea")
        assert sealed[0][0] > 0, "no encrypted artifact: the test proves nothing"
        _backdate(dsn, schema)
        url = str(tmp_path / "arch")
        report = retain(enc, older_than_days=30, archive=url)
        assert report.threads_archived == 1 and not report.archive_failed, report
        gc(enc, grace=0)
        (m,) = A.verify(url, serde=serde)
        assert m["unverified_artifacts"] == 0 and m["ledger_rows_dropped"] == 0
        (blind,) = A.verify(url)
        assert blind["unverified_artifacts"] > 0
        with DurablePostgresSaver.from_conn_string(dsn, schema=schema, artifact_threshold=256) as plain:
            with pytest.raises(ArchiveIntegrityError) as info:
                A.restore(plain, url)
            assert info.value.fields["reason"] == "unverifiable_artifact"
        restored = A.restore(enc, url)
        assert restored.ledger_rows_dropped == 0
        back = sorted(r[0] for r in _q(dsn, schema, "SELECT key FROM durable_ledger WHERE thread_id = 'enc'"))
        assert back == keys


def test_audit_rows_written_before_redaction_are_read_redacted(
    dsn: str, schema: str, saver: DurablePostgresSaver
) -> None:
    """An audit row a release before the fix wrote, with the archive URL verbatim: every
    reader (the console's /audit page and the CLI go through list_audit) sees it redacted."""
    from langgraph_durable.audit import list_audit

    secret = f"oldsecret{SEED % 10_000}"
    detail = json.dumps({"archive": f"s3://ops:{secret}@bucket/arch?token={secret}", "n": 1})
    _q(
        dsn, schema,
        "INSERT INTO durable_audit (event_id, actor, via, action, thread_id, detail) "
        "VALUES (%s, 'old', 'cli', 'storage.retain', NULL, %s::jsonb)",
        str(uuid.uuid4()), detail,
    )
    rows = [r for r in list_audit(saver, action="storage.retain") if r["actor"] == "old"]
    assert rows and secret not in json.dumps(rows, default=str)
    assert rows[0]["detail"]["n"] == 1 and "bucket/arch" in rows[0]["detail"]["archive"]
