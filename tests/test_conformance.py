"""LangGraph's own conformance suite, every base and extended capability."""

from __future__ import annotations

import pytest
from langgraph.checkpoint.conformance import checkpointer_test, validate

from langgraph_durable import AsyncDurablePostgresSaver


@pytest.mark.parametrize("threshold", [1024, 0], ids=["default", "offload-everything"])
async def test_conformance_async(dsn: str, threshold: int) -> None:
    @checkpointer_test(name=f"AsyncDurablePostgresSaver[threshold={threshold}]")
    async def factory():  # type: ignore[no-untyped-def]
        async with AsyncDurablePostgresSaver.from_conn_string(
            dsn, artifact_threshold=threshold
        ) as saver:
            yield saver

    report = await validate(factory)
    report.print_report()
    counts = {cap: (r.tests_passed, r.tests_failed, r.tests_skipped) for cap, r in report.results.items()}
    print("conformance counts (passed, failed, skipped):", counts)
    assert len(report.results) == 8
    for cap, r in report.results.items():
        assert r.detected, cap
        assert r.tests_failed == 0, (cap, r.failures)
        assert r.tests_passed > 0 and r.passed is True, cap
