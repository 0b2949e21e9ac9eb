"""Newcomer review (issue 27): the console and the CLI opened with a WRONG key (a key
file for another environment, or the old key dropped before ``rekey`` reached a row).

docs/encryption.md: operator views opened without the key show ``<encrypted>`` /
``{"encrypted": true}``; the console's pages work on what is in the clear. Without any
key that held; with a key that does not open a row, every view that shows a sealed text
or JSON (the audit page, the ledger, the thread page's last error and failure, the
quarantine list) was a 400 ``DecryptionError`` page instead: one row sealed under another
key made the whole audit page unreadable, so a wrong key was worse than no key."""

# No `from __future__ import annotations`: LangGraph evaluates the local state schemas.

from typing import Any

import pytest
from langchain_core.messages import HumanMessage
from starlette.testclient import TestClient
from test_export_stock import chat_graph
from test_rekey import _failing_graph

from langgraph_durable import DurablePostgresSaver, idempotent
from langgraph_durable.audit import list_audit
from langgraph_durable.console import create_app
from langgraph_durable.idempotency.ledger import Ledger
from langgraph_durable.keyring import DurableEncryptedSerializer
from langgraph_durable.ops import control, inspection

KEY = b"newcomer-right-0123456789abcdef!"
WRONG = b"newcomer-wrong-0123456789abcdef!"
CANARY = "NC-CANARY-5d1f"


@pytest.fixture(scope="module")
def written(dsn: str) -> str:
    with DurablePostgresSaver.from_conn_string(dsn, serde=DurableEncryptedSerializer(KEY)) as saver:
        g = chat_graph().compile(checkpointer=saver)
        config: Any = {"configurable": {"thread_id": "nc-chat"}, "metadata": {"customer": CANARY}}
        g.invoke({"messages": [HumanMessage(CANARY + " hello")]}, config)

        @idempotent(ledger=saver, key=lambda card: "nc-charge")
        def charge(card: str) -> dict[str, Any]:
            return {"receipt": CANARY + card}

        charge(CANARY)
        with pytest.raises(RuntimeError):
            _failing_graph().compile(checkpointer=saver).invoke({"docs": []}, {"configurable": {"thread_id": "nc-fail"}})
        head = g.get_state({"configurable": {"thread_id": "nc-chat"}}).config["configurable"]["checkpoint_id"]
        control.fork(saver, "nc-chat", head, new_thread_id="nc-chat-fork")  # a sealed audit detail
    return dsn


def test_console_with_a_wrong_key_says_encrypted_like_without_one(written: str) -> None:
    with DurablePostgresSaver.from_conn_string(written, serde=DurableEncryptedSerializer(WRONG)) as saver:
        with TestClient(create_app(saver, sample_interval=0)) as client:
            pages = {
                p: client.get(p)
                for p in ("/", "/threads", "/audit", "/ledger?show=all", "/quarantine",
                          "/thread?id=nc-fail", "/thread?id=nc-chat")
            }
    for path, r in pages.items():
        # On main: /audit, /ledger?show=all and /thread?id=nc-fail are 400 DecryptionError pages.
        assert r.status_code == 200, (path, r.text[:300])
        assert CANARY not in r.text, path
        assert "lgd:sealed" not in r.text, path  # never ciphertext shown as a value
    assert "encrypted" in pages["/audit"].text


def test_python_views_with_a_wrong_key_say_encrypted(written: str) -> None:
    with DurablePostgresSaver.from_conn_string(written, serde=DurableEncryptedSerializer(WRONG)) as saver:
        rows = list_audit(saver, thread_id="nc-chat")  # on main: DecryptionError
        assert rows and all(r["detail"].get("encrypted") is True for r in rows if r["detail"]), rows
        entry = next(e for e in Ledger(saver).entries() if e.key == "nc-charge")
        assert entry.args_preview == "<encrypted>"
        shown = inspection.show_thread(saver, "nc-fail")
        assert shown["last_error"] == "<encrypted>"


def test_the_run_path_with_a_wrong_key_is_still_a_typed_error(written: str) -> None:
    """The views' placeholder does not soften the run path: reads with a wrong key
    raise ``DecryptionError`` naming the thread."""
    from langgraph_durable.errors import DecryptionError

    with DurablePostgresSaver.from_conn_string(written, serde=DurableEncryptedSerializer(WRONG)) as saver:
        with pytest.raises(DecryptionError) as err:
            saver.get_tuple({"configurable": {"thread_id": "nc-chat"}})
    assert err.value.fields["thread_id"] == "nc-chat"


@pytest.mark.parametrize("key", [None, KEY, WRONG], ids=["no-key", "key", "wrong-key"])
def test_threads_list_never_shows_a_sealed_error_text(written: str, key: bytes | None) -> None:
    """The threads list (console, both orders, and ``inspection.list_threads``) showed
    ``durable_threads.last_error`` as stored: ``lgd:sealed:v1:<base64>`` with or without
    the key (on main: the console's /threads page and list_threads' rows)."""
    serde = DurableEncryptedSerializer(key) if key else None
    with DurablePostgresSaver.from_conn_string(written, serde=serde) as saver:
        with TestClient(create_app(saver, sample_interval=0)) as client:
            pages = [client.get("/threads").text, client.get("/threads?sort=id").text,
                     client.get("/threads?state=error&newer_than_h=5").text]
        rows = inspection.list_threads(saver)
    failed = next(r for r in rows if r["thread_id"] == "nc-fail")
    for text in [*pages, repr(rows)]:
        assert "lgd:sealed" not in text
    if key == KEY:
        assert failed["last_error"] and "<encrypted>" not in failed["last_error"]
        assert "declined for Ada" in failed["last_error"] and all("declined for Ada" in p for p in pages)
    else:
        assert failed["last_error"] == "<encrypted>"
