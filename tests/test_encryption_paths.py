"""Issue 27, adversarial review (rev27): the canary on the paths the first canary test
(tests/test_encryption_at_rest.py) does not take.

A second workload puts the canary through a DeltaChannel conversation, deferred
checkpoints (``checkpoint_policy="defer"``), a subgraph's namespace, ``Send`` payloads,
an interrupt's question and its queued answer, ``update_state``, ``fork`` and
``copy_thread``, a graph-version migration that succeeds (its backup log row), a
failing ``@idempotent`` call whose failure is not cached, and an operator cancel; then
every row of every table is read as text (bytea raw and zstd-decompressed), as the first
test does. Without a key the canary must be found (so the scan can fail), with one
nowhere. Then the sealed rows are attacked: a sealed value swapped between two threads'
rows, and a rekey racing a copy.
"""

import operator
import uuid
from typing import Annotated, Any, TypedDict

import pytest
from langchain_core.messages import AIMessage, HumanMessage
from langgraph.channels.delta import DeltaChannel
from langgraph.checkpoint.serde.encrypted import EncryptedSerializer
from langgraph.graph import END, START, StateGraph
from langgraph.types import Send, interrupt
from test_encryption_at_rest import CANARY, KEY, Run, _cfg, _q, _scan

from langgraph_durable import idempotent
from langgraph_durable.errors import DecryptionError
from langgraph_durable.keyring import DurableEncryptedSerializer
from langgraph_durable.ops import control
from langgraph_durable.ops.migrations import migrate_threads
from langgraph_durable.versioning import MigrationRegistry

NEW_KEY = b"N" * 32


def _delta_reducer(old: list[Any] | None, new: list[Any]) -> list[Any]:
    return list(old or []) + list(new)


class Chat(TypedDict, total=False):
    messages: Annotated[list, DeltaChannel(_delta_reducer, snapshot_frequency=2)]


class Fan(TypedDict, total=False):
    items: list[str]
    done: Annotated[list[str], operator.add]
    sub: str
    answer: str


class Sub(TypedDict, total=False):
    sub: str


def _chat(saver: Any) -> Any:
    def reply(state: Chat) -> dict[str, Any]:
        return {"messages": [AIMessage(content=f"model reply {CANARY}")]}

    g = StateGraph(Chat)
    g.add_node("reply", reply)
    g.add_edge(START, "reply")
    g.add_edge("reply", END)
    return g.compile(checkpointer=saver)


def _fan(saver: Any) -> Any:
    """Send payloads, a subgraph (its own namespace), then an interrupt asking the canary."""

    def inner(state: Sub) -> dict[str, Any]:
        return {"sub": f"subgraph {CANARY}"}

    sg = StateGraph(Sub)
    sg.add_node("inner", inner)
    sg.add_edge(START, "inner")
    sg.add_edge("inner", END)
    subgraph = sg.compile()

    def fan_out(state: Fan) -> list[Send]:
        return [Send("work", {"items": [item]}) for item in state["items"]]

    def work(state: Fan) -> dict[str, Any]:
        return {"done": [f"worked {state['items'][0]}"]}

    def ask(state: Fan) -> dict[str, Any]:
        return {"answer": str(interrupt(f"question about {CANARY}"))}

    g = StateGraph(Fan)
    g.add_node("work", work)
    g.add_node("nested", subgraph)
    g.add_node("ask", ask)
    g.add_conditional_edges(START, fan_out, ["work"])
    g.add_edge("work", "nested")
    g.add_edge("nested", "ask")
    g.add_edge("ask", END)
    return g.compile(checkpointer=saver)


class Text(TypedDict, total=False):
    text: str


def _text(saver: Any) -> Any:
    def echo(state: Text) -> dict[str, Any]:
        return {"text": state["text"] + " echoed"}

    g = StateGraph(Text)
    g.add_node("echo", echo)
    g.add_edge(START, "echo")
    g.add_edge("echo", END)
    return g.compile(checkpointer=saver)


