"""Smoke test of bench/bench_reference.py --quick (issue 15, item 5): 50 workflows over 2
worker processes with a SIGKILL mid-run complete, with no effect done twice by the
package. No timing is asserted (the machine's load decides those)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


@pytest.mark.chaos
def test_quick_reference_benchmark(admin_dsn: str) -> None:
    env = dict(os.environ)
    env["PYTHONPATH"] = str(ROOT) + os.pathsep + env.get("PYTHONPATH", "")
    out = subprocess.run(
        [sys.executable, str(ROOT / "bench" / "bench_reference.py"), "--quick", "--dsn", admin_dsn],
        env=env, capture_output=True, text=True, timeout=600,
    )
    assert out.returncode == 0, out.stderr[-4000:]
    line = next(x for x in out.stdout.splitlines() if x.startswith("JSON "))
    result = json.loads(line[5:])
    rows = {r["config"]: r for r in result["rows"]}
    durable = rows["durable"]
    assert durable["kills"] >= 1 and durable["threads_interrupted"] >= 1
    assert durable["completed"] == durable["workflows"] == 50
    assert durable["duplicated_effects"] == 0
    assert durable["checkpoints"] >= 50 * 11
    # the stock rows ran the same workload and the same kills (their duplicates vary,
    # but are never none: that is what the durable row's 0 is measured against)
    assert {"stock", "stock-sync"} <= set(rows)
    assert all(r["kills"] >= 1 for r in rows.values())
    stock_dups = {c: rows[c]["duplicated_effects"] for c in ("stock", "stock-sync")}
    print("stock duplicated effects:", stock_dups)
    assert all(n > 0 for n in stock_dups.values()), f"the stock saver duplicated nothing: {stock_dups}"
    assert "| durable | 50/50 |" in out.stdout
