#!/usr/bin/env python3
"""Run LangGraph's own test suites against the stock and the durable savers; compare.

    python3 dev.py suites                       # what CI runs (after ``dev.py test``)
    python tests/langgraph_suites/run.py [--suite pregel-core] [--saver durable] [-n 2]

For the *installed* ``langgraph`` and ``langgraph-checkpoint-postgres``, pip downloads the
sdists of exactly those versions (they ship their tests) into ``.cache/langgraph-suites/``
(git-ignored) and unpacks them. The suites then run with pytest-xdist, once with the stock
savers and once with the durable ones substituted through the suites' own fixtures
(``suite_plugin.py`` says how, and holds the one normalisation: the ``graph_version`` metadata
key); ``--policy`` adds a third run, the durable savers with ``checkpoint_policy="defer"``
(CI runs it); ``--encrypted`` gives every saver of every run, stock and durable alike,
LangGraph's ``EncryptedSerializer`` (issue 27; ``suite_plugin --lgd-encrypted``). Per-test outcomes are compared; the run fails if any test's outcome differs
between stock and durable, unless ``KNOWN_DIFFERENCES`` lists it (each entry names the issue
item that removes it), and if a stock test fails at all (the environment, not the saver, is
wrong). A difference between stock and the policy run passes only as a reviewed history-only
failure: an assertion of theirs that reads the stored history, listed in
``policy_reviewed.py`` (judged by ``policy_review.py``: the exception type and the site come
from ``suite_plugin.py --lgd-failures``); any other exception, an unreviewed site, a setup or
teardown error fails the run.

Speed (issue 12: a few minutes of CI on 2 cores): one pytest per sdist and saver (the
pregel core and extended suites share one; outcomes are split back by file), all of them
side by side, ``-n 2`` each; the PostgreSQL server is a throwaway ``fsync=off`` cluster
(fastpg.py), and the langgraph suites reuse emptied databases instead of creating one per
test (suite_plugin._Databases). Measured on the shared 2-core machine, same load for both:
before 990 s wall, 209 s pytest CPU + 939 s PostgreSQL CPU; after 408 s wall (272 s in a
quieter moment), 163 s + 178 s. The policy run's failures (about 210, each reviewed) once
made it cost 1.7x the durable run's CPU (their tracebacks formatted): hence ``--tb=native`` (launch()).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import re
import signal
import subprocess
import sys
import tarfile
import threading
import time
import xml.etree.ElementTree as ET
from dataclasses import dataclass, field
from importlib import metadata
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
import fastpg  # noqa: E402 - this folder, not a package
from policy_review import Review, Verdict, entry_for, load_failures  # noqa: E402
from policy_reviewed import REVIEWED  # noqa: E402

REPO = HERE.parent.parent
CACHE = REPO / ".cache" / "langgraph-suites"
SERVER = "postgresql://postgres@127.0.0.1:5432/"

CORE = ("tests/test_pregel.py", "tests/test_pregel_async.py", "tests/test_checkpoint_migration.py")
# Test files of langgraph that build their own postgres savers (not through the fixtures),
# or test a stock-only feature: not part of the comparison.
NOT_FIXTURE_BASED = ("tests/test_prune_postgres.py", "tests/test_delta_channel_benchmark.py")


@dataclass(frozen=True)
class Known:
    """A test whose durable outcome may differ from stock's, and why."""

    suite: str  # "pregel-core" (durable vs stock) or "pregel-core/policy" (policy vs stock)
    pattern: str  # the test id ``file::name[params]``, where only ``*`` is a wildcard
    reason: str
    removed_by: str  # the issue item (and branch) whose merge makes it pass
    langgraph: str = ""  # only with this installed langgraph version (e.g. the oldest job's)

    def versions_match(self) -> bool:
        return not self.langgraph or metadata.version("langgraph") == self.langgraph


# Kept as short as it can be. An entry that no longer occurs fails the run too (remove it),
# so the list never hides a test that passes. Removed once merged into main (checked on a
# snapshot of main 41f0488): test_pending_sends_migration (issue 12 'Legacy formats', branch
# dropin-api) and the GraphVersionMismatchError of test_delta_channel_to_plain.py and
# test_large_cases.py::test_root_graph (issue 12 'Refuse what is incompatible', branch
# dropin-versions).
# Empty: the durable savers route rows through the stock-named _load_checkpoint_tuple,
# which the one test that patches it (test_get_checkpoint_no_channel_values) needs.
KNOWN_DIFFERENCES: list[Known] = []