def _workload(run: Run) -> dict[str, str]:
    tag = uuid.uuid4().hex[:8]
    t = {n: f"{n}-{tag}" for n in ("chat", "defer", "fan", "upd", "mig", "copy")}
    with run.saver() as saver:
        saver.setup()
        chat = _chat(saver)
        for turn in range(3):
            chat.invoke({"messages": [HumanMessage(content=f"user turn {turn} {CANARY}")]}, _cfg(t["chat"]))
        with run.saver(checkpoint_policy="defer") as deferring:
            _chat(deferring).invoke({"messages": [HumanMessage(content=f"deferred {CANARY}")]}, _cfg(t["defer"]))
        fan = _fan(saver)
        fan.invoke({"items": [f"send {CANARY} {i}" for i in range(2)], "done": []}, _cfg(t["fan"]))
        assert fan.get_state(_cfg(t["fan"])).interrupts, "the thread waits on the question"
        control.queue_answer(saver, t["fan"], f"queued answer {CANARY}")
        # update_state on a thread of its own, then copy_thread and fork of it.
        chat.invoke({"messages": [HumanMessage(content="hello")]}, _cfg(t["upd"]))
        chat.update_state(_cfg(t["upd"]), {"messages": [AIMessage(content=f"edited {CANARY}")]}, as_node="reply")
        saver.copy_thread(t["upd"], t["copy"])
        head = saver.get_tuple(_cfg(t["upd"]))
        assert head is not None
        control.fork(saver, t["upd"], head.config["configurable"]["checkpoint_id"])

        # A failing @idempotent call, failure not cached.
        @idempotent(ledger=saver, key=lambda card: f"pay-{tag}", name="pay")
        def pay(card: str) -> None:
            raise RuntimeError(f"gateway refused {card}")

        with pytest.raises(RuntimeError):
            pay(f"card {CANARY}")
        # A migration that succeeds: the log keeps the old checkpoint, metadata, blobs.
        v1 = saver.bind(graph_version="v1")
        _chat(v1).invoke({"messages": [HumanMessage(content=f"to migrate {CANARY}")]},
                         _cfg(t["mig"], customer=f"client {CANARY}"))
        registry = MigrationRegistry()
        registry.register("v1", "v2", lambda st: {**st, "messages": [*st.get("messages", []),
                                                                     AIMessage(content=f"migrated {CANARY}")]})
        report = migrate_threads(saver, "v1", "v2", registry=registry, thread_ids=[t["mig"]])
        assert report.migrated == [t["mig"]], report
    return t


@pytest.fixture(scope="module")
def plain(dsn: str, tmp_path_factory: pytest.TempPathFactory) -> tuple[Run, dict[str, str]]:
    run = Run(dsn, "encp_plain_" + uuid.uuid4().hex[:8], tmp_path_factory.mktemp("a-plain"), None)
    return run, _workload(run)


@pytest.fixture(scope="module")
def sealed(dsn: str, tmp_path_factory: pytest.TempPathFactory) -> tuple[Run, dict[str, str]]:
    run = Run(dsn, "encp_sealed_" + uuid.uuid4().hex[:8], tmp_path_factory.mktemp("a-sealed"), KEY, "rotating")
    return run, _workload(run)


def test_without_a_key_the_canary_is_readable(plain: tuple[Run, dict[str, str]]) -> None:
    found = _scan(plain[0], needles=(CANARY.encode(),))
    for place in ("checkpoint_writes.blob", "checkpoint_blobs.blob", "checkpoints.metadata",
                  "durable_migration_log.old_metadata", "durable_threads.answer_blob"):
        assert place in found, (place, sorted(found))


def test_with_a_key_the_canary_is_nowhere(sealed: tuple[Run, dict[str, str]]) -> None:
    found = _scan(sealed[0], needles=(CANARY.encode(),))
    assert found == {}, f"the canary is readable in {found}"


def test_with_the_key_every_path_reads_back(sealed: tuple[Run, dict[str, str]]) -> None:
    run, t = sealed
    with run.saver() as saver:
        for name in ("chat", "copy", "upd"):
            msgs = _chat(saver).get_state(_cfg(t[name])).values["messages"]
            assert CANARY in str(msgs), (name, msgs)
        fan = _fan(saver).get_state(_cfg(t["fan"]))
        assert len(fan.values["done"]) == 2 and CANARY in fan.values["sub"]


def _sealed_text_row(run: Run, thread: str) -> str:
    rows = _q(run, "SELECT last_error FROM durable_threads WHERE thread_id = %s", thread)
    assert rows and rows[0][0] and rows[0][0].startswith("lgd:sealed:v1:"), rows
    return str(rows[0][0])


