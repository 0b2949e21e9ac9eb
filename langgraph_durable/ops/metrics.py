"""The queue-depth gauge (``langgraph_durable_threads{status=...}``) for Prometheus.

It lives here, above telemetry.py, because it runs an op of recovery.py on a saver;
telemetry.py itself sits below everything it instruments (saver, ledger, worker) and
imports none of them.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Iterator
from typing import Any

from langgraph_durable import telemetry
from langgraph_durable._io import Batch, Stmt
from langgraph_durable._view import SaverView
from langgraph_durable.recovery import _op_status_counts
from langgraph_durable.sql.inspection import STATEMENT_TIMEOUT_SQL

logger = logging.getLogger("langgraph_durable.telemetry")


class _QueueCollector:
    """Threads by status (``langgraph_durable_threads{status=...}``), queried on scrape:
    one grouped count under a statement timeout, cached for ``min_interval`` seconds so
    frequent scrapes (several Prometheus replicas) cost one query."""

    def __init__(self, saver: SaverView, *, timeout: float = 2.0, min_interval: float = 5.0) -> None:
        self.saver = saver
        self.timeout = timeout
        self.min_interval = min_interval
        self._cached: tuple[float, dict[str, int]] | None = None
        self._lock = threading.Lock()

    def _counts(self) -> dict[str, int] | None:
        def op() -> Any:
            ms = max(int(self.timeout * 1000), 1)
            yield Batch([Stmt(STATEMENT_TIMEOUT_SQL, (f"{ms}ms",))])
            return (yield from _op_status_counts())

        with self._lock:
            now = time.monotonic()
            if self._cached is not None and now - self._cached[0] < self.min_interval:
                return self._cached[1]
            try:
                counts = self.saver.run_op(op)
            except Exception as exc:
                logger.warning("queue depth query failed: %s", exc)
                return self._cached[1] if self._cached is not None else None
            self._cached = (now, counts)
            return counts

    def collect(self) -> Iterator[Any]:
        from prometheus_client.core import GaugeMetricFamily

        family = GaugeMetricFamily(
            f"{telemetry.PREFIX}_threads", "Threads by status (queue depth), counted on scrape.", labels=["status"]
        )
        for status, n in sorted((self._counts() or {}).items()):
            family.add_metric([status], n)
        yield family


def register_queue_collector(saver: SaverView, **options: Any) -> Any:
    """Add the queue-depth gauge for ``saver``'s database to the default registry."""
    if not telemetry.HAS_PROMETHEUS:
        return None
    from prometheus_client import REGISTRY

    collector = _QueueCollector(saver, **options)
    REGISTRY.register(collector)
    return collector
