"""LangGraph's own conformance suite, every base and extended capability.

Also with a checkpoint policy on (issue 16: deferral must be invisible to everything but
the number of writes): the suite calls the saver directly, outside a leased root run, so
nothing may be deferred and every result must be the same as without a policy
(tests/test_granularity.py runs it with a ReworkBudget).
"""

from __future__ import annotations

import pytest
from langgraph.checkpoint.conformance import checkpointer_test, validate

from langgraph_durable import AsyncDurablePostgresSaver
from langgraph_durable.granularity import CheckpointPolicy


@pytest.mark.parametrize(
    ("threshold", "policy"),
    [(1024, None), (0, None), (1024, "defer")],
    ids=["default", "offload-everything", "policy-defer"],
)
async def test_conformance_async(dsn: str, threshold: int, policy: CheckpointPolicy | None) -> None:
    @checkpointer_test(name=f"AsyncDurablePostgresSaver[threshold={threshold}, policy={policy!r}]")
    async def factory():  # type: ignore[no-untyped-def]
        async with AsyncDurablePostgresSaver.from_conn_string(
            dsn, artifact_threshold=threshold, checkpoint_policy=policy
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