@dataclass
class Suite:
    name: str
    dist: str
    files: list[str]
    addopts: str  # their addopts minus --full-trace/--durations/-vv (noise in our logs)
    root: Path = field(default_factory=Path)


@dataclass
class Result:
    outcomes: dict[str, str]
    seconds: float
    cpu: float
    returncode: int
    built: int  # durable savers the run constructed (-1: plugin line missing)
    log: Path
    # suite_plugin --lgd-failures: each failed test's records (exception type, site)
    failures: dict[str, list[dict[str, Any]]] = field(default_factory=dict)

    def count(self, outcome: str) -> int:
        return sum(1 for o in self.outcomes.values() if o == outcome)


def _sh(cmd: list[str], **kw: object) -> None:
    print("+", " ".join(cmd), flush=True)
    subprocess.run(cmd, check=True, **kw)  # type: ignore[call-overload]


def unpack(dist: str) -> Path:
    """The unpacked sdist of the installed version of ``dist`` (downloaded once)."""
    version = metadata.version(dist)
    stem = f"{dist.replace('-', '_')}-{version}"
    root = CACHE / stem
    if (root / "tests").is_dir():
        return root
    dl = CACHE / "sdist"
    dl.mkdir(parents=True, exist_ok=True)
    want = f"{stem}.tar.gz".lower().replace("-", "_")

    def found() -> list[Path]:
        return [p for p in dl.glob("*.tar.gz") if p.name.lower().replace("-", "_") == want]

    archives = found()
    if not archives:
        _sh([sys.executable, "-m", "pip", "download", "--quiet", "--no-deps", "--no-binary", ":all:",
             "--dest", str(dl), f"{dist}=={version}"])
        archives = found()
    if len(archives) != 1:
        raise SystemExit(f"no sdist for {dist}=={version} in {dl}")
    tmp = CACHE / (stem + ".tmp")
    with tarfile.open(archives[0]) as tar:
        tar.extractall(tmp, filter="data")
    (tmp / next(p.name for p in tmp.iterdir())).rename(root)
    tmp.rmdir()
    return root


def suites() -> list[Suite]:
    lg = unpack("langgraph")
    pg = unpack("langgraph-checkpoint-postgres")
    extended = sorted(
        str(p.relative_to(lg))
        for p in (lg / "tests").glob("test_*.py")
        if re.search(r"\b(sync|async)_checkpointer\b", p.read_text(encoding="utf-8"))
        and str(p.relative_to(lg)) not in CORE + NOT_FIXTURE_BASED
    )
    lg_opts = "--strict-markers --strict-config --snapshot-warn-unused"
    return [
        Suite("checkpoint-postgres", "langgraph-checkpoint-postgres",
              ["tests/test_sync.py", "tests/test_async.py"], "--strict-markers --strict-config", pg),
        Suite("pregel-core", "langgraph", list(CORE), lg_opts, lg),
        Suite("pregel-extended", "langgraph", extended, lg_opts, lg),
    ]


def parse_junit(path: Path) -> dict[str, str]:
    outcomes: dict[str, str] = {}
    if not path.exists():
        return outcomes
    for case in ET.parse(path).iter("testcase"):
        # classname "tests.test_pregel" (or "tests.test_x.TestClass"), name "test_y[params]"
        parts = case.get("classname", "").split(".")
        mod = [p for p in parts if p.startswith("test_")]
        file = "/".join(parts[: parts.index(mod[0]) + 1]) + ".py" if mod else ".".join(parts)
        rest = parts[parts.index(mod[0]) + 1:] if mod else []
        tid = "::".join([file, *rest, case.get("name", "")])
        tags = {child.tag for child in case}
        if "error" in tags:
            outcome = "error"
        elif "failure" in tags:
            outcome = "failed"
        elif "skipped" in tags:
            outcome = "skipped"
        else:
            outcome = "passed"
        # A teardown error is reported as a second <testcase> with the same id: keep the worse.
        rank = {"passed": 0, "skipped": 1, "failed": 2, "error": 3}
        if tid not in outcomes or rank[outcome] > rank[outcomes[tid]]:
            outcomes[tid] = outcome
    return outcomes


