"""Behaviour that a LangGraph suite test checks through a stock-private hook, checked here
for the durable savers through the database instead (see run.py KNOWN_DIFFERENCES).

``langgraph-checkpoint-postgres`` ``test_get_checkpoint_no_channel_values`` monkeypatches
``PostgresSaver._load_checkpoint_tuple`` to drop ``channel_values`` from the loaded row, i.e.
a checkpoint stored by an old version without that key. The durable saver has no such
method; the same stored row is made here with SQL and read back by both durable savers.
"""

from __future__ import annotations

from typing import Any

import psycopg
from langgraph.checkpoint.base import create_checkpoint, empty_checkpoint

from langgraph_durable import AsyncDurablePostgresSaver, DurablePostgresSaver


def _config(thread: str) -> Any:
    return {"configurable": {"thread_id": thread, "checkpoint_ns": "", "__super_private_key": "x"}}


def _strip_channel_values(dsn: str, thread: str) -> None:
    with psycopg.connect(dsn, autocommit=True) as conn:
        cur = conn.execute(
            "UPDATE checkpoints SET checkpoint = checkpoint - 'channel_values' WHERE thread_id = %s",
            (thread,),
        )
        assert cur.rowcount == 1


def test_sync_checkpoint_without_channel_values(dsn: str) -> None:
    with DurablePostgresSaver.from_conn_string(dsn) as saver:
        saver.put(_config("no-cv-sync"), create_checkpoint(empty_checkpoint(), {}, 1), {}, {})
        _strip_channel_values(dsn, "no-cv-sync")
        got = saver.get_tuple(_config("no-cv-sync"))
        assert got is not None and got.checkpoint["channel_values"] == {}
        listed = list(saver.list({"configurable": {"thread_id": "no-cv-sync"}}))
        assert [t.checkpoint["channel_values"] for t in listed] == [{}]


async def test_async_checkpoint_without_channel_values(dsn: str) -> None:
    async with AsyncDurablePostgresSaver.from_conn_string(dsn) as saver:
        await saver.aput(_config("no-cv-async"), create_checkpoint(empty_checkpoint(), {}, 1), {}, {})
        _strip_channel_values(dsn, "no-cv-async")
        got = await saver.aget_tuple(_config("no-cv-async"))
        assert got is not None and got.checkpoint["channel_values"] == {}
        listed = [t async for t in saver.alist({"configurable": {"thread_id": "no-cv-async"}})]
        assert [t.checkpoint["channel_values"] for t in listed] == [{}]
