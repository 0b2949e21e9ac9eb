#!/usr/bin/env python3
"""Two commands for a fresh machine with only Python 3.11+ (no Postgres, no Docker):

    python3 dev.py demo         # crash a research pipeline with SIGKILL, resume it
    python3 dev.py test         # ruff + mypy + lint-imports + the whole test suite
    python3 dev.py lint         # ruff + mypy + lint-imports (the layers contract)
    python3 dev.py test --long  # the hypothesis tests only, long profile (many examples)
    python3 dev.py suites       # LangGraph's own test suites, stock vs durable savers
    python3 dev.py suites --policy  # ... and the durable savers with a checkpoint policy (CI)
    python3 dev.py test-oldest  # the oldest supported LangGraph: drop-in suites + LangGraph's suites
    python3 dev.py env-oldest   # only build test-oldest's virtualenv (CI does it beside the tests)

``demo``/``test``/``suites`` create ``.venv`` on first use and install the package with its
test extras (reinstalled when pyproject.toml changes). ``test-oldest`` does the same in
``.venv-oldest`` with the low end of the supported range pinned
(``[tool.langgraph-durable.oldest]`` in pyproject.toml) and runs ``OLDEST_SUITES``, then
LangGraph's own suites of those versions (tests/langgraph_suites/run.py).
Extra arguments go to the demo, to pytest or to tests/langgraph_suites/run.py.
"""

from __future__ import annotations

import hashlib
import os
import re
import subprocess
import sys
import tomllib
import venv
from pathlib import Path

ROOT = Path(__file__).resolve().parent
VENV = Path(os.environ.get("LANGGRAPH_DURABLE_VENV", ROOT / ".venv"))
BIN = VENV / ("Scripts" if os.name == "nt" else "bin")
PY = BIN / "python"


def _run(*cmd: str | os.PathLike[str]) -> int:
    print("+", " ".join(str(c) for c in cmd), flush=True)
    return subprocess.call([str(c) for c in cmd], cwd=ROOT)


def ensure_env(venv_dir: Path = VENV, requirements: tuple[str, ...] = (".[test]",)) -> Path:
    """A virtualenv at ``venv_dir`` with ``-e <requirements[0]>`` and the rest installed;
    rebuilt when pyproject.toml or the requirements change. Returns its python."""
    if sys.version_info < (3, 11):  # noqa: UP036 - users run this file with any python3
        sys.exit("langgraph-durable needs Python 3.11 or newer")
    py = venv_dir / ("Scripts" if os.name == "nt" else "bin") / "python"
    stamp = venv_dir / ".installed"
    digest = hashlib.sha256((ROOT / "pyproject.toml").read_bytes())
    digest.update("\n".join(requirements).encode())
    want = digest.hexdigest()
    if stamp.exists() and stamp.read_text() == want and py.exists():
        return py
    if not py.exists():
        print(f"creating {venv_dir}", flush=True)
        venv.EnvBuilder(with_pip=True).create(venv_dir)
    if _run(py, "-m", "pip", "install", "--quiet", "--upgrade", "pip") != 0:
        sys.exit("pip upgrade failed")
    if _run(py, "-m", "pip", "install", "--quiet", "-e", *requirements) != 0:
        sys.exit("installing the package failed")
    stamp.write_text(want)
    return py


# --- how the test suite runs -------------------------------------------------------------
# The suite waits far more than it computes (real processes SIGKILLed and resumed, leases
# expiring, servers starting): run serially it used 31% of one core (754 s wall, 236 CPU-s,
# 2-core machine). So pytest-xdist workers, more than the cores; ``--dist loadfile``: a test
# file stays on one worker (its module-scoped database is made once, and files that share a
# resource, e.g. test_model_chaos.py's report, never run beside themselves), handed out in
# collection order, which tests/conftest.py sorts slowest file first (SLOW_FIRST), so the
# longest files do not start last. ``LGD_TEST_WORKERS=0`` runs serially; an ``-n``/``--dist``/
# ``-p no:xdist`` of the caller's wins.
TEST_WORKERS = int(os.environ.get("LGD_TEST_WORKERS", "4"))


def xdist_args(rest: list[str], workers: int = TEST_WORKERS) -> list[str]:
    def own(a: str) -> bool:
        return (a.startswith("-n") and not a.startswith("--")) or a.startswith(("--numprocesses", "--dist")) \
            or a in ("no:xdist", "-pno:xdist", "--pdb", "--trace")  # a debugger needs the terminal

    if workers <= 1 or any(own(a) for a in rest):
        return []
    return ["-n", str(workers), "--dist", "loadfile", "--no-loadscope-reorder"]


