#!/usr/bin/env python3
"""Run every mutant (tests/mutants/__init__.py) against the tests that must catch it.

    .venv/bin/python tests/mutants/run.py            # all of them
    .venv/bin/python tests/mutants/run.py no-fence   # one

Each line says CAUGHT (the tests failed, as they must) or SURVIVED (they passed: a check
that cannot fail). Exit 1 if one survived. The chaos machine's seed varies: a SURVIVED
line names it (LGD_SEED=... replays it).
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
TARGETS = {
    "refuse-kinds": ["tests/test_value_roundtrip.py"],
    "no-fence": ["tests/test_model_chaos.py::test_model_chaos"],
}


def main(names: list[str]) -> int:
    survived = []
    for name in names or list(TARGETS):
        env = {**os.environ, "LGD_MUTANT": name}
        cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:randomly", "-p", "no:cacheprovider", *TARGETS[name]]
        out = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True)
        tail = [x for x in out.stdout.splitlines() if x.strip()][-1:] or ["(no output)"]
        seed = next((x.strip() for x in out.stdout.splitlines() if "seed" in x and "replay" in x), "")
        verdict = "CAUGHT" if out.returncode == 1 else ("SURVIVED" if out.returncode == 0 else f"ERROR rc={out.returncode}")
        print(f"{verdict:9} {name:14} {' '.join(TARGETS[name])}: {tail[0]} {seed}", flush=True)
        if out.returncode != 1:
            survived.append(name)
    return 1 if survived else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
