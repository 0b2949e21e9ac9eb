"""Child of test_rekey's kill test: `langgraph-durable rekey` one row per transaction,
each page logged to a marker file and followed by a short sleep, to be SIGKILLed.

argv: dsn key_file marker_file
"""

from __future__ import annotations

import sys
import time
from typing import Any

from langgraph_durable.cli import app
from langgraph_durable.ops import rekey as ops_rekey


def main() -> None:
    dsn, key_file, marker = sys.argv[1:4]
    real = ops_rekey.rekey

    def slow(saver: Any, **kwargs: Any) -> Any:
        def progress(done: int, total: int) -> None:
            with open(marker, "a") as f:
                f.write(f"{done} {total}\n")
            time.sleep(0.02)

        kwargs["progress"] = progress
        return real(saver, **kwargs)

    ops_rekey.rekey = slow  # type: ignore[assignment]
    app(["rekey", "--dsn", dsn, "--key-file", key_file, "--batch-size", "1", "--json"], standalone_mode=True)


if __name__ == "__main__":
    main()