@pytest.mark.xfail(strict=True, reason="rev27: the package's sealed columns are not bound to their row "
                   "(AES-EAX without associated data): a sealed value moved to another thread's row "
                   "opens there as that thread's value (docs/encryption.md now says so; associated "
                   "data is the proposed fix)")
def test_a_sealed_value_swapped_between_threads_is_refused(sealed: tuple[Run, dict[str, str]]) -> None:
    """Someone with write access to the tables (not the key) copies thread B's sealed
    metadata into thread A's checkpoint: A must not read B's value as its own."""
    run, t = sealed
    a, b = t["chat"], t["mig"]
    (md_b,) = _q(run, "SELECT metadata ->> 'lgd:sealed' FROM checkpoints WHERE thread_id = %s "
                      "AND metadata ? 'lgd:sealed' ORDER BY checkpoint_id DESC LIMIT 1", b)[0]
    _q(run, "UPDATE checkpoints SET metadata = jsonb_set(metadata, '{lgd:sealed}', to_jsonb(%s::text)) "
            "WHERE thread_id = %s", md_b, a)
    with run.saver() as saver:
        with pytest.raises(DecryptionError) as got:
            saver.get_tuple(_cfg(a))
        assert got.value.thread_id == a


def test_rekey_beside_a_copy_thread_leaves_nothing_under_the_old_key(dsn: str, tmp_path: Any) -> None:
    """A rekey walks checkpoint_blobs in thread order; a copy_thread that runs while it
    walks copies rows (in SQL, as they are) from a thread the walk has not reached into
    one it has passed. After the rekey reports done, the old key is dropped (what the
    rotation is for): every thread must still read."""
    from langgraph_durable.ops.rekey import rekey

    run = Run(dsn, "encp_race_" + uuid.uuid4().hex[:8], tmp_path, KEY, "langgraph")
    source, target = "zz-source", "aa-target"
    with run.saver() as saver:
        saver.setup()
        _text(saver).invoke({"text": f"old key {CANARY}"}, _cfg(source))
        _text(saver).invoke({"text": "first"}, _cfg("ab-other"))
    rotating = DurableEncryptedSerializer(current=NEW_KEY, old=[KEY])
    from langgraph_durable import DurablePostgresSaver

    copied: list[int] = []
    with DurablePostgresSaver.from_conn_string(dsn, schema=run.schema, serde=rotating) as both:

        def progress(done: int, total: int) -> None:
            if not copied:  # after the first page (thread "ab-other" rekeyed, "zz-source" not yet)
                both.copy_thread(source, target)
                copied.append(done)

        report = rekey(both, batch_size=1, progress=progress)
    assert copied
    new_only = DurableEncryptedSerializer(current=NEW_KEY)
    with DurablePostgresSaver.from_conn_string(dsn, schema=run.schema, serde=new_only) as fresh:
        for thread in (source, "ab-other", target):
            got = fresh.get_tuple(_cfg(thread))
            assert got is not None, thread
    assert report.passes >= 2, report  # the copy was re-encrypted by a later walk


def test_a_wrong_key_retried_never_quarantines(dsn: str, tmp_path: Any) -> None:
    """A worker or a caller configured with the wrong key (a half-rolled-out rotation)
    retries a thread again and again: each run start fails with DecryptionError naming
    the thread, and the thread is never quarantined nor its attempts spent (the key is
    a configuration problem, not the checkpoint's)."""
    from test_encryption_at_rest import OTHER_KEY

    run = Run(dsn, "encp_retry_" + uuid.uuid4().hex[:8], tmp_path, KEY, "langgraph")
    thread = "retried"
    with run.saver() as saver:
        saver.setup()
        _text(saver).invoke({"text": f"kept {CANARY}"}, _cfg(thread))
    with run.saver(OTHER_KEY) as wrong:
        for _ in range(4):  # max_resume_attempts=1
            with pytest.raises(DecryptionError) as got:
                _text(wrong).invoke(None, _cfg(thread))
            assert got.value.thread_id == thread
    rows = _q(run, "SELECT status, attempts FROM durable_threads WHERE thread_id = %s", thread)
    assert rows and rows[0][0] != "quarantined", rows
    assert not _q(run, "SELECT 1 FROM durable_quarantine WHERE thread_id = %s", thread)
    with run.saver() as saver:
        assert _text(saver).invoke(None, _cfg(thread)) is not None


