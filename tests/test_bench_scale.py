"""Smoke test of the scale benchmark's CI mode (issue 14): ``bench/bench_scale.py
--size 10k`` builds its database with SQL, runs every operator query and prints the
results table and each query's plan. No timing is asserted (a shared CI machine)."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[1] / "bench" / "bench_scale.py"


def test_bench_scale_10k_runs_and_prints_its_table(admin_dsn: str, capsys: pytest.CaptureFixture[str]) -> None:
    spec = importlib.util.spec_from_file_location("bench_scale", BENCH)
    assert spec is not None and spec.loader is not None
    bench = importlib.util.module_from_spec(spec)
    sys.modules["bench_scale"] = bench
    spec.loader.exec_module(bench)
    bench.main(["--dsn", admin_dsn, "--size", "10k", "--repeat", "1"])
    out = capsys.readouterr().out
    assert "10000 threads built" in out
    lines = out.splitlines()
    header = next(i for i, line in enumerate(lines) if line.startswith("query"))
    names = [line.split("  ")[0].strip() for line in lines[header + 1 :] if line.strip()]
    assert names == list(bench.queries())
    for name in names:
        assert f"## EXPLAIN {name} @ 10k" in out
    assert out.count("Execution Time:") == len(names)
