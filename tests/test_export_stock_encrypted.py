"""``export_stock`` with encryption at rest on (issue 27): what it writes, the stock
``PostgresSaver`` given the same serializer reads exactly as the durable saver did (values,
history, pending writes, metadata), and goes on with the threads; the serializer's
encryption of the values stays (blobs and writes are still ``<type>+aes``)."""

# No `from __future__ import annotations`: LangGraph evaluates the local state schemas.

from typing import Any

import psycopg
import pytest
from _db import q
from langgraph.checkpoint.postgres import PostgresSaver
from langgraph.checkpoint.serde.encrypted import EncryptedSerializer
from langgraph.types import Command
from psycopg.rows import dict_row
from test_export_stock import cfg, chat_graph, state_view, write_threads

from langgraph_durable import DurablePostgresSaver
from langgraph_durable.export import compare_snapshots, export_stock, snapshot_thread
from langgraph_durable.keyring import DurableEncryptedSerializer

KEY = b"export-key-0123456789abcdef01234"


@pytest.mark.parametrize("kind", ["durable", "langgraph"])
def test_stock_saver_with_the_same_serializer_reads_the_export(dsn: str, kind: str) -> None:
    serde: Any = DurableEncryptedSerializer(KEY) if kind == "durable" else EncryptedSerializer.from_pycryptodome_aes(key=KEY)
    with DurablePostgresSaver.from_conn_string(dsn, serde=serde) as saver:
        builders = write_threads(saver)
        meta = chat_graph().compile(checkpointer=saver)
        meta.invoke({"messages": []}, {"configurable": {"thread_id": "exp-meta"}, "metadata": {"customer": "Ada"}})
        builders["exp-meta"] = chat_graph
        tids = sorted(builders)
        before = {tid: state_view(builders[tid]().compile(checkpointer=saver), tid) for tid in tids}
        tuples = {tid: snapshot_thread(saver, tid) for tid in tids}
        report = export_stock(saver, thread_ids=tids)
    assert report.ok and report.totals()["threads_changed"] == len(tids)
    with psycopg.connect(dsn, autocommit=True, prepare_threshold=0, row_factory=dict_row) as conn:
        stock = PostgresSaver(conn, serde=serde)
        for tid in tids:
            assert compare_snapshots(tuples[tid], snapshot_thread(stock, tid)) == [], tid
            after = state_view(builders[tid]().compile(checkpointer=stock), tid)
            assert after["state"] == before[tid]["state"], tid
            assert after["history"] == before[tid]["history"], tid
        chat = chat_graph().compile(checkpointer=stock)
        assert chat.invoke(Command(resume="stock yes"), cfg("exp-chat"))["answer"] == "stock yes"
    # The values are still encrypted by the serializer (what the stock saver stores).
    types = {r["type"] for r in q(dsn, "SELECT DISTINCT type FROM checkpoint_blobs WHERE thread_id = ANY(%s)", (tids,))}
    assert types and all(t == "empty" or t.endswith("+aes") for t in types), types
    q(dsn, "DELETE FROM checkpoints; DELETE FROM checkpoint_blobs; DELETE FROM checkpoint_writes")