def test_a_worker_with_the_wrong_key_never_quarantines(dsn: str, tmp_path: Any) -> None:
    """A RecoveryWorker deployed with the wrong key claims a thread left to recover
    (here one in 'error', its node failed once) again and again: never quarantined,
    and the right key's worker then runs it."""
    from test_encryption_at_rest import OTHER_KEY

    from langgraph_durable import RecoveryWorker

    run = Run(dsn, "encp_worker_" + uuid.uuid4().hex[:8], tmp_path, KEY, "langgraph")
    thread = "to-recover"
    flaky = tmp_path / "flaky"

    def build(saver: Any) -> Any:
        def step(state: Text) -> dict[str, Any]:
            if not flaky.exists():
                flaky.write_text("failed once")
                raise RuntimeError(f"transient {CANARY}")
            return {"text": state["text"] + " done"}

        g = StateGraph(Text)
        g.add_node("step", step)
        g.add_edge(START, "step")
        g.add_edge("step", END)
        return g.compile(checkpointer=saver)

    from langgraph_durable import DurablePostgresSaver

    def saver_with(key: bytes) -> Any:
        return DurablePostgresSaver.from_conn_string(
            dsn, schema=run.schema, serde=EncryptedSerializer.from_pycryptodome_aes(key=key), max_resume_attempts=3
        )

    with saver_with(KEY) as saver:
        saver.setup()
        with pytest.raises(RuntimeError):
            build(saver).invoke({"text": "x"}, _cfg(thread))
    outcomes: list[Any] = []
    with saver_with(OTHER_KEY) as wrong:
        worker = RecoveryWorker(build(wrong), error_backoff=0.0, max_error_backoff=0.0, register=False)
        for _ in range(5):
            _q(run, "UPDATE durable_threads SET updated_at = now() - interval '1 hour' WHERE thread_id = %s", thread)
            result = worker.recover_one()
            if result is None:
                break
            assert result.outcome != "quarantined", result
            outcomes.append(result)
    assert len(outcomes) >= 4, outcomes  # it was claimed each time (and refused)
    rows = _q(run, "SELECT status, attempts FROM durable_threads WHERE thread_id = %s", thread)
    assert rows and rows[0][0] != "quarantined", (rows, outcomes, _q(run, "SELECT reason, last_error FROM durable_quarantine"))
    assert not _q(run, "SELECT 1 FROM durable_quarantine WHERE thread_id = %s", thread)
    with saver_with(KEY) as saver:
        worker = RecoveryWorker(build(saver), error_backoff=0.0, max_error_backoff=0.0, register=False)
        _q(run, "UPDATE durable_threads SET updated_at = now() - interval '1 hour' WHERE thread_id = %s", thread)
        result = worker.recover_one()
        assert result is not None and result.status == "done", result


def test_a_wrong_key_is_typed_on_the_other_read_paths(sealed: tuple[Run, dict[str, str]]) -> None:
    """The read paths the first canary test does not try: history, a DeltaChannel's
    ancestors, a subgraph's namespace, a fork. (inspection.thread_history reads only
    what is in the clear: no key needed.)"""
    from test_encryption_at_rest import OTHER_KEY

    run, t = sealed
    with run.saver(OTHER_KEY) as wrong:
        attempts: dict[str, Any] = {
            "history": lambda: list(_chat(wrong).get_state_history(_cfg(t["chat"]))),
            "delta state": lambda: _chat(wrong).get_state(_cfg(t["chat"])),
            "subgraph state": lambda: _fan(wrong).get_state(_cfg(t["fan"]), subgraphs=True),
            "fork": lambda: control.fork(wrong, t["upd"], wrong_head(wrong)),
        }

        def wrong_head(saver: Any) -> str:
            rows = _q(run, "SELECT max(checkpoint_id) FROM checkpoints WHERE thread_id = %s", t["upd"])
            return str(rows[0][0])

        failures = {}
        for name, attempt in attempts.items():
            try:
                attempt()
                failures[name] = "no error"
            except DecryptionError as exc:
                if exc.thread_id not in t.values():
                    failures[name] = f"DecryptionError naming {exc.thread_id!r}"
            except Exception as exc:
                failures[name] = f"{type(exc).__name__}: {exc}"[:300]
        assert not failures, failures


