"""Hypothesis settings profiles of the property and model-based tests.

``ci`` (the default) keeps tests/test_model_chaos.py and tests/test_value_roundtrip.py
at a few minutes on a 2-core machine; ``long`` is selected with
``LGD_HYPOTHESIS_PROFILE=long`` (``python3 dev.py test --long`` sets it) and runs many
more examples with no deadline. ``LGD_HYPOTHESIS_EXAMPLES`` overrides the number of
examples of either profile (a long run sized to the time available).

Import this module from a test file: registering twice is harmless.
"""

from __future__ import annotations

import os

from hypothesis import HealthCheck, settings

PROFILE = os.environ.get("LGD_HYPOTHESIS_PROFILE", "ci")
_SUPPRESS = [HealthCheck.too_slow, HealthCheck.function_scoped_fixture, HealthCheck.data_too_large]

settings.register_profile(
    "ci",
    deadline=None,  # real Postgres and real processes: wall time varies with load
    max_examples=40,
    # CI runs the same examples every time (a red CI names a reproducible case); the
    # long profile keeps searching new ones.
    derandomize=True,
    suppress_health_check=_SUPPRESS,
    print_blob=True,
)
settings.register_profile(
    "long",
    deadline=None,
    max_examples=2000,
    suppress_health_check=_SUPPRESS,
    print_blob=True,
)
settings.load_profile(PROFILE)


def examples(ci: int, long: int) -> int:
    """Per-test example count: ``ci`` or ``long`` by profile, or the env override."""
    override = os.environ.get("LGD_HYPOTHESIS_EXAMPLES")
    if override:
        return int(override)
    return long if PROFILE == "long" else ci


def is_long() -> bool:
    return PROFILE == "long"
