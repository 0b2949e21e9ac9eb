"""Operators with encryption at rest (issue 27): the CLI and the console decrypt when
given the key (``--key-file`` / ``LANGGRAPH_DURABLE_KEY_FILE``) and say "encrypted" when
not: never a traceback, never ciphertext shown as if it were a value."""

# No `from __future__ import annotations`: LangGraph evaluates the local state schemas.

import json
from pathlib import Path
from typing import Any

import pytest
from langchain_core.messages import HumanMessage
from starlette.testclient import TestClient
from test_export_stock import chat_graph
from test_rekey import _failing_graph
from typer.testing import CliRunner

from langgraph_durable import DurablePostgresSaver, idempotent
from langgraph_durable.cli import app
from langgraph_durable.console import create_app
from langgraph_durable.keyring import DurableEncryptedSerializer

KEY = b"operator-key-0123456789abcdef012"
CANARY = "CANARY-7f3a"
runner = CliRunner()


@pytest.fixture(scope="module")
def written(dsn: str, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    with DurablePostgresSaver.from_conn_string(dsn, serde=DurableEncryptedSerializer(KEY)) as saver:
        g = chat_graph().compile(checkpointer=saver)
        g.invoke({"messages": [HumanMessage(CANARY + " hello")]},
                 {"configurable": {"thread_id": "op-chat"}, "metadata": {"customer": CANARY}})

        @idempotent(ledger=saver, key=lambda card: "op-charge")
        def charge(card: str) -> dict[str, Any]:
            return {"receipt": CANARY + card}

        charge("4111")
        with pytest.raises(RuntimeError):
            _failing_graph().compile(checkpointer=saver).invoke({"docs": []}, {"configurable": {"thread_id": "op-fail"}})
    key_file = tmp_path_factory.mktemp("keys") / "keys"
    key_file.write_text("base64:" + __import__("base64").b64encode(KEY).decode() + "\n")
    return {"dsn": dsn, "key_file": str(key_file)}


COMMANDS = [
    ["threads", "show", "op-chat"],
    ["threads", "show", "op-fail"],
    ["threads", "history", "op-chat"],
    ["threads", "list"],
    ["ledger", "show", "op-charge"],
    ["stats"],
]


def _run(args: list[str], env: dict[str, str]) -> Any:
    result = runner.invoke(app, args, env=env)
    assert result.exception is None or isinstance(result.exception, SystemExit), result.exception
    return result


@pytest.mark.parametrize("args", COMMANDS, ids=[" ".join(c) for c in COMMANDS])
def test_cli_without_the_key_says_encrypted(written: dict[str, Any], args: list[str], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("LANGGRAPH_DURABLE_KEY_FILE", raising=False)
    monkeypatch.delenv("LANGGRAPH_AES_KEY", raising=False)
    result = _run([*args, "--dsn", written["dsn"]], {})
    out = result.output
    assert "Traceback" not in out and CANARY not in out
    assert result.exit_code == 0, out
    if args[:2] in (["threads", "show"], ["ledger", "show"]):
        assert "encrypted" in out, out


@pytest.mark.parametrize("args", COMMANDS, ids=[" ".join(c) for c in COMMANDS])
def test_cli_with_the_key_decrypts(written: dict[str, Any], args: list[str], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("LANGGRAPH_DURABLE_KEY_FILE", raising=False)
    flag = _run(["--key-file", written["key_file"], *args, "--dsn", written["dsn"]], {})
    env = _run([*args, "--dsn", written["dsn"]], {"LANGGRAPH_DURABLE_KEY_FILE": written["key_file"]})
    for result in (flag, env):
        assert result.exit_code == 0, result.output
        assert "Traceback" not in result.output
        assert "<encrypted>" not in result.output and "encrypted (" not in result.output
        assert "values are encrypted" not in result.output
    if args == ["threads", "show", "op-chat"]:
        # The JSON form: the table crops values to the terminal's width (80 columns
        # without a terminal, as in CI), which can cut the canary off.
        flag_json = _run(["--key-file", written["key_file"], *args, "--json", "--dsn", written["dsn"]], {})
        env_json = _run([*args, "--json", "--dsn", written["dsn"]], {"LANGGRAPH_DURABLE_KEY_FILE": written["key_file"]})
        assert CANARY in flag_json.output and CANARY in env_json.output
    if args == ["threads", "show", "op-fail"]:
        assert "declined for Ada" in flag.output
    if args == ["ledger", "show", "op-charge"]:
        assert CANARY + "4111" in flag.output


def test_cli_json_says_encrypted(written: dict[str, Any], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("LANGGRAPH_DURABLE_KEY_FILE", raising=False)
    result = _run(["threads", "show", "op-chat", "--dsn", written["dsn"], "--json"], {})
    info = json.loads(result.output)
    assert info["load_error"]["encrypted"] is True and info["load_error"]["error"] == "DecryptionError"


def test_a_bad_key_file_is_one_line(written: dict[str, Any], tmp_path: Path) -> None:
    bad = tmp_path / "bad"
    bad.write_text("hex:zz\n")
    result = runner.invoke(app, ["--key-file", str(bad), "threads", "show", "op-chat", "--dsn", written["dsn"]])
    assert result.exit_code == 1 and "Traceback" not in result.output
    assert "not valid hex" in result.output


@pytest.mark.parametrize("with_key", [False, True], ids=["no-key", "key"])
def test_console_decrypts_with_the_key_and_says_encrypted_without(written: dict[str, Any], with_key: bool) -> None:
    serde = DurableEncryptedSerializer(KEY) if with_key else None
    with DurablePostgresSaver.from_conn_string(written["dsn"], serde=serde) as saver:
        with TestClient(create_app(saver, sample_interval=0)) as client:
            pages = {p: client.get(p) for p in ("/", "/threads", "/thread?id=op-chat", "/thread?id=op-fail", "/ledger?show=all")}
    for path, r in pages.items():
        assert r.status_code == 200, (path, r.text[:300])
        # (with the key, op-fail's page shows the traceback its failure recorded, opened)
        assert "Traceback" not in r.text or (with_key and path.endswith("op-fail")), path
    chat = pages["/thread?id=op-chat"].text
    if with_key:
        assert CANARY in chat and 'id="encrypted"' not in chat
        assert "declined for Ada" in pages["/thread?id=op-fail"].text
    else:
        assert CANARY not in chat and 'id="encrypted"' in chat
        assert "declined for Ada" not in pages["/thread?id=op-fail"].text


def test_key_file_forms(tmp_path: Path) -> None:
    from langgraph_durable.cli._common import serde_from_keys
    from langgraph_durable.keyring import Keyring

    path = tmp_path / "keys"
    path.write_text(f"# rotation\nhex:{KEY.hex()}\n\n{'o' * 32}\ndigest:base64:"
                    + __import__("base64").b64encode(b"d" * 32).decode() + "\n")
    ring = Keyring.from_serde(serde_from_keys(str(path)))
    assert ring is not None and ring.keys == (KEY, b"o" * 32)
    assert ring.digest_key() == Keyring.from_serde(DurableEncryptedSerializer(b"d" * 32)).digest_key()  # type: ignore[union-attr]
