"""digest27 (issue 27): the digest secret of artifact digests and call fingerprints is the
database's own, random, stored sealed in ``durable_secrets``, so it survives a key
rotation.

The rotation sequence a user follows, on a real PostgreSQL with real SIGKILLs: write with
K1 (a run killed inside an ``@idempotent`` call, after a journaled model answer and a
completed charge were recorded); configure K2 + K1 and ``rekey``; configure K2 alone and
resume: the model and the charge are not called again, no ``IdempotencyConflictError``,
the killed call is an unknown outcome (never re-run on its own), and a new identical
large value deduplicates against the K1-era artifact. Run twice: on a database this
release created (a random secret), and on one written the way the release before it
did (digests keyed by a secret derived from the oldest key, no ``durable_secrets`` row:
that derived secret is adopted, sealed, on first use). Also: an artifact row holding
another artifact's (well encrypted) data is refused, naming the thread; without a key
nothing is stored; a custom cipher gets a stored secret too; concurrent first savers
agree on one secret.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import os
import signal
import subprocess
import sys
import threading
import uuid
from pathlib import Path
from typing import Any

import psycopg
import pytest
from _child_digest import BIG, State, build, effects
from langgraph.graph import END, START, StateGraph
from psycopg.rows import dict_row

from langgraph_durable import DurablePostgresSaver, Ledger
from langgraph_durable.artifacts import _digest, _element_content, _space
from langgraph_durable.errors import ArtifactIntegrityError, DecryptionError
from langgraph_durable.keyring import DurableEncryptedSerializer, Keyring, key_id
from langgraph_durable.ops import rekey as ops_rekey

K1 = b"k1-digest-0123456789abcdef012345"
K2 = b"k2-digest-0123456789abcdef012345"
HERE = Path(__file__).parent


def _schema(name: str) -> str:
    return f"dg_{name}_{uuid.uuid4().hex[:6]}"


def _q(dsn: str, schema: str, sql: str, params: Any = None) -> list[dict[str, Any]]:
    with psycopg.connect(dsn, autocommit=True, row_factory=dict_row) as conn:
        conn.execute(f'SET search_path TO "{schema}"')
        cur = conn.execute(sql, params)
        return cur.fetchall() if cur.description else []


def _saver(dsn: str, schema: str, serde: Any = None, **kw: Any) -> Any:
    return DurablePostgresSaver.from_conn_string(dsn, schema=schema, serde=serde, artifact_threshold=256, **kw)


def _setup_plain(dsn: str, schema: str) -> None:
    with _saver(dsn, schema) as saver:  # tables only: no key, so no digest secret
        saver.setup()


def _child(dsn: str, schema: str, thread: str, mode: str, keys: list[bytes], *extra: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(HERE / "_child_digest.py"), dsn, schema, thread, mode,
         ",".join(k.hex() for k in keys) or "-", *extra],
        capture_output=True, text=True, timeout=180, check=False, env={**os.environ, "PYTHONPATH": str(HERE)},
    )


def _sealed_kid(dsn: str, schema: str) -> bytes | None:
    rows = _q(dsn, schema, "SELECT sealed FROM durable_secrets WHERE name = 'digest'")
    return bytes(rows[0]["sealed"])[4:12] if rows else None


@pytest.mark.parametrize("origin", ["fresh", "from_main"])
def test_dropping_the_old_key_after_rekey_keeps_fingerprints_and_dedup(dsn: str, origin: str) -> None:
    schema, thread = _schema(origin), f"rot-{origin}"
    _setup_plain(dsn, schema)
    legacy = ("main",) if origin == "from_main" else ()

    # 1. K1: the run dies inside `ship`, after the model's answer and the charge were recorded.
    killed = _child(dsn, schema, thread, "kill", [K1], *legacy)
    assert killed.returncode == -signal.SIGKILL, killed.stderr[-2000:]
    assert effects(dsn, thread) == {"model": 1, "charge": 1, "ship": 1}
    artifacts = _q(dsn, schema, "SELECT count(*) AS n FROM durable_artifacts")[0]["n"]
    assert artifacts >= 1  # the large document of the input
    if origin == "fresh":
        assert _sealed_kid(dsn, schema) == key_id(K1)  # created by the first saver, sealed under K1
    else:
        assert _sealed_kid(dsn, schema) is None  # the release before digest27 stored none

    # 2. K2 + K1, rekey: every column moves to K2, the digest secret with them.
    with _saver(dsn, schema, DurableEncryptedSerializer(K2, old=[K1])) as saver:
        report = ops_rekey.rekey(saver, batch_size=3)
        assert report.columns["durable_secrets.sealed"]["scanned"] == 1
    assert _sealed_kid(dsn, schema) == key_id(K2)

    # 3. K2 alone. The resume replays the model's answer and the charge (not called again,
    # no IdempotencyConflictError: the fingerprints still match) and finds `ship` an
    # unknown outcome, as it would without any rotation.
    resumed = _child(dsn, schema, thread, "resume", [K2])
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    out = json.loads(resumed.stdout.strip().splitlines()[-1])
    assert out.get("error") == "OutcomeUnknownError", out
    assert effects(dsn, thread) == {"model": 1, "charge": 1, "ship": 1}
    with _saver(dsn, schema, DurableEncryptedSerializer(K2)) as saver:
        Ledger(saver).resolve(out["key"], "shipped order-7")  # the operator checked: it shipped
    done = _child(dsn, schema, thread, "resume", [K2])
    assert done.returncode == 0, done.stderr[-3000:]
    assert json.loads(done.stdout.strip().splitlines()[-1]) == {"ok": ["the model says yes", "r-1111", "shipped order-7"]}
    assert effects(dsn, thread) == {"model": 1, "charge": 1, "ship": 1}

    # 4. A new identical large value deduplicates against the K1-era artifact.
    artifacts = _q(dsn, schema, "SELECT count(*) AS n FROM durable_artifacts")[0]["n"]
    with _saver(dsn, schema, DurableEncryptedSerializer(K2)) as saver:
        g = StateGraph(State)
        g.add_node("noop", lambda s: {"out": ["seen"]})
        g.add_edge(START, "noop")
        g.add_edge("noop", END)
        app = g.compile(checkpointer=saver)
        app.invoke({"doc": BIG, "out": []}, {"configurable": {"thread_id": f"{thread}-again"}})
        assert app.get_state({"configurable": {"thread_id": thread}}).values["doc"] == BIG
    assert _q(dsn, schema, "SELECT count(*) AS n FROM durable_artifacts")[0]["n"] == artifacts


def test_turning_encryption_on_mid_thread_replays_the_plain_records(dsn: str) -> None:
    """A thread written without a key, killed inside `ship`; the resume with a key finds
    the journal record and the charge under their plain fingerprints (the journal looks
    the legacy keys up in the same round trip): not called again, no conflict."""
    schema, thread = _schema("turnon"), "turn-on"
    _setup_plain(dsn, schema)
    killed = _child(dsn, schema, thread, "kill", [])
    assert killed.returncode == -signal.SIGKILL, killed.stderr[-2000:]
    assert effects(dsn, thread) == {"model": 1, "charge": 1, "ship": 1}
    resumed = _child(dsn, schema, thread, "resume", [K1])
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    out = json.loads(resumed.stdout.strip().splitlines()[-1])
    assert out.get("error") == "OutcomeUnknownError", out
    assert effects(dsn, thread) == {"model": 1, "charge": 1, "ship": 1}


def test_an_artifact_row_swapped_for_another_is_refused_naming_the_thread(dsn: str) -> None:
    """Two artifacts of one thread, both legitimately encrypted under the key: their rows'
    data swapped in SQL. The read must refuse (the content does not match its digest
    under the database's secret), not return the other value because the cipher's tag
    authenticates it (the planted-artifact attack of tests/test_archive_hostile.py)."""
    schema, thread = _schema("swap"), "swapped"
    _setup_plain(dsn, schema)
    serde = DurableEncryptedSerializer(K1)
    with _saver(dsn, schema, serde) as saver:
        g = StateGraph(State)
        g.add_node("noop", lambda s: {})
        g.add_edge(START, "noop")
        g.add_edge("noop", END)
        g.compile(checkpointer=saver).invoke({"doc": BIG, "out": ["other " * 100]}, {"configurable": {"thread_id": thread}})
    rows = _q(dsn, schema, "SELECT digest, data FROM durable_artifacts ORDER BY digest")
    assert len(rows) == 2, rows
    _q(dsn, schema, "UPDATE durable_artifacts SET data = %s WHERE digest = %s", (rows[1]["data"], rows[0]["digest"]))
    _q(dsn, schema, "UPDATE durable_artifacts SET data = %s WHERE digest = %s", (rows[0]["data"], rows[1]["digest"]))
    with _saver(dsn, schema, serde) as saver, pytest.raises(ArtifactIntegrityError) as err:
        saver.get_tuple({"configurable": {"thread_id": thread}})
    assert err.value.thread_id == thread


def test_without_a_key_nothing_is_stored_and_digests_are_plain(dsn: str) -> None:
    schema = _schema("plain")
    with _saver(dsn, schema) as saver:
        saver.setup()
        app = build(dsn, "plain", kill=False).compile(checkpointer=saver)
        app.invoke({"doc": BIG, "out": []}, {"configurable": {"thread_id": "plain"}})
    assert _q(dsn, schema, "SELECT * FROM durable_secrets") == []
    from langgraph.checkpoint.serde.jsonplus import JsonPlusSerializer

    content = _element_content(*JsonPlusSerializer().dumps_typed(BIG))
    stored = {bytes(r["digest"]) for r in _q(dsn, schema, "SELECT digest FROM durable_artifacts")}
    assert hashlib.sha256(content).digest() in stored
    (fp,) = {r["fingerprint"] for r in _q(dsn, schema, "SELECT fingerprint FROM durable_ledger WHERE name = 'charge'")}
    assert len(fp) == 64  # plain sha256 hex, as before issue 27


class _XorAead:
    """A custom cipher (no key the package can see): AES-EAX under a key of its own,
    named "toy"."""

    def __init__(self, key: bytes) -> None:
        self.key = key

    def encrypt(self, plaintext: bytes) -> tuple[str, bytes]:
        from Crypto.Cipher import AES

        c = AES.new(self.key, AES.MODE_EAX)
        ct, tag = c.encrypt_and_digest(plaintext)
        return "toy", bytes(c.nonce) + tag + ct

    def decrypt(self, ciphername: str, ciphertext: bytes) -> bytes:
        from Crypto.Cipher import AES

        c = AES.new(self.key, AES.MODE_EAX, nonce=ciphertext[:16])
        return bytes(c.decrypt_and_verify(ciphertext[32:], ciphertext[16:32]))


def test_a_custom_cipher_gets_the_stored_secret(dsn: str) -> None:
    from langgraph.checkpoint.serde.encrypted import EncryptedSerializer
    from langgraph.checkpoint.serde.jsonplus import JsonPlusSerializer

    schema = _schema("custom")
    _setup_plain(dsn, schema)
    serde = EncryptedSerializer(_XorAead(K1), JsonPlusSerializer())
    with _saver(dsn, schema, serde) as saver:
        saver.setup()
        secret = saver.codec.digest.secret
        app = build(dsn, "custom", kill=False).compile(checkpointer=saver)
        app.invoke({"doc": BIG, "out": []}, {"configurable": {"thread_id": "custom"}})
    assert secret is not None and len(secret) == 32
    (row,) = _q(dsn, schema, "SELECT sealed FROM durable_secrets")
    assert bytes(row["sealed"])[:8] == b"LGK\x02toy\x00"  # sealed through the cipher
    content = _element_content(*JsonPlusSerializer().dumps_typed(BIG))
    stored = {bytes(r["digest"]) for r in _q(dsn, schema, "SELECT digest FROM durable_artifacts")}
    space = _space("toy")
    assert _digest(content, space, secret) in stored and _digest(content, space) not in stored
    (fp,) = {r["fingerprint"] for r in _q(dsn, schema, "SELECT fingerprint FROM durable_ledger WHERE name = 'charge'")}
    assert fp == hmac.new(secret, b"langgraph-durable fingerprint\x00" + _plain_fp(fp, secret, dsn, schema).encode(),
                          hashlib.sha256).hexdigest()


def _plain_fp(fp: str, secret: bytes, dsn: str, schema: str) -> str:
    """The charge call's plain fingerprint, recomputed as idempotency/keys.py does."""
    from langgraph.checkpoint.serde.jsonplus import JsonPlusSerializer

    from langgraph_durable.idempotency.keys import _fingerprint

    return _fingerprint("charge", {"card": "4111 1111 1111 1111"}, JsonPlusSerializer())[0]


def test_concurrent_first_savers_agree_on_one_secret(dsn: str) -> None:
    schema = _schema("race")
    _setup_plain(dsn, schema)
    barrier = threading.Barrier(4)
    got: list[bytes | None] = []

    def first() -> None:
        with _saver(dsn, schema, DurableEncryptedSerializer(K1)) as saver:
            barrier.wait()
            saver.setup()
            got.append(saver.codec.digest.secret)

    workers = [threading.Thread(target=first) for _ in range(4)]
    for w in workers:
        w.start()
    for w in workers:
        w.join()
    assert len(got) == 4 and got[0] is not None and len(set(got)) == 1
    assert len(_q(dsn, schema, "SELECT * FROM durable_secrets")) == 1


def test_a_wrong_key_cannot_open_the_secret_and_writes_refuse(dsn: str) -> None:
    schema = _schema("wrong")
    _setup_plain(dsn, schema)
    with _saver(dsn, schema, DurableEncryptedSerializer(K1)) as saver:
        saver.setup()
    with _saver(dsn, schema, DurableEncryptedSerializer(K2)) as saver:
        saver.setup()  # the refusal is kept, not raised here: reads name their thread
        assert saver.get_tuple({"configurable": {"thread_id": "none"}}) is None
        app = build(dsn, "wrong", kill=False).compile(checkpointer=saver)
        with pytest.raises(DecryptionError) as err:
            app.invoke({"doc": BIG, "out": []}, {"configurable": {"thread_id": "wrong"}})
        assert "durable_secrets.digest" in str(err.value)
    assert _q(dsn, schema, "SELECT 1 FROM checkpoints WHERE thread_id = 'wrong'") == []
    _ = Keyring


async def test_an_async_saver_reads_the_secret_before_its_first_fingerprint(dsn: str) -> None:
    """An @idempotent call on an async saver that has run nothing yet (no setup(), no
    run start): the secret is read (created) before the fingerprint, on the loop."""
    from langgraph_durable import AsyncDurablePostgresSaver, idempotent

    schema = _schema("async")
    _setup_plain(dsn, schema)
    runs: list[str] = []
    async with AsyncDurablePostgresSaver.from_conn_string(
        dsn, schema=schema, serde=DurableEncryptedSerializer(K1)
    ) as saver:

        @idempotent(ledger=saver, key=lambda x: "k-" + x, name="shout")
        async def shout(x: str) -> str:
            runs.append(x)
            return x + "!"

        assert await shout("a") == "a!" and await shout("a") == "a!"
        secret = saver.codec.digest.secret
    assert runs == ["a"] and secret is not None
    (row,) = _q(dsn, schema, "SELECT fingerprint FROM durable_ledger")
    assert _sealed_kid(dsn, schema) == key_id(K1)
    assert row["fingerprint"] != _fingerprint_plain("shout", {"x": "a"})


def _fingerprint_plain(name: str, args: dict[str, Any]) -> str:
    from langgraph.checkpoint.serde.jsonplus import JsonPlusSerializer

    from langgraph_durable.idempotency.keys import _fingerprint

    return _fingerprint(name, args, JsonPlusSerializer())[0]
