"""Newcomer review (issue 27): ``export-stock --verify`` on an encrypted database, as
docs/encryption.md and the README's Operations table tell an operator to run it before
uninstalling. The verify step read the exported rows with a stock ``PostgresSaver``
built without the serializer, so every encrypted database ended in a CLI traceback
(``NotImplementedError: Unknown serialization type: msgpack+aes``) after the export had
been written, and the operator could not tell whether it had worked."""

# No `from __future__ import annotations`: LangGraph evaluates the local state schemas.

import base64
import json
from pathlib import Path
from typing import Any

from test_export_stock import chat_graph
from typer.testing import CliRunner

from langgraph_durable import DurablePostgresSaver
from langgraph_durable.cli import app
from langgraph_durable.keyring import DurableEncryptedSerializer

KEY = b"newcomer-export-0123456789abcdef"


def test_export_stock_verify_with_the_key_reads_through_the_same_serializer(dsn: str, tmp_path: Path) -> None:
    serde: Any = DurableEncryptedSerializer(KEY)
    with DurablePostgresSaver.from_conn_string(dsn, serde=serde) as saver:
        graph = chat_graph().compile(checkpointer=saver)
        graph.invoke({"messages": []}, {"configurable": {"thread_id": "nc-exp"}, "metadata": {"customer": "Ada"}})
    key_file = tmp_path / "keys"
    key_file.write_text("base64:" + base64.b64encode(KEY).decode() + "\n")
    result = CliRunner().invoke(
        app, ["--key-file", str(key_file), "export-stock", "--verify", "--json", "--dsn", dsn]
    )
    # On main: result.exception is NotImplementedError('Unknown serialization type: msgpack+aes').
    assert result.exception is None or isinstance(result.exception, SystemExit), repr(result.exception)
    assert result.exit_code == 0, result.output
    out = json.loads(result.stdout)
    assert out["verified"] == {"threads": 1, "mismatches": 0}, out
