"""Key rotation and ``langgraph-durable rekey`` (issue 27) on a real PostgreSQL.

Threads are written with LangGraph's own ``EncryptedSerializer.from_pycryptodome_aes``
(the old key): artifacts, chunked lists, envelopes with inline encrypted items, pending
writes, a DeltaChannel, a subgraph, an @idempotent result. A ``rekey`` child process is
SIGKILLed mid-walk (one row per transaction); the database then holds both keys' rows
and a rotating saver reads it all. A rerun finishes (resumes: re-encrypts only what the
killed run had not), a third finds nothing, and a saver with the new key alone (and
LangGraph's serializer with it) reads every thread exactly as before: nothing lost,
nothing encrypted twice. A wrong key is a typed refusal naming the thread.
"""

# No `from __future__ import annotations`: LangGraph evaluates the local state schemas.

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import psycopg
import pytest
from _db import q
from langchain_core.messages import HumanMessage
from langgraph.checkpoint.serde.encrypted import EncryptedSerializer
from test_export_stock import cfg, chat_graph, state_view, write_threads

from langgraph_durable import DurablePostgresSaver, idempotent
from langgraph_durable.cli import app
from langgraph_durable.errors import DecryptionError
from langgraph_durable.keyring import DurableEncryptedSerializer, Keyring
from langgraph_durable.ops import rekey as ops_rekey
from langgraph_durable.sql.sealed import SEALED

OLD = b"old-key-0123456789abcdef01234567"
NEW = b"new-key-0123456789abcdef01234567"
WRONG = b"wrong-key-89abcdef0123456789abcd"
HERE = Path(__file__).parent


def _key_file(tmp_path: Path, *keys: bytes) -> str:
    path = tmp_path / f"keys-{len(keys)}-{keys[0][:3].decode()}"
    path.write_text("# current first\n" + "\n".join("hex:" + k.hex() for k in keys) + "\n")
    return str(path)


def _under(dsn: str, key: bytes) -> tuple[int, int]:
    """(encrypted values under ``key``, encrypted values in all), over every column of
    SEALED: each encrypted item of every blob, write, ledger result and artifact (tried
    with the key), and each sealed text/JSON/metadata value (by the key id it names)."""
    import base64

    from langgraph_durable._sealing import JSON_KEY, TEXT_PREFIX
    from langgraph_durable.artifacts import recrypt_envelope, recrypt_stored_artifact
    from langgraph_durable.keyring import key_id

    ring = Keyring.from_serde(DurableEncryptedSerializer(key))
    assert ring is not None
    kid = key_id(key)
    seen = {"under": 0, "total": 0}

    def count(ct: bytes) -> None:
        seen["total"] += 1
        try:
            ring.open_serde(ct, thread_id=None, where="test")
        except DecryptionError:
            return
        seen["under"] += 1

    def sealed(b64: str) -> None:
        seen["total"] += 1
        seen["under"] += base64.b64decode(b64)[4:12] == kid

    def serde(typ: str | None, data: bytes) -> None:
        if typ == "durable+ref":
            recrypt_envelope(data, count)
        elif typ and "+" in typ:
            count(data)

    for col in SEALED:
        type_col = f", {col.type_column}" if col.type_column else ""
        for row in q(dsn, f"SELECT {col.column} AS v{type_col} FROM {col.table}"):
            value = row["v"]
            if value is None:
                continue
            if col.kind == "artifact":
                recrypt_stored_artifact(bytes(value), count)
            elif col.kind == "serde":
                serde(row[col.type_column], bytes(value))
            elif col.kind == "serde_json":
                for e in value:
                    if e.get("blob"):
                        serde(e.get("type"), base64.b64decode(e["blob"]))
            elif col.kind == "text" and value.startswith(TEXT_PREFIX):
                sealed(value[len(TEXT_PREFIX):])
            elif col.kind in ("json", "metadata") and isinstance(value, dict) and JSON_KEY in value:
                sealed(value[JSON_KEY])
            elif col.kind == "sealed":  # Keyring.seal's bytes (the digest secret: digest27)
                sealed(base64.b64encode(bytes(value)).decode())
    return seen["under"], seen["total"]