def test_a_queued_answer_met_by_a_wrong_key_worker_is_typed(dsn: str, tmp_path: Any) -> None:
    """A queued answer (issue 25) run by a worker with the wrong key: a DecryptionError
    naming the thread, the answer kept for the right key's worker, never quarantined."""
    from test_encryption_at_rest import OTHER_KEY

    from langgraph_durable import DurablePostgresSaver, RecoveryWorker

    def saver_with(key: bytes) -> Any:
        return DurablePostgresSaver.from_conn_string(
            dsn, schema=schema, serde=EncryptedSerializer.from_pycryptodome_aes(key=key), max_resume_attempts=2
        )

    schema = "encp_answer_" + uuid.uuid4().hex[:8]
    thread = "asks"
    with saver_with(KEY) as saver:
        saver.setup()
        fan = _fan(saver)
        fan.invoke({"items": ["a"], "done": []}, _cfg(thread))
    # A console without the key cannot queue (its serializer would store it in the clear).
    with DurablePostgresSaver.from_conn_string(dsn, schema=schema) as keyless:
        with pytest.raises(DecryptionError):
            control.queue_answer(keyless, thread, f"keyless {CANARY}")
    with saver_with(KEY) as saver:
        control.queue_answer(saver, thread, f"answer {CANARY}")
    assert _q(Run(dsn, schema, tmp_path, None), "SELECT answer_type FROM durable_threads WHERE thread_id = %s",
              thread)[0][0].endswith("+aes")
    outcomes = []
    with saver_with(OTHER_KEY) as wrong:
        worker = RecoveryWorker(_fan(wrong), register=False)
        for _ in range(4):
            result = worker.recover_one()
            if result is None:
                break
            outcomes.append(result)
    assert outcomes, "the wrong key's worker never claimed it"
    for result in outcomes:
        assert result.status != "quarantined", result
        assert (result.error or "").startswith("DecryptionError") and thread in (result.error or ""), result
    with saver_with(KEY) as saver:
        result = RecoveryWorker(_fan(saver), register=False).recover_one()
        assert result is not None and result.status == "done", result
        assert _fan(saver).get_state(_cfg(thread)).values["answer"] == f"answer {CANARY}"


