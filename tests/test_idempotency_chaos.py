"""Chaos: SIGKILL pipelines of payment-like effects at random moments, resume them until
done, and count the payments.

Each child process (tests/_child_idempotency.py) runs many pipeline threads at once; the
parent kills it at a random moment, starts a new child that resumes every unfinished
thread, and repeats; a last child is left to finish. A *trial* is one pipeline thread
that was in flight when at least one SIGKILL landed.

* stock PostgresSaver, no wrapper: a node killed after its payment and before its
  checkpoint runs again from its first line: duplicates (asserted > 0, so the test can
  fail).
* the package with ``@idempotent``: 0 duplicated and 0 missing payments, every final
  state equal to an uncrashed run of the same order. A kill between a payment and its
  record surfaces as ``OutcomeUnknownError``; the child reconciles it like the docs tell
  an operator to (look the payment up by its key, then resolve or forget).
* ``@idempotent(transactional=True)``: the payment is written on the ledger's
  transaction and the function keeps working inside it, so kills land inside the
  function itself: still 0 duplicated and 0 missing, no unknown outcome at all.
"""

from __future__ import annotations

import json
import os
import queue
import random
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from typing import Any

import psycopg
import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
CHILD = os.path.join(HERE, "_child_idempotency.py")
sys.path.insert(0, HERE)
import _child_idempotency as child  # noqa: E402

pytestmark = pytest.mark.chaos

SEED = int(os.environ.get("IDEM_CHAOS_SEED", "20260503"))


@dataclass
class Figures:
    mode: str
    threads: int = 0
    kills: int = 0
    interrupted: int = 0  # thread-runs in flight at a kill, summed over kills
    trials: int = 0  # threads interrupted at least once
    unknown: int = 0  # OutcomeUnknownError seen and reconciled
    unknown_found: int = 0  # ... of which the payment had gone through (resolved)
    errors: list[str] = field(default_factory=list)
    final: dict[str, Any] = field(default_factory=dict)


class Child:
    """A child process with a reader thread, so the parent never blocks on its pipe."""

    def __init__(self, dsn: str, spec: dict[str, Any]) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, CHILD, "chaos", json.dumps(spec)],
            env={**os.environ, "IDEM_DSN": dsn},
            stdout=subprocess.PIPE,
            text=True,
        )
        self.events: queue.Queue[dict[str, Any] | None] = queue.Queue()
        self.reader = threading.Thread(target=self._read, daemon=True)
        self.reader.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            line = line.strip()
            if line.startswith("{"):
                self.events.put(json.loads(line))
        self.events.put(None)

    def next(self, timeout: float) -> dict[str, Any] | None:
        return self.events.get(timeout=timeout)

    def drain(self) -> list[dict[str, Any]]:
        out = []
        while True:
            try:
                ev = self.events.get_nowait()
            except queue.Empty:
                return out
            if ev is not None:
                out.append(ev)


def run_chaos(dsn: str, mode: str, threads: list[list[str]], kills: int, rng: random.Random,
              first_kill: tuple[float, float], later_kills: tuple[float, float]) -> Figures:
    figures = Figures(mode=mode, threads=len(threads))
    done: dict[str, Any] = {}
    hit: set[str] = set()

    def absorb(events: list[dict[str, Any]]) -> None:
        for ev in events:
            if ev["event"] == "done":
                done[ev["thread_id"]] = ev["state"]
            elif ev["event"] == "unknown":
                figures.unknown += 1
                figures.unknown_found += int(bool(ev["found"]))
            elif ev["event"] == "error":
                figures.errors.append(ev["error"])

    spec = {"mode": mode, "threads": threads, "lease_ttl": 1.5}
    for round_no in range(kills):
        pending = [t for t in threads if t[0] not in done]
        if not pending:
            break
        c = Child(dsn, {**spec, "threads": pending})
        ready = c.next(timeout=120)
        assert ready is not None and ready["event"] == "READY", ready
        lo, hi = first_kill if round_no == 0 else later_kills
        time.sleep(rng.uniform(lo, hi))
        absorb(c.drain())
        in_flight = [t[0] for t in pending if t[0] not in done]
        if c.proc.poll() is None:
            c.proc.send_signal(signal.SIGKILL)
        rc = c.proc.wait(timeout=60)
        c.reader.join(10)
        # Events printed in the instant before the kill still count.
        absorb(c.drain())
        if rc == 0:  # every pending thread finished before the kill moment
            continue
        assert rc == -signal.SIGKILL, rc
        in_flight = [t for t in in_flight if t not in done]
        figures.kills += 1
        figures.interrupted += len(in_flight)
        hit.update(in_flight)
    for _ in range(3):  # resume until done (a last child is never killed)
        pending = [t for t in threads if t[0] not in done]
        if not pending:
            break
        c = Child(dsn, {**spec, "threads": pending})
        assert c.proc.wait(timeout=180) == 0
        c.reader.join(10)
        absorb(c.drain())
    figures.trials = len(hit)
    figures.final = done
    assert set(done) == {t[0] for t in threads}, f"{mode}: not done: {set(t[0] for t in threads) - set(done)}"
    return figures


