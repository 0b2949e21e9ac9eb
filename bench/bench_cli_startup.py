"""How long `langgraph-durable --help` takes to start (issue 14, problem 5).

Runs the CLI's entry point N times in fresh interpreters and prints the median wall time
and the median CPU time (user + sys of the child: steadier than wall time on a loaded
machine), plus the same for a bare `python -c pass` and `import typer` as floors.

    PYTHONPATH=$PWD python bench/bench_cli_startup.py [-n 15] [--args "threads --help"]
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import subprocess
import sys
import time


def _run(code: str, args: list[str], n: int) -> tuple[float, float]:
    walls: list[float] = []
    cpus: list[float] = []
    for _ in range(n):
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        start = time.perf_counter()
        subprocess.run(
            [sys.executable, "-c", code, *args],
            check=True,
            stdout=subprocess.DEVNULL,
            env=os.environ,
        )
        walls.append(time.perf_counter() - start)
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        cpus.append(
            (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
        )
    return statistics.median(walls), statistics.median(cpus)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("-n", type=int, default=15, help="runs per command")
    parser.add_argument("--args", default="--help", help="CLI arguments")
    opts = parser.parse_args()
    cli = "import sys; from langgraph_durable.cli import main; sys.argv[0] = 'langgraph-durable'; main()"
    rows = [
        ("python -c pass", "pass", []),
        ("import typer", "import typer", []),
        (f"langgraph-durable {opts.args}", cli, opts.args.split()),
    ]
    print(f"{'command':<36} {'wall median':>12} {'cpu median':>12}")
    for label, code, args in rows:
        wall, cpu = _run(code, args, opts.n)
        print(f"{label:<36} {wall * 1000:>10.0f} ms {cpu * 1000:>10.0f} ms")


if __name__ == "__main__":
    main()
