"""The checkpointer factory ``langgraph.json`` points at.

``langgraph dev`` (langgraph-api) imports this file, calls ``make_checkpointer()`` once
per event loop and enters the async context manager it returns: the saver opens its
connection pool, creates or migrates its tables, and is closed when the server stops.

Database: ``LANGGRAPH_DURABLE_DSN`` when set, else the embedded PostgreSQL the package
starts under ``~/.local/share/langgraph-durable`` (``LANGGRAPH_DURABLE_HOME`` moves it).

Use the ``"./checkpointer.py:make_checkpointer"`` form in ``langgraph.json``: with
langgraph-api 0.16.x the ``"package.module:factory"`` form does not load.
"""

from __future__ import annotations

import os
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from langgraph_durable import AsyncDurablePostgresSaver


@asynccontextmanager
async def make_checkpointer() -> AsyncIterator[AsyncDurablePostgresSaver]:
    """Open the durable saver for the server's lifetime.

    ``on_busy="wait"``: the server may start a thread's next run (an enqueued or a
    rollback run) while the previous one is still releasing its lease; wait for it
    instead of failing the run with ``ThreadBusyError``.
    """
    async with AsyncDurablePostgresSaver.from_conn_string(
        # The embedded PostgreSQL only when chosen: here, when no server is configured.
        os.environ.get("LANGGRAPH_DURABLE_DSN") or "embedded",
        on_busy="wait",
        busy_timeout=float(os.environ.get("LANGGRAPH_DURABLE_BUSY_TIMEOUT", "60")),
    ) as saver:
        await saver.setup()
        yield saver