def payment_counts(dsn: str, prefix: str) -> dict[tuple[str, int], int]:
    with psycopg.connect(dsn) as conn:
        rows = conn.execute(
            "SELECT thread_id, step, count(*) FROM payments WHERE thread_id LIKE %s "
            "GROUP BY thread_id, step",
            (prefix + "%",),
        ).fetchall()
    return {(r[0], r[1]): r[2] for r in rows}


def duplicates_and_missing(dsn: str, prefix: str, thread_ids: list[str]) -> tuple[int, int]:
    counts = payment_counts(dsn, prefix)
    dup = sum(n - 1 for n in counts.values() if n > 1)
    missing = sum(
        1 for t in thread_ids for step in range(child.N_NODES) if counts.get((t, step), 0) == 0
    )
    return dup, missing


def expected_state(order: str) -> dict[str, Any]:
    return {
        "order": order,
        "receipts": [child.receipt(order, i, 100 + i)["receipt"] for i in range(child.N_NODES)],
    }


def uncrashed_states(dsn: str, orders: list[str]) -> dict[str, dict[str, Any]]:
    """The same pipeline, same orders, run once each without any kill."""
    threads = [[f"ref-{o}", o] for o in orders]
    c = Child(dsn, {"mode": "package", "threads": threads, "lease_ttl": 1.5})
    assert c.proc.wait(timeout=180) == 0
    c.reader.join(10)
    events = c.drain()
    return {ev["thread_id"][4:]: ev["state"] for ev in events if ev["event"] == "done"}


def test_chaos_sigkill_payments_stock_vs_package(dsn: str) -> None:
    child.create_tables(dsn)
    rng = random.Random(SEED)
    started = time.monotonic()

    stock_threads = [[f"stock-{i}", f"o{i}"] for i in range(20)]
    stock = run_chaos(dsn, "stock", stock_threads, kills=2, rng=rng,
                      first_kill=(0.3, 0.8), later_kills=(0.3, 1.2))
    stock_dup, stock_missing = duplicates_and_missing(dsn, "stock-", [t[0] for t in stock_threads])

    pkg_threads = [[f"pkg-{i}", f"o{i}"] for i in range(56)]
    pkg = run_chaos(dsn, "package", pkg_threads, kills=3, rng=rng,
                    first_kill=(0.3, 0.8), later_kills=(0.4, 2.5))
    pkg_dup, pkg_missing = duplicates_and_missing(dsn, "pkg-", [t[0] for t in pkg_threads])

    reference = uncrashed_states(dsn, [t[1] for t in pkg_threads])
    elapsed = time.monotonic() - started
    print(
        f"\nchaos figures (seed {SEED}, {elapsed:.0f} s): "
        f"stock: {stock.threads} threads, {stock.kills} kills, {stock.interrupted} "
        f"interrupted runs, {stock.trials} trials, duplicates={stock_dup}, missing={stock_missing} | "
        f"package: {pkg.threads} threads, {pkg.kills} kills, {pkg.interrupted} interrupted runs, "
        f"{pkg.trials} trials, unknown outcomes reconciled={pkg.unknown} "
        f"({pkg.unknown_found} paid -> resolve, {pkg.unknown - pkg.unknown_found} not -> forget), "
        f"duplicates={pkg_dup}, missing={pkg_missing}"
    )
    assert stock.trials >= 15
    assert stock_dup > 0, "the stock saver was expected to repeat payments"
    assert pkg.trials >= 50
    assert pkg_dup == 0 and pkg_missing == 0
    assert not [e for e in pkg.errors if "OutcomeUnknown" not in e], pkg.errors
    for thread_id, order in pkg_threads:
        assert pkg.final[thread_id] == reference[order] == expected_state(order), thread_id


def test_chaos_sigkill_inside_transactional_function(dsn: str) -> None:
    child.create_tables(dsn)
    rng = random.Random(SEED + 1)
    threads = [[f"tx-{i}", f"t{i}"] for i in range(24)]
    figures = run_chaos(dsn, "tx", threads, kills=3, rng=rng,
                        first_kill=(0.3, 0.7), later_kills=(0.4, 2.0))
    dup, missing = duplicates_and_missing(dsn, "tx-", [t[0] for t in threads])
    with psycopg.connect(dsn) as conn:
        attempts = int(conn.execute(
            "SELECT count(*) FROM tx_attempts WHERE thread_id LIKE 'tx-%'").fetchone()[0])  # type: ignore[index]
    committed = len(threads) * child.N_NODES
    killed_inside = attempts - committed
    print(
        f"\ntransactional chaos: {figures.threads} threads, {figures.kills} kills, "
        f"{figures.interrupted} interrupted runs, {figures.trials} trials, "
        f"{attempts} entries into the function, {killed_inside} ended by a kill inside it, "
        f"duplicates={dup}, missing={missing}, unknown outcomes={figures.unknown}"
    )
    assert figures.trials >= 20
    assert killed_inside > 0, "no kill landed inside the transactional function"
    assert dup == 0 and missing == 0 and figures.unknown == 0
    assert not figures.errors, figures.errors
    for thread_id, order in threads:
        assert figures.final[thread_id] == expected_state(order)
