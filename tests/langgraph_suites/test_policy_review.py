"""run.py's judgement of the policy run (policy_review.py) and the reviewed list itself.

No database: the judgement is a function of the failure records suite_plugin writes."""

from __future__ import annotations

import os
import sys
from typing import Any

import pytest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from policy_review import KINDS, Review, Site, digest
from policy_reviewed import REVIEWED

STMT = "    assert len(history) == \\\n        5"
SITE = Site("tests/test_x.py", "test_h", digest(STMT), 12, "assert len(history) == 5",
            "history-length", "counts stored checkpoints", tests=("tests/test_x.py::test_h[*]",))
TID = "tests/test_x.py::test_h[postgres]"


def _record(**over: Any) -> dict[str, Any]:
    record: dict[str, Any] = {
        "nodeid": TID, "when": "call", "exc_type": "builtins.AssertionError", "assertion": True,
        "site": {"file": "tests/test_x.py", "line": 30, "function": "test_h", "statement": STMT},
        "raised_at_site": True, "message": "assert 3 == 5",
    }
    record.update(over)
    return record


def test_a_reviewed_assertion_is_accepted_wherever_its_line_moved() -> None:
    # Line 30, reviewed at 12, re-indented: the key is file, function and the statement text.
    moved = _record(site={"file": "tests/test_x.py", "line": 30, "function": "test_h",
                          "statement": "assert len(history) == 5"})
    verdict = Review([SITE]).judge(TID, "passed", "failed", [moved])
    assert verdict.accepted and verdict.site is SITE


@pytest.mark.parametrize(
    ("record", "stock", "policy", "why"),
    [
        (_record(exc_type="langgraph_durable.errors.ClockSkewError", assertion=False), "passed", "failed",
         "reviewed for AssertionError only"),
        (_record(exc_type="builtins.IndexError", assertion=False), "passed", "failed",
         "reviewed for AssertionError only"),
        (_record(exc_type="langgraph_durable.errors.ClockSkewError", assertion=False,
                 site={"file": "tests/test_x.py", "line": 31, "function": "test_h", "statement": "graph.invoke(x)"}),
         "passed", "failed", "not an AssertionError, and not a reviewed site"),
        (_record(raised_at_site=False), "passed", "failed", "raised below the suite's code"),
        (_record(site={"file": "tests/test_x.py", "line": 31, "function": "test_h",
                       "statement": "assert state.values == {'x': 1}"}), "passed", "failed", "unreviewed site"),
        (_record(site={"file": "tests/test_x.py", "line": 30, "function": "test_other",
                       "statement": STMT}), "passed", "failed", "unreviewed site"),
        (_record(when="teardown"), "passed", "failed", "failed in teardown"),
        (_record(when="setup"), "passed", "error", "only a failed call"),
        (_record(), "skipped", "failed", "only a failed call"),
        (_record(), "passed", "absent", "only a failed call"),
    ],
)
def test_anything_else_fails_the_run(record: dict[str, Any], stock: str, policy: str, why: str) -> None:
    verdict = Review([SITE]).judge(TID, stock, policy, [record])
    assert not verdict.accepted and why in verdict.why


def test_a_setup_error_beside_a_reviewed_call_failure_is_not_accepted() -> None:
    verdict = Review([SITE]).judge(TID, "passed", "failed", [_record(), _record(when="teardown")])
    assert not verdict.accepted and "teardown" in verdict.why


def test_a_reviewed_site_covers_only_its_tests() -> None:
    verdict = Review([SITE]).judge("tests/test_x.py::test_other", "passed", "failed",
                                   [_record(nodeid="tests/test_x.py::test_other")])
    assert not verdict.accepted and "not reviewed for this test" in verdict.why


LOOKUP = "    before = next(s for s in history if s.next == ('b',))"
LOOKUP_SITE = Site("tests/test_x.py", "test_h", digest(LOOKUP), 40, LOOKUP.strip(), "history-index",
                   "looks a checkpoint up in the stored history", exceptions=("AssertionError", "StopIteration"))


@pytest.mark.parametrize(
    ("exc_type", "cause_type", "accepted"),
    [
        ("builtins.StopIteration", None, True),
        # an async test: Python turns the StopIteration leaving a coroutine into this
        ("builtins.RuntimeError", "builtins.StopIteration", True),
        ("builtins.RuntimeError", None, False),
        ("builtins.IndexError", None, False),
    ],
)
def test_a_lookup_site_allows_the_exceptions_it_names(exc_type: str, cause_type: str | None, accepted: bool) -> None:
    record = _record(exc_type=exc_type, cause_type=cause_type, assertion=False,
                     site={"file": "tests/test_x.py", "line": 41, "function": "test_h", "statement": LOOKUP})
    assert Review([LOOKUP_SITE]).judge(TID, "passed", "failed", [record]).accepted is accepted


def test_no_record_is_not_accepted() -> None:
    assert not Review([SITE]).judge(TID, "passed", "failed", []).accepted


def test_the_reviewed_list_is_well_formed() -> None:
    Review(REVIEWED)  # unique keys, known kinds
    for site in REVIEWED:
        assert site.kind in KINDS and len(site.reason) > 20, site
        assert site.file.startswith("tests/") and site.tests, site


TOY = '''
import pytest

def _check(history):
    assert len(history) == 5

def test_helper_assert():
    _check([1, 2])

def test_lookup():
    history = [1]
    before = next(s for s in history if s == 2)

@pytest.mark.asyncio
async def test_async_lookup():
    history = [1]
    before = next(s for s in history if s == 2)

def test_below():
    import json
    json.loads("{")
'''


def test_the_plugin_records_type_and_site(tmp_path: Any) -> None:
    """suite_plugin's --lgd-failures on a toy suite: the site is the innermost frame of the
    suite's own code with its whole statement; an async test's StopIteration is sited by
    its cause; an exception from a library is not raised at the site."""
    import subprocess

    from policy_review import effective_exception, load_failures

    here = os.path.dirname(os.path.abspath(__file__))
    (tmp_path / "tests").mkdir()
    (tmp_path / "tests" / "test_toy.py").write_text(TOY)
    (tmp_path / "conftest.py").write_text(
        f"import sys\nsys.path.insert(0, {here!r})\n"
        "from suite_plugin import pytest_addoption, pytest_runtest_makereport  # noqa: F401\n"
    )
    out = tmp_path / "failures"
    subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", f"--lgd-failures={out}",
         "-o", "asyncio_mode=strict", "tests/test_toy.py"],
        cwd=tmp_path, capture_output=True, check=False, timeout=120,
    )
    records = {tid.split("::")[1]: recs[0] for tid, recs in load_failures(out).items()}
    assert set(records) == {"test_helper_assert", "test_lookup", "test_async_lookup", "test_below"}
    helper = records["test_helper_assert"]
    assert helper["site"]["function"] == "_check" and helper["raised_at_site"]
    assert effective_exception(helper) == "AssertionError"
    assert "assert len(history) == 5" in helper["site"]["statement"]
    for name in ("test_lookup", "test_async_lookup"):
        r = records[name]
        assert effective_exception(r) == "StopIteration" and r["raised_at_site"], r
        assert r["site"]["function"] == name and "next(s for s in history" in r["site"]["statement"]
    below = records["test_below"]
    assert effective_exception(below) == "json.decoder.JSONDecodeError" and not below["raised_at_site"]
