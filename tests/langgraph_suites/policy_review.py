"""How run.py judges the ``policy`` run (issue 16: deferral must be invisible to everything
but the number of writes).

The suites run a third time with the durable savers given ``checkpoint_policy="defer"``.
Deferral stores fewer checkpoints, so a test that reads the stored history (its length, a
checkpoint picked from it by index, the ``checkpoints`` stream compared with it) fails by
definition. Every such failure must be one a person reviewed: ``policy_reviewed.REVIEWED``
lists each failing assertion of theirs, keyed by file, function and the assertion's whole
source text (whitespace-normalised; its line is recorded, not matched, so a line shift in a
new sdist does not unreview it, while an edited assertion must be reviewed again), with the
kind of history it reads and why that is history only.

``suite_plugin.py --lgd-failures`` records each failure as it happens (exception type, the
innermost frame of the suite's own code, whether the exception was raised right there).
A test whose outcome differs from stock's is accepted only if it failed in its call phase
with an ``AssertionError`` raised by an assertion of theirs that REVIEWED lists for that
test id. Anything else fails the run: another exception (a ``ClockSkewError``, an
``IndexError``, an assertion inside LangGraph or the saver), an unreviewed site, an error in
setup or teardown, a test that stock skips or does not run.
"""

from __future__ import annotations

import hashlib
import io
import json
import re
import textwrap
import tokenize
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

KINDS = {
    "history-length": "the number of stored checkpoints (len of get_state_history/list, "
    "or a count of steps taken from it)",
    "history-index": "a checkpoint picked from the stored history by position (history[i], "
    "the i-th list() entry, next(islice(...))) and its values/next/metadata/config/parent",
    "history-compare": "the whole stored history (or a slice of it) compared with an "
    "expected list or snapshot",
    "checkpoints-stream": "the checkpoints/debug stream or the checkpoint ids a run "
    "reported, compared with the stored history (deferred checkpoints are streamed, "
    "not stored)",
    "deferred-task-results": "a stored checkpoint's tasks/results or pending writes: with "
    "the policy the stored checkpoint is a later one, or its superseded writes were dropped",
}


def normalise(statement: str) -> str:
    """The statement's tokens, one space apart: indentation, line breaks, backslash
    continuations and comments do not change it."""
    skip = {tokenize.COMMENT, tokenize.NL, tokenize.NEWLINE, tokenize.INDENT, tokenize.DEDENT,
            tokenize.ENDMARKER}
    try:
        tokens = tokenize.generate_tokens(io.StringIO(textwrap.dedent(statement)).readline)
        return " ".join(t.string for t in tokens if t.type not in skip)
    except (tokenize.TokenError, IndentationError, SyntaxError):
        return " ".join(statement.replace("\\\n", " ").split())


def digest(statement: str) -> str:
    return hashlib.sha1(normalise(statement).encode()).hexdigest()[:12]


@dataclass(frozen=True)
class Site:
    """One reviewed failing assertion of LangGraph's suites under the policy."""

    file: str  # tests/test_time_travel.py
    function: str  # the function whose assertion fails (the test, or a helper of theirs)
    digest: str  # digest() of the whole assertion statement: the key, with file and function
    line: int  # where it was when reviewed (langgraph 1.2.24): shown, not matched
    source: str  # its first line (shown)
    kind: str  # a key of KINDS
    reason: str  # why this assertion reads the stored history only
    tests: tuple[str, ...] = ("*",)  # test ids that may fail here (``*`` is the wildcard)
    # The exceptions this statement may raise (builtins, by name). Besides a failed
    # ``assert``: a lookup in the stored history that finds nothing (``next(...)`` raises
    # StopIteration, ``[...][0]`` IndexError, a loop that never assigns UnboundLocalError).
    exceptions: tuple[str, ...] = ("AssertionError",)

    @property
    def key(self) -> tuple[str, str, str]:
        return (self.file, self.function, self.digest)

    def covers(self, tid: str) -> bool:
        return any(_match(p, tid) for p in self.tests)


def _match(pattern: str, tid: str) -> bool:
    return re.fullmatch(".*".join(map(re.escape, pattern.split("*"))), tid) is not None