@dataclass
class Job:
    """One pytest run per saver: the chosen suites of one sdist (same rootdir and addopts).
    The outcomes are split back into suites by test file."""

    suites: list[Suite]

    @property
    def name(self) -> str:
        return "+".join(s.name for s in self.suites)

    @property
    def files(self) -> list[str]:
        return [f for s in self.suites for f in s.files]


def jobs_of(chosen: list[Suite]) -> list[Job]:
    jobs: dict[tuple[Path, str], Job] = {}
    for suite in chosen:
        jobs.setdefault((suite.root, suite.addopts), Job([])).suites.append(suite)
    return list(jobs.values())


@dataclass
class Running:
    job: Job
    saver: str
    proc: subprocess.Popen[bytes]
    xml: Path
    log: Path
    started: float
    ended: tuple[float, int, Any] | None = None  # (monotonic time, wait status, rusage)

    def wait(self) -> None:
        """Reap the process (this pytest and, through it, its xdist workers)."""
        _, status, usage = os.wait4(self.proc.pid, 0)
        self.ended = (time.monotonic(), status, usage)


def wait_all(runs: list[Running]) -> list[Result]:
    """Wait for every run at once (each run's time ends when it does, not when the
    previous one in the list does)."""
    threads = [threading.Thread(target=run.wait) for run in runs]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return [finish(run) for run in runs]


# What each saver mode passes to suite_plugin.py: "policy" is the durable saver with a
# checkpoint policy on (issue 16: deferral must be invisible to the suites).
SAVER_ARGS = {
    "stock": ["--lgd-saver=stock"],
    "durable": ["--lgd-saver=durable"],
    "policy": ["--lgd-saver=durable", "--lgd-policy=defer"],
}


# Given to every saver mode's pytest: --encrypted adds --lgd-encrypted (issue 27: stock and
# durable savers alike with LangGraph's EncryptedSerializer, compared as without it).
EXTRA_ARGS: list[str] = []


def launch(job: Job, saver: str, workers: int, base: str, ids: list[str] | None = None) -> Running:
    # Per langgraph version: the newest and the oldest job may run at the same time.
    out = CACHE / "results" / (f"langgraph-{metadata.version('langgraph')}" + ("-encrypted" if EXTRA_ARGS else ""))
    out.mkdir(parents=True, exist_ok=True)
    stem = f"{job.name}-{saver}" + ("-rerun" if ids else "")
    xml, log = out / f"{stem}.xml", out / f"{stem}.log"
    xml.unlink(missing_ok=True)
    failures = out / f"{stem}.failures"
    for old in out.glob(failures.name + ".*"):
        old.unlink()
    env = dict(os.environ)
    # The repo first (the package under test, even over another editable install), then
    # this folder for ``-p suite_plugin``; the sdist root itself is pytest's rootdir.
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), str(HERE), env.get("PYTHONPATH")]))
    env["LGD_SUITE_PG"] = base
    root = job.suites[0].root
    # --tb=native: pytest's own styles parse each test file of a traceback (test_pregel.py is
    # 10,000 lines) once per failure, and the policy run has hundreds of reviewed failures:
    # that, with suite_plugin's own statement lookup, made the policy pytest cost 1.7x the
    # durable one's CPU. Python's tracebacks read lines through linecache instead.
    cmd = [
        sys.executable, "-m", "pytest", *(ids or job.files),
        "-p", "suite_plugin", *SAVER_ARGS[saver], *EXTRA_ARGS,
        "-p", "no:cacheprovider", "-o", f"addopts={job.suites[0].addopts}",
        "-q", "--tb=native", f"--junitxml={xml}", f"--lgd-failures={failures}",
    ]
    if workers > 0:
        cmd += ["-n", str(workers)]
    shown = f"{len(ids)} failed test(s) again" if ids else " ".join(cmd[3:])
    print(f"[{job.name} / {saver}] {shown}  (log: {log.relative_to(REPO)})", flush=True)
    with log.open("w") as fh:
        proc = subprocess.Popen(cmd, cwd=root, env=env, stdout=fh, stderr=subprocess.STDOUT)
    return Running(job, saver, proc, xml, log, time.monotonic())


