"""LangGraph's own conformance suite, every base and extended capability.

Also with a checkpoint policy on (issue 16: deferral must be invisible to everything but
the number of writes): the suite calls the saver directly, outside a leased root run, so
nothing may be deferred and every result must be the same as without a policy
(tests/test_granularity.py runs it with a ReworkBudget).
"""

from __future__ import annotations

import pytest
from langgraph.checkpoint.conformance import checkpointer_test, validate
from langgraph.checkpoint.serde.base import SerializerProtocol
from langgraph.checkpoint.serde.encrypted import EncryptedSerializer

from langgraph_durable import AsyncDurablePostgresSaver
from langgraph_durable.granularity import CheckpointPolicy
from langgraph_durable.keyring import DurableEncryptedSerializer

# Encryption at rest (issue 27): the same suite with an encrypting serializer, ours with
# a rotated key (writes the new key, reads both) and LangGraph's own with everything offloaded.
_KEY, _OLD_KEY = b"k" * 32, b"o" * 32


def _serde(kind: str | None) -> SerializerProtocol | None:
    if kind == "rotating":
        return DurableEncryptedSerializer(_KEY, old=[_OLD_KEY])
    if kind == "langgraph":
        return EncryptedSerializer.from_pycryptodome_aes(key=_KEY)
    return None


@pytest.mark.parametrize(
    ("threshold", "policy", "encryption"),
    [(1024, None, None), (0, None, None), (1024, "defer", None), (1024, None, "rotating"), (0, None, "langgraph")],
    ids=["default", "offload-everything", "policy-defer", "encrypted", "encrypted-offload-everything"],
)
async def test_conformance_async(
    dsn: str, threshold: int, policy: CheckpointPolicy | None, encryption: str | None
) -> None:
    @checkpointer_test(
        name=f"AsyncDurablePostgresSaver[threshold={threshold}, policy={policy!r}, encryption={encryption}]"
    )
    async def factory():  # type: ignore[no-untyped-def]
        async with AsyncDurablePostgresSaver.from_conn_string(
            dsn, artifact_threshold=threshold, checkpoint_policy=policy, serde=_serde(encryption)
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
