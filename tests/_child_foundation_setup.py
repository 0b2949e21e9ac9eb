"""Child process of tests/test_setup_and_connections.py (not a test module).

Waits for a line on stdin (so that every child starts at the same moment), then calls
``setup()`` on the DSN in ``SETUP_DSN``, first without and then with the schema named
in ``SETUP_SCHEMA``, and prints ``OK`` or the error.
"""

from __future__ import annotations

import os
import sys

from langgraph_durable import DurablePostgresSaver


def main() -> int:
    dsn = os.environ["SETUP_DSN"]
    schema = os.environ["SETUP_SCHEMA"]
    print("READY", flush=True)
    sys.stdin.readline()
    try:
        with DurablePostgresSaver.from_conn_string(dsn, pool_size=1) as saver:
            saver.setup()
        with DurablePostgresSaver.from_conn_string(dsn, pool_size=1, schema=schema) as saver:
            saver.setup()
    except Exception as exc:
        print(f"ERROR {type(exc).__name__}: {exc}", flush=True)
        return 1
    print("OK", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