def finish(run: Running) -> Result:
    # wait4: this pytest's own CPU (with its xdist workers), even with others running
    # beside it. On a busy shared machine wall time says little; CPU seconds bound what an
    # idle CI machine needs.
    if run.ended is None:
        run.wait()
    assert run.ended is not None
    ended, status, usage = run.ended
    run.proc.returncode = rc = os.waitstatus_to_exitcode(status)
    seconds = ended - run.started
    cpu = usage.ru_utime + usage.ru_stime
    text = run.log.read_text(errors="replace")
    m = re.findall(r"^lgd-suite saver=\S+ durable_savers_built=(\d+)$", text, re.M)
    db = re.findall(r"^lgd-suite databases .*$", text, re.M)
    tail = re.findall(r"^=*\s*(\d+ (?:passed|failed|error|skipped|deselected).* in [\d.]+s.*?)\s*=*$", text, re.M)
    print(f"[{run.job.name} / {run.saver}] exit {rc}: {tail[-1] if tail else 'no summary line'}"
          + (f"; {db[-1][len('lgd-suite '):]}" if db else ""), flush=True)
    failures = load_failures(run.xml.with_suffix(".failures"))
    return Result(parse_junit(run.xml), seconds, cpu, rc, int(m[-1]) if m else -1, run.log, failures)


def _report_policy(review: Review, accepted: dict[str, list[Verdict]],
                   unreviewed: dict[tuple[str, str, str], dict[str, Any]], chosen: list[Suite]) -> None:
    """The policy run's accepted differences by reviewed site and kind; the reviewed sites
    no test hit (stale: a warning, since another langgraph version may still hit them);
    entries to fill in for the unreviewed sites."""
    hit: dict[tuple[str, str, str], int] = {}
    for suite, verdicts in accepted.items():
        kinds: dict[str, int] = {}
        for v in verdicts:
            assert v.site is not None
            hit[v.site.key] = hit.get(v.site.key, 0) + 1
            kinds[v.site.kind] = kinds.get(v.site.kind, 0) + 1
        sites = {v.site.key for v in verdicts if v.site is not None}
        print(f"\npolicy run {suite}: {len(verdicts)} tests differ from stock, each at a reviewed "
              f"history-only assertion ({len(sites)} sites; policy_reviewed.py): "
              + ", ".join(f"{k} {n}" for k, n in sorted(kinds.items(), key=lambda kv: -kv[1])))
    for site in sorted(review.by_key.values(), key=lambda s: (s.file, s.line)):
        if site.key in hit:
            print(f"  {hit[site.key]:4}  {site.file}:{site.line} {site.function} [{site.kind}] {site.source[:70]}")
    files = {f for s in chosen for f in s.files}
    for site in review.by_key.values():
        if site.key not in hit and site.file in files:
            print(f"WARNING: reviewed site not hit (stale?): {site.file}:{site.line} {site.function}: {site.source[:80]}")
    if unreviewed:
        print(f"\n{len(unreviewed)} unreviewed site(s); review each and add it to policy_reviewed.REVIEWED:")
        for record in unreviewed.values():
            print(entry_for(record))


def known_for(suite: str, tid: str) -> Known | None:
    for k in KNOWN_DIFFERENCES:
        if k.suite == suite and k.versions_match() and re.fullmatch(".*".join(map(re.escape, k.pattern.split("*"))), tid):
            return k
    return None


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--suite", action="append", help="checkpoint-postgres, pregel-core, pregel-extended")
    ap.add_argument("--saver", action="append", choices=tuple(SAVER_ARGS))
    ap.add_argument("--policy", action="store_true",
                    help="also run the durable savers with a checkpoint policy on (saver 'policy')")
    ap.add_argument("--encrypted", action="store_true",
                    help="every saver, stock and durable, with LangGraph's EncryptedSerializer "
                    "(issue 27: the suites pass with encryption at rest on)")
    ap.add_argument("-n", "--workers", type=int, default=int(os.environ.get("LGD_SUITE_WORKERS", "2")),
                    help="xdist workers per pytest run (default 2; the runs go side by side)")
    ap.add_argument("--sequential", action="store_true", help="one pytest run at a time (default: all at once)")
    ap.add_argument("--base", default=os.environ.get("LGD_SUITE_PG"),
                    help="PostgreSQL server URI ending in '/' (test databases are created there); "
                    "default: a throwaway cluster (fastpg.py), else " + SERVER)
    args = ap.parse_args(argv)
    if args.encrypted:
        EXTRA_ARGS[:] = ["--lgd-encrypted"]
    with contextlib.ExitStack() as stack:
        base = args.base or stack.enter_context(fastpg.start()) or SERVER
        return _main(args, base)


