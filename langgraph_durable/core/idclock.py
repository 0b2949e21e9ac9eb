"""The checkpoint-id clock (issue 11, clock skew)."""

from __future__ import annotations

import logging
import threading
import time
import uuid
from typing import Any

logger = logging.getLogger("langgraph_durable")


# LangGraph makes checkpoint ids with uuid6 from this machine's clock and the latest
# checkpoint is the greatest id. A resumer whose clock is behind the head's writer would
# write ids that sort before the head, and a later load would resume from the old head
# and run its steps again. So whenever a checkpoint is loaded, LangGraph's uuid6
# generator (which never goes backwards within a process: _last_v6_timestamp) is moved
# past it: every id this process makes afterwards sorts after everything it has read,
# whatever the skew, with no waiting. durable_checkpoint_order (SQL, in every put) is the
# backstop: a put that would still sort before its head is refused (ClockSkewError).
_UUID_EPOCH_100NS = 0x01B21DD213814000


_ID_CLOCK_LOCK = threading.Lock()


def _uuid6_ticks(checkpoint_id: Any) -> int | None:
    """The 100-ns timestamp of a uuid6 checkpoint id (None for any other id)."""
    try:
        u = uuid.UUID(str(checkpoint_id))
    except (ValueError, TypeError):
        return None
    if u.version != 6:
        return None
    n = u.int
    return (((n >> 80) & 0xFFFFFFFFFFFF) << 12) | ((n >> 64) & 0x0FFF)


def _advance_id_clock(checkpoint_id: Any) -> None:
    """Make LangGraph's next uuid6 ids sort after ``checkpoint_id``."""
    ticks = _uuid6_ticks(checkpoint_id)
    if ticks is None:
        return
    now = time.time_ns() // 100 + _UUID_EPOCH_100NS
    if ticks < now:
        return  # our clock is past it already: the common case, nothing to do
    import importlib

    id_module = importlib.import_module("langgraph.checkpoint.base.id")
    with _ID_CLOCK_LOCK:
        last = getattr(id_module, "_last_v6_timestamp", None)
        if last is None or ticks > last:
            id_module._last_v6_timestamp = ticks  # type: ignore[attr-defined]
            if ticks - now > 10_000_000:
                logger.warning(
                    "checkpoint %s was written by a clock %.3f s ahead of this machine's; "
                    "this process's checkpoint ids now continue after it",
                    checkpoint_id, (ticks - now) / 1e7,
                )
