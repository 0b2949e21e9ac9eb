#!/usr/bin/env python3
"""Two commands for a fresh machine with only Python 3.11+ (no Postgres, no Docker):

    python3 dev.py demo     # crash a research pipeline with SIGKILL, resume it
    python3 dev.py test     # ruff + mypy + the whole test suite
    python3 dev.py suites   # LangGraph's own test suites, stock vs durable savers

Both create ``.venv`` on first use and install the package with its test extras
(reinstalled when pyproject.toml changes). Extra arguments go to the demo, to pytest or to
tests/langgraph_suites/run.py.
"""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
import venv
from pathlib import Path

ROOT = Path(__file__).resolve().parent
VENV = Path(os.environ.get("LANGGRAPH_DURABLE_VENV", ROOT / ".venv"))
BIN = VENV / ("Scripts" if os.name == "nt" else "bin")
PY = BIN / "python"


def _run(*cmd: str | os.PathLike[str]) -> int:
    print("+", " ".join(str(c) for c in cmd), flush=True)
    return subprocess.call([str(c) for c in cmd], cwd=ROOT)


def ensure_env() -> None:
    if sys.version_info < (3, 11):  # noqa: UP036 - users run this file with any python3
        sys.exit("langgraph-durable needs Python 3.11 or newer")
    stamp = VENV / ".installed"
    want = hashlib.sha256((ROOT / "pyproject.toml").read_bytes()).hexdigest()
    if stamp.exists() and stamp.read_text() == want and PY.exists():
        return
    if not PY.exists():
        print(f"creating {VENV}", flush=True)
        venv.EnvBuilder(with_pip=True).create(VENV)
    if _run(PY, "-m", "pip", "install", "--quiet", "--upgrade", "pip") != 0:
        sys.exit("pip upgrade failed")
    if _run(PY, "-m", "pip", "install", "--quiet", "-e", ".[test]") != 0:
        sys.exit("installing the package failed")
    stamp.write_text(want)


def main(argv: list[str]) -> int:
    if not argv or argv[0] not in ("demo", "test", "lint", "suites"):
        print(__doc__)
        return 2
    ensure_env()
    command, rest = argv[0], argv[1:]
    if command == "demo":
        return _run(BIN / "langgraph-durable", "demo", *rest)
    if command == "suites":
        return _run(PY, ROOT / "tests" / "langgraph_suites" / "run.py", *rest)
    lint_dirs = [d for d in ("langgraph_durable", "tests", "bench", "examples", "dev.py") if (ROOT / d).exists()]
    if _run(PY, "-m", "ruff", "check", *lint_dirs) != 0:
        return 1
    if _run(PY, "-m", "mypy") != 0:
        return 1
    if command == "lint":
        return 0
    return _run(PY, "-m", "pytest", *rest)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
