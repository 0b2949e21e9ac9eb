"""Child of test_archive's kill test: `langgraph-durable retain --archive` with the
archive's windows widened (archive._pause sleeps and logs where it is), to be SIGKILLed.

argv: dsn schema url marker_file
"""

from __future__ import annotations

import random
import sys
import time

from langgraph_durable import archive
from langgraph_durable.cli import app


def main() -> None:
    dsn, schema, url, marker = sys.argv[1:5]

    def pause(point: str) -> None:
        with open(marker, "a") as f:
            f.write(point + "\n")
        time.sleep(random.uniform(0.0, 0.1))

    archive._pause = pause
    app(
        ["retain", "--dsn", dsn, "--schema", schema, "--days", "30", "--status", "done",
         "--archive", url, "--batch-size", "1", "--no-gc", "--json"],
        standalone_mode=True,
    )


if __name__ == "__main__":
    main()