def _write(dsn: str) -> dict[str, Any]:
    with DurablePostgresSaver.from_conn_string(dsn, serde=EncryptedSerializer.from_pycryptodome_aes(key=OLD)) as saver:
        builders = write_threads(saver)

        @idempotent(ledger=saver, key=lambda card: "charge-" + card[-4:])
        def charge(card: str) -> dict[str, Any]:
            return {"charged": card, "receipt": "r-" + card}

        assert charge("4111111111111111")["receipt"] == "r-4111111111111111"
        meta = chat_graph().compile(checkpointer=saver)
        meta.invoke({"messages": [HumanMessage("with metadata")]},
                    {"configurable": {"thread_id": "exp-meta"}, "metadata": {"customer": "Ada 4111"}})
        builders = {**builders, "exp-meta": chat_graph}
        failing = _failing_graph().compile(checkpointer=saver)
        with pytest.raises(RuntimeError):
            failing.invoke({"docs": []}, cfg("exp-fails"))
        # An operator's queued interrupt answer (issue 25): durable_threads.answer_blob.
        from langgraph_durable.ops.control import queue_answer

        _asking_graph().compile(checkpointer=saver).invoke({"docs": []}, cfg("exp-asked"))
        queue_answer(saver, "exp-asked", "approved for Ada 4111")
        views = {tid: state_view(b().compile(checkpointer=saver), tid) for tid, b in builders.items()}
    return {"builders": builders, "views": views}


def _asking_graph() -> Any:
    from langgraph.graph import END, START, StateGraph
    from langgraph.types import interrupt
    from test_export_stock import State

    def ask(state: Any) -> dict[str, Any]:
        interrupt("approve?")
        return {}

    b = StateGraph(State)
    b.add_node("ask", ask)
    b.add_edge(START, "ask")
    b.add_edge("ask", END)
    return b


def _answer(dsn: str) -> tuple[str, bytes]:
    (row,) = q(dsn, "SELECT answer_type, answer_blob FROM durable_threads WHERE thread_id = 'exp-asked'")
    return str(row["answer_type"]), bytes(row["answer_blob"])


def _failing_graph() -> Any:
    from langgraph.graph import END, START, StateGraph
    from test_export_stock import State

    def boom(state: Any) -> dict[str, Any]:
        raise RuntimeError("card 4111 1111 declined for Ada")

    b = StateGraph(State)
    b.add_node("boom", boom)
    b.add_edge(START, "boom")
    b.add_edge("boom", END)
    return b


def _views(dsn: str, serde: Any, builders: dict[str, Any]) -> dict[str, Any]:
    with DurablePostgresSaver.from_conn_string(dsn, serde=serde) as saver:
        return {tid: state_view(b().compile(checkpointer=saver), tid) for tid, b in builders.items()}


def _rekey_json(dsn: str, key_file: str, capsys: pytest.CaptureFixture[str]) -> dict[str, Any]:
    capsys.readouterr()
    with pytest.raises(SystemExit) as done:
        app(["rekey", "--dsn", dsn, "--key-file", key_file, "--json"], standalone_mode=True)
    out = capsys.readouterr().out
    assert done.value.code in (0, None), out
    return dict(json.loads(out))


