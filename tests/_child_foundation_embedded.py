"""Child process of tests/test_setup_and_connections.py (not a test module).

Runs with ``LANGGRAPH_DURABLE_DSN=embedded`` (the explicit choice; no DSN at all is a
``DsnMissingError``) and ``LANGGRAPH_DURABLE_HOME`` pointing at a temporary folder, so
``from_conn_string()`` starts the embedded PostgreSQL. ``write`` stores a checkpoint, ``read`` prints it back; either way the
process exits normally, which must stop the server it started.
"""

from __future__ import annotations

import json
import sys

from langgraph.checkpoint.conformance.test_utils import (
    generate_checkpoint,
    generate_config,
    generate_metadata,
)

from langgraph_durable import DurablePostgresSaver


def main() -> int:
    with DurablePostgresSaver.from_conn_string() as saver:
        saver.setup()
        if sys.argv[1] == "write":
            saver.put(
                generate_config("embedded"),
                generate_checkpoint(channel_values={"v": "kept\x00"}, channel_versions={"v": "1"}),
                generate_metadata(),
                {"v": "1"},
            )
            values = None
        else:
            tup = saver.get_tuple(generate_config("embedded"))
            values = tup.checkpoint["channel_values"] if tup else None
        print(json.dumps({"conninfo": str(saver.conn.conninfo), "values": values}), flush=True)  # type: ignore[union-attr]
    return 0


if __name__ == "__main__":
    sys.exit(main())