# --- the oldest supported versions (CI's second, shorter job) ---------------------------
OLDEST_VENV = Path(os.environ.get("LANGGRAPH_DURABLE_OLDEST_VENV", ROOT / ".venv-oldest"))
# What the oldest job runs: the drop-in suites. HOOK: suites that must also pass on the
# low end of the range (e.g. LangGraph's own test suites run against the durable savers)
# append their pytest arguments here, or to OLDEST_EXTRA_SUITES via add_oldest_suite().
OLDEST_SUITES: list[str] = [
    "tests/test_conformance.py",
    "tests/test_crash_resume.py",
    "tests/test_dropin_api.py",
]
# Test extras the oldest job needs (their version specs are taken from pyproject.toml's
# ``test`` and ``langgraph-suites`` extras): not the notebook/Studio/lint tools, which pull
# in the newest LangGraph.
OLDEST_TEST_TOOLS = (
    "pytest", "pytest-asyncio", "langgraph-checkpoint-conformance", "hypothesis",
    "pytest-xdist", "asyncpg",
    # LangGraph's own suites (tests/langgraph_suites/run.py), from the oldest sdists
    "syrupy", "pytest-mock", "redis", "langgraph-checkpoint-sqlite", "pycryptodome",
)
OLDEST_EXTRA_SUITES: list[str] = []
# Then LangGraph's own suites of the oldest versions (their sdists), stock vs durable:
# tests/langgraph_suites/run.py with these arguments (LGD_OLDEST_SUITES=0 skips it).
# Not --policy: its reviewed history-only statements (policy_reviewed.py) were reviewed on the
# newest sdists; the oldest ones' failing statements have not been, so the run would fail on
# them as unreviewed (review them first, then add "--policy" here).
OLDEST_LANGGRAPH_SUITES: list[str] = []


def add_oldest_suite(*pytest_args: str) -> None:
    """Register more pytest arguments for the oldest job (see OLDEST_SUITES)."""
    OLDEST_EXTRA_SUITES.extend(pytest_args)


def oldest_requirements() -> tuple[str, ...]:
    """``.`` plus the pinned low end of the range and the test tools it needs."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())
    pins = project["tool"]["langgraph-durable"]["oldest"]["pins"]
    tools = []
    extras = project["project"]["optional-dependencies"]
    for spec in [*extras["test"], *extras["langgraph-suites"]]:
        name = re.split(r"[\[<>=!~; ]", spec, maxsplit=1)[0].lower()
        if name in OLDEST_TEST_TOOLS and spec not in tools:
            tools.append(spec)
    return (".", *pins, *tools)


def test_oldest(rest: list[str]) -> int:
    py = ensure_env(OLDEST_VENV, oldest_requirements())
    code = _run(py, "-c", "import langgraph_durable._compat as c; print('oldest job on', c.describe_versions())")
    if code != 0:
        return code
    # No rerun: a failure fails the job. (The random-SIGKILL crash test, which used to
    # fail about once in ten loaded runs and was rerun, now kills at node events, not
    # moments, and prints its seed: LGD_SEED=<seed> replays a failure.)
    code = _run(py, "-m", "pytest", *xdist_args(rest, min(TEST_WORKERS, 3)), *OLDEST_SUITES, *OLDEST_EXTRA_SUITES, *rest)
    if os.environ.get("LGD_OLDEST_SUITES", "1") != "0" and not rest:
        # LangGraph's suites of exactly the oldest versions: run.py unpacks the sdists of
        # what this virtualenv has installed (langgraph 1.0.6, checkpoint-postgres 3.2.0).
        suites = _run(py, ROOT / "tests" / "langgraph_suites" / "run.py", *OLDEST_LANGGRAPH_SUITES)
        code = code or suites
    return code


def main(argv: list[str]) -> int:
    if not argv or argv[0] not in ("demo", "test", "lint", "test-oldest", "env-oldest", "suites"):
        print(__doc__)
        return 2
    command, rest = argv[0], argv[1:]
    if command == "env-oldest":
        ensure_env(OLDEST_VENV, oldest_requirements())
        return 0
    if command == "test-oldest":
        return test_oldest(rest)
    ensure_env()
    if command == "demo":
        return _run(BIN / "langgraph-durable", "demo", *rest)
    if command == "suites":
        return _run(PY, ROOT / "tests" / "langgraph_suites" / "run.py", *rest)
    lint_dirs = [d for d in ("langgraph_durable", "tests", "bench", "examples", "dev.py") if (ROOT / d).exists()]
    if _run(PY, "-m", "ruff", "check", *lint_dirs) != 0:
        return 1
    if _run(PY, "-m", "mypy") != 0:
        return 1
    if _run(PY, ROOT / "tools" / "async_to_sync.py", "--check") != 0:  # the generated sync driver
        return 1
    # The layers contract ([tool.importlinter] in pyproject.toml): no module imports a
    # layer above its own.
    if _run(BIN / "lint-imports", "--no-cache") != 0:
        return 1
    if command == "lint":
        return 0
    if "--long" in rest:
        # The property and model-based tests with the long hypothesis profile
        # (tests/_hypothesis_profiles.py); LGD_HYPOTHESIS_EXAMPLES sizes the run.
        rest = [a for a in rest if a != "--long"]
        os.environ["LGD_HYPOTHESIS_PROFILE"] = "long"
        if "-m" not in rest:
            rest = ["-m", "hypothesis", *rest]
    return _run(PY, "-m", "pytest", *xdist_args(rest), *rest)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