def test_rotation_and_rekey_survive_a_sigkill(dsn: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    written = _write(dsn)
    builders, before = written["builders"], written["views"]
    under_old, total = _under(dsn, OLD)
    assert total > 40 and under_old == total  # every encrypted value, LangGraph's form
    rotating = DurableEncryptedSerializer(NEW, old=[OLD])

    # The rotating saver reads the old key's rows and writes with the new key.
    assert _views(dsn, rotating, builders) == before

    keys = _key_file(tmp_path, NEW, OLD)
    marker = tmp_path / "marker"
    marker.write_text("")
    child = subprocess.Popen(
        [sys.executable, str(HERE / "_child_rekey.py"), dsn, keys, str(marker)],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, env={**os.environ, "PYTHONPATH": str(HERE)},
    )
    deadline = time.monotonic() + 120
    while len(marker.read_text().splitlines()) < 150:  # into checkpoint_writes
        assert child.poll() is None, child.communicate()
        assert time.monotonic() < deadline, "the rekey child made no progress"
        time.sleep(0.01)
    os.kill(child.pid, signal.SIGKILL)
    child.wait()
    assert child.returncode == -signal.SIGKILL

    under_new, total_after = _under(dsn, NEW)
    assert total_after == total and 0 < under_new < total  # killed mid-walk: both keys
    assert _views(dsn, rotating, builders) == before  # a mixed database reads whole
    assert not q(dsn, "SELECT 1 FROM durable_audit WHERE action = 'storage.rekey'")  # not finished

    resumed = _rekey_json(dsn, keys, capsys)
    assert 0 < resumed["rekeyed"] <= total - under_new  # only what the killed run left
    under_new, total_after = _under(dsn, NEW)  # (+1: the rekey's own audit detail, sealed)
    assert under_new == total_after >= total and _under(dsn, OLD)[0] == 0
    again = _rekey_json(dsn, keys, capsys)
    assert again["rekeyed"] == 0 and again["scanned"] == resumed["scanned"] + 1  # its audit row
    audit = q(dsn, "SELECT actor, via, detail FROM durable_audit WHERE action = 'storage.rekey' ORDER BY id")
    from langgraph_durable._sealing import open_json

    ring = Keyring.from_serde(DurableEncryptedSerializer(NEW))
    assert ring is not None and len(audit) == 2 and audit[0]["actor"]
    detail = open_json(ring, audit[0]["detail"], thread_id=None, where="durable_audit.detail")
    assert detail["rekeyed"] == resumed["rekeyed"] and detail["key_id"] == ring.current_id

    # The new key alone, ours or LangGraph's serializer: every thread as it was.
    assert _views(dsn, DurableEncryptedSerializer(NEW), builders) == before
    assert _views(dsn, EncryptedSerializer.from_pycryptodome_aes(key=NEW), builders) == before
    with DurablePostgresSaver.from_conn_string(dsn, serde=DurableEncryptedSerializer(NEW)) as saver:
        chat = chat_graph().compile(checkpointer=saver)
        chat.invoke({"messages": [HumanMessage("after rekey")]}, cfg("exp-chat"))
    # The queued answer moved to the new key too (digest27: answer_blob is in SEALED).
    answer = DurableEncryptedSerializer(NEW).loads_typed(_answer(dsn))  # {interrupt id: value}
    assert list(answer.values()) == ["approved for Ada 4111"]
    with pytest.raises(DecryptionError):
        DurableEncryptedSerializer(OLD).loads_typed(_answer(dsn))
    row = q(dsn, "SELECT result_type, result FROM durable_ledger")[0]
    stored = (row["result_type"], bytes(row["result"]))
    assert DurableEncryptedSerializer(NEW).loads_typed(stored)["receipt"] == "r-4111111111111111"
    with pytest.raises(DecryptionError):  # the ledger's result really moved too
        DurableEncryptedSerializer(OLD).loads_typed(stored)


def test_wrong_key_is_a_typed_refusal_naming_the_thread(dsn: str, tmp_path: Path) -> None:
    # The database's current key is NEW (the test above rekeyed it): a saver writes only
    # with a key that opens its digest secret (digest27).
    with DurablePostgresSaver.from_conn_string(dsn, serde=DurableEncryptedSerializer(NEW, old=[OLD])) as saver:
        g = chat_graph().compile(checkpointer=saver)
        g.invoke({"messages": [HumanMessage("hello")]}, cfg("wrong-key"))
    for serde in (DurableEncryptedSerializer(WRONG), EncryptedSerializer.from_pycryptodome_aes(key=WRONG)):
        with DurablePostgresSaver.from_conn_string(dsn, serde=serde) as saver:
            with pytest.raises(DecryptionError) as info:
                saver.get_tuple(cfg("wrong-key"))
            assert info.value.thread_id == "wrong-key"
            with pytest.raises(DecryptionError) as run:  # a run start refuses it too
                chat_graph().compile(checkpointer=saver).invoke(
                    {"messages": [HumanMessage("again")]}, cfg("wrong-key")
                )
            assert run.value.thread_id == "wrong-key"
    # Not quarantined (the data is not damaged, the key is wrong): the right key goes on.
    assert not q(dsn, "SELECT 1 FROM durable_quarantine WHERE thread_id = 'wrong-key'")
    with DurablePostgresSaver.from_conn_string(dsn, serde=DurableEncryptedSerializer(NEW, old=[OLD])) as saver:
        g = chat_graph().compile(checkpointer=saver)
        assert "__interrupt__" in g.invoke({"messages": [HumanMessage("right key")]}, cfg("wrong-key"))

    # rekey with keys that do not open the rows: refused, typed, the thread named.
    proc = subprocess.run(
        [sys.executable, "-c", "from langgraph_durable.cli import main; main()", "rekey", "--dsn", dsn, "--key-file",
         _key_file(tmp_path, WRONG), "--json"],
        capture_output=True, text=True, timeout=120, check=False,
    )
    assert proc.returncode == 1, proc.stderr
    err = json.loads(proc.stdout)
    threads = {r["thread_id"] for r in q(dsn, "SELECT thread_id FROM checkpoints")}
    assert err["error"] == "DecryptionError" and err["thread_id"] in threads, err
    assert err["where"] and err["thread_id"] in err["message"]
    assert "Traceback" not in proc.stderr


def test_rekey_refuses_a_saver_without_keys(dsn: str) -> None:
    from langgraph_durable.errors import RekeyError

    with DurablePostgresSaver.from_conn_string(dsn) as saver, pytest.raises(RekeyError):
        ops_rekey.rekey(saver)
    _ = psycopg


async def test_arekey_with_the_async_saver(dsn: str) -> None:
    from langgraph_durable import AsyncDurablePostgresSaver

    # Keys of its own, the database's current one (NEW, which seals its digest secret)
    # kept as an old one so the secret opens.
    old, new = b"async-old-456789abcdef0123456789", b"async-new-456789abcdef0123456789"
    cfg_ = {"configurable": {"thread_id": "async-rekey"}, "metadata": {"customer": "Ada"}}
    async with AsyncDurablePostgresSaver.from_conn_string(dsn, serde=DurableEncryptedSerializer(old, old=[NEW])) as saver:
        g = chat_graph().compile(checkpointer=saver)
        await g.ainvoke({"messages": [HumanMessage("async " + "x" * 3000)]}, cfg_)
        before = await g.aget_state(cfg_)
    rotating = DurableEncryptedSerializer(new, old=[old, NEW, OLD])  # the earlier tests: NEW, OLD
    async with AsyncDurablePostgresSaver.from_conn_string(dsn, serde=rotating) as saver:
        report = await ops_rekey.arekey(saver, batch_size=7)
        assert report.rekeyed > 0
        assert (await ops_rekey.arekey(saver)).rekeyed == 0
    async with AsyncDurablePostgresSaver.from_conn_string(
        dsn, serde=DurableEncryptedSerializer(new)  # every old key dropped after the rekey
    ) as saver:
        after = await chat_graph().compile(checkpointer=saver).aget_state(cfg_)
    assert after.values == before.values and after.metadata == before.metadata