def load_failures(stem: Path) -> dict[str, list[dict[str, Any]]]:
    """The records suite_plugin wrote for one pytest run (``<stem>.<worker>`` files)."""
    out: dict[str, list[dict[str, Any]]] = {}
    for path in sorted(stem.parent.glob(stem.name + ".*")):
        for line in path.read_text(encoding="utf-8", errors="replace").splitlines():
            try:
                record = json.loads(line)
            except json.JSONDecodeError:
                continue
            out.setdefault(record["nodeid"], []).append(record)
    return out


@dataclass
class Verdict:
    accepted: bool
    why: str
    site: Site | None = None
    key: tuple[str, str, str] | None = None
    record: dict[str, Any] | None = None


@dataclass
class Review:
    reviewed: Sequence[Site]
    by_key: dict[tuple[str, str, str], Site] = field(init=False)

    def __post_init__(self) -> None:
        self.by_key = {}
        for site in self.reviewed:
            assert site.kind in KINDS, f"{site}: unknown kind"
            assert site.key not in self.by_key, f"{site.key} listed twice"
            self.by_key[site.key] = site

    def judge(self, tid: str, stock: str, policy: str, records: Iterable[dict[str, Any]]) -> Verdict:
        """Is this difference between stock's outcome and the policy run's a reviewed,
        history-only one?"""
        records = list(records)
        if stock != "passed" or policy != "failed":
            return Verdict(False, f"stock {stock}, policy {policy}: only a failed call of a "
                           "test stock passes can be a history-only difference")
        phases = [r for r in records if r.get("when") != "call"]
        if phases:
            r = phases[0]
            return Verdict(False, f"failed in {r.get('when')}: {r.get('exc_type')}: "
                           f"{r.get('message', '')[:120]}", record=r)
        calls = [r for r in records if r.get("when") == "call"]
        if not calls:
            return Verdict(False, "no failure record (suite_plugin --lgd-failures missing?)")
        r = calls[-1]
        site = r.get("site")
        where = f"{site['file']}:{site['line']} in {site['function']}" if site else "no frame of the suite"
        exc = effective_exception(r)
        if not site or not r.get("raised_at_site"):
            return Verdict(False, f"{exc} raised below the suite's code (in LangGraph, the saver or "
                           f"a library; last suite frame {where}): {r.get('message', '')[:160]}", record=r)
        key = (site["file"], site["function"], digest(site["statement"]))
        reviewed = self.by_key.get(key)
        if reviewed is None:
            if exc != "AssertionError":
                return Verdict(False, f"{exc} at {where} (not an AssertionError, and not a reviewed "
                               f"site: a real defect until shown otherwise): {r.get('message', '')[:160]}",
                               key=key, record=r)
            return Verdict(False, f"unreviewed site {where}: {normalise(site['statement'])[:160]}",
                           key=key, record=r)
        if exc not in reviewed.exceptions:
            return Verdict(False, f"{exc} at reviewed site {where}, which is reviewed for "
                           f"{', '.join(reviewed.exceptions)} only: {r.get('message', '')[:160]}", reviewed, key, r)
        if not reviewed.covers(tid):
            return Verdict(False, f"reviewed site {where} is not reviewed for this test", reviewed, key, r)
        return Verdict(True, reviewed.kind, reviewed, key, r)


def effective_exception(record: dict[str, Any]) -> str:
    """The exception's name as REVIEWED lists it: builtins by bare name, others qualified;
    the RuntimeError Python raises for a StopIteration leaving a coroutine is that
    StopIteration (an async test's ``next(...)`` over the stored history)."""
    name = str(record.get("exc_type") or "?")
    if name == "builtins.RuntimeError" and record.get("cause_type") == "builtins.StopIteration":
        name = "builtins.StopIteration"
    return name.removeprefix("builtins.")


def entry_for(record: dict[str, Any]) -> str:
    """A REVIEWED entry to fill in for an unreviewed site (printed by run.py)."""
    site = record["site"]
    first = site["statement"].strip().splitlines()[0].strip() if site["statement"].strip() else ""
    exc = effective_exception(record)
    extra = "" if exc == "AssertionError" else f', exceptions=("{exc}",)'
    return (f'Site("{site["file"]}", "{site["function"]}", "{digest(site["statement"])}", {site["line"]},\n'
            f'     {first[:100]!r},\n     "<kind>", "<why this reads the stored history only>"{extra}),')
