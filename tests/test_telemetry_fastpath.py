"""The telemetry fast paths of the write path (issue 14), checked against the slow ones.

* ``telemetry._Histogram`` (one bisect, one lock per observation) must report exactly
  what prometheus-client's ``Histogram`` reports for the same observations: the
  exposition text of both, in registries of their own, is compared line by line.
* The tracer check reads opentelemetry's global instead of calling
  ``get_tracer_provider()`` per call: a provider set after the first (negative) check
  must still be seen by the next call. Run in a subprocess: a process sets its global
  provider once.
"""

from __future__ import annotations

import math
import subprocess
import sys
import textwrap

import pytest
from conftest import require_or_skip
from prometheus_client import CollectorRegistry, Histogram, generate_latest

from langgraph_durable import telemetry


def _exposition(registry: CollectorRegistry, name: str) -> list[str]:
    text = generate_latest(registry).decode().replace(name, "NAME")
    # _created is the creation time of each: equal only to the second.
    return [line if "_created" not in line else line.rsplit(" ", 1)[0] for line in text.splitlines()]


@pytest.mark.parametrize("buckets", [telemetry._SECONDS, telemetry._BYTES, (1.0, 2.0, math.inf)])
def test_fast_histogram_reports_what_prometheus_client_reports(buckets: tuple[float, ...]) -> None:
    mine_reg, theirs_reg = CollectorRegistry(), CollectorRegistry()
    mine = telemetry._Histogram("fast_h", "A histogram.", buckets, registry=mine_reg)
    theirs = Histogram("slow_h", "A histogram.", buckets=buckets, registry=theirs_reg)
    values: list[float] = [0.0, 1e-9, 10**9, -1.0, math.inf, 3, 3.0]
    values += list(buckets)  # exactly on a bound: that bucket (le is inclusive)
    values += [b * 1.0000001 for b in buckets if math.isfinite(b)]
    for v in values:
        mine.observe(v)
        theirs.observe(v)
    assert _exposition(mine_reg, "fast_h") == _exposition(theirs_reg, "slow_h")
    assert mine_reg.get_sample_value("fast_h_count") == len(values)


def test_fast_histogram_refuses_a_second_registration() -> None:
    reg = CollectorRegistry()
    telemetry._Histogram("dup_h", "A histogram.", (1.0,), registry=reg)
    with pytest.raises(ValueError, match="Duplicated"):
        Histogram("dup_h", "A histogram.", registry=reg)


def test_saver_histograms_are_the_fast_ones() -> None:
    if not telemetry.HAS_PROMETHEUS:
        require_or_skip("prometheus-client is not installed (the test extra)")
    telemetry.observe("put_seconds", 0.001)
    assert isinstance(telemetry._metrics["put_seconds"], telemetry._Histogram)


def test_tracer_provider_set_after_a_negative_check_is_seen() -> None:
    code = textwrap.dedent(
        """
        from opentelemetry import trace
        from opentelemetry.sdk.trace import TracerProvider
        from langgraph_durable import telemetry
        assert telemetry._get_tracer() is None
        assert telemetry._get_tracer() is None  # the fast negative path
        trace.set_tracer_provider(TracerProvider())
        assert telemetry._get_tracer() is not None
        print("ok")
        """
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0 and out.stdout.strip() == "ok", out.stderr