def _split(job: Job, r: Result) -> dict[str, Result]:
    """The job's result per suite (outcomes by test file; time and CPU are the job's)."""
    out = {}
    for suite in job.suites:
        files = tuple(f + "::" for f in suite.files)
        outcomes = {t: o for t, o in r.outcomes.items() if t.startswith(files)}
        out[suite.name] = Result(outcomes, r.seconds, r.cpu, r.returncode, r.built, r.log, r.failures)
    return out


def _main(args: argparse.Namespace, base: str) -> int:
    started = time.monotonic()
    savers = args.saver or ["stock", "durable"]
    if args.policy and "policy" not in savers:
        savers.append("policy")
    chosen = [s for s in suites() if not args.suite or s.name in args.suite]
    jobs = jobs_of(chosen)
    print("langgraph", metadata.version("langgraph"), "/ langgraph-checkpoint-postgres",
          metadata.version("langgraph-checkpoint-postgres"), "/ langgraph-checkpoint",
          metadata.version("langgraph-checkpoint"), flush=True)
    pg0 = fastpg.server_cpu()
    # Every (job, saver) pytest at once: the same load for stock and durable, and the
    # suites wait on round trips as much as they use CPU. The largest job starts first.
    pending = [(job, saver) for job in sorted(jobs, key=lambda j: -len(j.files)) for saver in savers]
    job_results: dict[tuple[str, str], Result] = {}
    if args.sequential:
        for job, saver in pending:
            job_results[job.name, saver] = finish(launch(job, saver, args.workers, base))
    else:
        running = [launch(job, saver, args.workers, base) for job, saver in pending]
        for run, result in zip(running, wait_all(running), strict=True):
            job_results[run.job.name, run.saver] = result
    flaky: list[str] = []
    review = Review(REVIEWED)
    for job in jobs:
        for saver in savers:  # stock first: the policy run's failures are judged against it
            r = job_results[job.name, saver]
            # Timing-sensitive tests of theirs can fail under load (seen: stock
            # test_imp_nested[postgres_aio-sync], stream order of parallel tasks): every
            # failure is run once more, alone; one that then passes is reported as flaky.
            # The policy run's reviewed history-only failures are not: they fail every time.
            bad = sorted(t for t, o in r.outcomes.items() if o in ("failed", "error"))
            if saver == "policy" and (job.name, "stock") in job_results:
                stock_outcomes = job_results[job.name, "stock"].outcomes
                bad = [t for t in bad if not review.judge(
                    t, stock_outcomes.get(t, "absent"), r.outcomes[t], r.failures.get(t, [])).accepted]
            if bad and len(bad) <= 200:
                again = finish(launch(job, saver, 0, base, ids=bad))
                r.seconds += again.seconds
                r.cpu += again.cpu
                for tid in bad:
                    # What the policy run is judged on: the failure of the run it last failed in.
                    r.failures[tid] = again.failures.get(tid, [])
                    if again.outcomes.get(tid) == "passed":
                        r.outcomes[tid] = "passed"
                        flaky.append(f"{job.name}/{saver}: {tid}")
    server_cpu = fastpg.server_cpu() - pg0
    results: dict[tuple[str, str], Result] = {}
    problems: list[str] = []
    for job in jobs:
        for saver in savers:
            whole = job_results[job.name, saver]
            for name, r in _split(job, whole).items():
                results[name, saver] = r
            # A collection error (an import error of a test module) has no test id of a
            # suite file, and a file that collects nothing hides its tests: both fail the run.
            for tid, o in sorted(whole.outcomes.items()):
                if not tid.startswith(tuple(f + "::" for f in job.files)) and o in ("failed", "error"):
                    problems.append(f"{job.name}/{saver}: {o} outside any test: {tid} (see {whole.log})")
            for f in job.files:
                if whole.outcomes and not any(t.startswith(f + "::") for t in whole.outcomes):
                    problems.append(f"{job.name}/{saver}: no test of {f} ran (see {whole.log})")
    explained: dict[Known, list[str]] = {}
    # The policy run: the differences accepted as reviewed history-only ones, by site.
    accepted: dict[str, list[Verdict]] = {}
    unreviewed: dict[tuple[str, str, str], dict[str, Any]] = {}
    compared = agreed = 0
    print()
    head = f"{'suite':<20} {'saver':<8} {'passed':>7} {'failed':>7} {'errors':>7} {'skipped':>8}"
    print(head)
    print("-" * len(head))
    for suite in chosen:
        for saver in savers:
            r = results[suite.name, saver]
            print(f"{suite.name:<20} {saver:<8} {r.count('passed'):>7} {r.count('failed'):>7} "
                  f"{r.count('error'):>7} {r.count('skipped'):>8}")
            if not r.outcomes:
                problems.append(f"{suite.name}/{saver}: no test ran (exit {r.returncode}, see {r.log})")
            elif (r.built > 0) != (saver != "stock"):
                problems.append(f"{suite.name}/{saver}: {r.built} durable savers built: the "
                                f"substitution did not work as intended (see {r.log})")
        stock = results.get((suite.name, "stock"))
        if stock is not None:
            for tid, o in sorted(stock.outcomes.items()):
                if o in ("failed", "error"):
                    problems.append(f"{suite.name}: STOCK {o}: {tid} (environment? see {stock.log})")
        if stock is None:
            continue
        for saver in savers:
            if saver == "stock":
                continue
            other = results[suite.name, saver]
            seen: set[Known] = set()
            for tid in sorted(stock.outcomes.keys() | other.outcomes.keys()):
                compared += 1
                so, do = stock.outcomes.get(tid, "absent"), other.outcomes.get(tid, "absent")
                if so == do:
                    agreed += 1
                    continue
                k = known_for(suite.name if saver == "durable" else f"{suite.name}/{saver}", tid)
                if k is not None:
                    seen.add(k)
                    agreed += 1
                    explained.setdefault(k, []).append(f"{tid} (stock {so}, {saver} {do})")
                elif saver == "policy":
                    verdict = review.judge(tid, so, do, other.failures.get(tid, []))
                    if verdict.accepted:
                        agreed += 1
                        accepted.setdefault(suite.name, []).append(verdict)
                    else:
                        problems.append(f"{suite.name}/policy: {tid}: {verdict.why} (see {other.log})")
                        if verdict.key is not None and verdict.site is None and verdict.record:
                            unreviewed.setdefault(verdict.key, verdict.record)
                else:
                    problems.append(f"{suite.name}: {tid}: stock {so}, {saver} {do} (see {other.log})")
            for k in KNOWN_DIFFERENCES:
                wanted = suite.name if saver == "durable" else f"{suite.name}/{saver}"
                if k.suite == wanted and k not in seen and k.versions_match():
                    problems.append(f"known difference no longer occurs, remove it from "
                                    f"KNOWN_DIFFERENCES: {k.suite} {k.pattern}")
    print()
    head = f"{'pytest run':<36} {'saver':<8} {'time':>8} {'cpu':>7}"
    print(head)
    print("-" * len(head))
    for job in jobs:
        for saver in savers:
            r = job_results[job.name, saver]
            print(f"{job.name:<36} {saver:<8} {r.seconds:>7.0f}s {r.cpu:>6.0f}s")
    if fastpg.postmaster_pid is not None:
        print(f"{'PostgreSQL (all runs)':<36} {'server':<8} {'':>8} {server_cpu:>6.0f}s")
    print(f"{'wall time of the whole run':<36} {'':<8} {time.monotonic() - started:>7.0f}s")
    print()
    for line in flaky:
        print("FLAKY (failed, then passed when run again):", line)
    for k, tids in explained.items():
        print(f"KNOWN ({len(tids)}): {k.suite} {k.pattern}: {k.reason} [removed by: {k.removed_by}]")
        for tid in tids:
            print("    ", tid)
    for line in problems:
        print("PROBLEM:", line)
    if "policy" in savers:
        _report_policy(review, accepted, unreviewed, chosen)
    print(f"\n{compared} test ids compared with stock; {sum(map(len, explained.values()))} differ as listed in "
          f"KNOWN_DIFFERENCES, {len(problems)} problem(s).")
    # The closing line counts test ids whose outcome matches stock's (or is a listed
    # difference) as passed, the rest as failed.
    failed = min(compared, len(problems))
    print(f"langgraph-suites: {compared - failed} passed, {failed} failed")
    return 1 if problems else 0


if __name__ == "__main__":
    # SIGTERM (a CI timeout, a kill) unwinds like Ctrl-C, so the throwaway cluster stops.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    sys.exit(main())