def test_an_operator_without_the_key_cannot_store_plaintext(dsn: str, tmp_path: Any,
                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    """`ledger resolve` (the CLI, and the console's form: both Ledger.resolve) run
    without the key on an encrypted database: the operator's value would be stored by
    a serializer without a key, in the clear, in a row whose arguments are sealed. It
    must be refused (DecryptionError: the key is needed), nothing written."""
    from test_encryption_at_rest import _interrupted
    from typer.testing import CliRunner

    from langgraph_durable import Ledger
    from langgraph_durable.cli import app

    monkeypatch.delenv("LANGGRAPH_DURABLE_KEY_FILE", raising=False)
    run = Run(dsn, "encp_resolve_" + uuid.uuid4().hex[:8], tmp_path, KEY, "langgraph")
    key = "refund-by-operator"
    with run.saver() as saver:
        saver.setup()
        _interrupted(saver, key)
    result = CliRunner().invoke(app, ["ledger", "resolve", key, "--result-json",
                                      f'{{"refunded": "{CANARY}"}}', "--dsn", dsn, "--schema", run.schema])
    assert CANARY not in result.output
    assert _scan(run, needles=(CANARY.encode(),)) == {}, "the operator's value is stored in the clear"
    assert result.exit_code != 0 and "key" in result.output, result.output
    from langgraph_durable import DurablePostgresSaver

    with DurablePostgresSaver.from_conn_string(dsn, schema=run.schema) as keyless:
        with pytest.raises(DecryptionError):
            Ledger(keyless).resolve(key, {"refunded": CANARY})
    with run.saver() as saver:  # with the key it resolves, sealed
        Ledger(saver).resolve(key, {"refunded": CANARY})
        assert Ledger(saver).result(key) == {"refunded": CANARY}
    assert _scan(run, needles=(CANARY.encode(),)) == {}


def test_an_archive_of_the_old_key_restored_after_rekey_reads_with_the_new_key_alone(
    dsn: str, tmp_path: Any,
) -> None:
    from langgraph_durable import DurablePostgresSaver
    from langgraph_durable.archive import restore
    from langgraph_durable.ops.rekey import rekey
    from langgraph_durable.ops.retention import retain

    run = Run(dsn, "encp_arch_" + uuid.uuid4().hex[:8], tmp_path / "archive", KEY, "langgraph")
    thread = "archived-old"
    with run.saver() as saver:
        saver.setup()
        _text(saver).invoke({"text": f"archived {CANARY}"}, _cfg(thread, customer=CANARY))
    _q(run, "UPDATE checkpoints SET checkpoint = jsonb_set(checkpoint, '{ts}', "
            "to_jsonb('2000-01-01T00:00:00.000000+00:00'::text)) WHERE thread_id = %s", thread)
    _q(run, "UPDATE durable_threads SET updated_at = now() - interval '40 days' WHERE thread_id = %s", thread)
    rotating = DurableEncryptedSerializer(current=NEW_KEY, old=[KEY])
    with DurablePostgresSaver.from_conn_string(dsn, schema=run.schema, serde=rotating) as both:
        assert retain(both, older_than_days=30, archive=str(run.archive)).threads_archived == 1
        rekey(both)
        restore(both, str(run.archive))  # with both keys: the archive opens
    with DurablePostgresSaver.from_conn_string(
        dsn, schema=run.schema, serde=DurableEncryptedSerializer(current=NEW_KEY)
    ) as new_only:
        got = new_only.get_tuple(_cfg(thread))
        assert got is not None and got.metadata["customer"] == CANARY
        assert got.checkpoint["channel_values"]["text"] == f"archived {CANARY} echoed"
    # review27, fixed: restore re-seals what the archive holds under an old key with the
    # current one (archive._resealed), so nothing restored needs the dropped key.


def test_a_killed_rekey_rerun_with_another_key_set(dsn: str, tmp_path: Any) -> None:
    """rekey OLD->NEW SIGKILLed mid-walk; the operator reruns it with NEW2 first and
    OLD forgotten: a typed refusal naming a thread and the column (exit 1), nothing
    garbled; rerun with all three keys it finishes, and NEW2 alone reads every thread."""
    import json
    import os
    import signal
    import subprocess
    import sys
    import time
    from pathlib import Path

    from test_rekey import NEW, OLD, _key_file
    from typer.testing import CliRunner

    from langgraph_durable import DurablePostgresSaver
    from langgraph_durable.cli import app

    new2 = b"newer-key-0123456789abcdef012345"
    threads = [f"kill-{i:02d}" for i in range(12)]
    with DurablePostgresSaver.from_conn_string(dsn, serde=DurableEncryptedSerializer(OLD)) as saver:
        for tid in threads:
            _text(saver).invoke({"text": f"{tid} {CANARY}"}, _cfg(tid, customer=tid))
    marker = tmp_path / "marker"
    marker.write_text("")
    here = Path(__file__).parent
    child = subprocess.Popen(
        [sys.executable, str(here / "_child_rekey.py"), dsn, _key_file(tmp_path, NEW, OLD), str(marker)],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, env={**os.environ, "PYTHONPATH": str(here)},
    )
    deadline = time.monotonic() + 120
    while len(marker.read_text().splitlines()) < 20:
        assert child.poll() is None, child.communicate()
        assert time.monotonic() < deadline, "the rekey child made no progress"
        time.sleep(0.01)
    os.kill(child.pid, signal.SIGKILL)
    child.wait()
    runner = CliRunner()
    partial_keys = _key_file(tmp_path, new2, NEW)
    result = runner.invoke(app, ["rekey", "--dsn", dsn, "--key-file", partial_keys, "--json"])
    assert result.exit_code == 1, result.output
    err = json.loads(result.output)
    assert err["error"] in ("DecryptionError", "RekeyError"), err
    assert err.get("thread_id") in threads or err.get("where"), err
    every = DurableEncryptedSerializer(new2, old=[NEW, OLD])
    with DurablePostgresSaver.from_conn_string(dsn, serde=every) as saver:
        for tid in threads:
            assert _text(saver).get_state(_cfg(tid)).values["text"] == f"{tid} {CANARY} echoed"
    result = runner.invoke(app, ["rekey", "--dsn", dsn, "--key-file", _key_file(tmp_path, new2, NEW, OLD), "--json"])
    assert result.exit_code == 0, result.output
    with DurablePostgresSaver.from_conn_string(dsn, serde=DurableEncryptedSerializer(new2)) as saver:
        for tid in threads:
            state = _text(saver).get_state(_cfg(tid))
            assert state.values["text"] == f"{tid} {CANARY} echoed" and state.metadata["customer"] == tid


@pytest.mark.parametrize("with_key", [False, True], ids=["no-key", "key"])
def test_every_console_page_on_the_sealed_paths(sealed: tuple[Run, dict[str, str]], with_key: bool) -> None:
    """Each console page over the second workload's threads (a DeltaChannel chat, a
    subgraph and a queued answer, a fork, a migration): 200, no traceback; without the
    key no canary and the "encrypted" notice, with it the values opened."""
    from starlette.testclient import TestClient

    from langgraph_durable import DurablePostgresSaver
    from langgraph_durable.console import create_app

    run, t = sealed
    serde = DurableEncryptedSerializer(KEY, old=[b"0" * 32]) if with_key else None
    paths = ["/", "/threads", "/quarantine", "/ledger?show=all", "/versions", "/storage", "/audit",
             *(f"/thread?id={tid}" for tid in t.values())]
    with DurablePostgresSaver.from_conn_string(run.dsn, schema=run.schema, serde=serde) as saver:
        with TestClient(create_app(saver, sample_interval=0)) as client:
            pages = {p: client.get(p) for p in paths}
    for path, r in pages.items():
        assert r.status_code == 200, (path, r.text[:300])
        assert "Traceback" not in r.text, path
        if not with_key:
            assert CANARY not in r.text, path
    if with_key:
        page = pages[f"/thread?id={t['chat']}"].text
        assert 'id="encrypted"' not in page and "DecryptionError" not in page, page[-3000:]
        assert "HumanMessage" in page  # the preview, opened (cut before the canary)


class Count(TypedDict, total=False):
    n: int
    log: Annotated[list[str], operator.add]


def test_rekey_beside_a_live_run_loses_nothing(dsn: str, tmp_path: Any) -> None:
    """A run keeps writing (a new key first, the old one listed) while rekey walks one
    row per transaction: every step's write lands once, nothing is left under the old
    key, and the new key alone reads the whole history."""
    import threading

    from langgraph_durable import DurablePostgresSaver
    from langgraph_durable.ops.rekey import rekey

    schema = "encp_live_" + uuid.uuid4().hex[:8]
    old_serde = EncryptedSerializer.from_pycryptodome_aes(key=KEY)
    rotating = DurableEncryptedSerializer(current=NEW_KEY, old=[KEY])

    def counter(saver: Any) -> Any:
        def bump(state: Count) -> dict[str, Any]:
            return {"n": state.get("n", 0) + 1, "log": [f"step {state.get('n', 0)} {CANARY}"]}

        g = StateGraph(Count)
        g.add_node("bump", bump)
        g.add_edge(START, "bump")
        g.add_edge("bump", END)
        return g.compile(checkpointer=saver)

    with DurablePostgresSaver.from_conn_string(dsn, schema=schema, serde=old_serde) as saver:
        saver.setup()
        for i in range(6):
            counter(saver).invoke({"n": 0, "log": []}, _cfg(f"old-{i}"))
        counter(saver).invoke({"n": 0, "log": []}, _cfg("live"))
    turns = 25
    errors: list[BaseException] = []

    def live() -> None:
        try:
            with DurablePostgresSaver.from_conn_string(dsn, schema=schema, serde=rotating) as saver:
                graph = counter(saver)
                for _ in range(turns):
                    graph.invoke({}, _cfg("live"))
        except BaseException as exc:  # reported below
            errors.append(exc)

    runner = threading.Thread(target=live)
    with DurablePostgresSaver.from_conn_string(dsn, schema=schema, serde=rotating) as saver:
        runner.start()
        report = rekey(saver, batch_size=1)
        runner.join(timeout=120)
    assert not errors, errors
    assert report.rekeyed > 0
    with DurablePostgresSaver.from_conn_string(
        dsn, schema=schema, serde=DurableEncryptedSerializer(current=NEW_KEY)
    ) as fresh:
        graph = counter(fresh)
        state = graph.get_state(_cfg("live"))
        assert state.values["n"] == turns + 1 and len(state.values["log"]) == turns + 1
        assert len(list(graph.get_state_history(_cfg("live")))) >= 3 * (turns + 1)
        for i in range(6):
            assert graph.get_state(_cfg(f"old-{i}")).values["n"] == 1
